"""The W2S study: E1 as one vectorised arm, the classification tasks per (eta_l, eta_u) setting, and
the report (the paper's two claims: the gain falls with (eta_u - eta_l)^2 and can turn negative, and
Enhanced-W2S helps most when eta_u != eta_l)."""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np

from methods.base import Report, figure_grid, interval_cell
from methods.w2s.regression import ETA_T_LABELS, _key

# ---------------------------------------------------------------------------------------------------
# Arms
# ---------------------------------------------------------------------------------------------------


def _setting_name(task: str, eta_l: float, eta_u: float) -> str:
  return f"{task}_l{eta_l:g}_u{eta_u:g}"


def study_arms(config: ml_collections.ConfigDict):
  """`e1` (the regression grid) if `study.regression`, then one arm per (eta_l, eta_u) of
  `study.settings` for each task of `study.tasks`, with that task's `study.overrides` applied."""
  arms = []
  if config.study.regression:
    arm = ml_collections.ConfigDict(config.to_dict())
    arm.task = "regression"
    arms.append(("e1", arm))
  for task in config.study.tasks:
    for eta_l, eta_u in config.study.settings:
      arm = ml_collections.ConfigDict(config.to_dict())
      arm.task = task
      if task in config.study.overrides:
        arm.update(config.study.overrides[task].to_dict())
      arm.groups.eta_labelled, arm.groups.eta_unlabelled = eta_l, eta_u
      arms.append((_setting_name(task, eta_l, eta_u), arm))
  return arms


# ---------------------------------------------------------------------------------------------------
# E1: gain curves, quadratic fits and the predictor's errors
# ---------------------------------------------------------------------------------------------------


def _e1_value(results, quantity, **cell) -> float:
  return results[f"{_key(**cell)}/{quantity}"]


def quadratic_fit(shift_sq: np.ndarray, gain: np.ndarray) -> tuple[float, float, float]:
  """Least squares gain = a + b (eta_u - eta_l)^2; returns (a, b, R^2)."""
  design = np.stack([np.ones_like(shift_sq), shift_sq], axis=1)
  (a, b), *_ = np.linalg.lstsq(design, gain, rcond=None)
  residual = gain - design @ np.array([a, b])
  total = np.sum((gain - gain.mean()) ** 2)
  return float(a), float(b), float(1.0 - np.sum(residual**2) / total) if total > 0 else 1.0


def e1_curves(config, results) -> list[dict]:
  """Per (s, ||Xi||^2, eta_l) at eta_t = eta_l: gains over eta_u (sim, std, pred, relayed) in units
  of c d_z, the quadratic fit in (eta_u - eta_l)^2 and the relative errors of the predictor."""
  r, unit = config.regression, results["e1/risk_unit"]
  curves = []
  for s in r.separations:
    for xi2 in r.similarities:
      for eta_l in r.eta_labelled:
        cells = [dict(s=s, xi2=xi2, eta_l=eta_l, eta_u=u, eta_t="eta_l") for u in r.eta_unlabelled]
        get = lambda q, cells=cells: np.array([_e1_value(results, q, **c) for c in cells])
        shift_sq = (np.asarray(r.eta_unlabelled) - eta_l) ** 2
        gain = get("gain") / unit
        a, b, r2 = quadratic_fit(shift_sq, gain)
        er_sim, er_pred = get("student_er"), get("student_er_pred")
        curves.append(
          {
            "s": s,
            "xi2": xi2,
            "eta_l": eta_l,
            "eta_u": np.asarray(r.eta_unlabelled),
            "shift_sq": shift_sq,
            "gain": gain,
            "gain_std": get("gain_std") / unit,
            "gain_pred": get("gain_pred") / unit,
            "gain_relayed": get("gain_relayed") / unit,
            "fit": (a, b, r2),
            "student_rel_error": np.abs(er_sim - er_pred) / er_pred,
          }
        )
  return curves


def _e1_teacher_rel_errors(config, results) -> np.ndarray:
  r = config.regression
  errors = []
  for s in r.separations:
    for eta_l in r.eta_labelled:
      for label in ETA_T_LABELS:
        sim = _e1_value(results, "teacher_er", s=s, eta_l=eta_l, eta_t=label)
        pred = _e1_value(results, "teacher_er_pred", s=s, eta_l=eta_l, eta_t=label)
        errors.append(abs(sim - pred) / pred)
  return np.asarray(errors)


