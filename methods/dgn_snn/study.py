"""The DGN study: LIF, DGN, s-DGN and a parameter-matched LIF under unseen spike perturbations.

Arms (`config.study`): each model of `study.models` on the main data, `num_seeds` vmapped seeds each;
`dgn_sigmoid` (phi = sigmoid ablation) when `study.phi_ablation`; `<data>_lif` and `<data>_dgn` on
`study.second_dataset`. The `dgn` arm also runs the Eq. 13-14 variance check. The report tabulates clean
and robust accuracy (mean ± std over seeds), PGD accuracy, spike counts and synaptic operations per
inference, and plots accuracy against the strength of every perturbation family.
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np

from core.data.spikes import PERTURBATIONS
from methods.base import Report, with_changes
from methods.dgn_snn.phases import perturbation_grid
from methods.reports import figure_grid, mean_std_cell

MAIN = "dgn"  # the arm that carries the variance check and the headline numbers
SECOND_DATA_STEPS = {"mnist1d": 80}  # time steps of the second data set's spike trains


def study_arms(config: ml_collections.ConfigDict):
  study, base_width = config.study, config.model.hidden_sizes
  arms = []
  for name, kind, multiplier in study.models:
    hidden = tuple(multiplier * n for n in base_width)
    arm = with_changes(
      config,
      model__kind=kind,
      model__hidden_sizes=hidden,
      compare_lif=False,
      stability__enabled=name == MAIN,
    )
    arms.append((name, arm))
  if study.phi_ablation:
    arm = with_changes(
      config, model__kind="dgn", model__phi="sigmoid", compare_lif=False, stability__enabled=False
    )
    arms.append(("dgn_sigmoid", arm))
  if study.second_dataset:
    data = study.second_dataset
    for kind in ("lif", "dgn"):
      arm = with_changes(
        config,
        model__kind=kind,
        data__name=data,
        data__num_steps=SECOND_DATA_STEPS.get(data, config.data.num_steps),
        compare_lif=False,
        stability__enabled=False,
      )
      arms.append((f"{data}_{kind}", arm))
  return arms


def _cell(values, digits: int = 1) -> str:
  return mean_std_cell(np.ravel(values), scale=100.0, digits=digits)


def _row(config, name: str, arm_config, result) -> dict:
  grid = perturbation_grid(arm_config)
  strongest_add = np.asarray(result["accuracy_additive"])[:, -1] if grid["additive"] else None
  return {
    "arm": name,
    "data": arm_config.data.name,
    "neuron": f"{arm_config.model.kind}/{arm_config.model.phi}",
    "hidden": "-".join(str(n) for n in arm_config.model.hidden_sizes),
    "params": int(result["num_params"]),
    "clean %": _cell(result["clean_accuracy_per_seed"]),
    "robust %": _cell(result["robust_accuracy_per_seed"]),
    f"additive p={grid['additive'][-1]:g} %" if grid["additive"] else "additive": (
      _cell(strongest_add) if strongest_add is not None else "-"
    ),
    "PGD %": _cell(np.mean(result["accuracy_pgd"], axis=1)) if "accuracy_pgd" in result else "-",
    "train %": f"{100 * result['train_accuracy']:.1f}",
    "decay clean -> inserted": (
      f"{result['mean_decay_clean']:.2f} -> {result['mean_decay_inserted']:.2f}"
      if "mean_decay_clean" in result
      else "-"
    ),
    "spikes / inference": f"{result['spikes_per_inference']:.0f}",
    "synaptic ops / inference": f"{result['synaptic_ops_per_inference']:.3g}",
  }


def _summary(config, arms, results) -> dict:
  summary = {}
  for name, _ in arms:
    r = results[name]
    summary[f"clean_accuracy_{name}"] = r["clean_accuracy"]
    summary[f"robust_accuracy_{name}"] = r["robust_accuracy"]
    if "pgd_accuracy" in r:
      summary[f"pgd_accuracy_{name}"] = r["pgd_accuracy"]
    summary[f"spikes_per_inference_{name}"] = r["spikes_per_inference"]
    for key in ("mean_decay_clean", "mean_decay_inserted", "positive_conductance_fraction"):
      if key in r:
        summary[f"{key}_{name}"] = r[key]
  if MAIN in results and "lif" in results:
    dgn, lif = results[MAIN], results["lif"]
    summary["robust_gain_dgn_over_lif"] = dgn["robust_accuracy"] - lif["robust_accuracy"]
    summary["clean_gap_dgn_minus_lif"] = dgn["clean_accuracy"] - lif["clean_accuracy"]
    summary["dgn_above_lif_in_every_condition"] = bool(
      all(
        np.all(np.mean(dgn[f"accuracy_{f}"], 0) > np.mean(lif[f"accuracy_{f}"], 0))
        for f in PERTURBATIONS
        if np.size(dgn[f"accuracy_{f}"])
      )
    )
    summary["spike_ratio_dgn_over_lif"] = dgn["spikes_per_inference"] / lif["spikes_per_inference"]
  if MAIN in results and "variance_dgn_formula" in results[MAIN]:
    r = results[MAIN]
    for key in (
      "variance_lif_formula",
      "variance_lif_simulated",
      "variance_formula_max_relative_error",
      "variance_ito_max_relative_error",
    ):
      summary[key] = r[key]
  return summary


def _strength_axis(family: str, strengths) -> list[float]:
  """x values of a family's curve, 0 (clean) first; mixed: its insertion probability."""
  return [0.0] + [s[0] if family == "mixed" else s for s in strengths]


