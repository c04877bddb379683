"""`core.nn.clip_text` and `core.data.clip_tokenizer` against transformers' `CLIPTextModel` and
`CLIPTokenizer`.

`fixtures/clip_text.npz` (written by `fixtures/make_clip_text.py` with torch and transformers) holds
a tiny CLIP vocabulary (`vocab.json`, `merges.txt`) with transformers' ids for sentences that
exercise merges, case, punctuation, digits, whitespace, non-ASCII bytes, special tokens written in
the text and truncation, and a tiny randomly initialised `CLIPTextModel` of ViT-L/14's text layout
with its last hidden states on fixed ids.
"""

import json

import fixture_files
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.data.clip_tokenizer import CLIPTokenizer
from core.nn import clip_text


@pytest.fixture(scope="module")
def arrays():
  return fixture_files.arrays("clip_text")


@pytest.fixture(scope="module")
def state_dict(arrays):
  return fixture_files.state_dict(arrays)


@pytest.fixture(scope="module")
def tokenizer_folder(arrays, tmp_path_factory):
  folder = tmp_path_factory.mktemp("clip_tokenizer")
  (folder / "vocab.json").write_text(str(arrays["vocab_json"]), encoding="utf-8")
  (folder / "merges.txt").write_text(str(arrays["merges_txt"]), encoding="utf-8")
  return folder


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder):
  return CLIPTokenizer.from_files(str(tokenizer_folder))


def test_tokenizer_reads_a_folder_or_the_two_files(tokenizer, tokenizer_folder):
  folder = tokenizer_folder
  files = clip_text.CLIPTokenizer.from_files(str(folder / "vocab.json"), str(folder / "merges.txt"))
  assert files.vocab == tokenizer.vocab and files.ranks == tokenizer.ranks


def test_tokenizer_matches_transformers(arrays, tokenizer):
  texts = json.loads(str(arrays["texts_json"]))
  ids = tokenizer.encode(texts)
  assert ids.shape == (len(texts), 77) and ids.dtype == np.int32
  for text, got, want in zip(texts, ids, arrays["ids"], strict=True):
    np.testing.assert_array_equal(got, want, err_msg=repr(text))
  bos, eos = tokenizer.bos_id, tokenizer.eos_id
  assert (bos, eos) == (598, 599) and ids[4, :3].tolist() == [bos, eos, eos]  # "" -> BOS EOS pad
  assert ids[-1, 0] == bos and ids[-1, -1] == eos  # truncated row keeps its EOS
  merged = tokenizer.tokenize("relighting")
  assert len(merged) == 1 and merged[0] == tokenizer.vocab["relighting</w>"]


def test_tokenizer_bad_inputs_are_named(tokenizer, tmp_path):
  with pytest.raises(TypeError, match="texts must be a list of strings"):
    tokenizer.encode("a cat")
  with pytest.raises(FileNotFoundError, match="no such file .*vocab.json"):
    CLIPTokenizer.from_files(str(tmp_path))
  with pytest.raises(ValueError, match="vocab.json has no '<\\|startoftext\\|>'"):
    CLIPTokenizer({"a</w>": 0, "<|endoftext|>": 1}, [])


def test_config_from_transformers_json(arrays):
  config = clip_text.CLIPTextConfig.from_transformers(json.loads(str(arrays["config_json"])))
  assert config == clip_text.CLIPTextConfig.tiny()
  vit_l = {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12}
  assert clip_text.CLIPTextConfig.from_transformers({"text_config": vit_l}) == (
    clip_text.CLIPTextConfig()
  )
  with pytest.raises(ValueError, match="CLIPTextConfig.hidden_act: must be one of"):
    clip_text.CLIPTextConfig.from_transformers({"hidden_act": "relu"})
  with pytest.raises(ValueError, match="CLIPTextConfig.hidden_size: 30 is not a multiple"):
    clip_text.CLIPTextConfig(hidden_size=30, num_attention_heads=4)


def test_last_hidden_state_matches_transformers(arrays, state_dict):
  config = clip_text.CLIPTextConfig.tiny()
  params = clip_text.convert_clip_text(state_dict, config)
  model = clip_text.CLIPTextModel(config)
  hidden = jax.jit(model.apply)(params, jnp.asarray(arrays["model_ids"]))
  assert hidden.shape == (3, 77, 32) and hidden.dtype == jnp.float32
  np.testing.assert_allclose(hidden, arrays["hidden"], atol=1e-4, rtol=1e-4)
  # transformers 5 keeps no `text_model.` prefix in memory; old checkpoints carry position_ids
  bare = {k.removeprefix("text_model."): v for k, v in state_dict.items()}
  jax.tree.map(np.testing.assert_array_equal, clip_text.convert_clip_text(bare, config), params)
  old = state_dict | {"text_model.embeddings.position_ids": np.arange(77)[None]}
  jax.tree.map(np.testing.assert_array_equal, clip_text.convert_clip_text(old, config), params)


def test_conversion_errors_name_the_key(state_dict):
  config, error = clip_text.CLIPTextConfig.tiny(), clip_text.CheckpointError
  key = "text_model.encoder.layers.1.mlp.fc1.bias"
  with pytest.raises(error, match=rf"missing keys \['{key}'\]"):
    clip_text.convert_clip_text({k: v for k, v in state_dict.items() if k != key}, config)
  with pytest.raises(error, match=r"unexpected keys \['text_projection.weight'\]"):
    extra = state_dict | {"text_projection.weight": np.zeros((32, 32), np.float32)}
    clip_text.convert_clip_text(extra, config)
  bad = "text_model.encoder.layers.0.self_attn.q_proj.weight"
  with pytest.raises(error, match=rf"{bad}: expected shape \(32, 32\)"):
    clip_text.convert_clip_text(state_dict | {bad: np.zeros((32, 16), np.float32)}, config)
  with pytest.raises(error, match=r"embeddings.position_ids: expected 0..76"):
    positions = {"text_model.embeddings.position_ids": np.zeros((1, 77), np.int64)}
    clip_text.convert_clip_text(state_dict | positions, config)


def test_vit_l14_shapes_and_parameter_count(arrays):
  model = clip_text.CLIPTextModel(clip_text.CLIPTextConfig())
  ids = jax.ShapeDtypeStruct((2, 77), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), ids)
  assert sum(leaf.size for leaf in jax.tree.leaves(params)) == int(arrays["vit_l14_param_count"])
  assert jax.eval_shape(model.apply, params, ids).shape == (2, 77, 768)
  with pytest.raises(ValueError, match=r"ids must be integers \[N, L\]"):
    jax.eval_shape(model.apply, params, jax.ShapeDtypeStruct((2, 77), jnp.float32))
  with pytest.raises(ValueError, match="longer than max_position_embeddings=77"):
    jax.eval_shape(model.apply, params, jax.ShapeDtypeStruct((2, 78), jnp.int32))
