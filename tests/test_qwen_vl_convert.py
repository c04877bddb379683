"""Qwen2.5-VL in JAX against transformers (tests/fixtures/make_qwen_vl.py: a tiny random
`Qwen2_5_VLForConditionalGeneration` of the real layout): the video processor's pixel rows and
smart_resize, the vision tower's merged tokens, M-RoPE ids, the full forward's logits, M-RoPE
decoding against one teacher-forced forward, and errors that name the key."""

import functools
import json

import fixture_files
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import decoding
from core.nn import qwen_vision, vlm
from core.nn import qwen_vl_convert as qc
from core.nn.convert import CheckpointError
from core.nn.transformer import Transformer, rope


@pytest.fixture(scope="module")
def fixture():
  arrays = fixture_files.arrays("qwen_vl")
  state = fixture_files.state_dict(arrays, "sd/")
  return arrays, state, json.loads(str(arrays["config"]))


@pytest.fixture(scope="module")
def model(fixture):
  arrays, state, config = fixture
  qvl = vlm.QwenVL.from_hf_config(config, rope_rule="grid")
  return qvl, qc.convert(state, qvl.decoder, qvl.tower)


def video_inputs(arrays, qvl):
  pixels, grid = qwen_vision.pixel_values(arrays["frames"], qvl.tower.config)
  return jnp.asarray(pixels), (grid,)


def test_pixel_rows_and_smart_resize_match_the_processor(fixture, model):
  arrays, _, _ = fixture
  pixels, grid = video_inputs(arrays, model[0])
  assert grid == tuple(map(tuple, arrays["video_grid_thw"]))
  np.testing.assert_allclose(pixels[arrays["pixel_rows"]], arrays["pixel_values_videos"], atol=1e-5)
  resized = [qwen_vision.smart_resize(int(h), int(w)) for h, w in arrays["resize_cases"]]
  np.testing.assert_array_equal(resized, arrays["resized"])


