"""The official Flow2GAN generator weights as `MultiBranchGenerator` parameters: names and layouts.

Flow2GAN ("Flow2GAN: Hybrid Flow Matching and GAN with Multi-Resolution Network for Few-step Audio
Generation", ICLR 2026) releases PyTorch generators (k2-fsa/Flow2GAN on the Hugging Face Hub, e.g.
`libritts-mel-1-step.pt`: `{"model": MelAudioGenerator.state_dict()}`, the `mel_24k_base` config of
`flow2gan/models/config.py`). Torch is not a dependency here, so the state dict is read from an `.npz`
of named arrays, written where torch is installed:

  python -c "import sys, torch, numpy as np; sd = torch.load(sys.argv[1], map_location='cpu')['model']; \
    np.savez(sys.argv[2], **{k: v.float().numpy() for k, v in sd.items()})" libritts-mel-1-step.pt g.npz

Torch names (`flow2gan/models/{generator,modules}.py`) -> `core/nn/audio_convnext.py`:

  cond_encoder.in_proj (Conv1d k3)             encoder/Conv_0            kernel [3, n_mels, C]
  cond_encoder.in_norm (BiasNorm)              encoder/BiasNorm_0
  cond_encoder.blocks.J                        encoder/ConvNeXtBlock_J
  estimators.I.decoder.in_proj (Conv1d k1)     branches_I/in_proj
  estimators.I.decoder.in_norm                 branches_I/BiasNorm_0
  estimators.I.decoder.time_mlp.0 / .2         branches_I/Dense_1 / Dense_0   (Linear)
  estimators.I.decoder.cond_mlp.0 / .1 / .2    branches_I/Dense_3 / PReLU_0 / Dense_2
  estimators.I.decoder.blocks.J                branches_I/ConvNeXtBlock_J
  estimators.I.decoder.out_proj                branches_I/out_proj
  <block>.dwconv (depthwise Conv1d)            <block>/Conv_0            kernel [K, 1, C]
  <block>.norm                                 <block>/BiasNorm_0        bias, log_scale
  <block>.pwconv1 / act / pwconv2              <block>/Dense_0 / PReLU_0 / Dense_1
  <block>.cond_proj / time_embed_proj          <block>/cond_proj / time_proj
  <block>.residual_scale.scale [C, 1]          <block>/ChannelScale_0/scale [C]

(The branch's `Dense_0` is the time MLP's output layer because Flax numbers a compact module's
submodules in construction order, and the outer layer of `dense(dense(x))` is constructed first.)
Conv1d weights `[out, in, k]` become Flax Conv kernels `[k, in, out]`, 1x1 convolutions and Linear
`[out, in]` become Dense kernels `[in, out]`; PReLU's `weight` is our `slope`. Buffers are not
parameters: the STFT windows (`estimators.I.fft.window`, `.ifft.window`) are checked to be the
periodic Hann window of the branch's size and dropped, and the loss spectrogram's
(`loss_spec.*`, training only) are dropped. A `module.` prefix (DDP) is removed. Any missing or
unexpected key, or a shape that does not fit the model, raises `CheckpointError` naming the key.

The function computed is the reference's: fft_to_real stacks real then imaginary parts (our
`concatenate([real, imag])`), the condition is repeated to each branch's frame rate and cut or
zero-padded (`convert_length`), and the branches are averaged (`branch_reduction="mean"`); the
reference's network time is 0 at noise (`phases.model_fn` hands it `1 - t`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import jax
import numpy as np

from core import audio
from core.nn.convert import CheckpointError, Path, read_npz

__all__ = ["CheckpointError", "flow2gan_to_flax", "read_npz", "torch_key"]

_BLOCK = {
  "Conv_0": "dwconv",
  "BiasNorm_0": "norm",
  "Dense_0": "pwconv1",
  "PReLU_0": "act",
  "Dense_1": "pwconv2",
  "cond_proj": "cond_proj",
  "time_proj": "time_embed_proj",
  "ChannelScale_0": "residual_scale",
}
_ENCODER = {"Conv_0": "in_proj", "BiasNorm_0": "in_norm"}
_BRANCH = {
  "in_proj": "in_proj",
  "BiasNorm_0": "in_norm",
  "Dense_0": "time_mlp.2",
  "Dense_1": "time_mlp.0",
  "Dense_2": "cond_mlp.2",
  "Dense_3": "cond_mlp.0",
  "PReLU_0": "cond_mlp.1",
  "out_proj": "out_proj",
}
_PARAM = {"kernel": "weight", "bias": "bias", "log_scale": "log_scale", "slope": "weight"}
_DROPPED = re.compile(r"^(loss_spec\..*|estimators\.\d+\.i?fft\.window)$")
_WINDOW = re.compile(r"^estimators\.(\d+)\.i?fft\.window$")
WINDOW_TOLERANCE = 1e-6


def torch_key(path: Path) -> str:
  """The torch state-dict name of the Flax parameter at `path` (without the leading "params")."""
  top, *inner = path
  if top == "encoder":
    prefix, table = "cond_encoder.", _ENCODER
  elif top.startswith("branches_"):
    prefix, table = f"estimators.{top.split('_')[1]}.decoder.", _BRANCH
  else:
    raise CheckpointError(f"no torch name for the parameter {'/'.join(path)}")
  module, *rest = inner
  if module.startswith("ConvNeXtBlock_"):
    prefix += f"blocks.{module.split('_')[1]}."
    module, *rest = rest
    table = _BLOCK
  if module not in table or len(rest) != 1:
    raise CheckpointError(f"no torch name for the parameter {'/'.join(path)}")
  name = rest[0]
  if module.startswith("ChannelScale"):
    return f"{prefix}{table[module]}.scale"
  return f"{prefix}{table[module]}.{_PARAM[name]}"


def to_flax_layout(key: str, value: np.ndarray, want: tuple[int, ...]) -> np.ndarray:
  """`value` (torch layout) rearranged for a Flax leaf of shape `want`; raises naming `key`."""
  value = np.asarray(value, np.float32)
  if value.ndim == 3 and len(want) == 3:  # Conv1d [out, in, k] -> Conv [k, in, out]
    out = value.transpose(2, 1, 0)
  elif value.ndim == 3 and len(want) == 2 and value.shape[-1] == 1:  # 1x1 Conv1d -> Dense
    out = value[..., 0].T
  elif value.ndim == 2 and len(want) == 2:  # Linear [out, in] -> Dense [in, out]
    out = value.T
  elif value.ndim == 2 and len(want) == 1 and value.shape[-1] == 1:  # ChannelScale [C, 1]
    out = value[:, 0]
  else:
    out = value
  if out.shape != tuple(want):
    raise CheckpointError(
      f"{key}: torch shape {list(value.shape)} does not fit the model's {list(want)} (check "
      "model.n_ffts, channels, num_blocks, cond_channels, time_dim, hidden_factor, mel.n_mels)"
    )
  return out


def _strip_prefix(state_dict: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  if state_dict and all(k.startswith("module.") for k in state_dict):
    return {k[len("module.") :]: v for k, v in state_dict.items()}
  return dict(state_dict)


def _check_buffers(state_dict: Mapping[str, np.ndarray], n_ffts: tuple[int, ...]) -> None:
  for key, value in state_dict.items():
    match = _WINDOW.match(key)
    if match is None:
      continue
    branch = int(match.group(1))
    if branch >= len(n_ffts):
      raise CheckpointError(f"{key}: the model has {len(n_ffts)} branches (model.n_ffts {n_ffts})")
    hann = np.asarray(audio.hann_window(n_ffts[branch]))
    value = np.asarray(value)
    if value.shape != hann.shape or np.max(np.abs(value - hann)) > WINDOW_TOLERANCE:
      raise CheckpointError(
        f"{key}: not the periodic Hann window of n_fft {n_ffts[branch]} (shape {list(value.shape)})"
      )


def flow2gan_to_flax(
  state_dict: Mapping[str, np.ndarray], expected, n_ffts: tuple[int, ...]
) -> dict:
  """Converts the official generator's state dict (torch names, numpy arrays) into `{"params": ...}`
  with the structure and shapes of `expected` (the model's `init` output or its `jax.eval_shape`);
  `n_ffts` are the branches' STFT sizes (to check the window buffers)."""
  state_dict = _strip_prefix(state_dict)
  _check_buffers(state_dict, n_ffts)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(expected)
  converted, used = [], set()
  for path, leaf in leaves:
    names = tuple(str(getattr(k, "key", k)) for k in path)
    if names[0] != "params":
      raise CheckpointError(f"expected a {{'params': ...}} tree, got the collection {names[0]!r}")
    key = torch_key(names[1:])
    if key not in state_dict:
      raise CheckpointError(
        f"{key}: missing from the state dict (model parameter {'/'.join(names)})"
      )
    converted.append(to_flax_layout(key, state_dict[key], tuple(leaf.shape)))
    used.add(key)
  unexpected = sorted(k for k in state_dict if k not in used and not _DROPPED.match(k))
  if unexpected:
    raise CheckpointError(
      f"{unexpected[0]}: not a parameter of the configured model ({len(unexpected)} unexpected keys: "
      f"{', '.join(unexpected[:5])}{', ...' if len(unexpected) > 5 else ''})"
    )
  return jax.tree_util.tree_unflatten(treedef, converted)
