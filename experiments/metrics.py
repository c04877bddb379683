"""Metrics to the workdir: `metrics.jsonl` (one JSON object per line) and TensorBoard event files."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence


def to_json_number(value):
  value = float(value)
  return value if math.isfinite(value) else str(value)


class MetricWriter:
  """Appends `{"phase", "step", **metrics}` rows; a no-op on processes other than 0."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tensorboard = None
    if enabled:
      from tensorboardX import SummaryWriter

      self._tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, phase: str, step: int, metrics: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    row = {"phase": phase, "step": int(step), **{k: to_json_number(v) for k, v in metrics.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    for name, value in metrics.items():
      self._tensorboard.add_scalar(f"{phase}/{name}", float(value), int(step))

  def truncate_after(self, phases_done: Sequence[str], phase: str, step: int) -> None:
    """Drops rows a resumed run will write again: those of `phase` after `step` and of later phases."""
    if not self.enabled or not os.path.exists(self.path):
      return
    with open(self.path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    keep = [
      r
      for r in rows
      if r.get("phase") in phases_done or (r.get("phase") == phase and r["step"] <= step)
    ]
    with open(self.path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in keep)

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()
