"""Writes a study's report (results.json, results.md with a Markdown table) and the artifacts of runs and
studies: PNG figures, WAV examples, GIF clips. The report's tables and figures are built with
the helpers of `methods/base.py`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np
from absl import logging

from core.data import gif, wav
from experiments.metrics import to_json_number
from methods.base import Report, format_cell, markdown_table


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
  summary = "\n".join(f"- {k}: {format_cell(v)}" for k, v in report.summary.items())
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