def e1_summary(config, results) -> dict:
  curves = e1_curves(config, results)
  matched = [c["gain"][np.argmin(c["shift_sq"])] for c in curves if c["shift_sq"].min() < 1e-12]
  xi0 = [c for c in curves if c["xi2"] == 0]
  student_err = np.concatenate([c["student_rel_error"] for c in curves])
  teacher_err = _e1_teacher_rel_errors(config, results)
  failures = lambda key: int(sum((c[key] < 0).sum() for c in curves))
  peak_offset = lambda cs: float(
    np.mean([abs(c["eta_u"][np.argmax(c["gain"])] - c["eta_l"]) for c in cs])
  )
  curvature_grows = all(
    np.all(np.diff([c["fit"][1] for c in xi0 if c["eta_l"] == eta_l]) < 0)
    for eta_l in config.regression.eta_labelled
  )
  return {
    "e1_min_gain_matched": float(min(matched)),
    "e1_gain_nonnegative_when_matched": bool(min(matched) >= 0),
    "e1_gain_falls_with_shift_xi0": bool(all(c["fit"][1] < 0 for c in xi0)),
    "e1_quadratic_r2_min_xi0": float(min(c["fit"][2] for c in xi0)),
    "e1_quadratic_r2_median_all": float(np.median([c["fit"][2] for c in curves])),
    "e1_curvature_grows_with_separation_xi0": bool(curvature_grows),
    "e1_peak_offset_xi0": peak_offset(xi0),
    "e1_peak_offset_xi_positive": peak_offset([c for c in curves if c["xi2"] > 0]),
    "e1_failures_simulated": failures("gain"),
    "e1_failures_predicted": failures("gain_pred"),
    "e1_failures_relayed": failures("gain_relayed"),
    "e1_num_cells": int(sum(len(c["gain"]) for c in curves)),
    "e1_student_rel_error_median": float(np.median(student_err)),
    "e1_student_rel_error_p90": float(np.quantile(student_err, 0.9)),
    "e1_student_within_10pct": float(np.mean(student_err < 0.1)),
    "e1_teacher_rel_error_median": float(np.median(teacher_err)),
    "e1_teacher_rel_error_max": float(teacher_err.max()),
  }


def e1_notes(curves) -> str:
  """A Markdown table per E1 curve: matched gain (mean ± std over seeds), fit and failures (units of
  c d_z)."""
  header = (
    "| s | xi2 | eta_l | G matched (sim) | G matched (exact-moment) | G matched (relayed) | fit b | R^2 "
    "| min G (sim) | eta_u with G<0 |"
  )
  lines = ["E1, eta_t = eta_l, gains in units of c d_z:", "", header, "|" + "---|" * 10]
  for c in curves:
    i = int(np.argmin(c["shift_sq"]))
    failing = ",".join(f"{u:g}" for u, g in zip(c["eta_u"], c["gain"], strict=True) if g < 0) or "-"
    lines.append(
      f"| {c['s']:g} | {c['xi2']:g} | {c['eta_l']:g} | {interval_cell(c['gain'][i], c['gain_std'][i])} | "
      f"{c['gain_pred'][i]:.3f} | {c['gain_relayed'][i]:.3f} | {c['fit'][1]:.2f} | {c['fit'][2]:.3f} | "
      f"{c['gain'].min():.3f} | {failing} |"
    )
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Classification: the teacher / W2S / Enhanced-W2S table
# ---------------------------------------------------------------------------------------------------


def _classification_rows(results) -> list[dict]:
  rows = []
  for arm, res in results.items():
    if arm == "e1":
      continue
    task, l_part, u_part = arm.rsplit("_", 2)
    eta_l, eta_u = float(l_part[1:]), float(u_part[1:])
    w2s_acc, enhanced = res["w2s_accuracy"], res["enhanced_accuracy"]
    rows.append(
      {
        "task": task,
        "eta_l": eta_l,
        "eta_u": eta_u,
        "setting": "matched" if eta_l == eta_u else "mismatched",
        "teacher_acc": res["teacher_accuracy"],
        "teacher_wg": res["worst_group_teacher_accuracy"],
        "w2s_acc": w2s_acc,
        "w2s_wg": res["worst_group_w2s_accuracy"],
        "enhanced_acc": enhanced,
        "enhanced_wg": res["worst_group_enhanced_accuracy"],
        "w2s_gain": res["w2s_gain"],
        "enhanced_gain": res["enhanced_gain"],
        "enhanced_rel_improvement_pct": 100.0 * (enhanced - w2s_acc) / w2s_acc,
        "selected_p": res["enhanced_selected_p"],
        "selected_q": res["enhanced_selected_q"],
        "oracle_acc": res["enhanced_oracle_accuracy"],
        "ceiling_acc": res.get("ceiling_accuracy", np.nan),
        "ceiling_wg": res.get("worst_group_ceiling_accuracy", np.nan),
        "pgr": res.get("w2s_performance_gap_recovered", np.nan),
      }
    )
  return rows