@pytest.mark.slow
def test_vision_tower_matches_transformers(fixture, model):
  arrays, _, _ = fixture
  qvl, params = model
  pixels, grid = video_inputs(arrays, qvl)
  order, bounds = qwen_vision.window_index(grid, qvl.tower.config)
  assert len(bounds) - 1 > grid[0][0]  # several windows per temporal slice: windowing is exercised
  tokens = qvl.visual_tokens(params, pixels, grid)
  np.testing.assert_allclose(tokens, arrays["vision_tokens"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rule", ["grid", "max"])
def test_rope_index_matches_get_rope_index(fixture, model, rule):
  arrays, _, _ = fixture
  qvl = model[0]
  ids, grid = arrays["input_ids"][0], tuple(map(tuple, arrays["video_grid_thw"]))
  positions, delta = qwen_vision.rope_index(
    ids, qvl.video_id, grid, tokens_per_second=2, seconds_per_grid=(1.0,), rule=rule
  )
  # on this short video the temporal ids stay below the spatial ones: both rules agree
  np.testing.assert_array_equal(positions, arrays["position_ids"][:, 0])
  assert delta == arrays["rope_deltas"][0, 0]


def test_rules_differ_on_a_long_video():
  ids = np.array([1] + [9] * 8 + [2, 3])
  grid = ((8, 2, 2),)  # 8 temporal patches of one merged token
  grid_rule, _ = qwen_vision.rope_index(ids, 9, grid, tokens_per_second=2, rule="grid")
  max_rule, _ = qwen_vision.rope_index(ids, 9, grid, tokens_per_second=2, rule="max")
  assert list(max_rule[0, -2:]) == [1 + 7 * 2 + 1, 1 + 7 * 2 + 2]
  assert list(grid_rule[0, -2:]) == [2, 3]


@pytest.mark.slow
def test_forward_logits_match_transformers(fixture, model):
  arrays, _, _ = fixture
  qvl, params = model
  pixels, grid = video_inputs(arrays, qvl)
  tokens = jnp.asarray(arrays["input_ids"])
  lengths = np.array([tokens.shape[1]])
  rope, deltas = qvl.positions(tokens, lengths, grid, seconds_per_grid=(1.0,))
  np.testing.assert_array_equal(rope, arrays["position_ids"])
  at = tokens == qvl.video_id
  embeddings = vlm.qwen_embeddings(qvl.visual_tokens(params, pixels, grid), at)
  logits = qvl.decoder.apply(
    params["decoder"], tokens, embeddings, embeddings_at=at, rope_positions=rope, mask=None
  ).logits
  causal = qvl.decoder.apply(
    params["decoder"],
    tokens,
    embeddings,
    embeddings_at=at,
    rope_positions=rope,
    mask=jnp.tril(jnp.ones((1, 1) + tokens.shape[1:] * 2, bool)),
  ).logits
  assert not np.allclose(logits, causal)  # the mask matters: the comparison below is not vacuous
  np.testing.assert_allclose(causal, arrays["logits"], atol=1e-4, rtol=1e-4)


def test_mrope_with_equal_axes_is_plain_rope():
  x = jax.random.normal(jax.random.key(0), (2, 5, 3, 16))
  positions = jnp.arange(5)[None] + jnp.array([[0], [7]])
  mixed = rope(x, jnp.stack([positions] * 3), 1e6, sections=(2, 3, 3))
  np.testing.assert_allclose(mixed, rope(x, positions, 1e6), atol=1e-6)
  moved = rope(x, jnp.stack([positions, positions + 1, positions]), 1e6, sections=(2, 3, 3))
  assert not np.allclose(moved, mixed)


@pytest.mark.slow
def test_decoding_with_rope_deltas_equals_teacher_forcing(fixture, model):
  arrays, _, _ = fixture
  qvl, params = model
  # a sharper head than random init gives, so that wrong rotary ids show in the log-probs
  decoder = jax.tree.map(lambda x: x, params["decoder"])
  decoder["params"]["unembed"]["kernel"] = decoder["params"]["unembed"]["kernel"] * 30.0
  params = {**params, "decoder": decoder}
  pixels, grid = video_inputs(arrays, qvl)
  prompt = arrays["input_ids"][0]
  tokens = jnp.asarray(np.stack([prompt, np.r_[prompt[:-2], 0, 0]]))
  lengths = np.array([len(prompt), len(prompt) - 2])
  rope, deltas = qvl.positions(tokens, lengths, grid * 2)
  visual = qvl.visual_tokens(params, jnp.concatenate([pixels, pixels]), grid * 2)
  generate = jax.jit(
    functools.partial(
      vlm.qwen_generate, qvl, max_new_tokens=4, sampling=decoding.Sampling(1.0), stop_tokens=(-5,)
    )
  )
  score = jax.jit(functools.partial(vlm.qwen_completion_log_probs, qvl))
  gen = generate(params, tokens, lengths, visual, rope, deltas, jax.random.key(1))
  scored = score(params, tokens, lengths, visual, rope, deltas, gen.tokens)
  np.testing.assert_allclose(scored, gen.log_probs, atol=1e-4)
  unshifted = score(params, tokens, lengths, visual, rope, deltas * 0 + 40, gen.tokens)
  assert np.abs(unshifted - gen.log_probs).max() > 1e-2


def test_both_key_layouts_and_errors_name_the_key(fixture, model):
  _, state, config = fixture
  qvl, params = model
  released = {}
  for key, value in state.items():
    key = key.replace("model.language_model.", "model.").replace("model.visual.", "visual.")
    released[key] = value
  again = qc.convert(released, qvl.decoder, qvl.tower)
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a, b)
  missing = dict(state)
  del missing["model.language_model.layers.1.self_attn.k_proj.bias"]
  with pytest.raises(CheckpointError, match=r"layers\.1\.self_attn\.k_proj\.bias"):
    qc.convert(missing, qvl.decoder, qvl.tower)
  bad = {**state, "model.visual.blocks.2.attn.qkv.weight": np.zeros((3, 3), np.float32)}
  with pytest.raises(
    CheckpointError, match=r"^model\.visual\.blocks\.2\.attn\.qkv\.weight: expected"
  ):
    qc.convert(bad, qvl.decoder, qvl.tower)
  with pytest.raises(CheckpointError, match="attention_bias=True"):
    qc.convert(state, Transformer(160, 32, 2, 2), qvl.tower)
  with pytest.raises(CheckpointError, match="model_type 'llama'"):
    qc.text_settings({**config, "model_type": "llama"})


def test_video_reader_samples_uniformly_and_resizes_as_the_processor(tmp_path):
  av = pytest.importorskip("av")
  from core.data import video_files

  path = str(tmp_path / "ramp.mp4")
  with av.open(path, "w") as container:
    stream = container.add_stream("mpeg4", rate=5)
    stream.height, stream.width, stream.pix_fmt = 50, 90, "yuv420p"
    for i in range(10):  # frame i is uniformly grey at level 20 i
      frame = av.VideoFrame.from_ndarray(np.full((50, 90, 3), 20 * i, np.uint8), format="rgb24")
      container.mux(stream.encode(frame))
    container.mux(stream.encode())
  clip = video_files.read_video(path, 4, min_pixels=28 * 28, max_pixels=28 * 28 * 6)
  assert clip.frames.shape == (4, *qwen_vision.smart_resize(50, 90, 28, 28 * 28, 28 * 28 * 6), 3)
  assert clip.frames.shape[1:3] == (56, 84) and clip.frames.dtype == np.uint8
  picked = video_files.sample_indices(10, 4)
  np.testing.assert_array_equal(picked, [0, 3, 6, 9])
  np.testing.assert_allclose(clip.frames.reshape(4, -1).mean(1), 20 * picked, atol=4)
  np.testing.assert_allclose(clip.times, picked / 5.0)
  assert clip.seconds_per_grid(2) == pytest.approx(2 / (4 / 10 * 5))  # 4 of 10 frames at 5 fps
  pixels, grid = qwen_vision.pixel_values(clip.frames, qwen_vision.VisionConfig())
  assert grid == (2, 4, 6) and pixels.shape == (48, 3 * 2 * 14 * 14)
  long = video_files.read_video(path, 16, min_pixels=28 * 28, max_pixels=28 * 28 * 6)
  assert len(long.frames) == 16  # a short video repeats frames to reach the count
  with pytest.raises(ValueError, match="cannot decode"):
    video_files.read_video(str(tmp_path / "missing.mp4"), 4)


def test_qwen2_text_layout_through_the_llama_converter(fixture, model):
  from core.nn import hf_convert

  _, state, config = fixture
  qvl, params = model
  text = {
    k.replace("model.language_model.", "model."): v
    for k, v in state.items()
    if not k.startswith("model.visual.")
  }
  settings = hf_convert.transformer_settings({**config["text_config"], "model_type": "qwen2"})
  assert settings["attention_bias"] and settings["rope_base"] == 1e6
  plain = Transformer(**settings)  # a Qwen2 LM: the same weights, plain RoPE
  converted = hf_convert.llama_to_flax(text, plain)
  for a, b in zip(jax.tree.leaves(converted), jax.tree.leaves(params["decoder"]), strict=True):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match=r"mrope_section=\(2, 3, 2\) must sum to head_dim / 2 = 8"):
    Transformer(160, 32, 1, 2, mrope_section=(2, 3, 2)).init(
      jax.random.key(0), jnp.zeros((1, 2), jnp.int32)
    )


