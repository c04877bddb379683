"""A tiny random Qwen2.5-VL checkpoint of the released layout and tiny mp4 clips, for the tests of
MARC's paper-scale path (tests/test_marc.py, tests/test_marc_paper.py)."""

import json

import numpy as np
import pytest

# the special tokens' ids when no tokenizer is written (a tokenizer.json gives its own)
SPECIAL_IDS = {
  "<|im_end|>": 59,
  "<|vision_start|>": 60,
  "<|vision_end|>": 61,
  "<|video_pad|>": 62,
  "<|image_pad|>": 63,
}


def config(ids: dict = SPECIAL_IDS) -> dict:
  """The flat config.json of the released checkpoints, at a tiny size."""
  return {
    "model_type": "qwen2_5_vl",
    "vocab_size": max(ids.values()) + 1,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "tie_word_embeddings": True,
    "eos_token_id": ids["<|im_end|>"],
    "vision_start_token_id": ids["<|vision_start|>"],
    "vision_end_token_id": ids["<|vision_end|>"],
    "video_token_id": ids["<|video_pad|>"],
    "image_token_id": ids["<|image_pad|>"],
    "vision_config": {
      "depth": 2,
      "hidden_size": 16,
      "intermediate_size": 24,
      "num_heads": 2,
      "in_chans": 3,
      "out_hidden_size": 32,
      "patch_size": 14,
      "spatial_merge_size": 2,
      "temporal_patch_size": 2,
      "window_size": 56,
      "fullatt_block_indexes": [1],
      "tokens_per_second": 2,
    },
  }


def write_checkpoint(folder, hf_config: dict) -> dict:
  """config.json + model.safetensors of random weights under the released key names; returns them."""
  from safetensors.numpy import save_file

  from core.nn import qwen_vl_convert
  from core.nn import vlm as vlm_lib

  qvl = vlm_lib.QwenVL.from_hf_config(hf_config)
  rng = np.random.default_rng(0)
  state = {}
  for key, shape in qwen_vl_convert.checkpoint_shapes(qvl.decoder, qvl.tower).items():
    scale = 0.3 if len(shape) > 1 else 0.1
    state[key] = (rng.normal(0, scale, shape) + ("norm" in key or "ln_q" in key)).astype(np.float32)
  save_file(state, str(folder / "model.safetensors"))
  (folder / "config.json").write_text(json.dumps(hf_config))
  return state


def write_video(path, frames: int = 6, size=(56, 84), seed: int = 1) -> None:
  """An mp4 of `frames` noisy frames growing brighter (PyAV; the test is skipped without it)."""
  av = pytest.importorskip("av")
  with av.open(str(path), "w") as container:
    stream = container.add_stream("mpeg4", rate=2)
    stream.height, stream.width = size
    stream.pix_fmt = "yuv420p"
    rng = np.random.default_rng(seed)
    for i in range(frames):
      image = np.clip(rng.normal(40 * i, 30, (*size, 3)), 0, 255).astype(np.uint8)
      for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)
