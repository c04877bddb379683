"""Token-Guard's study: one arm per seed (world, training stream and model), every decoder side by
side in each arm; the table (mean ± std over seeds), the summary and the figure."""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np

from core.data import factual_world
from methods.base import Report, figure_grid, interval_cell, mean_std_cell, with_changes

AUROC_KEYS = ("auroc_token_score", "auroc_probability", "auroc_cosine", "auroc_segment_score")
AUROC_KEYS += ("auroc_chain_global",)
COLUMNS = (
  ("em", 100, "EM %"),
  ("f1", 100, "F1 %"),
  ("answered_hallucination_rate", 100, "halluc. of answered %"),
  ("false_abstention_rate", 100, "false abstention %"),
  ("answered_rate", 100, "answered %"),
  ("hallucination_rate", 100, "halluc. (abstaining counts as none) %"),
  ("counterfactual_hallucination_rate", 100, "halluc. cf %"),
  ("override_rate", 100, "override %"),
  ("misread_rate", 100, "misread %"),
  ("fabrication_rate", 100, "fabric. %"),
  ("unanswerable_rate", 100, "ans. unanswerable %"),
  ("step_hallucination_rate", 100, "step halluc. %"),
  ("abstention_accuracy", 100, "abstention acc. %"),
  ("forward_passes", 1, "fwd passes / q"),
  ("seconds_per_question", 1000, "ms / q"),
)


def study_arms(config: ml_collections.ConfigDict):
  return [
    (f"seed{seed}", with_changes(config, seed=seed, data__world_seed=seed))
    for seed in config.study.seeds
  ]


def _values(results, key):
  return [arm.get(key) for arm in results.values() if arm.get(key) is not None]


def _mean(results, key) -> float:
  values = _values(results, key)
  return float(np.mean(values)) if values else float("nan")


def _rows(config, results) -> list[dict]:
  rows = []
  for name in config.eval.decoders:
    row = {"decoder": name}
    for key, scale, label in COLUMNS:
      row[label] = mean_std_cell(_values(results, f"{key}_{name}"), scale, 1)
    rows.append(row)
  return rows


NO_ABSTAIN = "token_guard_no_abstain"  # the reduction vs greedy is measured with abstention off


def paired_interval(results, key: str, decoder: str, baseline: str = "greedy"):
  """Mean and 95% t-interval half-width over arms (seeds) of `key_<decoder> - key_<baseline>`."""
  from scipy import stats

  diffs = [
    arm[f"{key}_{decoder}"] - arm[f"{key}_{baseline}"]
    for arm in results.values()
    if arm.get(f"{key}_{decoder}") is not None and arm.get(f"{key}_{baseline}") is not None
  ]
  if not diffs:
    return float("nan"), float("nan")
  if len(diffs) < 2:
    return float(diffs[0]), float("nan")
  half = stats.t.ppf(0.975, len(diffs) - 1) * np.std(diffs, ddof=1) / np.sqrt(len(diffs))
  return float(np.mean(diffs)), float(half)


def _summary(config, results) -> dict:
  main = config.eval.main_decoder
  summary = {
    key: _mean(results, key)
    for key in ("answered_hallucination_rate", "f1", "false_abstention_rate", "em", "cost_ratio")
  }
  summary["time_ratio"] = _mean(results, "time_ratio")
  per_decoder = ("hallucination_rate", "answered_hallucination_rate", "false_abstention_rate")
  per_decoder += ("answered_rate", "em", "f1", "forward_passes", "step_hallucination_rate")
  for name in config.eval.decoders:
    for key in per_decoder:
      summary[f"{key}_{name}"] = _mean(results, f"{key}_{name}")
  extra = ("samples_correct_rate", "samples_any_correct_rate", "samples_best_global_correct_rate")
  extra += tuple(f"calibrated_{t}" for t in ("tau_token", "tau_low", "tau_high", "tau_global"))
  for key in AUROC_KEYS + extra:
    if _values(results, key):
      summary[key] = _mean(results, key)
  greedy = summary.get("hallucination_rate_greedy", float("nan"))
  no_abstain = summary.get(f"hallucination_rate_{NO_ABSTAIN}", float("nan"))
  summary["relative_hallucination_reduction_vs_greedy"] = (
    1 - no_abstain / greedy if greedy > 0 else float("nan")
  )
  if NO_ABSTAIN in config.eval.decoders:
    for key in ("hallucination_rate", "em", "f1"):
      mean, half = paired_interval(results, key, NO_ABSTAIN)
      summary[f"{key}_{NO_ABSTAIN}_minus_greedy"] = mean
      summary[f"{key}_{NO_ABSTAIN}_minus_greedy_ci95"] = half
  summary["main_decoder"] = main
  return summary


