r"""Runs a method's study: each arm through the training loop, then the method's report.

  python experiments/study.py --config=configs/quant_diffusion.py:study --workdir=runs/qdpm_study

Arm `a` runs in `<workdir>/<a>/` (and resumes there, like any training run). The study writes
`<workdir>/results.json` (summary, table rows, every arm's results), `<workdir>/results.md` (the table)
and one PNG per figure of the report.

Before the first arm runs, every arm's config is built and validated (the loop's checks and the
method's, which include its data paths and optional packages), so a study fails in seconds, naming the
arm and the field, rather than after hours of arms.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Path to configs/<method>.py:study.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Study folder; default runs/<method>/study.")
flags.mark_flags_as_required(["config"])


def run_study(config, workdir: str) -> dict:
  """Runs every arm of `config`'s study and writes the report; returns the results.json payload."""
  import methods
  from experiments import loop, reports

  method = methods.get_method(config.method)
  if method.study_arms is None or method.report is None:
    raise loop.ConfigError(f"config.method: {config.method!r} defines no study")
  arms = list(method.study_arms(config))
  check_arms(arms)
  results = {}
  for index, (name, arm_config) in enumerate(arms):
    logging.info("study arm %d/%d: %s", index + 1, len(arms), name)
    results[name] = loop.run(arm_config, os.path.join(workdir, name)).results
  return reports.write_report(workdir, method.report(config, results), results)


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
    payload = run_study(config, workdir)
  except loop.RUN_ERRORS as error:
    sys.exit(f"error: {error}")
  logging.info("study summary: %s", payload["summary"])


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  app.run(main)
