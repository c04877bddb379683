"""What a study's report is made of: Markdown tables, table cells and matplotlib figure grids.

Methods build their `methods.base.Report` (rows, summary, figures) with these; writing the report and
its figures to files is the launcher's (`experiments/reports.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Rows of equal keys as a Markdown table; floats to 4 significant digits."""
  if not rows:
    return "(no rows)\n"
  columns = list(rows[0])
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(format_cell(row.get(c)) for c in columns) + " |" for row in rows]
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


def format_cell(value) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return "" if value is None else str(value)
