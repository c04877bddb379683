"""Writes a study's report (results.json, results.md with a Markdown table) and the artifacts of runs and
studies: PNG figures, WAV examples, GIF clips."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from core.data import gif, wav
from experiments.metrics import to_json_number
from methods.base import Report


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Rows of equal keys as a Markdown table; floats to 4 significant digits."""
  if not rows:
    return "(no rows)\n"
  columns = list(rows[0])
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def mean_std_cell(values, scale: float = 1.0, digits: int = 1) -> str:
  """`"m ± s"`: mean and population std of `values` times `scale`; missing (None) values are skipped,
  and "-" stands for none at all."""
  values = [scale * v for v in values if v is not None]
  if not values:
    return "-"
  return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def interval_cell(mean: float, half_width: float, digits: int = 3) -> str:
  """`"m ± h"` for an estimate and the half-width of its interval."""
  return f"{mean:.{digits}f} ± {half_width:.{digits}f}"


def figure_grid(rows: int = 1, cols: int = 1, panel_size=(5.0, 3.5), **subplots_kw):
  """A matplotlib figure (non-interactive backend) and its axes as a `[rows, cols]` array; each panel
  `panel_size` inches unless `figsize` is given."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  subplots_kw.setdefault("figsize", (panel_size[0] * cols, panel_size[1] * rows))
  return plt.subplots(rows, cols, squeeze=False, **subplots_kw)


def _cell(value) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return "" if value is None else str(value)


def _json_default(value):
  if hasattr(value, "item"):
    return value.item()
  return to_json_number(value)


def write_report(
  workdir: str, report: Report, arm_results: Mapping[str, Mapping[str, float]]
) -> dict:
  os.makedirs(workdir, exist_ok=True)
  payload = {"summary": dict(report.summary), "rows": list(report.rows), "arms": dict(arm_results)}
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(payload, f, indent=2, default=_json_default)
  summary = "\n".join(f"- {k}: {_cell(v)}" for k, v in report.summary.items())
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(
      markdown_table(report.rows)
      + "\n"
      + summary
      + "\n"
      + (f"\n{report.notes}\n" if report.notes else "")
    )
  for stem, artifact in report.figures.items():
    write_artifact(workdir, stem, artifact)
  return payload


def write_artifact(workdir: str, stem: str, artifact) -> None:
  """A figure (anything with `savefig`) or an image array as `<stem>.png`; `AudioExamples` as WAV files
  and `VideoClips` as GIFs in `<stem>/`."""
  if isinstance(artifact, wav.AudioExamples):
    folder = os.path.join(workdir, stem)
    wav.write_examples(folder, artifact.sample_rate, artifact.waveforms, artifact.count)
    logging.info("wrote %s", folder)
    return
  if isinstance(artifact, gif.VideoClips):
    folder = os.path.join(workdir, stem)
    gif.write_clips(folder, artifact)
    logging.info("wrote %s", folder)
    return
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  path = os.path.join(workdir, f"{stem}.png")
  if hasattr(artifact, "savefig"):
    artifact.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(artifact)  # pyplot keeps every open figure alive
  else:
    plt.imsave(path, np.asarray(artifact), cmap="gray")
  logging.info("wrote %s", path)
