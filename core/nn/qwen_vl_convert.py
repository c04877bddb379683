"""Qwen2.5-VL checkpoints (`Qwen2_5_VLForConditionalGeneration`, e.g. Qwen2.5-VL-3B-Instruct, the
model of "MARC: Memory-Augmented RL Token Compression for Efficient Video Understanding", ICLR 2026)
as parameters of `core.nn.transformer.Transformer` (the language model) and
`core.nn.qwen_vision.VisionTower`.

The language model is Qwen2 (transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py,
`Qwen2_5_VLTextModel`): `Transformer(attention_bias=True, mrope_section=rope_scaling.mrope_section,
rope_base=rope_theta, tie_embeddings=tie_word_embeddings, ...)`, mapped by
`core.nn.hf_convert.decoder_rules`. Two key layouts are accepted:

  released safetensors (transformers 4.x)   transformers 5.x `state_dict()`
  model.embed_tokens / layers.N / norm      model.language_model.embed_tokens / layers.N / norm
  visual.*                                  model.visual.*
  lm_head.weight (absent or a copy when tied)

The vision tower's keys (under `visual.` or `model.visual.`) -> `VisionTower` parameters:

  patch_embed.proj.weight [D, C, 2, p, p]        patch_embed/kernel [C 2 p p, D]
  blocks.N.norm1 / norm2.weight                  block_N/norm1, norm2/scale
  blocks.N.attn.qkv.weight, bias [3D, D]         block_N/qkv/kernel [D, 3D], bias
  blocks.N.attn.proj.weight, bias                block_N/proj
  blocks.N.mlp.gate_proj / up_proj / down_proj   block_N/gate, up, down (with biases)
  merger.ln_q.weight                             merger_norm/scale
  merger.mlp.0 / merger.mlp.2 (weight, bias)     merger_in, merger_out

A missing, unexpected or misshapen key raises `CheckpointError` naming it (`core.nn.convert`).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import qwen_vision
from core.nn.convert import CheckpointError, Rule, apply_rules, linear, param_shapes
from core.nn.hf_convert import decoder_rules, decoder_shapes, read_safetensors, transformer_settings
from core.nn.transformer import Transformer

SPECIAL_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def text_settings(hf_config: Mapping) -> dict:
  """`Transformer` keyword arguments of a Qwen2.5-VL `config.json` (flat released layout, or
  transformers 5.x's with a `text_config`): `hf_convert.transformer_settings` with M-RoPE."""
  if hf_config.get("model_type") not in ("qwen2_5_vl", "qwen2_5_vl_text"):
    raise CheckpointError(
      f"config.json: model_type {hf_config.get('model_type')!r} is not 'qwen2_5_vl'"
    )
  return transformer_settings(hf_config)


def vision_settings(hf_config: Mapping) -> qwen_vision.VisionConfig:
  if "vision_config" not in hf_config:
    raise CheckpointError("config.json: no vision_config")
  return qwen_vision.VisionConfig.from_hf(hf_config["vision_config"])


def special_ids(hf_config: Mapping) -> dict[str, int]:
  """The placeholder / delimiter token ids (released defaults when the config omits them)."""
  defaults = dict(zip(SPECIAL_IDS, (151655, 151656, 151652, 151653), strict=True))
  ids = {name: int(hf_config.get(name, default)) for name, default in defaults.items()}
  text = {**hf_config, **(hf_config.get("text_config") or {})}
  eos = text.get("eos_token_id", 151645)
  ids["eos_token_id"] = int(eos[0] if isinstance(eos, list | tuple) else eos)
  return ids


def layout_prefixes(state_dict: Mapping) -> tuple[str, str]:
  """`(language model prefix, vision prefix)` of a state dict's key layout."""
  if any(key.startswith("model.language_model.") for key in state_dict):
    return "model.language_model.", "model.visual."
  return "model.", "visual."


def vision_rules(config: qwen_vision.VisionConfig, expected, prefix: str) -> dict[str, Rule]:
  d, p = config.hidden_size, config.patch_size
  patch = (d, config.in_channels, config.temporal_patch_size, p, p)
  rules = {
    prefix + "patch_embed.proj.weight": (
      patch,
      lambda w: {("patch_embed", "kernel"): np.asarray(w).reshape(d, -1).T},
    ),
    prefix + "merger.ln_q.weight": ((d,), lambda w: {("merger_norm", "scale"): w}),
  }
  rules |= linear(prefix + "merger.mlp.0", ("merger_in",), expected)
  rules |= linear(prefix + "merger.mlp.2", ("merger_out",), expected)
  for n in range(config.depth):
    hf, ours = f"{prefix}blocks.{n}.", f"block_{n}"
    for norm in ("norm1", "norm2"):
      rules[hf + f"{norm}.weight"] = (
        (d,),
        lambda w, norm=norm, ours=ours: {(ours, norm, "scale"): w},
      )
    rules |= linear(hf + "attn.qkv", (ours, "qkv"), expected)
    rules |= linear(hf + "attn.proj", (ours, "proj"), expected)
    for name in ("gate", "up", "down"):
      rules |= linear(hf + f"mlp.{name}_proj", (ours, name), expected)
  return rules


def vision_shapes(tower: qwen_vision.VisionTower) -> dict:
  c = tower.config
  grid = ((1, 2 * c.spatial_merge_size, 2 * c.spatial_merge_size),)
  pixels = jnp.zeros((4 * c.spatial_merge_size**2, c.patch_dim))
  return param_shapes(jax.eval_shape(lambda: tower.init(jax.random.key(0), pixels, grid)))


def convert(
  state_dict: Mapping[str, np.ndarray], decoder: Transformer, tower: qwen_vision.VisionTower
) -> dict:
  """`{"decoder": {"params": ...}, "vision": {"params": ...}}` from a Qwen2.5-VL state dict of
  either key layout (module docstring)."""
  if not (decoder.attention_bias and decoder.mrope_section and decoder.mlp == "swiglu"):
    raise CheckpointError(
      "a Qwen2.5-VL checkpoint needs Transformer(attention_bias=True, mrope_section=..., mlp='swiglu')"
    )
  text_prefix, vision_prefix = layout_prefixes(state_dict)
  state_dict = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
  if decoder.tie_embeddings:
    state_dict.pop("lm_head.weight", None)  # a copy of the embedding where it is stored
  vision = {k: v for k, v in state_dict.items() if k.startswith(vision_prefix)}
  text = {k: v for k, v in state_dict.items() if k not in vision}
  decoder_params = apply_rules(
    text,
    decoder_rules(decoder, prefix=text_prefix),
    decoder_shapes(decoder),
    source="Qwen2.5-VL language model",
    dtype=decoder.param_dtype,
  )
  expected = vision_shapes(tower)
  vision_params = apply_rules(
    vision,
    vision_rules(tower.config, expected, vision_prefix),
    expected,
    source="Qwen2.5-VL vision tower",
    dtype=tower.param_dtype,
  )
  return {"decoder": decoder_params, "vision": vision_params}


def read_config(folder: str) -> dict:
  path = os.path.join(folder, "config.json")
  try:
    with open(path) as file:
      return json.load(file)
  except (OSError, ValueError) as error:
    raise CheckpointError(f"cannot read {path!r}: {type(error).__name__}: {error}") from None


def read_state_dict(path: str) -> dict:
  """The state dict of a checkpoint folder (its `model.safetensors.index.json`, else every
  `*.safetensors`), or of one `.safetensors` / index file."""
  if os.path.isfile(path):
    return read_safetensors(path)
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    return read_safetensors(index)
  files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
  if not files:
    raise CheckpointError(f"{path!r}: no model.safetensors.index.json and no *.safetensors")
  state = {}
  for file in files:
    state.update(read_safetensors(file))
  return state


def checkpoint_shapes(
  decoder: Transformer, tower: qwen_vision.VisionTower, layout: str = "released"
) -> dict[str, tuple[int, ...]]:
  """Every key of a checkpoint for these modules and its shape, in the `released` or
  `transformers5` key layout (what `convert` reads)."""
  if layout not in ("released", "transformers5"):
    raise ValueError(
      f"checkpoint_shapes: layout must be 'released' or 'transformers5', got {layout!r}"
    )
  text_prefix, vision_prefix = ("model.", "visual.")
  if layout == "transformers5":
    text_prefix, vision_prefix = "model.language_model.", "model.visual."
  rules = decoder_rules(decoder, prefix=text_prefix)
  rules |= vision_rules(tower.config, vision_shapes(tower), vision_prefix)
  return {key: tuple(shape) for key, (shape, _) in rules.items()}
