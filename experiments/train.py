r"""Trains (or resumes) any registered method: the one launcher of the codebase.

  python experiments/train.py --config=configs/quant_diffusion.py [--workdir=runs/quant_diffusion/default]
  python experiments/train.py --config=configs/quant_diffusion.py:cifar10 --config.steps=1000

A multi-process job (one process per host, or several on one machine):

  python experiments/train.py --config=... --coordinator_address=127.0.0.1:1234 \
    --num_processes=2 --process_id=0
  python experiments/train.py --config=... --distributed      # TPU pod slice, SLURM: from the environment

Running the same command on an unfinished workdir resumes from its latest checkpoint. SIGTERM
(preemption) and SIGINT (Ctrl-C) save where the run is (a checkpoint at the current step, or the
finished chunks of an evaluation) and exit 0 or 130; the next launch resumes. A stop that arrives
inside one long call exits after --stop_grace_s seconds anyway, naming what was saved last
(`experiments/stopping.py`).

Before spending pod time, lower every phase for the target without running anything
(`experiments/lowering.py`; one line per program, exit status 1 if any fails):

  python experiments/train.py --config=configs/quant_diffusion.py:tpu_pod \
    --config.data.data_dir=/data/tfds --lower_only=tpu --lower_devices=256
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
  # the repository's packages without an install; a signal during the slow imports exits cleanly
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from experiments import stopping

  stopping.exit_at_once_until_started()

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Path to a configs/<method>.py[:variant].", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder; default runs/<method>/<variant>.")
_COORDINATOR = flags.DEFINE_string(
  "coordinator_address",
  None,
  "host:port of process 0, to join a multi-process job (jax.distributed).",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the multi-process job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in the job.")
_DISTRIBUTED = flags.DEFINE_bool(
  "distributed",
  False,
  "Join a multi-process job from the cluster's environment (TPU pod, SLURM, ...).",
)
_LOWER_ONLY = flags.DEFINE_list(
  "lower_only",
  None,
  "Lower every phase's init and step for these platforms (cuda, tpu) and report; runs nothing.",
)
_LOWER_DEVICES = flags.DEFINE_integer(
  "lower_devices",
  None,
  "With --lower_only: lay config.mesh over this many abstract devices (default: this machine's).",
)
flags.mark_flags_as_required(["config"])

_STOP_GRACE = flags.DEFINE_float(
  "stop_grace_s",
  20.0,
  "After SIGTERM/SIGINT, seconds to wait for the loop to save and stop before exiting anyway.",
)


def default_workdir(config) -> str:
  return os.path.join("runs", config.method, config.get("variant", "default"))


def initialize_distributed() -> None:
  """Joins the multi-process job named by the flags, or by the cluster's environment with --distributed."""
  import jax

  if _COORDINATOR.value is not None:
    jax.distributed.initialize(
      coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value,
    )
  elif _DISTRIBUTED.value:
    jax.distributed.initialize()


def main(argv):
  del argv
  from experiments import loop, runtime, stopping  # after flag parsing, so --help stays fast

  runtime.setup()
  if _LOWER_ONLY.value:
    from experiments import lowering

    return lowering.main(_CONFIG.value, _LOWER_ONLY.value, _LOWER_DEVICES.value)
  initialize_distributed()
  config = _CONFIG.value
  workdir = _WORKDIR.value or default_workdir(config)
  stop = stopping.StopSignals(_STOP_GRACE.value, loop.LAST_SAVED)
  try:
    summary = loop.run(config, workdir, should_stop=stop.should_stop)
  except loop.Interrupted as interrupted:
    logging.info("%s", interrupted)
    return stop.exit_code()
  except loop.RUN_ERRORS as error:
    sys.exit(f"error: {error}")
  logging.info("results in %s: %s", os.path.join(workdir, "results.json"), summary.results)
  return 0


if __name__ == "__main__":
  app.run(main)
