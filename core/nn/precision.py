"""Compute dtypes of the shared networks: the config string -> a jnp dtype.

Mixed precision as in big_vision and maxtext: parameters, optimizer state and EMA stay float32
(`param_dtype`), matrix products and activations run in the compute `dtype` (bfloat16 on the
accelerator variants that train or sample that way). Each network keeps its numerically delicate
parts in float32 and says so beside the code: softmax and log-sum-exp, norms' reductions, recurrent
state, graph aggregations, and the outputs that losses and samplers read.

A method's `validate` checks `config.model.dtype` with
`require_choice(config, "model.dtype", precision.DTYPE_NAMES)` (a `ConfigError` naming the field;
`core/` does not import `methods/`), and builds its networks with `compute_dtype(config.model.dtype)`.
"""

from __future__ import annotations

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
DTYPE_NAMES = tuple(DTYPES)


def compute_dtype(name: str):
  """`"float32"` -> `jnp.float32`, `"bfloat16"` -> `jnp.bfloat16`; ValueError for anything else."""
  if name not in DTYPES:
    raise ValueError(f"compute dtype must be one of {list(DTYPE_NAMES)}, got {name!r}")
  return DTYPES[name]
