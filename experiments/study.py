r"""Runs a method's study: each arm through the training loop, then the method's report.

  python experiments/study.py --config=configs/quant_diffusion.py:study --workdir=runs/qdpm_study

Arm `a` runs in `<workdir>/<a>/` (and resumes there, like any training run). The study writes
`<workdir>/results.json` (summary, table rows, every arm's results), `<workdir>/results.md` (the table)
and one PNG per figure of the report.

Before the first arm runs, every arm's config is built and validated (the loop's checks and the
method's, which include its data paths and optional packages), so a study fails in seconds, naming the
arm and the field, rather than after hours of arms.

Large studies run as N processes (array-job tasks, hosts) on one shared workdir: `--shard=I/N` runs
the arms whose index is I modulo N, and `--report_only` assembles the report from the finished arms
(naming any that is missing). The process that finishes the last arm writes the report too.

  for i in 0 1 2 3; do python experiments/study.py --config=... --workdir=W --shard=$i/4 & done; wait
  sbatch --array=0-3 --wrap 'python experiments/study.py --config=... --workdir=W \
    --shard=$SLURM_ARRAY_TASK_ID/4'
  python experiments/study.py --config=... --workdir=W --report_only

An arm whose folder holds `results.json` for the same config is finished and is not run again. SIGTERM
(preemption) and SIGINT save the running arm where it is and exit 0 or 130 (`experiments/train.py`,
`experiments/stopping.py`); the same command resumes it.
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
  "config", None, "Path to configs/<method>.py:study.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Study folder; default runs/<method>/study.")
_SHARD = flags.DEFINE_string(
  "shard", "0/1", "I/N: run the arms whose index is I modulo N (N processes share one workdir)."
)
_REPORT_ONLY = flags.DEFINE_bool(
  "report_only", False, "Run no arm; write the report from the finished arms in --workdir."
)
flags.mark_flags_as_required(["config"])

_STOP_GRACE = flags.DEFINE_float(
  "stop_grace_s",
  20.0,
  "After SIGTERM/SIGINT, seconds to wait for the loop to save and stop before exiting anyway.",
)


def main(argv):
  del argv
  from experiments import loop, runtime, stopping
  from experiments.studies import StudyIncomplete, parse_shard, run_study

  runtime.setup()
  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join("runs", config.method, "study")
  try:
    shard = parse_shard(_SHARD.value)
  except ValueError as error:
    sys.exit(f"error: {error}")
  stop = stopping.StopSignals(_STOP_GRACE.value, loop.LAST_SAVED)
  try:
    payload = run_study(
      config,
      workdir,
      shard=shard,
      report_only=_REPORT_ONLY.value,
      should_stop=stop.should_stop,
    )
  except loop.Interrupted as interrupted:
    logging.info("%s", interrupted)
    return stop.exit_code()
  except (*loop.RUN_ERRORS, StudyIncomplete) as error:
    sys.exit(f"error: {error}")
  if payload is not None:
    logging.info("study summary: %s", payload["summary"])
  return 0


if __name__ == "__main__":
  app.run(main)
