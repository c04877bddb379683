"""`tree_aggregate`: all-pairs path-product aggregation over a rooted tree in O(n f) work.

  y[v] = sum_u (product of the edge weights on the path u -> v, in the direction of travel) * x[u]

for all n^2 pairs (u = v: the empty product 1), computed by two sweeps over the tree (FGL,
Theorem 1 / Eq. 7-8 with W_A = I): a bottom-up pass accumulates subtree sums, a top-down
pass adds, at each node, its parent's total minus its own subtree's share. The edge v -> parent(v)
weighs `weight_up[v]`, parent(v) -> v weighs `weight_down[v]`.

The map x -> y is linear with operator P; P^T is the same operator with `weight_up` and
`weight_down` swapped, so the backward pass (`custom_vjp`) is the same two passes on the cotangent,
and the weight gradients are products of forward and backward partial sums:
  dL/dw_up[a]   = < H^T[Fa(a)] - w_down[a] S^T[a],  S[a] >
  dL/dw_down[a] = < S^T[a],  H[Fa(a)] - w_up[a] S[a] >
(S, H: forward passes on x; S^T, H^T: passes on the cotangent with swapped weights; the first
factor of each is the aggregate at Fa(a) of everything outside a's subtree.)
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_batching

from kernels.tree_aggregate import layout as layout_lib
from kernels.tree_aggregate import pallas as pallas_lib
from kernels.tree_aggregate import xla as xla_lib

IMPLEMENTATIONS = ("xla", "sequential", "pallas")


def default_implementation() -> str:
  """The level-synchronous "xla" implementation, on every backend.

  On CPU it matches "sequential" for one tree and wins for batches of trees (the FGL forest); the
  Pallas kernel is opt-in: it lowers for GPU (Triton) and TPU (Mosaic), checked on CPU by
  tests/test_kernel_lowering.py, but has not been compiled or timed on a device by this codebase
  (`python -m kernels.tree_aggregate.bench` on one decides whether it becomes the default).
  """
  return "xla"


def block_rows(n: int, implementation: str) -> int:
  """Rows per block of a level: a power of two near sqrt(n) (a spanning tree of n nodes is
  typically ~sqrt(n) deep and wide), within [8, 128] ([16, 32] for the Pallas kernel's matmul)."""
  low, high = (16, 32) if implementation == "pallas" else (8, 128)
  return min(high, max(low, 1 << (math.isqrt(n).bit_length() - 1 if n > 1 else 0)))


def _run_batched(
  implementation, block, interpret, x, weight_up, weight_down, parent_row, level_ptr, levels
):
  """(S, H) of a batch of trees: every argument has a leading tree axis."""
  if implementation == "xla":
    return xla_lib.levels_two_pass(
      x, weight_up, weight_down, parent_row, level_ptr, levels, block=block
    )
  if implementation == "sequential":
    return xla_lib.sequential_two_pass(x, weight_up, weight_down, parent_row, level_ptr, levels)
  return pallas_lib.pallas_two_pass(
    x, weight_up, weight_down, parent_row, level_ptr, levels, block=block, interpret=interpret
  )


@functools.cache
def _runner(implementation: str, block: int, interpret: bool | None):
  """(S, H) of one tree, with a `vmap` rule that sweeps a batch of trees in lockstep."""

  @custom_batching.custom_vmap
  def run(*args):
    s, h = _run_batched(implementation, block, interpret, *(a[None] for a in args))
    return s[0], h[0]

  @run.def_vmap
  def run_batched(axis_size, in_batched, *args):
    args = [
      a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
      for a, batched in zip(args, in_batched, strict=True)
    ]
    return _run_batched(implementation, block, interpret, *args), (True, True)

  return run


def _run(kernel, *args):
  return _runner(*kernel)(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _aggregate_rows(kernel, x, weight_up, weight_down, parent_row, level_ptr, levels):
  return _run(kernel, x, weight_up, weight_down, parent_row, level_ptr, levels)[1]


def _aggregate_rows_fwd(kernel, x, up, down, parent_row, level_ptr, levels):
  s, h = _run(kernel, x, up, down, parent_row, level_ptr, levels)
  return h, (s, h, up, down, parent_row, level_ptr, levels)


def _aggregate_rows_bwd(kernel, residuals, cotangent):
  s, h, up, down, parent_row, level_ptr, levels = residuals
  s_t, h_t = _run(kernel, cotangent, down, up, parent_row, level_ptr, levels)
  outside = h[parent_row] - up * s  # aggregate at Fa(a) of x outside a's subtree
  outside_t = h_t[parent_row] - down * s_t  # the same for the cotangent under P^T
  grad_up, grad_down = outside_t * s, s_t * outside
  if up.shape[1] == 1:
    grad_up = grad_up.sum(axis=1, keepdims=True)
    grad_down = grad_down.sum(axis=1, keepdims=True)
  return h_t, grad_up, grad_down, None, None, None


_aggregate_rows.defvjp(_aggregate_rows_fwd, _aggregate_rows_bwd)


def tree_aggregate(
  x: jax.Array,
  parent: jax.Array,
  weight_up: jax.Array,
  weight_down: jax.Array | None = None,
  *,
  normalize: bool = False,
  implementation: str | None = None,
  interpret: bool | None = None,
) -> jax.Array:
  """Sums every node's features into every other node, weighted by the product along the path.

  Args:
    x: [n, f] float node features.
    parent: [n] int; `parent[root] = -1`, any node order. Several roots make a forest (pairs in
      different trees do not interact); padding a batch of trees to a common n is done with extra
      roots whose x is 0.
    weight_up: [n] (one weight per edge) or [n, f] (one per edge and feature channel): the weight of
      the edge v -> parent(v). Ignored at roots.
    weight_down: the weight of parent(v) -> v, same shape; default: `weight_up` (symmetric).
    normalize: divide by the same aggregation of ones (TreeFilter's normalisation; needs weights
      that keep it positive, e.g. non-negative ones).
    implementation: "xla" (level-synchronous), "sequential", "pallas" or None for
      `default_implementation()`.
    interpret: for "pallas": True runs the Pallas interpreter on every platform, False the compiled
      kernel of the platform lowered for (Triton on GPU, Mosaic on TPU), None the interpreter when
      lowered for CPU and the compiled kernel otherwise (`pallas.py`).

  Returns:
    [n, f]: y[v] = sum_u prod_{edges a->b on the path u->v} w(a->b) * x[u].

  Raises:
    ValueError: naming the argument whose shape, dtype or value is wrong.
  """
  implementation = implementation or default_implementation()
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"implementation: must be one of {IMPLEMENTATIONS} or None, got {implementation!r}"
    )
  weight_down = weight_up if weight_down is None else weight_down
  _check_arguments(x, parent, weight_up, weight_down)
  n, f = x.shape
  block = block_rows(n, implementation)
  rows = layout_lib.num_rows(n, block)
  layout = layout_lib.tree_layout(jnp.asarray(parent), block)
  is_root = jnp.asarray(parent)[layout.order] < 0

  def sorted_weights(weight):
    weight = jnp.asarray(weight, x.dtype).reshape(n, -1)[layout.order]
    weight = jnp.where(is_root[:, None], 0, weight)
    return jnp.pad(weight, ((0, rows - n), (0, 0)))

  up, down = sorted_weights(weight_up), sorted_weights(weight_down)
  if normalize:  # aggregate ones alongside x in one call: extra channels with the same weights
    channels = up.shape[1]
    x = jnp.concatenate([x, jnp.ones((n, channels), x.dtype)], axis=1)
    if channels > 1:
      up, down = jnp.concatenate([up, up], axis=1), jnp.concatenate([down, down], axis=1)
  out = _aggregate_rows(
    (implementation, block, interpret),
    layout_lib.to_rows(x, layout, rows),
    up,
    down,
    layout.parent_row,
    layout.level_ptr,
    layout.num_levels,
  )[layout.position]
  return out[:, :f] / out[:, f:] if normalize else out


def _check_arguments(x, parent, weight_up, weight_down) -> None:
  if jnp.ndim(x) != 2:
    raise ValueError(f"x: expected [n, f], got shape {jnp.shape(x)}")
  if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
    raise ValueError(f"x: expected a float array, got dtype {jnp.result_type(x)}")
  n, f = jnp.shape(x)
  if n < 1:
    raise ValueError("x: needs at least one node (n >= 1)")
  if jnp.shape(parent) != (n,):
    raise ValueError(
      f"parent: expected shape ({n},) to match x {jnp.shape(x)}, got {jnp.shape(parent)}"
    )
  if not jnp.issubdtype(jnp.result_type(parent), jnp.integer):
    raise ValueError(f"parent: expected an integer array, got dtype {jnp.result_type(parent)}")
  for name, weight in (("weight_up", weight_up), ("weight_down", weight_down)):
    if jnp.shape(weight) not in ((n,), (n, f)):
      raise ValueError(
        f"{name}: expected shape ({n},) or ({n}, {f}) for x {jnp.shape(x)}, got {jnp.shape(weight)}"
      )
  if jnp.shape(weight_up) != jnp.shape(weight_down):
    raise ValueError(
      f"weight_down: shape {jnp.shape(weight_down)} differs from weight_up {jnp.shape(weight_up)}"
    )
  try:
    concrete = np.asarray(parent)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return  # values are data inside jit/vmap; only shapes can be checked
  layout_lib.check_parent_values(concrete)
