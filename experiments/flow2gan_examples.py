r"""Flow2GAN's listening examples for runs finished before the benchmark wrote WAV files: restores the
benchmark phase's checkpoint (every generator), regenerates the test set with the benchmark's noise
(the loop's evaluation key), and writes the WAV files and `examples/quality.json`, with no training:

  python experiments/flow2gan_examples.py --config=configs/flow2gan.py:study --workdir=runs/flow2gan_study
  python experiments/flow2gan_examples.py --config=configs/flow2gan.py --workdir=runs/flow2gan

New runs need none of this: the benchmark phase writes `<workdir>/examples/<generator>_<i>.wav` and
`reference_<i>.wav` as its `examples` artifact (`methods.flow2gan.phases.audio_examples`). The recomputed
metrics match the run's `results.json` up to float rounding (the speed is not re-timed); wideband PESQ
is added when the `pesq` package is installed, and `--merge_pesq` also adds the PESQ keys to the run's
`results.json`, so `experiments/study.py --report_only` tabulates them.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import jax

from core.data import wav
from experiments.checkpoints import PhaseCheckpoints
from methods.flow2gan import tokens

# the module, not the package's `phases` function of the same name
flow2gan_phases = importlib.import_module("methods.flow2gan.phases")

EXAMPLES_DIR = "examples"


# ---------------------------------------------------------------------------------------------------
# Finished runs: examples and PESQ from the benchmark's checkpoint
# ---------------------------------------------------------------------------------------------------


def benchmark_index(config) -> int:
  return [p.name for p in flow2gan_phases.phases(config)].index("benchmark")


def evaluation_key(config) -> jax.Array:
  """The key the loop hands the benchmark's `evaluate` (`experiments/loop.py`: phase `i` runs with
  `fold_in(key(seed), i)`, split into init, step and evaluation keys)."""
  phase_key = jax.random.fold_in(jax.random.key(config.seed), benchmark_index(config))
  return jax.random.split(phase_key, 3)[2]


def restore_generators(config, run_dir: str) -> dict:
  """Every generator's parameters (`{phase: params}`) from the benchmark phase's checkpoint."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def placed(init):
    shapes = jax.eval_shape(init)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), shapes)

  one = placed(lambda: flow2gan_phases.init_generator(config, jax.random.key(0)))
  names = ["flow", *(f"gan_{n}step" for n in config.gan.generator_steps)]
  target = {name: one for name in names}
  if tokens.uses_tokens(config):
    target["codec"] = placed(
      lambda: tokens.codec_outputs(tokens.init_codec_state(config, jax.random.key(0)))
    )
  store = PhaseCheckpoints(os.path.join(run_dir, "checkpoints", "benchmark"), max_to_keep=1)
  try:
    step = store.latest_step()
    if step is None:
      raise FileNotFoundError(f"{run_dir}: no benchmark checkpoint (has the run finished?)")
    state, _ = store.restore(step, target)
  finally:
    store.close()
  return state


def from_checkpoints(config, run_dir: str, merge_pesq: bool = False) -> dict[str, float]:
  """Writes the run's WAV examples and `examples/quality.json` from its checkpoints; returns the
  recomputed metrics (`<generator>/<metric>`, PESQ included when available)."""
  from core import audio

  _check_config(config, run_dir)
  params_by_phase = restore_generators(config, run_dir)
  rng = evaluation_key(config)
  metrics, examples = {}, {}
  for name, phase, steps in flow2gan_phases.generators(config):
    codec = params_by_phase.get("codec")
    values, examples[name] = flow2gan_phases.quality(
      config, params_by_phase[phase], steps, rng, codec
    )
    metrics.update({f"{name}/{k}": v for k, v in values.items()})
  folder = os.path.join(run_dir, EXAMPLES_DIR)
  wav.write_examples(
    folder,
    config.data.sample_rate,
    flow2gan_phases.waveforms(config, examples),
    flow2gan_phases.WAV_EXAMPLES,
  )
  with open(os.path.join(folder, "quality.json"), "w") as f:
    json.dump(metrics, f, indent=2, sort_keys=True)
  if merge_pesq and audio.PESQ_AVAILABLE:
    _merge_into_results(config, run_dir, metrics)
  return metrics


def _check_config(config, run_dir: str) -> None:
  """The run must have been made with `config` (its test set, noise and generators)."""
  path = os.path.join(run_dir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{run_dir}: no config.json (not a run folder)")
  with open(path) as f:
    if json.load(f) != json.loads(config.to_json()):
      raise ValueError(
        f"{run_dir}: config.json differs from the given config; pass the run's config"
      )


def _merge_into_results(config, run_dir: str, metrics: dict[str, float]) -> None:
  """Adds the PESQ keys (and the headline's `pesq`) to the run's `results.json`."""
  path = os.path.join(run_dir, "results.json")
  with open(path) as f:
    results = json.load(f)
  added = {k: v for k, v in metrics.items() if k.endswith("/pesq")}
  added["pesq"] = metrics[f"{flow2gan_phases.headline(config)}/pesq"]
  with open(path, "w") as f:
    json.dump({**results, **added}, f, indent=2, sort_keys=True)


def runs(config, workdir: str) -> list[tuple[str, object]]:
  """`(run folder, config)`: the study's arms for a study config, else the one run."""
  if config.variant not in ("study", "tokens"):
    return [(workdir, config)]
  from methods.flow2gan import study

  return [(os.path.join(workdir, name), arm) for name, arm in study.study_arms(config)]


def main(argv) -> int:
  del argv
  from absl import flags

  values = flags.FLAGS
  for run_dir, config in runs(values.config, values.workdir):
    metrics = from_checkpoints(config, run_dir, values.merge_pesq)
    print(run_dir, json.dumps({k: round(v, 4) for k, v in metrics.items()}), flush=True)
  return 0


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file(
    "config", None, "configs/flow2gan.py or configs/flow2gan.py:study"
  )
  flags.DEFINE_string("workdir", None, "The run's folder, or the study's (one folder per arm).")
  flags.DEFINE_bool("merge_pesq", False, "Also add the PESQ keys to each run's results.json.")
  flags.mark_flags_as_required(["config", "workdir"])
  sys.exit(app.run(main))
