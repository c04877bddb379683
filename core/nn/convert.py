"""Released PyTorch weights as Flax parameters: what every checkpoint converter here shares.

A converter is a table of rules, one per key of the released state dict: the shape that key must have
and a function from its array to `{flax path: array}`. `apply_rules` checks the state dict against the
table (missing and unexpected keys, each array's shape, each converted array's shape against the
model's own parameters, and that every parameter of the model is covered) and builds the parameter
tree. Every failure raises `CheckpointError` naming the key, so a wrong checkpoint stops with one line
instead of a shape error deep inside `apply`. Pure: reading the file is the caller's (`read_npz` for
state dicts saved as `.npz` of named arrays, which needs no torch).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import jax
import jax.numpy as jnp
import numpy as np

Path = tuple[str, ...]
# one released key -> (its expected shape, a function from its array to {flax path: array})
Rule = tuple[tuple[int, ...], Callable[[np.ndarray], dict[Path, np.ndarray]]]


class CheckpointError(ValueError):
  """A state dict that does not fit the model; the message names the key."""


def param_shapes(abstract_variables) -> dict[Path, tuple[int, ...]]:
  """`{path: shape}` of the `"params"` collection of `jax.eval_shape(model.init, ...)`'s output."""
  leaves = jax.tree_util.tree_flatten_with_path(abstract_variables["params"])[0]
  return {tuple(part.key for part in path): tuple(leaf.shape) for path, leaf in leaves}


def linear(torch_prefix: str, path: Path, expected, *, bias: bool = True) -> dict[str, Rule]:
  """`torch.nn.Linear` (`weight [out, in]`, `bias [out]`) as a `flax.linen.Dense` at `path`."""
  d_in, d_out = expected[path + ("kernel",)]
  rules = {f"{torch_prefix}.weight": ((d_out, d_in), lambda w: {path + ("kernel",): w.T})}
  if bias:
    rules[f"{torch_prefix}.bias"] = ((d_out,), lambda b: {path + ("bias",): b})
  return rules


def layer_norm(torch_prefix: str, path: Path, expected) -> dict[str, Rule]:
  """`torch.nn.LayerNorm` (`weight`, `bias`) as a `flax.linen.LayerNorm` (`scale`, `bias`)."""
  (d,) = expected[path + ("scale",)]
  return {
    f"{torch_prefix}.weight": ((d,), lambda w: {path + ("scale",): w}),
    f"{torch_prefix}.bias": ((d,), lambda b: {path + ("bias",): b}),
  }


def apply_rules(
  state_dict: Mapping[str, np.ndarray],
  rules: Mapping[str, Rule],
  expected: Mapping[Path, tuple[int, ...]],
  *,
  source: str,
  dtype=jnp.float32,
  shape_checked_by_rule: Collection[str] = (),
) -> dict:
  """`{"params": tree}` from `state_dict` by `rules`; `expected` is `param_shapes` of the model.
  `source` names the checkpoint family in errors; keys in `shape_checked_by_rule` (e.g. a position
  table that the rule interpolates) skip the shape check here because their rule does its own.
  Converted arrays are cast to `dtype` and stay numpy where the rule gives numpy."""
  _check_keys(state_dict, rules, source)
  flat: dict[Path, jax.Array] = {}
  for key, (shape, convert) in rules.items():
    value = state_dict[key]  # numpy or jax, any float dtype: cast per key, never a full copy
    if key not in shape_checked_by_rule and tuple(value.shape) != tuple(shape):
      raise CheckpointError(
        f"{key}: expected shape {tuple(shape)} for this model, got {tuple(value.shape)}"
      )
    for path, array in convert(value).items():
      if path not in expected:
        raise CheckpointError(f"{key}: converts to {'/'.join(path)}, which the model does not have")
      if tuple(array.shape) != expected[path]:
        raise CheckpointError(
          f"{key}: converts to {tuple(array.shape)}, the model has {expected[path]}"
        )
      flat[path] = _cast(array, dtype)
  if flat.keys() != expected.keys():
    raise CheckpointError(f"no {source} key for {sorted(expected.keys() - flat.keys())[:5]}")
  return {"params": unflatten(flat)}


def _cast(array, dtype):
  """numpy stays numpy (host memory; safe to cache even when first built inside a trace), jax
  stays jax (a checkpoint read onto the device is not copied back to the host)."""
  if isinstance(array, np.ndarray):
    return np.asarray(array, np.dtype(dtype))
  return jnp.asarray(array, dtype)


def unflatten(flat: Mapping[Path, jax.Array]) -> dict:
  """`{("a", "b"): x}` -> `{"a": {"b": x}}`."""
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for part in path[:-1]:
      node = node.setdefault(part, {})
    node[path[-1]] = value
  return tree


def read_npz(path: str) -> dict[str, np.ndarray]:
  """Every array of a `.npz` file by name (no pickles)."""
  try:
    with np.load(path, allow_pickle=False) as archive:
      return {name: archive[name] for name in archive.files}
  except (OSError, ValueError) as error:
    raise CheckpointError(f"cannot read {path!r}: {type(error).__name__}: {error}") from None


def _check_keys(state_dict: Mapping[str, np.ndarray], rules: Mapping[str, Rule], source: str):
  missing = sorted(rules.keys() - state_dict.keys())
  unexpected = sorted(state_dict.keys() - rules.keys())
  problems = []
  if missing:
    problems.append(f"missing keys {missing[:8]}{' ...' if len(missing) > 8 else ''}")
  if unexpected:
    problems.append(f"unexpected keys {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
  if problems:
    raise CheckpointError(f"{source} state dict does not fit the model: " + "; ".join(problems))
