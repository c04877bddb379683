"""A kernel per device: XLA cannot partition a Pallas call, so a mesh-aware caller splits it itself.

Lowering a Mosaic TPU kernel into a program over more than one device fails ("Mosaic kernels cannot
be automatically partitioned") unless the call sits in a `shard_map` manual over every mesh axis;
a Triton call on GPU is computed whole on every device. `split_leading_axis(fn, *args)` runs `fn`
under `jax.shard_map` over the context mesh (`jax.set_mesh`, `jax.sharding.use_abstract_mesh`) with
the leading axis of every argument and result split over the mesh axes, in mesh order, whose sizes
keep dividing it (the rest replicated), and is plain `fn(*args)` without a context mesh or on one
device. The leading axis must be independent rows (batch, trees, cache blocks).
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P


def leading_axes(mesh, size: int) -> tuple[str, ...]:
  """Mesh axes, in order, whose running product divides `size`."""
  axes, product = [], 1
  for name in mesh.axis_names:
    if size % (product * mesh.shape[name]) == 0:
      axes.append(name)
      product *= mesh.shape[name]
  return tuple(axes)


def split_leading_axis(fn, *args):
  """`fn(*args)`, run per device with the leading axis split over the context mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return fn(*args)
  axes = leading_axes(mesh, jax.tree.leaves(args)[0].shape[0])
  spec = P(axes) if axes else P()
  return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(*args)