def _notes(config, results, summary) -> str:
  lines = [
    f"{len(results)} seed(s); cells are mean ± std over seeds. `always_abstain` is the trivial "
    "policy: a hallucination rate that counts abstentions as no hallucination is 0 for it, so "
    "read hallucination among answered questions beside F1 and the false abstention rate."
  ]
  if f"hallucination_rate_{NO_ABSTAIN}_minus_greedy" in summary:
    cells = []
    for key in ("hallucination_rate", "em", "f1"):
      mean = summary[f"{key}_{NO_ABSTAIN}_minus_greedy"]
      half = summary[f"{key}_{NO_ABSTAIN}_minus_greedy_ci95"]
      cells.append(f"{key} {interval_cell(100 * mean, 100 * half, 1)} points")
    lines.append(
      "Token-Guard with abstention forbidden minus greedy (mean ± 95% t-interval over seeds): "
      + ", ".join(cells)
      + "."
    )
  if "auroc_token_score" in summary:
    lines.append(
      "Token-score AUROC for flagging hallucinated object tokens: F_tok "
      f"{summary['auroc_token_score']:.3f}, probability alone {summary['auroc_probability']:.3f}, "
      f"cosine alone {summary['auroc_cosine']:.3f}, F_seg {summary['auroc_segment_score']:.3f}; "
      f"F_global for flagging hallucinated answers {summary.get('auroc_chain_global', float('nan')):.3f}."
    )
  if "samples_any_correct_rate" in summary:
    lines.append(
      "Headroom: a single answer sampled at T = 1 is correct "
      f"{100 * summary['samples_correct_rate']:.1f}% of the time, at least one of "
      f"{config.eval.analysis_samples} draws {100 * summary['samples_any_correct_rate']:.1f}%, "
      f"the draw with the highest F_global "
      f"{100 * summary.get('samples_best_global_correct_rate', float('nan')):.1f}%."
    )
  return "\n".join(lines)


def _figure(config, results):
  names = list(config.eval.decoders)
  fig, axes = figure_grid(1, 3, figsize=(15, 4.2))
  ax = axes[0, 0]
  bottom = np.zeros(len(names))
  for kind in factual_world.HALLUCINATION_TYPES:
    heights = np.array([100 * _mean(results, f"{kind}_rate_{n}") for n in names])
    ax.bar(range(len(names)), heights, bottom=bottom, label=kind)
    bottom += heights
  ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
  ax.set_ylabel("answers hallucinated (%)")
  ax.set_ylim(0, 1.3 * max(bottom.max(), 1.0))
  ax.set_title("answer hallucination by type")
  ax.legend(fontsize=7, ncol=2, loc="upper left")
  ax = axes[0, 1]
  passes = np.array([_mean(results, f"forward_passes_{n}") for n in names])
  halluc = np.array([100 * _mean(results, f"answered_hallucination_rate_{n}") for n in names])
  em = np.array([100 * _mean(results, f"f1_{n}") for n in names])
  points = ax.scatter(halluc, em, c=np.log10(np.maximum(passes, 1.0)), cmap="viridis", s=30)
  for index, n in enumerate(names):
    ax.annotate(
      n,
      (halluc[index], em[index]),
      fontsize=6,
      xytext=(3, 3 - 4 * (index % 3)),
      textcoords="offset points",
    )
  fig.colorbar(points, ax=ax, label="log10 forward passes / question")
  ax.set_xlabel("answered questions hallucinated (%)")
  ax.set_ylabel("F1 (%)")
  ax.set_title("F1 vs hallucination of answered (colour: cost)")
  ax = axes[0, 2]
  present = [k for k in AUROC_KEYS if _values(results, k)]
  ax.bar(range(len(present)), [_mean(results, k) for k in present], color="tab:purple")
  ax.axhline(0.5, color="gray", linestyle=":")
  labels = [k.removeprefix("auroc_") for k in present]
  ax.set_xticks(range(len(present)), labels, rotation=30, ha="right", fontsize=8)
  ax.set_ylim(0.0, 1.0)
  ax.set_title("AUROC flagging hallucinated tokens")
  fig.tight_layout()
  return fig


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  summary = _summary(config, results)
  rows = _rows(config, results)
  figures = {"token_guard_study": _figure(config, results)}
  return Report(rows=rows, summary=summary, figures=figures, notes=_notes(config, results, summary))
