"""The device mesh and the shardings of state and batches.

One `("data",)` mesh over every device of every process; batches are split over "data", the state is
replicated (data parallelism). Batches enter as each process's slice of the global batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D data mesh over `devices` (default: all devices of all processes)."""
  devices = list(jax.devices() if devices is None else devices)
  return Mesh(np.asarray(devices), (DATA_AXIS,), axis_types=(AxisType.Auto,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def state_shardings(mesh: Mesh, abstract_state):
  """Replicates every leaf of the state."""
  return jax.tree.map(lambda _: replicated(mesh), abstract_state)


def global_batch(local_batch, mesh: Mesh):
  """Assembles each process's slice into global arrays split over the data axis."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(
    lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch
  )
