"""IID's study: IF vs LF vs IF + each loss vs IID across the incoherence delta, both signs of the
informatic constraint, loss-weight sweeps and the affine-only mechanism check; the table, summary and
figure (see the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import ml_collections
import numpy as np

from methods.base import Report, figure_grid, interval_cell, with_changes
from methods.if_mml.phases import MODELS, REPLICATES

WEIGHTING_SUFFIX = {"energy": "q", "pdf": "p"}  # IID-Q, IID-P


def arm_name(model: str, sign: int) -> str:
  """`<model>` with the printed sign of L_ic, `<model>_neg` with the prose's sign."""
  return f"{model}_neg" if MODELS[model].informatic and sign < 0 else model


def study_arms(config: ml_collections.ConfigDict):
  """Main arms: each of `study.models`, with each sign of `study.ic_signs` where L_ic applies.
  Sweeps: `if_ic[_neg]_alpha<a>` at each alpha of `study.alphas`, `if_dc_beta<b>` at each beta of
  `study.betas`. Fusion weights: `<model>_q` (QMF energy weights, IID-Q) and `<model>_p` (PDF
  co-belief weights, IID-P) for each of `study.weighted_models` and `study.weightings`, against the
  static weights (IID-L) of the main arm `<model>`. Mechanism check: `<arm>_affine` for each arm of
  `study.affine_arms`, the same run on data whose incoherence is affine only (no heavy tails,
  `data.tail_rate = 0`)."""
  return [(name, with_changes(config, **changes)) for name, changes in arm_changes(config).items()]


def arm_changes(config) -> dict[str, dict]:
  study, arms = config.study, {}
  for model in study.models:
    signs = study.ic_signs if MODELS[model].informatic else (config.ic.unimodal_sign,)
    for sign in signs:
      arms[arm_name(model, sign)] = {"models": (model,), "ic__unimodal_sign": sign}
  for alpha in study.alphas:
    for sign in study.ic_signs:
      arms[f"{arm_name('if_ic', sign)}_alpha{alpha:g}"] = {
        "models": ("if_ic",),
        "ic__alpha": alpha,
        "ic__unimodal_sign": sign,
      }
  for beta in study.betas:
    arms[f"if_dc_beta{beta:g}"] = {"models": ("if_dc",), "dc__beta": beta}
  for model in study.weighted_models:
    for weighting in study.weightings:
      arms[f"{model}_{WEIGHTING_SUFFIX[weighting]}"] = {
        "models": (model,),
        "ic__unimodal_sign": config.ic.unimodal_sign,
        "model__weighting": weighting,
      }
  for name in study.affine_arms:
    arms[f"{name}_affine"] = dict(arms[name], data__tail_rate=0.0)
  return arms


def weighted_arms(config) -> list[tuple[str, str, str]]:
  """`(arm, static-weight reference arm, weighting)` of the fusion-weight arms."""
  return [
    (f"{model}_{WEIGHTING_SUFFIX[w]}", model, w)
    for model in config.study.weighted_models
    for w in config.study.weightings
  ]


def arm_model(arm_results: Mapping) -> str:
  """The model an arm trained (its results hold `accuracy_<model>`)."""
  return next(m for m in MODELS if f"accuracy_{m}" in arm_results)


def _values(results, arm: str, metric: str) -> np.ndarray:
  """(deltas, seeds) values of `metric` (e.g. "accuracy", "final_gap") in `arm`."""
  key = f"{metric}_{arm_model(results[arm])}{REPLICATES}"
  return np.asarray(results[arm][key], np.float64)