def classification_summary(rows) -> dict:
  out = {}
  for task in sorted({row["task"] for row in rows}):
    mean = lambda key, setting, task=task: float(
      np.mean([r[key] for r in rows if r["task"] == task and r["setting"] == setting] or [np.nan])
    )
    out[f"{task}_enhanced_gain_mismatched"] = mean("enhanced_gain", "mismatched")
    out[f"{task}_enhanced_gain_matched"] = mean("enhanced_gain", "matched")
    out[f"{task}_remedy_helps_most_when_mismatched"] = bool(
      mean("enhanced_gain", "mismatched") > mean("enhanced_gain", "matched")
    )
    out[f"{task}_w2s_gain_matched"] = mean("w2s_gain", "matched")
    out[f"{task}_w2s_gain_mismatched"] = mean("w2s_gain", "mismatched")
    sel = [r for r in rows if r["task"] == task]
    out[f"{task}_ceiling_minus_teacher_min"] = float(
      min(r["ceiling_acc"] - r["teacher_acc"] for r in sel)
    )
  return out


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  summary, figures, notes = {}, {}, ""
  if "e1" in results:
    summary.update(e1_summary(config, results["e1"]))
    curves = e1_curves(config, results["e1"])
    figures.update(e1_figures(config, curves))
    notes = e1_notes(curves)
  rows = _classification_rows(results)
  if rows:
    summary.update(classification_summary(rows))
    figures["remedy"] = remedy_figure(rows)
    if any(row["task"].startswith("digits") for row in rows):
      figures["digits"] = digits_figure([r for r in rows if r["task"].startswith("digits")])
  return Report(rows=rows, summary=summary, figures=figures, notes=notes)


# ---------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------


def e1_figures(config, curves) -> dict:
  return {
    "e1_gain_vs_shift": _gain_figure(config, curves),
    "e1_simulated_vs_predicted": _prediction_figure(curves),
    "e1_failure_region": _failure_figure(config, curves),
  }


def _gain_figure(config, curves):
  """Simulated gain against (eta_u - eta_l)^2 with its quadratic fit, a panel per (||Xi||^2, s)."""
  r = config.regression
  fig, axes = figure_grid(len(r.similarities), len(r.separations), panel_size=(4, 3.2))
  for c in curves:
    ax = axes[r.similarities.index(c["xi2"]), r.separations.index(c["s"])]
    color = f"C{r.eta_labelled.index(c['eta_l'])}"
    ax.errorbar(
      c["shift_sq"],
      c["gain"],
      yerr=c["gain_std"],
      fmt="o",
      ms=3,
      color=color,
      label=f"eta_l={c['eta_l']:g}",
    )
    grid = np.linspace(0, c["shift_sq"].max(), 50)
    ax.plot(grid, c["fit"][0] + c["fit"][1] * grid, "-", color=color, lw=1)
    ax.set_title(f"s={c['s']:g}, ||Xi||^2={c['xi2']:g}", fontsize=9)
  for ax in axes.flat:
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_xlabel("(eta_u - eta_l)^2")
    ax.set_ylabel("gain / (c d_z)")
  axes[0, 0].legend(fontsize=7)
  fig.tight_layout()
  return fig


def _prediction_figure(curves):
  """Simulated gain against the exact-moment prediction and against the relayed theorems."""
  sim = np.concatenate([c["gain"] for c in curves])
  pred = np.concatenate([c["gain_pred"] for c in curves])
  relayed = np.concatenate([c["gain_relayed"] for c in curves])
  fig, axes = figure_grid(1, 2, figsize=(9, 4))
  for ax, theory, name in (
    (axes[0, 0], pred, "exact-moment"),
    (axes[0, 1], relayed, "relayed Thm 1-2"),
  ):
    ax.scatter(theory, sim, s=5)
    lim = [min(sim.min(), theory.min()), max(sim.max(), theory.max())]
    ax.plot(lim, lim, "k--", lw=0.8)
    ax.set_xlabel(f"predicted gain ({name})")
    ax.set_ylabel("simulated gain")
  fig.tight_layout()
  return fig


