"""EnCodec's released encoder and quantizer as `core/nn/codec.py`'s `SEANetEncoder` and codebooks.

EnCodec 24 kHz (Défossez et al., "High Fidelity Neural Audio Compression", 2022; `facebook/encodec_24khz`
on the Hugging Face Hub) is read in the layout of transformers' `EncodecModel.state_dict()`, exported
to an `.npz` of named arrays where torch is installed (torch is not a dependency here):

  python -c "import sys, numpy as np; from transformers import EncodecModel; \
    sd = EncodecModel.from_pretrained(sys.argv[1]).state_dict(); \
    np.savez(sys.argv[2], **{k: v.float().numpy() for k, v in sd.items()})" facebook/encodec_24khz e.npz

Names (`encoder.layers.<i>` is the i-th module of `EncodecEncoder.layers`; ELUs hold no weights):

  encoder.layers.<i>.conv.{weight | weight_g, weight_v | parametrizations.weight.original0/1}, .bias
                                           layers_<i>/conv/kernel [k, in, out], bias
  encoder.layers.<i>.block.<j>.conv.*      layers_<i>/block_<j>/conv/*       (SEANet residual block)
  encoder.layers.<i>.shortcut.conv.*       layers_<i>/shortcut/conv/*
  encoder.layers.<i>.lstm.weight_ih_l<l>, weight_hh_l<l> [4C, C], bias_ih_l<l>, bias_hh_l<l>
                                           layers_<i>/kernel_ih_<l>, kernel_hh_<l> [C, 4C], bias_*
  quantizer.layers.<q>.codebook.embed [K, D]   codebooks[q]

Weight normalisation is folded (`w = g v / ||v||`, the norm over all axes but the output channel,
`torch.nn.utils.weight_norm(dim=0)`; both the legacy `weight_g` / `weight_v` names and the
parametrization's `original0` / `original1` are read). The quantizer's other buffers (`inited`,
`cluster_size`, `embed_avg`: training state) are dropped, `inited` checked to be set; the decoder's
keys are dropped (tokens need only the encoder and codebooks). Any missing or unexpected encoder key,
or a shape that does not fit the configured encoder, raises `CheckpointError` naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from core.nn.convert import CheckpointError, Path, Rule, apply_rules, param_shapes, read_npz

__all__ = ["CheckpointError", "encodec_to_flax", "fold_weight_norm", "read_npz", "torch_key"]

_WEIGHT_NORM = {
  ".weight_g": ".weight_v",
  ".parametrizations.weight.original0": ".parametrizations.weight.original1",
}


def fold_weight_norm(state_dict: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Each weight-normalised `(g, v)` pair replaced by the plain `.weight = g v / ||v||`."""
  out = dict(state_dict)
  for g_suffix, v_suffix in _WEIGHT_NORM.items():
    for key in [k for k in state_dict if k.endswith(g_suffix)]:
      prefix = key[: -len(g_suffix)]
      v_key = prefix + v_suffix
      if v_key not in state_dict:
        raise CheckpointError(f"{key}: weight norm without its direction {v_key}")
      g, v = np.asarray(out.pop(key), np.float64), np.asarray(out.pop(v_key), np.float64)
      norm = np.sqrt(np.sum(np.square(v), axis=tuple(range(1, v.ndim)), keepdims=True))
      out[prefix + ".weight"] = (g * v / norm).astype(np.float32)
  return out


def torch_key(path: Path) -> str:
  """`("layers_3", "block_1", "conv")` -> `"encoder.layers.3.block.1.conv"`."""
  parts = [re.sub(r"^(layers|block)_(\d+)$", r"\1.\2", p) for p in path]
  return "encoder." + ".".join(parts)


def _conv_rules(path: Path, expected) -> dict[str, Rule]:
  k, c_in, c_out = expected[path + ("kernel",)]
  prefix = torch_key(path)
  return {
    f"{prefix}.weight": (
      (c_out, c_in, k),
      lambda w: {path + ("kernel",): np.transpose(w, (2, 1, 0))},
    ),
    f"{prefix}.bias": ((c_out,), lambda b: {path + ("bias",): b}),
  }


def _lstm_rules(path: Path, expected) -> dict[str, Rule]:
  rules: dict[str, Rule] = {}
  prefix = torch_key(path) + ".lstm"
  for name in [p[-1] for p in expected if p[:-1] == path]:
    kind, layer = re.fullmatch(r"(kernel_ih|kernel_hh|bias_ih|bias_hh)_(\d+)", name).groups()
    target = path + (name,)
    shape = expected[target]
    if kind.startswith("kernel"):
      rules[f"{prefix}.weight_{kind[-2:]}_l{layer}"] = (shape[::-1], lambda w, t=target: {t: w.T})
    else:
      rules[f"{prefix}.{kind}_l{layer}"] = (shape, lambda b, t=target: {t: b})
  return rules


def encoder_rules(expected: Mapping[Path, tuple[int, ...]]) -> dict[str, Rule]:
  rules: dict[str, Rule] = {}
  for path in sorted({p[:-1] for p in expected}):
    if path[-1] == "conv":
      rules |= _conv_rules(path, expected)
    else:
      rules |= _lstm_rules(path, expected)
  return rules


def encodec_to_flax(state_dict: Mapping[str, np.ndarray], abstract_encoder, num_quantizers: int):
  """`{"encoder": params, "codebooks": (num_quantizers, K, D)}` from an `EncodecModel` state dict;
  `abstract_encoder` is `jax.eval_shape(SEANetEncoder(...).init, ...)`."""
  state_dict = {k.removeprefix("module."): v for k, v in state_dict.items()}
  expected = param_shapes(abstract_encoder)
  encoder = fold_weight_norm({k: v for k, v in state_dict.items() if k.startswith("encoder.")})
  params = apply_rules(encoder, encoder_rules(expected), expected, source="EnCodec encoder")
  quantizer = {k: v for k, v in state_dict.items() if k.startswith("quantizer.")}
  names = {int(m.group(1)) for k in quantizer if (m := re.match(r"quantizer\.layers\.(\d+)\.", k))}
  if sorted(names) != list(range(len(names))) or len(names) != num_quantizers:
    raise CheckpointError(
      f"quantizer.layers: {len(names)} codebooks in the state dict, the config has {num_quantizers}"
    )
  codebooks = []
  dimension = abstract_encoder["params"][max(abstract_encoder["params"], key=_layer_index)]
  dimension = dimension["conv"]["kernel"].shape[-1]
  for q in range(num_quantizers):
    prefix = f"quantizer.layers.{q}.codebook."
    for buffer in ("embed", "inited"):
      if prefix + buffer not in quantizer:
        raise CheckpointError(f"missing key {prefix}{buffer}")
    if not np.all(np.asarray(quantizer[prefix + "inited"])):
      raise CheckpointError(f"{prefix}inited: the codebook was never initialised")
    embed = np.asarray(quantizer[prefix + "embed"], np.float32)
    if embed.ndim != 2 or embed.shape[1] != dimension:
      raise CheckpointError(f"{prefix}embed: shape {embed.shape}, the encoder gives {dimension}-d")
    codebooks.append(embed)
  if len({c.shape for c in codebooks}) != 1:
    raise CheckpointError("quantizer.layers: codebooks of different sizes")
  return {"encoder": params["params"], "codebooks": np.stack(codebooks)}


def _layer_index(name: str) -> int:
  return int(name.split("_")[1])
