"""Timing shared by the benchmarks (kernel vs reference, and the front-door parity run)."""

import statistics
import time

import jax


def median_seconds(fn, *args, repeats: int = 3) -> float:
  """Median wall time in seconds of `fn(*args)` over `repeats` calls, after one call that compiles it."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)