def _curve_panels(axes, config, arms, results) -> None:
  for ax, family in zip(axes, PERTURBATIONS, strict=True):
    for name, arm_config in arms:
      if arm_config.data.name != config.data.name:
        continue
      strengths = perturbation_grid(arm_config)[family]
      r = results[name]
      curves = np.concatenate(
        [np.asarray(r["clean_accuracy_per_seed"])[:, None], np.asarray(r[f"accuracy_{family}"])],
        axis=1,
      )
      x, mean, std = _strength_axis(family, strengths), curves.mean(0), curves.std(0)
      (line,) = ax.plot(x, 100 * mean, "o-", ms=3, label=name)
      ax.fill_between(x, 100 * (mean - std), 100 * (mean + std), color=line.get_color(), alpha=0.2)
    label = {
      "additive": "insertion p",
      "subtractive": "deletion p",
      "mixed": "mixed: insertion p (deletion rises with it)",
      "jitter": "jitter sigma (steps)",
    }[family]
    ax.set(xlabel=label, ylabel="test accuracy %", title=family, ylim=(0, 102))
  axes[0].legend(fontsize=7)


def _pgd_panel(ax, config, arms, results) -> None:
  for name, arm_config in arms:
    if arm_config.data.name != config.data.name or "accuracy_pgd" not in results[name]:
      continue
    r = results[name]
    curves = np.concatenate(
      [np.asarray(r["clean_accuracy_per_seed"])[:, None], np.asarray(r["accuracy_pgd"])], axis=1
    )
    x = [0.0, *arm_config.eval.pgd_epsilons]
    ax.errorbar(x, 100 * curves.mean(0), yerr=100 * curves.std(0), marker="o", ms=3, label=name)
  ax.set(xlabel="PGD epsilon (L-inf, inputs in [0, 1])", ylabel="test accuracy %", title="PGD")
  ax.set_ylim(0, 102)


def _bar_panels(ax_acc, ax_spikes, arms, results) -> None:
  names = [name for name, _ in arms]
  x = np.arange(len(names))
  for offset, key, label in ((-0.2, "clean", "clean"), (0.2, "robust", "robust (mean perturbed)")):
    values = [100 * np.asarray(results[n][f"{key}_accuracy_per_seed"]) for n in names]
    ax_acc.bar(
      x + offset, [v.mean() for v in values], 0.4, yerr=[v.std() for v in values], label=label
    )
  ax_acc.set_xticks(x, names, rotation=45, ha="right", fontsize=7)
  ax_acc.set(ylabel="test accuracy %", ylim=(0, 122), title="clean vs robust")
  ax_acc.legend(fontsize=7, loc="upper center", ncol=2)
  ax_spikes.bar(x, [results[n]["spikes_per_inference"] for n in names], color="C2")
  ax_spikes.set_xticks(x, names, rotation=45, ha="right", fontsize=7)
  ax_spikes.set(ylabel="hidden spikes / inference", title="energy proxy")


def _variance_panel(ax, result) -> None:
  scales = np.asarray(result["variance_conductance_scales"])
  ax.plot(scales, result["variance_dgn_formula"], "-", label="DGN, Eq. 13 (linearised)")
  ax.plot(scales, result["variance_dgn_ito"], "--", label="DGN, exact Ito")
  ax.plot(scales, result["variance_dgn_simulated"], "o", label="DGN, Euler-Maruyama")
  ax.axhline(result["variance_lif_formula"], color="gray", ls=":", label="LIF, Eq. 14")
  ax.set(xlabel="conductance scale (C = scale * C0)", ylabel="Var V", yscale="log")
  ax.set_title("stationary variance, one neuron")
  ax.legend(fontsize=7)


def _figure(config, arms, results):
  fig, axes = figure_grid(2, 4, panel_size=(4.2, 3.3))
  _curve_panels(axes[0], config, arms, results)
  _pgd_panel(axes[1, 0], config, arms, results)
  _bar_panels(axes[1, 1], axes[1, 2], arms, results)
  if MAIN in results and "variance_dgn_formula" in results[MAIN]:
    _variance_panel(axes[1, 3], results[MAIN])
  else:
    axes[1, 3].axis("off")
  fig.suptitle(
    f"DGN vs LIF on {config.data.name}: trained clean, tested on unseen perturbations "
    f"(mean ± std over {config.num_seeds} seeds)"
  )
  fig.tight_layout()
  return fig


def report(config, results: Mapping[str, Mapping]) -> Report:
  arms = [(name, arm) for name, arm in study_arms(config) if name in results]
  rows = [_row(config, name, arm, results[name]) for name, arm in arms]
  notes = (
    "Accuracies in %, mean ± std over the seeds. robust = mean accuracy over every perturbed "
    "condition (insertion, deletion, mixed, jitter; never seen in training); PGD = mean over its "
    "epsilons. Spikes and synaptic operations (presynaptic spikes x fan-out x pathways) per test "
    "example, clean inputs. decay: mean rho^t of the first hidden layer on clean inputs and with "
    f"spikes inserted at p = {max(config.eval.additive_probs, default=0):g}."
  )
  return Report(
    rows=rows,
    summary=_summary(config, arms, results),
    figures={"dgn_snn_study": _figure(config, arms, results)},
    notes=notes,
  )