def _failure_figure(config, curves):
  """Simulated gain over (eta_l, eta_u), marking where each theory predicts G < 0."""
  r = config.regression
  fig, axes = figure_grid(len(r.similarities), len(r.separations), panel_size=(4, 2.6))
  for xi_index, xi2 in enumerate(r.similarities):
    for s_index, s in enumerate(r.separations):
      ax = axes[xi_index, s_index]
      sel = [c for c in curves if c["xi2"] == xi2 and c["s"] == s]
      gain = np.stack([c["gain"] for c in sel])
      bound = max(np.abs(gain).max(), 1e-9)
      ax.imshow(gain, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto", origin="lower")
      for i, c in enumerate(sel):
        for j in range(len(c["eta_u"])):
          if c["gain_pred"][j] < 0:
            ax.plot(j, i, "kx", ms=4)
          if c["gain_relayed"][j] < 0:
            ax.plot(j, i, "o", mfc="none", mec="k", ms=6)
      ax.set_xticks(
        range(len(r.eta_unlabelled)), [f"{u:g}" for u in r.eta_unlabelled], fontsize=6, rotation=90
      )
      ax.set_yticks(range(len(sel)), [f"{c['eta_l']:g}" for c in sel], fontsize=7)
      ax.set_title(f"s={s:g}, ||Xi||^2={xi2:g}: G (red < 0)", fontsize=8)
      ax.set_xlabel("eta_u")
      ax.set_ylabel("eta_l")
  fig.suptitle(
    "simulated gain; x: exact-moment predicts G < 0; o: relayed formula predicts G < 0", fontsize=9
  )
  fig.tight_layout()
  return fig


def remedy_figure(rows):
  """Average and worst-group accuracy of teacher, W2S and Enhanced-W2S per setting, a row per task."""
  tasks = sorted({row["task"] for row in rows})
  fig, axes = figure_grid(len(tasks), 2, panel_size=(5, 3.2))
  for t, task in enumerate(tasks):
    sel = [row for row in rows if row["task"] == task]
    labels = [f"l={row['eta_l']:g}\nu={row['eta_u']:g}" for row in sel]
    for k, (metric, title) in enumerate(
      (("acc", "average accuracy"), ("wg", "worst-group accuracy"))
    ):
      ax = axes[t, k]
      for m, model in enumerate(("teacher", "w2s", "enhanced")):
        ax.bar(
          np.arange(len(sel)) + 0.27 * (m - 1),
          [row[f"{model}_{metric}"] for row in sel],
          0.27,
          label=model,
        )
      ax.set_xticks(range(len(sel)), labels, fontsize=8)
      ax.set_title(f"{task}: {title}", fontsize=9)
      ax.set_ylim(0, 1)
  axes[0, 0].legend(fontsize=8)
  fig.tight_layout()
  return fig


def digits_figure(rows):
  """Per digits setup (a column) and setting: teacher, strong ceiling (a head on true labels), vanilla
  W2S and Enhanced-W2S; average accuracy on top, worst-group below."""
  tasks = sorted({row["task"] for row in rows})
  fig, axes = figure_grid(2, len(tasks), panel_size=(5, 3.2))
  models = (("teacher", "teacher"), ("ceiling", "strong ceiling"), ("w2s", "W2S"))
  models += (("enhanced", "Enhanced-W2S"),)
  for t, task in enumerate(tasks):
    sel = [row for row in rows if row["task"] == task]
    labels = [f"l={row['eta_l']:g}\nu={row['eta_u']:g}" for row in sel]
    for k, (metric, title) in enumerate((("acc", "average"), ("wg", "worst-group"))):
      ax = axes[k, t]
      for m, (model, name) in enumerate(models):
        offset = 0.2 * (m - (len(models) - 1) / 2)
        values = [row[f"{model}_{metric}"] for row in sel]
        ax.bar(np.arange(len(sel)) + offset, values, 0.2, label=name)
      ax.set_xticks(range(len(sel)), labels, fontsize=8)
      ax.set_title(f"{task}: {title} accuracy", fontsize=9)
      ax.set_ylim(0, 1)
  axes[0, 0].legend(fontsize=7, loc="lower left")
  fig.tight_layout()
  return fig
