"""The device mesh and the shardings of state and batches.

The mesh comes from `config.mesh`, a sequence of `(axis name, size)` with one size -1 filling the
remaining devices (default `(("data", -1),)`: every device of every process on one data axis).
Batches are split over "data". The state follows `config.sharding`:
  "replicate"  every leaf on every device (data parallelism);
  "fsdp"       leaves of at least `fsdp_min_size` elements split over "data" along their largest
               divisible axis (fully sharded data parallelism: XLA gathers them where used), so a
               model larger than one device's memory needs no change to method code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"
DEFAULT_MESH = ((DATA_AXIS, -1),)
STRATEGIES = ("replicate", "fsdp")


class MeshError(ValueError):
  """`config.mesh` does not fit the devices."""


def mesh_shape(
  axes: Sequence[Sequence], num_devices: int
) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """Axis names and sizes, with a -1 size filled so that the sizes multiply to `num_devices`."""
  names = tuple(str(name) for name, _ in axes)
  sizes = [int(size) for _, size in axes]
  if DATA_AXIS not in names:
    raise MeshError(f"config.mesh: needs a {DATA_AXIS!r} axis, got axes {names}")
  if len(set(names)) != len(names) or sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise MeshError(
      f"config.mesh: axes must be unique with positive sizes and at most one -1, got {list(axes)}"
    )
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise MeshError(f"config.mesh: sizes {sizes} do not divide the {num_devices} devices")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise MeshError(
      f"config.mesh: sizes {sizes} multiply to {math.prod(sizes)}, not the {num_devices} devices"
    )
  return names, tuple(sizes)


def make_mesh(
  axes: Sequence[Sequence] = DEFAULT_MESH, devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """A mesh over `devices` (default: all devices of all processes) with the axes of `config.mesh`."""
  devices = list(jax.devices() if devices is None else devices)
  names, sizes = mesh_shape(axes, len(devices))
  grid = np.asarray(devices).reshape(sizes)
  return Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))


def data_size(mesh: Mesh) -> int:
  return mesh.shape[DATA_AXIS]


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def fsdp_spec(shape: Sequence[int], shards: int, min_size: int) -> P:
  """Splits the largest axis divisible by `shards` over "data", for leaves of >= `min_size` elements."""
  if shards == 1 or math.prod(shape) < min_size:
    return P()
  candidates = [axis for axis, size in enumerate(shape) if size % shards == 0]
  if not candidates:
    return P()
  axis = max(candidates, key=lambda a: shape[a])
  return P(*([None] * axis + [DATA_AXIS]))


def state_shardings(
  mesh: Mesh, abstract_state, strategy: str = "replicate", fsdp_min_size: int = 2**14
):
  """One `NamedSharding` per leaf of the state, following `strategy` (see the module docstring)."""
  if strategy not in STRATEGIES:
    raise MeshError(f"config.sharding: must be one of {STRATEGIES}, got {strategy!r}")
  if strategy == "replicate":
    return jax.tree.map(lambda _: replicated(mesh), abstract_state)
  return jax.tree.map(
    lambda leaf: NamedSharding(mesh, fsdp_spec(leaf.shape, data_size(mesh), fsdp_min_size)),
    abstract_state,
  )


def global_batch(local_batch, mesh: Mesh):
  """Assembles each process's slice into global arrays split over the data axis."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
    lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch
  )
