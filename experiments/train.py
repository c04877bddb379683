r"""Trains (or resumes) any registered method: the one launcher of the codebase.

  python experiments/train.py --config=configs/quant_diffusion.py [--workdir=runs/quant_diffusion/default]
  python experiments/train.py --config=configs/quant_diffusion.py:cifar10 --config.steps=1000

Running the same command on an unfinished workdir resumes from its latest checkpoint. SIGTERM saves a
checkpoint at the current step and exits 0 (preemption); the next launch resumes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Path to a configs/<method>.py[:variant].", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder; default runs/<method>/<variant>.")
flags.mark_flags_as_required(["config"])

_PREEMPTED = threading.Event()


def default_workdir(config) -> str:
  return os.path.join("runs", config.method, config.get("variant", "default"))


def main(argv):
  del argv
  from experiments import logs, loop  # after flag parsing, so --help stays fast

  logs.setup()
  config = _CONFIG.value
  workdir = _WORKDIR.value or default_workdir(config)
  signal.signal(signal.SIGTERM, lambda *_: _PREEMPTED.set())
  try:
    summary = loop.run(config, workdir, should_stop=lambda phase, step: _PREEMPTED.is_set())
  except loop.Interrupted as stop:
    logging.info("%s", stop)
    return 0
  except (
    loop.ConfigError,
    loop.NonFiniteLossError,
    loop.BadBatchError,
    loop.CheckpointError,
  ) as error:
    sys.exit(f"error: {error}")
  logging.info("results in %s: %s", os.path.join(workdir, "results.json"), summary.results)
  return 0


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  app.run(main)
