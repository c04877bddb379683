"""QDPM's studies: QDPM vs the VDM-style discrete model vs the dequantized model on digits, and every
estimate of the bound against the entropy on data of known entropy."""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np

from methods.base import (
  Report,
  figure_grid,
  with_changes,
)
from methods.quant_diffusion.phases import KINDS

# ---------------------------------------------------------------------------------------------------
# Study: QDPM vs the VDM-style discrete model vs the dequantized model, same data and backbone
# ---------------------------------------------------------------------------------------------------


def study_arms(config: ml_collections.ConfigDict):
  """QDPM, the VDM-style discrete model and the dequantized model on the same data and backbone,
  plus the discrete baseline at each extra truncation time in `config.study.vdm_t_mins`; with
  `config.study.sources`, the three models on each known-entropy source instead (`<source>_<kind>`)."""
  if config.study.sources:
    return [
      (
        f"{source}_{kind}",
        with_changes(config, data__name=source, model__kind=kind),
      )
      for source in config.study.sources
      for kind in KINDS
    ]
  arms = []
  for kind in KINDS:
    arm = ml_collections.ConfigDict(config.to_dict())
    arm.model.kind = kind
    arms.append((kind, arm))
  for t_min in config.study.vdm_t_mins:
    arm = ml_collections.ConfigDict(config.to_dict())
    arm.model.kind, arm.model.t_min = "vdm", t_min
    arms.append((f"vdm_t_min={t_min:g}", arm))
  return arms


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  if config.study.sources:
    return entropy_report(config, results)
  rows = [
    {
      "model": kind,
      "test_bpd": r["test_bpd"],
      "test_bpd_stderr": r["test_bpd_stderr"],
      "train_bpd": r["train_bpd"],
      "null_bpd": r["null_bpd"],
      "on_grid_fraction": r["on_grid_fraction"],
      "on_grid_fraction_before_t0": r["on_grid_fraction_before_t0"],
    }
    for kind, r in results.items()
  ]
  bpd = {kind: r["test_bpd"] for kind, r in results.items()}
  summary = {
    "qdpm_below_vdm": bpd["qdpm"] < bpd["vdm"],
    "vdm_below_dequantized": bpd["vdm"] < bpd["dequantized"],
    "qdpm_on_grid_fraction": results["qdpm"]["on_grid_fraction"],
    "qdpm_solver2_on_grid_fraction": results["qdpm"].get("on_grid_fraction_solver2"),
    "qdpm_test_bpd_monte_carlo_C": results["qdpm"].get("test_bpd_monte_carlo_C"),
    "log2_num_levels": results["qdpm"]["log2_num_levels"],
    "memorization_floor_bpd": results["qdpm"]["memorization_floor_bpd"],
  }
  fig, (axes,) = figure_grid(1, 2, figsize=(9, 3.5))
  kinds = list(results)
  axes[0].bar(
    kinds,
    [bpd[k] for k in kinds],
    yerr=[results[k]["test_bpd_stderr"] for k in kinds],
    color="C0",
  )
  axes[0].axhline(summary["log2_num_levels"], color="gray", ls="--", label="null model (log2 K)")
  axes[0].set_ylabel("test bits / dim (+- s.e.)")
  axes[1].bar(kinds, [results[k]["on_grid_fraction"] for k in kinds], color="C1")
  axes[1].set_ylabel("sample coordinates on the grid")
  axes[1].set_ylim(0, 1.05)
  for ax in axes:
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_xlabel("model")
  axes[0].legend(loc="lower right")
  fig.tight_layout()
  return Report(rows=rows, summary=summary, figures={"bpd_and_on_grid": fig})


# ---------------------------------------------------------------------------------------------------
# Study on data of known entropy: is the bound a bound?
# ---------------------------------------------------------------------------------------------------

# (label, arm kind, result prefix): every estimate of the test bound against the entropy
ENTROPY_ESTIMATES = (
  ("null model (delta_hat = 0)", "qdpm", "null_bpd"),
  ("closed-form denoiser, analytic C", "qdpm", "oracle_bpd"),
  ("closed-form denoiser, C sampled in log t", "qdpm", "oracle_bpd_importance_C"),
  ("closed-form denoiser, plain Monte-Carlo C", "qdpm", "oracle_bpd_monte_carlo_C"),
  ("QDPM, analytic C", "qdpm", "test_bpd"),
  ("QDPM, analytic C, theta sampled in log t", "qdpm", "test_bpd_log_t"),
  ("QDPM, C sampled in log t", "qdpm", "test_bpd_importance_C"),
  ("QDPM, plain Monte-Carlo C", "qdpm", "test_bpd_monte_carlo_C"),
  ("VDM-style discrete", "vdm", "test_bpd"),
  ("dequantized", "dequantized", "test_bpd"),
)