def t_interval(values: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
  """Mean and the half-width of a 95% Student-t interval along `axis`."""
  from scipy import stats

  n = values.shape[axis]
  mean = values.mean(axis)
  if n < 2:
    return mean, np.full_like(mean, np.nan)
  half = stats.t.ppf(0.975, n - 1) * values.std(axis, ddof=1) / math.sqrt(n)
  return mean, half


def paired(results, arm: str, reference: str, metric: str = "accuracy"):
  """(arm - reference), paired by seed: per delta (mean, half-width over seeds) and over all
  deltas (each seed's mean difference across deltas, then the interval over seeds).

  Every delta of a seed shares its data and initial weights, so the (delta, seed) replicates are
  not independent: the seeds are the units of the overall interval."""
  diff = _values(results, arm, metric) - _values(results, reference, metric)
  return t_interval(diff), t_interval(diff.mean(0))


def _main_arms(results) -> list[str]:
  return [a for a in results if a.removesuffix("_neg") in MODELS]


def _rows(config, results) -> list[dict]:
  rows = []
  for arm in results:
    cells = {
      key: t_interval(_values(results, arm, metric))
      for key, metric in (
        ("test_accuracy", "accuracy"),
        ("train_minus_test", "gap"),
        ("final_test_accuracy", "final_accuracy"),
        ("final_train_minus_test", "final_gap"),
        ("relative_W2(z1,z2)", "final_relative_incoherence"),
      )
    }
    selected = f"selected_step_{arm_model(results[arm])}{REPLICATES}" in results[arm]
    steps = _values(results, arm, "selected_step").mean(1) if selected else None
    for i, delta in enumerate(config.data.deltas):
      row = {"arm": arm, "delta": delta}
      row.update({key: interval_cell(m[i], h[i]) for key, (m, h) in cells.items()})
      row["selected_step"] = float(steps[i]) if selected else None
      rows.append(row)
  return rows


PAIRS = (
  ("if", "lf"),
  ("if_ic", "lf"),
  ("full", "lf"),
  ("if_ic", "if"),
  ("if_ic_neg", "if"),
  ("if_dc", "if"),
  ("full", "if"),
  ("full_neg", "if"),
  ("concat", "if"),
)


def _pairs(config) -> list[tuple[str, str]]:
  """The summary's paired comparisons: PAIRS, each weighted arm against its static-weight arm,
  IF against LF under each dynamic weighting, and IID-Q against IID-P."""
  pairs = list(PAIRS) + [(arm, reference) for arm, reference, _ in weighted_arms(config)]
  for weighting in config.study.weightings:
    suffix = WEIGHTING_SUFFIX[weighting]
    pairs += [(f"if_{suffix}", f"lf_{suffix}"), (f"full_{suffix}", f"lf_{suffix}")]
  pairs += [(f"{m}_p", f"{m}_q") for m in config.study.weighted_models]
  return pairs


def _summary(config, results) -> dict:
  deltas = list(config.data.deltas)
  summary = {"deltas": deltas, "seeds": config.data.num_seeds}
  for prefix in ("", "final_"):
    for arm in _main_arms(results) + [a for a, _, _ in weighted_arms(config) if a in results]:
      summary[f"{prefix}accuracy_{arm}"] = float(_values(results, arm, f"{prefix}accuracy").mean())
    for arm, reference in _pairs(config):
      if arm in results and reference in results:
        (per_mean, per_half), (mean, half) = paired(results, arm, reference, f"{prefix}accuracy")
        summary[f"{prefix}{arm}_minus_{reference}"] = interval_cell(mean, half)
        summary[f"{prefix}{arm}_minus_{reference}_by_delta"] = [
          interval_cell(m, h) for m, h in zip(per_mean, per_half, strict=True)
        ]
    for arm in ("lf", "if", "if_dc", "full"):
      if arm in results and len(deltas) > 1:
        acc = _values(results, arm, f"{prefix}accuracy").mean(1)
        summary[f"{prefix}accuracy_drop_{arm}"] = float(acc[0] - acc[-1])
  for arm in ("if", "if_dc", "full"):
    if arm in results:
      rel = _values(results, arm, "final_relative_incoherence").mean(1)
      summary[f"relative_incoherence_{arm}_by_delta"] = [round(float(v), 3) for v in rel]
  return summary


def _errorbars(ax, deltas, series: Mapping[str, tuple]):
  """One error-bar line per entry `label -> (mean, half-width)` over delta, slightly offset."""
  for index, (label, (mean, half)) in enumerate(series.items()):
    offset = (index - len(series) / 2) * 0.015 * max(deltas.max(), 1.0)
    ax.errorbar(deltas + offset, mean, yerr=half, marker="o", ms=3, capsize=2, label=label)
  ax.set_xlabel("incoherence delta")


def _intervals(results, arms, metric: str) -> dict[str, tuple]:
  return {arm: t_interval(_values(results, arm, metric)) for arm in arms}


def _differences(results, arms, metric: str, reference: str = "if") -> dict[str, tuple]:
  return {f"{a} - {reference}": paired(results, a, reference, metric)[0] for a in arms}


def _sweep_panel(ax, config, results):
  """Paired accuracy difference to IF (mean over deltas and seeds) against the loss weight."""
  sweeps = [(f"if_ic_alpha{a:g}", a, "alpha (if_ic)") for a in config.study.alphas]
  sweeps += [(f"if_ic_neg_alpha{a:g}", a, "alpha (if_ic_neg)") for a in config.study.alphas]
  sweeps += [(f"if_dc_beta{b:g}", b, "beta (if_dc)") for b in config.study.betas]
  defaults = {
    "alpha (if_ic)": ("if_ic", config.ic.alpha),
    "beta (if_dc)": ("if_dc", config.dc.beta),
  }
  defaults["alpha (if_ic_neg)"] = ("if_ic_neg", config.ic.alpha)
  for label in dict.fromkeys(lbl for _, _, lbl in sweeps):
    points = [(w, arm) for arm, w, lbl in sweeps if lbl == label and arm in results]
    arm, weight = defaults[label]
    if arm in results:
      points.append((weight, arm))
    points = sorted(points)
    if "if" not in results or not points:
      continue
    for prefix, style in (("", "-"), ("final_", ":")):
      stats = [paired(results, a, "if", f"{prefix}accuracy")[1] for _, a in points]
      ax.errorbar(
        [w for w, _ in points],
        [m for m, _ in stats],
        yerr=[h for _, h in stats],
        ls=style,
        marker="o",
        ms=3,
        capsize=2,
        label=f"{label}{' final' if prefix else ''}",
      )
  ax.axhline(0.0, color="gray", lw=0.8)
  ax.set(xscale="log", xlabel="loss weight", ylabel="accuracy - IF (all deltas)")
  ax.legend(fontsize=6)


def _figure(config, results):
  deltas = np.asarray(config.data.deltas, float)
  main = _main_arms(results)
  fig, axes = figure_grid(4, 3, figsize=(14, 14.5))
  for row, (prefix, title) in enumerate(
    (("", "best-validation weights"), ("final_", "final weights"))
  ):
    acc, diff, gap = axes[row]
    _errorbars(acc, deltas, _intervals(results, main, f"{prefix}accuracy"))
    acc.set(ylabel="test accuracy", title=title)
    acc.legend(fontsize=6, ncol=2)
    if "if" in results:
      others = [a for a in main if a != "if"]
      _errorbars(diff, deltas, _differences(results, others, f"{prefix}accuracy"))
      diff.axhline(0.0, color="gray", lw=0.8)
      diff.set(ylabel="paired test-accuracy difference to IF", title=title)
      diff.legend(fontsize=6, ncol=2)
    _errorbars(gap, deltas, _intervals(results, main, f"{prefix}gap"))
    gap.set(ylabel="generalisation gap (train - test accuracy)", title=title)
  incoherence_ax, sweep_ax, affine_ax = axes[2]
  _errorbars(incoherence_ax, deltas, _intervals(results, main, "final_relative_incoherence"))
  incoherence_ax.set(ylabel="W2(z1, z2) / spread of the latents", title="final weights")
  _sweep_panel(sweep_ax, config, results)
  _affine_panel(affine_ax, config, results, deltas)
  _weighting_panels(axes[3], config, results, deltas)
  fig.suptitle(
    f"IF vs LF vs IID on two-modality synthetic data: {config.data.num_seeds} seeds per delta, "
    "95% t-intervals, paired differences"
  )
  fig.tight_layout()
  return fig


def _weighting_panels(axes, config, results, deltas):
  """Dynamic fusion weights (IID-Q, IID-P) minus the static weights (IID-L) of the same model, per
  delta at both weight sets; the third panel: each arm's test accuracy over all deltas."""
  arms = [(a, r, w) for a, r, w in weighted_arms(config) if a in results and r in results]
  for ax, (prefix, title) in zip(
    axes[:2], (("", "best-validation weights"), ("final_", "final weights")), strict=True
  ):
    series = {f"{a} - {r}": paired(results, a, r, f"{prefix}accuracy")[0] for a, r, _ in arms}
    _errorbars(ax, deltas, series)
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set(ylabel="paired accuracy difference to static weights", title=title)
    ax.legend(fontsize=6, ncol=2)
  names = sorted({n for a, r, _ in arms for n in (a, r)}, key=lambda n: (n.split("_")[0], n))
  for offset, prefix in ((-0.15, ""), (0.15, "final_")):
    stats = [t_interval(_values(results, n, f"{prefix}accuracy").mean(0)) for n in names]
    axes[2].errorbar(
      np.arange(len(names)) + offset,
      [m for m, _ in stats],
      yerr=[h for _, h in stats],
      fmt="o",
      ms=3,
      capsize=2,
      label="final weights" if prefix else "best-validation weights",
    )
  axes[2].set_xticks(range(len(names)), names, fontsize=7, rotation=30)
  axes[2].set(ylabel="test accuracy (mean over deltas)", title="fusion weights: L (static), q, p")
  axes[2].legend(fontsize=6)


def _affine_panel(ax, config, results, deltas):
  """Each `study.affine_arms` arm minus IF under the full and the affine-only incoherence."""
  series = {}
  for name in config.study.affine_arms:
    if name == "if" or "if_affine" not in results or f"{name}_affine" not in results:
      continue
    for suffix, tag in (("", "full incoherence"), ("_affine", "affine only")):
      series[f"{name} - if, {tag}"] = paired(
        results, name + suffix, "if" + suffix, "final_accuracy"
      )[0]
  _errorbars(ax, deltas, series)
  ax.axhline(0.0, color="gray", lw=0.8)
  ax.set(ylabel="paired test-accuracy difference to IF", title="mechanism check (final weights)")
  ax.legend(fontsize=6)


def report(config, results: Mapping[str, Mapping]) -> Report:
  notes = (
    "Arms: lf, if, concat, if_ic / if_dc (IF + one loss), full (IID = IF + L_ic + L_dc); `_neg` arms "
    "use the prose's sign of L_ic's unimodal term (-1), the others the printed one (+1); "
    "`_alpha<a>` / `_beta<b>` arms change the loss weight; `_affine` arms use incoherence without "
    "heavy tails; `_q` / `_p` arms fuse with QMF energy weights (IID-Q) / PDF co-belief weights "
    "(IID-P) instead of the static (1/2, 1/2) (IID-L). Columns without `final_`: each replicate's "
    "best-validation weights; `final_`: the weights after all steps. Intervals: 95% Student-t over "
    "seeds; differences are paired (same data and initial encoders per seed); intervals over all "
    "deltas are over the seeds' mean differences across deltas."
  )
  return Report(
    rows=_rows(config, results),
    summary=_summary(config, results),
    figures={"if_mml_study": _figure(config, results)},
    notes=notes,
  )
