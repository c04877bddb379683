"""LightCtrl's study: one run (its relight phase already evaluates every arm on the same clips and the
same trained networks); the report's table of the arms, its summary and the metrics figure."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from methods.base import Report
from methods.reports import figure_grid, mean_std_cell

COLUMNS = (
  ("psnr", "PSNR (dB)", 1.0, 2),
  ("ssim", "SSIM", 1.0, 3),
  ("light_following", "light following", 1.0, 3),
  ("psnr_light", "PSNR in light (dB)", 1.0, 2),
  ("source_leakage", "source leakage", 1.0, 3),
  ("flicker", "flicker x100", 100.0, 2),
  ("prompt_error", "prompt error", 1.0, 3),
)
FIGURE_METRICS = ("light_following", "source_leakage", "flicker", "prompt_error")


def study_arms(config):
  return [("lightctrl", config)]


def report(config, results: Mapping[str, Mapping]) -> Report:
  """Rows: each arm's metrics as mean ± std over clips; summary: the headline arm, the training
  losses and the orderings the paper claims; figure: per-arm bars with the clips as dots."""
  r = results["lightctrl"]
  arms = list(config.evaluation.arms)
  rows = []
  for arm in arms:
    row = {"arm": arm}
    for key, title, scale, digits in COLUMNS:
      row[title] = mean_std_cell(r[f"{arm}/{key}_per_clip"], scale, digits)
    rows.append(row)
  summary = {k: r[k] for k in ("psnr", "light_following", "source_leakage", "flicker")}
  for key in ("autoencoder_psnr", "relighter_validation_loss", "video_prior_validation_loss"):
    summary[key] = r[key]
  summary.update(_claims(r, arms))
  notes = (
    "Mean ± std over the evaluation clips (the paper's six trajectories, prompts cycled). "
    "relit_frames.png in the run's folder shows one clip per arm frame by frame."
  )
  return Report(
    rows=rows, summary=summary, figures={"lightctrl_study": _figure(arms, r)}, notes=notes
  )


def _claims(r, arms) -> dict:
  """The paper's qualitative claims as comparisons of means (only where both arms ran)."""
  m = lambda arm, key: r[f"{arm}/{key}"]
  checks = {
    "per_frame_flickers_more_than_lav": ("per_frame", "lav_traj", "flicker", ">"),
    "lmi_raises_following": ("lightctrl", "lightctrl_no_lmi", "light_following", ">"),
    "gar_lowers_leakage": ("lightctrl", "lightctrl_no_gar", "source_leakage", "<"),
    "lightctrl_follows_better_than_lav": ("lightctrl", "lav_traj", "light_following", ">"),
  }
  out = {}
  for name, (a, b, key, sign) in checks.items():
    if a in arms and b in arms:
      out[name] = bool(m(a, key) > m(b, key)) if sign == ">" else bool(m(a, key) < m(b, key))
  return out


def _figure(arms, r):
  fig, (axes,) = figure_grid(1, len(FIGURE_METRICS), panel_size=(3.6, 3.4))
  x = np.arange(len(arms))
  for ax, key in zip(axes, FIGURE_METRICS, strict=True):
    means = [r[f"{arm}/{key}"] for arm in arms]
    ax.bar(x, means, color=["C3" if a == "lightctrl" else "C0" for a in arms], alpha=0.7)
    for i, arm in enumerate(arms):
      values = np.asarray(r[f"{arm}/{key}_per_clip"], float)
      ax.plot(np.full(values.shape, i), values, ".", color="k", ms=3)
    ax.set_xticks(x)
    ax.set_xticklabels(arms, rotation=70, fontsize=7, ha="right")
    ax.set_title(key)
  fig.tight_layout()
  return fig
