r"""diffusers state dicts as `core.nn.sd_unet.UNet` parameters: SD-1.5's UNet, IC-Light fc, AnimateDiff.

Expected layout: **diffusers'** `UNet2DConditionModel` keys (the `unet/diffusion_pytorch_model.safetensors`
of a diffusers folder, e.g. `down_blocks.0.attentions.1.transformer_blocks.0.attn2.to_k.weight`), not the
original LDM single-file layout (`model.diffusion_model.input_blocks...`) that Realistic Vision and
SD-1.5 `.safetensors` downloads use; convert such a file with diffusers'
`StableDiffusionPipeline.from_single_file(...).save_pretrained(...)` first. A state dict in the LDM
layout is refused with a message saying so. IC-Light's `iclight_sd15_fc.safetensors` holds offsets in
the diffusers layout (its `gradio_demo.py` adds them to diffusers' UNet), merged by
`core.nn.iclight_convert.merge_fc_offsets`; AnimateDiff's motion adapter file (diffusers `MotionAdapter`,
e.g. v1-5-3) holds only `down_blocks.i.motion_modules.j...` / `up_blocks...` (/ `mid_block...`) keys and
is merged onto the base UNet's keys (LightCtrl, GVCLab/LightCtrl `relight.py`, builds its video prior as
`UNetMotionModel.from_unet2d(unet, adapter)`, the same union).

Names: the Flax modules carry the torch names with dots as underscores (`down_blocks_0_resnets_1/conv1`,
`.../transformer_blocks_0/attn1/to_out_0`, `ff/net_0/proj`, `time_embedding_linear_1`); layouts:
conv `(out, in, kh, kw)` -> `(kh, kw, in, out)`, Linear `[out, in]` -> `[in, out]`, norm `weight` ->
`scale`. The rules are built from the model's own parameters, so every parameter needs its key; the
motion modules' `pos_embed.pe` buffers (fixed sinusoidal tables) are checked against
`sd_unet.frame_positions` when present and dropped. Every missing, unexpected or misshapen key raises
`CheckpointError` naming it (core/nn/convert.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import iclight_convert
from core.nn.convert import CheckpointError, Path, Rule, apply_rules, param_shapes
from core.nn.sd_unet import UNet, UNetConfig, frame_positions

__all__ = ["CheckpointError", "convert_unet", "merge_motion", "torch_name"]

POSITION_TOLERANCE = 1e-4
_SPECIAL = {
  "time_embedding_linear_1": "time_embedding.linear_1",
  "time_embedding_linear_2": "time_embedding.linear_2",
}
_LEAF = {"kernel": "weight", "scale": "weight", "bias": "bias"}


def torch_name(path: Path) -> str:
  """The diffusers key of a Flax parameter path, e.g. `("up_blocks_1_attentions_0", "proj_in",
  "kernel")` -> `up_blocks.1.attentions.0.proj_in.weight`."""
  parts = []
  for part in path[:-1]:
    if part in _SPECIAL:
      parts.append(_SPECIAL[part])
      continue
    part = re.sub(r"_(\d+)", r".\1", part)
    part = re.sub(r"(\d)_", r"\1.", part).replace("mid_block_", "mid_block.")
    parts.append(part)
  return ".".join(parts + [_LEAF[path[-1]]])


def _rule(path: Path, shape: tuple[int, ...]) -> Rule:
  """Torch shape and conversion of one Flax parameter."""
  if path[-1] == "kernel" and len(shape) == 4:
    kh, kw, cin, cout = shape
    return (cout, cin, kh, kw), lambda w: {path: np.transpose(np.asarray(w), (2, 3, 1, 0))}
  if path[-1] == "kernel":
    return (shape[1], shape[0]), lambda w: {path: np.asarray(w).T}
  return shape, lambda w: {path: np.asarray(w)}


def _position_rule(key: str, dim: int, length: int) -> Rule:
  table = frame_positions(length, dim)

  def check(pe):
    if np.max(np.abs(np.asarray(pe, np.float32) - table)) > POSITION_TOLERANCE:
      raise CheckpointError(f"{key}: not the sinusoidal frame-position table of width {dim}")
    return {}

  return table.shape, check


def expected_shapes(config: UNetConfig) -> dict[Path, tuple[int, ...]]:
  """`{flax path: shape}` of `UNet(config)` (abstract: nothing is allocated)."""
  factor = 2 ** (len(config.block_out_channels) - 1)
  x = jnp.zeros((1, factor, factor, config.in_channels))
  text = jnp.zeros((1, 1, config.cross_attention_dim))
  abstract = jax.eval_shape(UNet(config).init, jax.random.key(0), x, jnp.zeros((1,)), text)
  return param_shapes(abstract)


def convert_unet(state_dict: Mapping[str, np.ndarray], config: UNetConfig) -> dict:
  """`{"params": ...}` of `UNet(config)` from a diffusers state dict (numpy arrays, torch layout):
  a `UNet2DConditionModel`'s, or with `config.motion` the union of that and a motion adapter's
  (`merge_motion`). Raises `CheckpointError` naming the first key that does not fit."""
  _refuse_ldm(state_dict)
  expected = expected_shapes(config)
  rules = {torch_name(path): _rule(path, shape) for path, shape in expected.items()}
  for key in state_dict:
    if key.endswith("pos_embed.pe") and "motion_modules" in key:
      module = key.split(".transformer_blocks.")[0]
      path = (re.sub(r"\.(\d+)", r"_\1", module).replace(".", "_"), "proj_in", "kernel")
      if path not in expected:
        raise CheckpointError(f"{key}: the model has no motion module {module!r}")
      rules[key] = _position_rule(key, expected[path][1], config.motion_max_seq_length)
  return apply_rules(state_dict, rules, expected, source="diffusers UNet")


def merge_motion(
  unet: Mapping[str, np.ndarray], adapter: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
  """The base UNet's keys and a motion adapter's (which must all be motion-module keys) in one dict."""
  for key in adapter:
    if ".motion_modules." not in key:
      raise CheckpointError(f"motion adapter key {key!r} is not a motion-module key")
    if key in unet:
      raise CheckpointError(f"motion adapter key {key!r} is also in the base UNet")
  return {**unet, **adapter}


def iclight_unet(
  base: Mapping[str, np.ndarray], offsets: Mapping[str, np.ndarray], config: UNetConfig
) -> dict:
  """IC-Light fc's relighter: `base` widened to 8 input channels plus `offsets`, converted for
  `config` (which must have `in_channels = 8`)."""
  if config.in_channels != 4 + iclight_convert.CONDITION_CHANNELS:
    raise CheckpointError(f"IC-Light fc needs in_channels = 8, the config has {config.in_channels}")
  _refuse_ldm(base)
  return convert_unet(iclight_convert.merge_fc_offsets(base, offsets), config)


def _refuse_ldm(state_dict: Mapping[str, np.ndarray]) -> None:
  ldm = next(
    (k for k in state_dict if k.startswith(("model.diffusion_model.", "input_blocks."))), None
  )
  if ldm is not None:
    raise CheckpointError(
      f"{ldm}: an original LDM (single-file) layout; save the UNet in diffusers' layout "
      "(StableDiffusionPipeline.from_single_file(...).save_pretrained) and pass unet/"
      "diffusion_pytorch_model.safetensors"
    )