def entropy_rows(config, results: Mapping[str, Mapping[str, float]]) -> list[dict]:
  """One row per source and estimate: bpd, the signed gap to the entropy, both with standard errors;
  for plain Monte-Carlo C also how many of the independent repeats fall below the entropy by more
  than 3 of their own standard errors."""
  rows = []
  for source in config.study.sources:
    for label, kind, prefix in ENTROPY_ESTIMATES:
      r = results[f"{source}_{kind}"]
      gap, gap_se = r[f"{prefix}_gap"], r[f"{prefix}_gap_stderr"]
      row = {
        "source": source,
        "entropy_bpd": r["entropy_bpd"],
        "estimate": label if kind != "vdm" else f"{label} (t_min = {config.model.t_min:g})",
        "bpd": r[f"{prefix}_mean"],
        "stderr": r[f"{prefix}_stderr"],
        "gap": gap,
        "gap_stderr": gap_se,
        "gap_in_stderr": gap / gap_se if gap_se > 0 else float("nan"),
        "below_entropy_beyond_3se": bool(gap < -3 * gap_se),
        "repeats_below_entropy_beyond_3se": "",
      }
      repeats = r.get(f"{prefix}_repeats_gap")
      if repeats is not None:
        below = np.asarray(repeats) < -3 * np.asarray(r[f"{prefix}_repeats_gap_stderr"])
        row["repeats_below_entropy_beyond_3se"] = f"{int(below.sum())}/{len(below)}"
      rows.append(row)
  return rows


def entropy_report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  """Table and figure of every estimate against the exact entropy, per known-entropy source."""
  rows = entropy_rows(config, results)
  summary = {}
  for source in config.study.sources:
    r = results[f"{source}_qdpm"]
    summary[source] = {
      "entropy_bpd": r["entropy_bpd"],
      "log2_num_levels": r["log2_num_levels"],
      "importance_sampled_C_bpd": r["importance_sampled_C_mean"],
      "importance_sampled_C_stderr": r["importance_sampled_C_stderr"],
      "below_entropy_beyond_3se": [
        row["estimate"]
        for row in rows
        if row["source"] == source and row["below_entropy_beyond_3se"]
      ],
      "monte_carlo_C_repeat_gaps": {
        "qdpm": [float(g) for g in r["test_bpd_monte_carlo_C_repeats_gap"]],
        "closed_form": [float(g) for g in r["oracle_bpd_monte_carlo_C_repeats_gap"]],
      },
    }
  return Report(
    rows=rows,
    summary=summary,
    figures={"entropy_gaps": _entropy_figure(config, rows, results)},
  )


def _entropy_figure(config, rows, results):
  """Top: each estimate +- 3 s.e. against the entropy (dashed) and log2 K (dotted); bottom: the
  signed gap to the entropy +- 3 s.e.; grey dots: the independent plain Monte-Carlo repeats."""
  sources = list(config.study.sources)
  fig, axes = figure_grid(2, len(sources), figsize=(6.5 * len(sources), 8))
  labels = [row["estimate"] for row in rows if row["source"] == sources[0]]
  y = np.arange(len(labels))[::-1]
  for col, source in enumerate(sources):
    mine = [row for row in rows if row["source"] == source]
    top, bottom = axes[0][col], axes[1][col]
    for ax, key, ref in (
      (top, "bpd", mine[0]["entropy_bpd"]),
      (bottom, "gap", 0.0),
    ):
      colors = ["C3" if row["below_entropy_beyond_3se"] else "C0" for row in mine]
      err = [3 * row["stderr" if key == "bpd" else "gap_stderr"] for row in mine]
      for yi, row, c, e in zip(y, mine, colors, err, strict=True):
        ax.errorbar(row[key], yi, xerr=e, fmt="o", color=c, capsize=3)
      ax.axvline(ref, color="k", ls="--", lw=1, label="entropy" if key == "bpd" else None)
      ax.set_yticks(y)
      ax.set_yticklabels(labels if col == 0 else [""] * len(labels), fontsize=8)
    r = results[f"{source}_qdpm"]
    top.axvline(r["log2_num_levels"], color="gray", ls=":", lw=1, label="log2 K")
    for prefix in ("oracle_bpd_monte_carlo_C", "test_bpd_monte_carlo_C"):
      yi = y[[p for _, _, p in ENTROPY_ESTIMATES].index(prefix)]
      gaps = np.asarray(r[f"{prefix}_repeats_gap"])
      bottom.scatter(gaps, np.full(len(gaps), yi - 0.25), s=8, color="gray", zorder=3)
    top.set_title(f"{source}: entropy {mine[0]['entropy_bpd']:.3f} bits/dim")
    top.set_xlabel("test bits / dim (+- 3 s.e.)")
    bottom.set_xlabel("bound - entropy, bits / dim (+- 3 s.e.; grey: MC repeats)")
    top.legend(fontsize=8)
  fig.tight_layout()
  return fig