QWEN25_VL_3B = {  # the released Qwen2.5-VL-3B-Instruct config.json (the fields read here)
  "model_type": "qwen2_5_vl",
  "vocab_size": 151936,
  "hidden_size": 2048,
  "intermediate_size": 11008,
  "num_hidden_layers": 36,
  "num_attention_heads": 16,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-6,
  "rope_theta": 1000000.0,
  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
  "tie_word_embeddings": True,
  "vision_config": {
    "depth": 32,
    "hidden_act": "silu",
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_chans": 3,
    "out_hidden_size": 2048,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "spatial_patch_size": 14,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
    "temporal_patch_size": 2,
  },
}


def test_the_released_3b_config_gives_its_layout_and_size():
  qvl = vlm.QwenVL.from_hf_config(QWEN25_VL_3B)
  assert qvl.decoder.mrope_section == (16, 24, 24) and qvl.decoder.tie_embeddings
  assert (qvl.video_id, qvl.start_id, qvl.end_id, qvl.eos_id) == (151656, 151652, 151653, 151645)
  shapes = qc.checkpoint_shapes(qvl.decoder, qvl.tower)
  assert shapes["visual.patch_embed.proj.weight"] == (1280, 3, 2, 14, 14)
  assert shapes["visual.merger.mlp.0.weight"] == (5120, 5120)
  assert shapes["visual.merger.mlp.2.weight"] == (2048, 5120)
  assert shapes["model.layers.35.self_attn.k_proj.bias"] == (256,)
  assert "lm_head.weight" not in shapes and len(shapes) == 824
  assert sum(int(np.prod(s)) for s in shapes.values()) == 3_754_622_976  # "3.75B"
  order, bounds = qwen_vision.window_index(((2, 32, 46),), qvl.tower.config)
  assert sorted(order) == list(range(2 * 16 * 23)) and bounds[-1] == 2 * 32 * 46
