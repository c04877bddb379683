r"""Is the input pipeline the bottleneck? Step time with real batches vs one fixed device batch.

  python experiments/bench_input.py --config=configs/quant_diffusion.py [--steps=300]

Runs the first phase's jitted step in alternating blocks: one block re-using a batch already on the
devices, the next reading each step's batch from the data source and placing it, and reports the
median time per step of each and their ratio (1.0 = the pipeline costs nothing; the target is within
10%). Both arms run in the same process on the same state, so the ratio is robust to machine speed.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "configs/<method>.py[:variant]", lock_config=True
)
_STEPS = flags.DEFINE_integer("steps", 300, "Steps per arm (split into blocks).")
flags.mark_flags_as_required(["config"])


def measure_input_overhead(config, steps: int, blocks: int = 6) -> dict[str, float]:
  """Median seconds per step with a fixed device batch and with real batches, and their ratio."""
  import jax

  import methods
  from experiments import sharding

  phase = next(p for p in methods.get_method(config.method).phases(config) if p.data is not None)
  mesh = sharding.make_mesh(config.get("mesh", sharding.DEFAULT_MESH))
  rng = jax.random.key(config.seed)
  state = jax.jit(lambda r: phase.init(r, {}))(rng)  # jit: no aliased leaves to donate twice
  source = phase.data({})
  step_fn = jax.jit(phase.step, donate_argnums=0)
  fixed = sharding.global_batch(source.batch(0), mesh)
  state, metrics = step_fn(state, fixed, rng)
  jax.block_until_ready(metrics)
  per_block = max(steps // blocks, 1)
  times: dict[str, list[float]] = {"fixed": [], "real": []}
  step = 0
  for block in range(2 * blocks):
    arm = "fixed" if block % 2 == 0 else "real"
    start = time.perf_counter()
    for _ in range(per_block):
      batch = fixed if arm == "fixed" else sharding.global_batch(source.batch(step), mesh)
      state, metrics = step_fn(state, batch, jax.random.fold_in(rng, step))
      step += 1
    jax.block_until_ready(metrics)
    times[arm].append((time.perf_counter() - start) / per_block)
  fixed_s, real_s = statistics.median(times["fixed"]), statistics.median(times["real"])
  return {
    "fixed_batch_s_per_step": fixed_s,
    "real_data_s_per_step": real_s,
    "ratio": real_s / fixed_s,
  }


def main(argv):
  del argv
  from experiments import runtime

  runtime.setup()
  result = measure_input_overhead(_CONFIG.value, _STEPS.value)
  logging.info(
    "fixed device batch %.3f ms/step, real data %.3f ms/step, ratio %.3f (input overhead %+.1f%%)",
    1e3 * result["fixed_batch_s_per_step"],
    1e3 * result["real_data_s_per_step"],
    result["ratio"],
    100 * (result["ratio"] - 1),
  )


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  app.run(main)
