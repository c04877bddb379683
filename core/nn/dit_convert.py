"""Latte checkpoints as `VideoDiT` parameters: a pure mapping of names and layouts, no file I/O.

Latte (Ma et al. 2024, "Latte: Latent Diffusion Transformer for Video Generation", Sec. 3, variant 1:
alternating spatial and temporal blocks) is a DiT over VAE latents; `VideoDiT(positions="latte",
attention="alternating", patch=(1, p, p), time_frequencies=256, time_scale=1, learn_sigma=True)` computes
the same function on `(B, F, H, W, C)` latents (Latte takes `(B, F, C, H, W)`). Torch layout -> here:

  x_embedder.proj (Conv2d [D, C, p, p])       patch_embed: Dense over our patch features, which are
                                              ordered (row, column, channel) -> kernel [p*p*C, D]
  t_embedder.mlp.0 / .2                       time_in / time_out
  y_embedder.embedding_table [K + 1, D]       class_embed (only with num_classes = K > 0)
  blocks.N.attn.qkv ([3D, D], fused q|k|v,    blocks_N/attn/{query,key,value}: kernel [D, heads, D/heads]
    each head-major)
  blocks.N.attn.proj                          blocks_N/attn/out: kernel [heads, D/heads, D]
  blocks.N.mlp.fc1 / fc2                      blocks_N/mlp_in / mlp_out
  blocks.N.adaLN_modulation.1                 blocks_N/modulation
  final_layer.adaLN_modulation.1 / linear     final_modulation / final_linear (2C outputs with learn_sigma)
  pos_embed [1, S, D], temp_embed [1, F, D]   fixed sin-cos tables, not parameters: checked against the
                                              model's own and then dropped

Linear weights `[out, in]` become kernels `[in, out]`. Any missing or unexpected key, or a shape that
does not match the model, raises `CheckpointError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from core.nn.convert import CheckpointError, Rule, apply_rules, linear, param_shapes
from core.nn.dit import VideoDiT, latte_spatial_positions, latte_temporal_positions

__all__ = ["CheckpointError", "latte_to_flax"]

POSITION_TOLERANCE = 1e-4  # both tables are float32 sin-cos; Latte computes its own in float64
_QKV = ("query", "key", "value")


def latte_to_flax(state_dict: Mapping[str, np.ndarray], model: VideoDiT) -> dict:
  """Converts a Latte state dict (torch names, numpy arrays) into `model.init`'s `{"params": ...}`."""
  if model.positions != "latte" or model.attention != "alternating" or model.patch[0] != 1:
    raise CheckpointError(
      "a Latte checkpoint needs VideoDiT(positions='latte', attention='alternating', patch=(1, p, p))"
    )
  x = jnp.zeros((1, *model.video_shape))
  expected = param_shapes(jax.eval_shape(model.init, jax.random.key(0), x, jnp.zeros((1,))))
  rules = _linear_rules(expected) | _attention_rules(expected, model.heads)
  rules |= _embedding_rules(expected, model)
  return apply_rules(state_dict, rules, expected, source="Latte")


def _linear_rules(expected) -> dict[str, Rule]:
  names = {
    "t_embedder.mlp.0": ("time_in",),
    "t_embedder.mlp.2": ("time_out",),
    "final_layer.adaLN_modulation.1": ("final_modulation",),
    "final_layer.linear": ("final_linear",),
  }
  for block in sorted({path[0] for path in expected if path[0].startswith("blocks_")}):
    n = block.removeprefix("blocks_")
    names[f"blocks.{n}.mlp.fc1"] = (block, "mlp_in")
    names[f"blocks.{n}.mlp.fc2"] = (block, "mlp_out")
    names[f"blocks.{n}.adaLN_modulation.1"] = (block, "modulation")
  rules: dict[str, Rule] = {}
  for torch_prefix, path in names.items():
    rules |= linear(torch_prefix, path, expected)
  return rules


def _attention_rules(expected, heads: int) -> dict[str, Rule]:
  """Latte splits the fused output as (q|k|v, head, head_dim); flax keeps heads as a kernel axis."""
  rules: dict[str, Rule] = {}
  for block in sorted({path[0] for path in expected if path[0].startswith("blocks_")}):
    n, attn = block.removeprefix("blocks_"), (block, "attn")
    d, _, head_dim = expected[attn + ("query", "kernel")]

    def qkv_weight(w, attn=attn, head_dim=head_dim):
      w = w.reshape(3, heads, head_dim, -1)
      return {attn + (s, "kernel"): w[i].transpose(2, 0, 1) for i, s in enumerate(_QKV)}

    def qkv_bias(b, attn=attn, head_dim=head_dim):
      b = b.reshape(3, heads, head_dim)
      return {attn + (s, "bias"): b[i] for i, s in enumerate(_QKV)}

    def proj_weight(w, attn=attn, head_dim=head_dim):
      return {attn + ("out", "kernel"): w.T.reshape(heads, head_dim, -1)}

    rules[f"blocks.{n}.attn.qkv.weight"] = ((3 * d, d), qkv_weight)
    rules[f"blocks.{n}.attn.qkv.bias"] = ((3 * d,), qkv_bias)
    rules[f"blocks.{n}.attn.proj.weight"] = ((d, d), proj_weight)
    rules[f"blocks.{n}.attn.proj.bias"] = ((d,), lambda b, attn=attn: {attn + ("out", "bias"): b})
  return rules


def _embedding_rules(expected, model: VideoDiT) -> dict[str, Rule]:
  """Patch embedding, class table and the two fixed position tables."""
  _, ph, pw = model.patch
  channels, (gf, gh, gw) = model.video_shape[3], _grid(model)
  d = model.hidden

  def patch_weight(w):  # Conv2d [D, C, ph, pw] -> our token features (row, column, channel)
    return {("patch_embed", "kernel"): w.transpose(2, 3, 1, 0).reshape(ph * pw * channels, d)}

  rules: dict[str, Rule] = {
    "x_embedder.proj.weight": ((d, channels, ph, pw), patch_weight),
    "x_embedder.proj.bias": ((d,), lambda b: {("patch_embed", "bias"): b}),
    "pos_embed": ((1, gh * gw, d), _fixed("pos_embed", latte_spatial_positions(gh, gw, d))),
    "temp_embed": ((1, gf, d), _fixed("temp_embed", latte_temporal_positions(gf, d))),
  }
  if model.num_classes:
    table = ("class_embed", "embedding")
    rules["y_embedder.embedding_table.weight"] = (expected[table], lambda e: {table: e})
  return rules


def _fixed(key: str, ours: jax.Array):
  ours = np.asarray(ours)

  def check(value):
    error = float(np.max(np.abs(value[0] - ours)))
    if error > POSITION_TOLERANCE:
      raise CheckpointError(f"{key}: differs from the model's sin-cos table by up to {error:.3g}")
    return {}

  return check


def _grid(model: VideoDiT) -> tuple[int, int, int]:
  return tuple(n // p for n, p in zip(model.video_shape[:3], model.patch, strict=True))
