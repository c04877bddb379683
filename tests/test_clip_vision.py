"""`core.nn.clip_vision` against transformers' `CLIPModel` (image tower + `visual_projection`, text
tower pooled at EOS + `text_projection`).

`fixtures/clip_vision.npz` (written by `fixtures/make_clip_vision.py` with torch and transformers)
holds a tiny randomly initialised `CLIPModel` of CLIP's layout with its image features on fixed pixels
and its text features on fixed ids.
"""

import json

import fixture_files
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.nn import clip_text, clip_vision


@pytest.fixture(scope="module")
def arrays():
  return fixture_files.arrays("clip_vision")


@pytest.fixture(scope="module")
def state_dict(arrays):
  return fixture_files.state_dict(arrays)


def _text_config():
  return clip_text.CLIPTextConfig(
    vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
  )


def test_configs_from_transformers_json(arrays):
  config = json.loads(str(arrays["config_json"]))
  assert (
    clip_vision.CLIPVisionConfig.from_transformers(config) == clip_vision.CLIPVisionConfig.tiny()
  )
  assert clip_text.CLIPTextConfig.from_transformers(config) == _text_config()
  with pytest.raises(ValueError, match="CLIPVisionConfig.image_size: 30 is not a multiple"):
    clip_vision.CLIPVisionConfig(image_size=30, patch_size=8)


@pytest.mark.slow
def test_image_and_text_features_match_transformers(arrays, state_dict):
  vision_config, text_config = clip_vision.CLIPVisionConfig.tiny(), _text_config()
  vision_params, text_params = clip_vision.convert_clip_model(
    state_dict, text_config, vision_config
  )
  pixels = jnp.asarray(arrays["pixels"]).transpose(0, 2, 3, 1)  # NCHW -> NHWC
  image = jax.jit(clip_vision.CLIPVisionModelWithProjection(vision_config).apply)(
    vision_params, pixels
  )
  assert image.shape == (2, 16) and image.dtype == jnp.float32
  np.testing.assert_allclose(image, arrays["image_features"], atol=1e-4, rtol=1e-4)
  text_model = clip_vision.CLIPTextWithProjection(text_config, 16)
  text = jax.jit(text_model.apply)(text_params, jnp.asarray(arrays["text_ids"]))
  assert text.shape == (3, 16)
  np.testing.assert_allclose(text, arrays["text_features"], atol=1e-4, rtol=1e-4)
  # the text tower inside is clip_text's own: the same parameters give the same hidden states
  ids = jnp.asarray(arrays["text_ids"])
  hidden = clip_text.CLIPTextModel(text_config).apply(
    {"params": text_params["params"]["text_model"]}, ids
  )
  assert hidden.shape == (3, 77, 32)


def test_conversion_errors_name_the_key(state_dict):
  config, error = clip_vision.CLIPVisionConfig.tiny(), clip_vision.CheckpointError
  vision = {
    k: v for k, v in state_dict.items() if k.startswith(("vision_model.", "visual_projection."))
  }
  key = "vision_model.encoder.layers.1.mlp.fc2.weight"
  with pytest.raises(error, match=rf"missing keys \['{key}'\]"):
    clip_vision.convert_clip_vision({k: v for k, v in vision.items() if k != key}, config)
  bad = "vision_model.embeddings.patch_embedding.weight"
  with pytest.raises(error, match=rf"{bad}: expected shape \(32, 3, 8, 8\)"):
    clip_vision.convert_clip_vision(vision | {bad: np.zeros((32, 3, 4, 4), np.float32)}, config)
  with pytest.raises(error, match=r"unexpected keys \['foo'\]"):
    clip_vision.convert_clip_model(state_dict | {"foo": np.zeros(1)}, _text_config(), config)
  text = {k: v for k, v in state_dict.items() if k.startswith("text_")}
  with pytest.raises(error, match=r"text_projection.weight: expected shape \(8, 32\)"):
    clip_vision.convert_clip_text_projection(text, _text_config(), 8)
  old = vision | {"vision_model.embeddings.position_ids": np.arange(17)[None]}
  params = clip_vision.convert_clip_vision(vision, config)
  jax.tree.map(np.testing.assert_array_equal, clip_vision.convert_clip_vision(old, config), params)


def test_vit_l14_shapes_parameter_count_and_preprocess(arrays):
  config = clip_vision.CLIPVisionConfig()
  model = clip_vision.CLIPVisionModelWithProjection(config)
  pixels = jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.float32)
  params = jax.eval_shape(model.init, jax.random.key(0), pixels)
  count = sum(leaf.size for leaf in jax.tree.leaves(params))
  assert count == int(arrays["vit_l14_vision_param_count"])
  assert jax.eval_shape(model.apply, params, pixels).shape == (2, 768)
  with pytest.raises(ValueError, match=r"pixels must be \[N, \*\(224, 224, 3\)\]"):
    jax.eval_shape(model.apply, params, jax.ShapeDtypeStruct((2, 112, 112, 3), jnp.float32))
  frames = jnp.full((2, 3, 48, 64, 3), 0.5)
  out = clip_vision.preprocess(frames, clip_vision.CLIPVisionConfig.tiny())
  assert out.shape == (6, 32, 32, 3)
  np.testing.assert_allclose(
    out[0, 0, 0], (0.5 - np.array(clip_vision.CLIP_MEAN)) / clip_vision.CLIP_STD, rtol=1e-5
  )
