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
(preemption) saves the running arm at its current step and exits 0; the same command resumes it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from absl import app, flags, logging
from ml_collections import config_flags

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

_PREEMPTED = threading.Event()


class StudyIncomplete(ValueError):
  """The report needs arms that have not finished."""


def parse_shard(text: str) -> tuple[int, int]:
  """`"I/N"` -> (I, N) with 0 <= I < N."""
  try:
    index, count = (int(part) for part in text.split("/"))
  except ValueError:
    index = count = -1
  if not 0 <= index < count:
    raise ValueError(f"--shard must be I/N with 0 <= I < N, got {text!r}")
  return index, count


def run_study(
  config,
  workdir: str,
  *,
  shard: tuple[int, int] = (0, 1),
  report_only: bool = False,
  should_stop=lambda phase, step: False,
) -> dict | None:
  """Runs this shard's unfinished arms of `config`'s study, then writes the report if every arm has
  finished; returns the results.json payload, or None while other shards' arms are outstanding.

  Raises `loop.Interrupted` when `should_stop` stopped an arm (saved, resumable), and
  `StudyIncomplete` naming the missing arms with `report_only`."""
  import methods
  from experiments import loop, reports

  method = methods.get_method(config.method)
  if method.study_arms is None or method.report is None:
    raise loop.ConfigError(f"config.method: {config.method!r} defines no study")
  arms = list(method.study_arms(config))
  check_arms(arms)
  index, count = shard
  results = {}
  if not report_only:
    for position, (name, arm_config) in enumerate(arms):
      if position % count != index:
        continue
      arm_dir = os.path.join(workdir, name)
      if finished_results(arm_config, arm_dir) is not None:
        logging.info("study arm %d/%d: %s finished earlier", position + 1, len(arms), name)
        continue
      logging.info("study arm %d/%d: %s", position + 1, len(arms), name)
      # keys sorted as in the arm's results.json, so a report reads the same from memory or disk
      results[name] = dict(
        sorted(loop.run(arm_config, arm_dir, should_stop=should_stop).results.items())
      )
  for name, arm_config in arms:
    if name not in results:
      results[name] = finished_results(arm_config, os.path.join(workdir, name))
  missing = [name for name, _ in arms if results[name] is None]
  if missing:
    if report_only:
      raise StudyIncomplete(
        f"study arms not finished in {workdir}: {', '.join(missing)}; run them with "
        "--shard=I/N (or without --report_only) first"
      )
    logging.info("%d arms of other shards outstanding; no report yet", len(missing))
    return None
  results = {name: results[name] for name, _ in arms}
  return reports.write_report(workdir, method.report(config, results), results)


def finished_results(arm_config, arm_dir: str) -> dict | None:
  """The arm's results if `arm_dir` holds a finished run of exactly `arm_config`, else None."""
  results_path, config_path = (os.path.join(arm_dir, f) for f in ("results.json", "config.json"))
  if not (os.path.exists(results_path) and os.path.exists(config_path)):
    return None
  with open(config_path) as f:
    if json.load(f) != json.loads(arm_config.to_json()):
      return None
  with open(results_path) as f:
    return json.load(f)


def check_arms(arms) -> None:
  """Raises `ConfigError("study arm '<name>': config.<field>: ...")` for the first arm that cannot run
  (or a repeated arm name), before any arm has run."""
  from experiments import loop
  from experiments import sharding as sharding_lib

  names = [name for name, _ in arms]
  repeated = sorted({name for name in names if names.count(name) > 1})
  if repeated:
    raise loop.ConfigError(f"study arms: names {repeated} are used more than once")
  for name, arm_config in arms:
    try:
      mesh = sharding_lib.make_mesh(arm_config.get("mesh", sharding_lib.DEFAULT_MESH))
      loop.validate(arm_config, sharding_lib.data_size(mesh))
    except (loop.ConfigError, sharding_lib.MeshError) as error:
      raise loop.ConfigError(f"study arm {name!r}: {error}") from None


def main(argv):
  del argv
  from experiments import loop, runtime

  runtime.setup()
  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join("runs", config.method, "study")
  try:
    shard = parse_shard(_SHARD.value)
  except ValueError as error:
    sys.exit(f"error: {error}")
  signal.signal(signal.SIGTERM, lambda *_: _PREEMPTED.set())
  try:
    payload = run_study(
      config,
      workdir,
      shard=shard,
      report_only=_REPORT_ONLY.value,
      should_stop=lambda phase, step: _PREEMPTED.is_set(),
    )
  except loop.Interrupted as stop:
    logging.info("%s", stop)
    return 0
  except (*loop.RUN_ERRORS, StudyIncomplete) as error:
    sys.exit(f"error: {error}")
  if payload is not None:
    logging.info("study summary: %s", payload["summary"])
  return 0


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  app.run(main)
