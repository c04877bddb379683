"""Resumable batching: the batch of step `s` is a pure function of (seed, s).

Each epoch visits every record once in an order drawn from `(seed, epoch)`; the last partial batch of
an epoch is dropped. Because the position in the data is the step itself, a run restored at step `s`
reads exactly the batches an uninterrupted run would have read, with no iterator state to save.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

Records = Callable[[np.ndarray], dict[str, np.ndarray]]


def power_of_two_at_least(n: int, minimum: int = 1) -> int:
  """The smallest power of two >= max(n, minimum): a batch padded to it is one of few compiled
  shapes whatever n is, with less than n rows of padding."""
  return 1 << max(0, (max(n, minimum) - 1).bit_length())


def _epoch_order(seed: int, epoch: int, num_records: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(num_records)


@dataclasses.dataclass
class IndexedBatches:
  """Shuffled fixed-size batches over a random-access source.

  Attributes:
    gather: `indices -> {field: array with leading axis len(indices)}`; a dict of in-memory arrays
      (`from_arrays`) or a tfds `data_source` (`from_random_access`).
    num_records: size of the source.
    global_batch_size: records per step, over all processes.
    seed: shuffling seed.
  """

  gather: Records
  num_records: int
  global_batch_size: int
  seed: int

  def __post_init__(self):
    if self.global_batch_size > self.num_records:
      raise ValueError(
        f"batch size {self.global_batch_size} exceeds the {self.num_records} records of the source"
      )
    self._cached_epoch = (-1, None)

  @property
  def steps_per_epoch(self) -> int:
    return self.num_records // self.global_batch_size

  def indices(self, step: int) -> np.ndarray:
    epoch, offset = divmod(step, self.steps_per_epoch)
    if self._cached_epoch[0] != epoch:
      self._cached_epoch = (epoch, _epoch_order(self.seed, epoch, self.num_records))
    start = offset * self.global_batch_size
    return self._cached_epoch[1][start : start + self.global_batch_size]

  def batch(
    self, step: int, process_index: int = 0, process_count: int = 1
  ) -> dict[str, np.ndarray]:
    rows = process_rows(self.global_batch_size, process_index, process_count)
    return self.gather(self.indices(step)[rows])


def process_rows(global_batch_size: int, process_index: int, process_count: int) -> slice:
  """The contiguous rows of a global batch that process `process_index` of `process_count` feeds."""
  if global_batch_size % process_count:
    raise ValueError(
      f"batch size {global_batch_size} is not divisible by {process_count} processes"
    )
  local = global_batch_size // process_count
  return slice(process_index * local, (process_index + 1) * local)


@dataclasses.dataclass(frozen=True)
class GeneratedBatches:
  """A data source for generated data: `generate(step)` makes the whole global batch of `step` (a pure
  function of the step), and each process keeps its rows."""

  generate: Callable[[int], dict[str, np.ndarray]]
  global_batch_size: int

  def batch(
    self, step: int, process_index: int = 0, process_count: int = 1
  ) -> dict[str, np.ndarray]:
    rows = process_rows(self.global_batch_size, process_index, process_count)
    return {name: value[rows] for name, value in self.generate(step).items()}


def from_arrays(
  arrays: Mapping[str, np.ndarray], global_batch_size: int, seed: int
) -> IndexedBatches:
  """Batches over in-memory arrays sharing their leading axis."""
  lengths = {name: len(value) for name, value in arrays.items()}
  if len(set(lengths.values())) != 1:
    raise ValueError(f"arrays differ in length: {lengths}")
  arrays = dict(arrays)
  return IndexedBatches(
    gather=lambda idx: {name: value[idx] for name, value in arrays.items()},
    num_records=next(iter(lengths.values())),
    global_batch_size=global_batch_size,
    seed=seed,
  )


def from_random_access(
  source, global_batch_size: int, seed: int, transform: Callable[[dict], dict] = lambda r: r
) -> IndexedBatches:
  """Batches over a random-access source of record dicts (`tfds.data_source(...)`, array_record)."""

  def gather(indices: np.ndarray) -> dict[str, np.ndarray]:
    records = [transform(source[int(i)]) for i in indices]
    return {name: np.stack([r[name] for r in records]) for name in records[0]}

  return IndexedBatches(gather, len(source), global_batch_size, seed)
