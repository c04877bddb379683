"""MARC's study: one arm per seed, every zero-shot arm and trained student evaluated inside each;
the table (accuracy per question type, visual tokens), the summary and the figure (accuracy per arm
and type, reward curves, the tau sweep, tokens / FLOPs / latency)."""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np

from core.data import eventworld
from methods.base import Report, figure_grid, mean_std_cell, with_changes
from methods.marc.evaluation import arms_of, main_arm
from methods.marc.inputs import tokens_per_frame

SUMMARY_KEYS = (
  "accuracy",
  "teacher_accuracy",
  "blind_accuracy",
  "segmentation_exact_train",
  "retrieval_recall_true_cuts",
  "token_ratio",
  "latency_ratio",
  "end_to_end_latency_ratio",
  "flops_ratio",
  "segmentation_exact",
  "retrieval_recall",
  "retrieval_hit_local",
)
TAU_ARMS = {"marc_tau04": 0.4, "marc": 0.6, "marc_tau08": 0.8}


def study_arms(config: ml_collections.ConfigDict):
  return [(f"seed{seed}", with_changes(config, seed=seed)) for seed in config.study.seeds]


def _values(results, key):
  return [arm[key] for arm in results.values() if isinstance(arm.get(key), (int, float))]


def _mean(results, key) -> float:
  values = _values(results, key)
  return float(np.mean(values)) if values else float("nan")


def _above_floor(results, name) -> list[float]:
  """(accuracy - blind floor) / (1 - floor) of each seed: 0 at the floor, 1 at a perfect score."""
  pairs = [(arm.get(f"accuracy_{name}"), arm.get("blind_accuracy")) for arm in results.values()]
  return [(acc - floor) / (1.0 - floor) for acc, floor in pairs if None not in (acc, floor)]


def _rows(config, results) -> list[dict]:
  rows = []
  inputs = {"blind": "no video: each type's majority answer", **arms_of(config)}
  for name in inputs:
    row = {"arm": name, "input": inputs[name]}
    row["accuracy %"] = mean_std_cell(_values(results, f"accuracy_{name}"), 100, 1)
    row["above floor %"] = mean_std_cell(_above_floor(results, name), 100, 1)
    for kind in eventworld.QUESTION_TYPES:
      row[f"{kind} %"] = mean_std_cell(_values(results, f"accuracy_{name}_{kind}"), 100, 1)
    row["format %"] = mean_std_cell(_values(results, f"format_{name}"), 100, 1)
    row["visual tokens"] = mean_std_cell(_values(results, f"visual_tokens_{name}"), 1, 1)
    rows.append(row)
  return rows


def _summary(config, results) -> dict:
  summary = {key: _mean(results, key) for key in SUMMARY_KEYS}
  for name in arms_of(config):
    summary[f"accuracy_{name}"] = _mean(results, f"accuracy_{name}")
  local = [f"accuracy_{{}}_{eventworld.QUESTION_TYPES[i]}" for i in eventworld.LOCAL_TYPES]
  for name in ("teacher_full", main_arm(config)):
    summary[f"local_accuracy_{name}"] = float(
      np.mean([_mean(results, key.format(name)) for key in local])
    )
  for name in ("teacher_full", main_arm(config)):
    summary[f"above_floor_{name}"] = float(np.mean(_above_floor(results, name)))
  for k in config.eval.top_k_sweep:
    for key in (f"accuracy_teacher_vmr_k{k}", f"retrieval_recall_k{k}"):
      summary[key] = _mean(results, key)
  summary["main_arm"] = main_arm(config)
  return summary


def _figure(config, results):
  names = ["blind", *arms_of(config)]
  fig, axes = figure_grid(1, 4, panel_size=(5.2, 3.8))
  ax = axes[0, 0]
  width = 0.8 / len(eventworld.QUESTION_TYPES)
  for i, kind in enumerate(eventworld.QUESTION_TYPES):
    heights = [100 * _mean(results, f"accuracy_{n}_{kind}") for n in names]
    ax.bar(np.arange(len(names)) + (i - 2) * width, heights, width, label=kind)
  ax.scatter(
    range(len(names)),
    [100 * _mean(results, f"accuracy_{n}") for n in names],
    color="black",
    marker="_",
    s=200,
    zorder=3,
    label="all",
  )
  ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
  ax.set_ylabel("test accuracy (%)")
  ax.set_title("accuracy per arm and question type")
  ax.legend(fontsize=6, ncol=2)
  ax = axes[0, 1]
  for name in config.students:
    curves = [arm.get(f"{name}_reward_curve") for arm in results.values()]
    curves = [np.asarray(c) for c in curves if c is not None]
    if curves:
      mean = np.mean(curves, 0)
      smooth = np.convolve(mean, np.ones(10) / 10, mode="valid")
      ax.plot(smooth, label=name)
  ax.set_xlabel("RL step")
  ax.set_ylabel("mean reward R (10-step average)")
  ax.set_title("C-GRPO / GRPO reward curves")
  ax.legend(fontsize=7)
  ax = axes[0, 2]
  taus = [(tau, name) for name, tau in TAU_ARMS.items() if name in config.students]
  if taus:
    ax.plot(
      [t for t, _ in taus],
      [100 * _mean(results, f"accuracy_{n}") for _, n in taus],
      "o-",
      label="MARC (all types)",
    )
    local = [f"accuracy_{{}}_{eventworld.QUESTION_TYPES[i]}" for i in eventworld.LOCAL_TYPES]
    ax.plot(
      [t for t, _ in taus],
      [100 * np.mean([_mean(results, k.format(n)) for k in local]) for _, n in taus],
      "s--",
      label="MARC (local types)",
    )
    ax.axhline(
      100 * _mean(results, "accuracy_teacher_full"),
      color="gray",
      ls=":",
      label="teacher, full input",
    )
    ax.legend(fontsize=7)
  ax.set_xlabel("tau")
  ax.set_ylabel("test accuracy (%)")
  ax.set_title("tau sweep")
  ax = axes[0, 3]
  labels = ["visual tokens", "prefill FLOPs", "decoder latency", "end-to-end latency"]
  keys = ["token_ratio", "flops_ratio", "latency_ratio", "end_to_end_latency_ratio"]
  ax.bar(range(4), [100 * _mean(results, k) for k in keys], color="tab:purple")
  ax.axhline(100, color="gray", ls=":")
  ax.set_xticks(range(4), labels, rotation=30, ha="right", fontsize=8)
  ax.set_ylabel("% of the full-input teacher")
  ax.set_title(f"cost of {main_arm(config)} vs full input")
  fig.tight_layout()
  return fig


def _notes(config, results, summary) -> str:
  return (
    f"{len(results)} seed(s); cells are mean ± std over seeds. Visual tokens of the full "
    f"input: {config.data.num_frames * tokens_per_frame(config)}; budget "
    f"{config.compress.budget} frames. Retriever: "
    f"segmentation exact on {100 * summary['segmentation_exact']:.1f}% of videos, recall of the "
    f"relevant frames {100 * summary['retrieval_recall']:.1f}%."
  )


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  summary = _summary(config, results)
  return Report(
    rows=_rows(config, results),
    summary=summary,
    figures={"marc_study": _figure(config, results)},
    notes=_notes(config, results, summary),
  )
