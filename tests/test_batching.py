"""Resumable batching: batches are pure functions of (seed, step) and split exactly across processes."""

import numpy as np
import pytest

from core.data import batching


def _source(batch_size=8, seed=3):
  x = np.arange(50, dtype=np.float32)[:, None]
  return batching.from_arrays({"x": x, "i": np.arange(50)}, batch_size, seed)


def test_batch_is_a_function_of_step():
  a, b = _source(), _source()
  for step in (0, 5, 6, 17, 3):
    np.testing.assert_array_equal(a.batch(step)["i"], b.batch(step)["i"])


def test_epoch_visits_distinct_records_and_reshuffles():
  source = _source()
  epoch0 = np.concatenate([source.batch(s)["i"] for s in range(source.steps_per_epoch)])
  epoch1 = np.concatenate(
    [source.batch(s)["i"] for s in range(source.steps_per_epoch, 2 * source.steps_per_epoch)]
  )
  assert len(np.unique(epoch0)) == len(epoch0) == 48
  assert not np.array_equal(epoch0, epoch1)


def test_process_slices_tile_the_global_batch():
  source = _source()
  whole = source.batch(7)["i"]
  parts = [source.batch(7, p, 4)["i"] for p in range(4)]
  np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="differ in length"):
    batching.from_arrays({"a": np.zeros(3), "b": np.zeros(4)}, 2, 0)
  with pytest.raises(ValueError, match="exceeds"):
    batching.from_arrays({"a": np.zeros(3)}, 4, 0)
  with pytest.raises(ValueError, match="not divisible by 3 processes"):
    _source().batch(0, 0, 3)


@pytest.mark.parametrize(
  "n, minimum, want", [(1, 1, 1), (2, 1, 2), (3, 1, 4), (8, 1, 8), (9, 1, 16), (3, 8, 8), (0, 8, 8)]
)
def test_power_of_two_at_least(n, minimum, want):
  assert batching.power_of_two_at_least(n, minimum) == want
