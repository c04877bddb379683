"""LightCtrl's study: one run per seed of `study.seeds` (each run's relight phase evaluates every arm on
the same clips and the same trained networks; a seed changes the training data, the initialisation
and the evaluation clips); the report's table of the arms with intervals over seeds, the paper's
claims as paired differences with intervals, and the metrics figure."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy import stats

from methods.base import Report, figure_grid, interval_cell, with_changes

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
# the paper's comparisons: (claim, arm a, arm b, metric, sign of a - b the paper expects)
CLAIMS = (
  ("per_frame_flickers_more_than_lav", "per_frame", "lav_traj", "flicker", +1),
  ("lav_follows_better_than_per_frame", "lav_traj", "per_frame", "light_following", +1),
  ("lightctrl_follows_better_than_per_frame", "lightctrl", "per_frame", "light_following", +1),
  ("lightctrl_follows_better_than_lav", "lightctrl", "lav_traj", "light_following", +1),
  ("lmi_raises_following", "lightctrl", "lightctrl_no_lmi", "light_following", +1),
  ("gar_lowers_leakage", "lightctrl", "lightctrl_no_gar", "source_leakage", -1),
  ("lightctrl_prompt_error_below_source", "lightctrl", "source", "prompt_error", -1),
)


def study_arms(config):
  return [(f"seed_{s}", with_changes(config, seed=int(s))) for s in config.study.seeds]


def t_interval(values) -> tuple[float, float]:
  """Mean and the half-width of its 95% Student-t interval (0 for a single value)."""
  values = np.asarray(values, np.float64)
  if values.size < 2:
    return float(values.mean()), 0.0
  half = stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
  return float(values.mean()), float(half)


def per_seed(results: Mapping[str, Mapping], arm: str, key: str) -> np.ndarray:
  """The clip mean of `arm`'s `key` in every seed's run."""
  return np.array([r[f"{arm}/{key}"] for r in results.values()], np.float64)


def claim_checks(results: Mapping[str, Mapping], arms) -> dict:
  """Each claim as the paired difference a - b over seeds: its mean, interval and verdict
  ("holds" when the interval excludes 0 on the paper's side, "reversed" on the other side, else
  "unresolved"); with one seed the verdict is the sign of the difference."""
  out = {}
  for name, a, b, key, sign in CLAIMS:
    if a not in arms or b not in arms:
      continue
    mean, half = t_interval(per_seed(results, a, key) - per_seed(results, b, key))
    if sign * mean - half > 0:
      verdict = "holds"
    elif sign * mean + half < 0:
      verdict = "reversed"
    else:
      verdict = "unresolved"
    out[f"{name}/difference"] = mean
    out[f"{name}/half_width"] = half
    out[f"{name}/verdict"] = verdict
  return out


def report(config, results: Mapping[str, Mapping]) -> Report:
  """Rows: each arm's metrics as the mean over seeds of the clip means ± the 95% interval over
  seeds; summary: the headline arm, the training losses and the paper's claims with verdicts;
  figure: per-arm bars with the seeds as dots."""
  arms = list(config.evaluation.arms)
  rows = []
  for arm in arms:
    row = {"arm": arm}
    for key, title, scale, digits in COLUMNS:
      mean, half = t_interval(scale * per_seed(results, arm, key))
      row[title] = interval_cell(mean, half, digits)
    rows.append(row)
  summary = {}
  for key in ("psnr", "light_following", "source_leakage", "flicker", "prompt_error"):
    summary[key] = float(np.mean([r[key] for r in results.values()]))
  for key in ("autoencoder_psnr", "relighter_validation_loss", "video_prior_validation_loss"):
    if all(key in r for r in results.values()):
      summary[key] = float(np.mean([r[key] for r in results.values()]))
  summary.update(claim_checks(results, arms))
  notes = (
    f"Mean over {len(results)} seeds ({', '.join(results)}) of each run's clip mean ± the half-width "
    f"of the 95% t-interval over seeds; {config.evaluation.num_clips} clips per seed covering the six "
    "trajectories and the three prompts round-robin. The `source` row is the trivial policy (the "
    "input unchanged). relit_frames.png in each seed's folder shows one clip per arm."
  )
  return Report(
    rows=rows, summary=summary, figures={"lightctrl_study": _figure(arms, results)}, notes=notes
  )


def _figure(arms, results):
  fig, (axes,) = figure_grid(1, len(FIGURE_METRICS), panel_size=(3.6, 3.4))
  x = np.arange(len(arms))
  for ax, key in zip(axes, FIGURE_METRICS, strict=True):
    seeds = np.stack([per_seed(results, arm, key) for arm in arms])  # (arms, seeds)
    ax.bar(
      x, seeds.mean(axis=1), color=["C3" if a == "lightctrl" else "C0" for a in arms], alpha=0.7
    )
    for i in range(len(arms)):
      ax.plot(np.full(seeds.shape[1], i), seeds[i], ".", color="k", ms=4)
    ax.set_xticks(x)
    ax.set_xticklabels(arms, rotation=70, fontsize=7, ha="right")
    ax.set_title(f"{key} (dots: seeds)")
  fig.tight_layout()
  return fig
