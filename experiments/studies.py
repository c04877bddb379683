"""The study runner's library: run a study's arms (all, or one shard of them) and assemble its report.

`experiments/study.py` is the command line around it; see its docstring for sharding, resuming and
`--report_only`. No absl flags here, so tests and other scripts can import it.
"""

from __future__ import annotations

import json
import os

from absl import logging


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
