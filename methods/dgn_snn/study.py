"""The DGN study: LIF, DGN, s-DGN and a parameter-matched LIF under unseen spike perturbations.

Arms (`config.study`): each model of `study.models` on the main data, `num_seeds` vmapped seeds each;
`dgn_sigmoid` (phi = sigmoid ablation) when `study.phi_ablation`; `<data>_lif` and `<data>_dgn` on
`study.second_dataset`. The `dgn` arm also runs the Eq. 13-14 variance check. The report tabulates
clean and robust accuracy (mean ± std over seeds), jitter apart, FGSM / BIM / PGD accuracy, spike
counts and synaptic operations per inference, and plots accuracy against the strength of every
perturbation family and attack.
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np

from core.attacks import ATTACKS
from core.data.spikes import PERTURBATIONS
from methods.base import Report, figure_grid, mean_std_cell, with_changes
from methods.dgn_snn.phases import RANDOM_FAMILIES, perturbation_grid

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
    "jitter %": _cell(result["jitter_accuracy_per_seed"]) if "jitter_accuracy" in result else "-",
    **{
      f"{name.upper()} %": _cell(np.mean(result[f"accuracy_{name}"], axis=1))
      if f"accuracy_{name}" in result
      else "-"
      for name in arm_config.eval.attacks
    },
    "adversarial %": (
      _cell(result["adversarial_accuracy_per_seed"]) if "adversarial_accuracy" in result else "-"
    ),
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
    for key in ("jitter_accuracy", "adversarial_accuracy", *(f"{a}_accuracy" for a in ATTACKS)):
      if key in r:
        summary[f"{key}_{name}"] = r[key]
    summary[f"spikes_per_inference_{name}"] = r["spikes_per_inference"]
    for key in ("mean_decay_clean", "mean_decay_inserted", "positive_conductance_fraction"):
      if key in r:
        summary[f"{key}_{name}"] = r[key]
  if MAIN in results and "lif" in results:
    dgn, lif = results[MAIN], results["lif"]
    summary["robust_gain_dgn_over_lif"] = dgn["robust_accuracy"] - lif["robust_accuracy"]
    if "adversarial_accuracy" in dgn and "adversarial_accuracy" in lif:
      summary["adversarial_gain_dgn_over_lif"] = (
        dgn["adversarial_accuracy"] - lif["adversarial_accuracy"]
      )
    summary["clean_gap_dgn_minus_lif"] = dgn["clean_accuracy"] - lif["clean_accuracy"]
    summary["dgn_above_lif_in_every_condition"] = bool(
      all(
        np.all(np.mean(dgn[f"accuracy_{f}"], 0) > np.mean(lif[f"accuracy_{f}"], 0))
        for f in RANDOM_FAMILIES
        if np.size(dgn[f"accuracy_{f}"])
      )
    )
    summary["spike_ratio_dgn_over_lif"] = dgn["spikes_per_inference"] / lif["spikes_per_inference"]
  if MAIN in results and "variance_dgn_formula" in results[MAIN]:
    r = results[MAIN]
    for key in (
      "variance_lif_formula",
      "variance_unclipped_cells",
      "variance_discrete_max_relative_error",
      "variance_formula_max_relative_error",
    ):
      if key in r:
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


def _attack_panel(ax, config, arms, results) -> None:
  """Accuracy against epsilon: one colour per arm, one line style per attack."""
  styles = dict(zip(ATTACKS, ("o:", "s--", "^-"), strict=True))
  for index, (name, arm_config) in enumerate(arms):
    if arm_config.data.name != config.data.name:
      continue
    r = results[name]
    for attack in arm_config.eval.attacks:
      if f"accuracy_{attack}" not in r:
        continue
      curves = np.concatenate(
        [np.asarray(r["clean_accuracy_per_seed"])[:, None], np.asarray(r[f"accuracy_{attack}"])],
        axis=1,
      )
      x = [0.0, *arm_config.eval.attack_epsilons]
      label = f"{name} {attack.upper()}" if attack == "pgd" else None
      ax.plot(x, 100 * curves.mean(0), styles[attack], color=f"C{index}", ms=3, label=label)
  ax.set(xlabel="epsilon (L-inf, inputs in [0, 1])", ylabel="test accuracy %")
  ax.set_title("FGSM (dotted), BIM (dashed), PGD (solid)", fontsize=9)
  ax.set_ylim(0, 102)
  ax.legend(fontsize=6)


def _bar_panels(ax_acc, ax_spikes, arms, results) -> None:
  names = [name for name, _ in arms]
  x = np.arange(len(names))
  bars = (("clean", "clean"), ("robust", "random perturbations"), ("adversarial", "attacks"))
  for offset, (key, label) in zip((-0.27, 0.0, 0.27), bars, strict=True):
    if not all(f"{key}_accuracy_per_seed" in results[n] for n in names):
      continue
    values = [100 * np.asarray(results[n][f"{key}_accuracy_per_seed"]) for n in names]
    ax_acc.bar(
      x + offset, [v.mean() for v in values], 0.27, yerr=[v.std() for v in values], label=label
    )
  ax_acc.set_xticks(x, names, rotation=45, ha="right", fontsize=7)
  ax_acc.set(ylabel="test accuracy %", ylim=(0, 122), title="clean, random, adversarial")
  ax_acc.legend(fontsize=7, loc="upper center", ncol=2)
  ax_spikes.bar(x, [results[n]["spikes_per_inference"] for n in names], color="C2")
  ax_spikes.set_xticks(x, names, rotation=45, ha="right", fontsize=7)
  ax_spikes.set(ylabel="hidden spikes / inference", title="energy proxy")


def _variance_panel(ax, result) -> None:
  """The neuron's stationary variance at each step dt against Eq. 13 and the exact variances."""
  scales = np.asarray(result["variance_conductance_scales"])
  ax.plot(scales, result["variance_dgn_formula"], "k-", label="Eq. 13 (linearised)")
  ax.plot(scales, result["variance_dgn_ito"], "k--", label="exact Ito")
  for i, dt in enumerate(result["variance_dts"]):
    ax.plot(
      scales,
      np.asarray(result["variance_neuron"])[i],
      "o",
      color=f"C{i}",
      label=f"neuron, dt {dt:g}",
    )
    ax.plot(scales, np.asarray(result["variance_discrete"])[i], ":", color=f"C{i}")
  ax.set(xlabel="conductance scale (C = scale * C0)", ylabel="Var V", yscale="log")
  ax.set_title("one neuron (dotted: exact, unclipped update)", fontsize=9)
  ax.legend(fontsize=6)


def _figure(config, arms, results):
  fig, axes = figure_grid(2, 4, panel_size=(4.2, 3.3))
  _curve_panels(axes[0], config, arms, results)
  _attack_panel(axes[1, 0], config, arms, results)
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
    "Accuracies in %, mean ± std over the seeds. robust = mean accuracy over the random spike "
    "perturbations (insertion, deletion, mixed; never seen in training); jitter apart; FGSM, BIM, "
    "PGD = mean over their epsilons; adversarial = mean over the attacks. Spikes and synaptic "
    "operations (presynaptic spikes x fan-out x pathways) per test example, clean inputs. decay: "
    "mean rho^t of the first hidden layer on clean inputs and with "
    f"spikes inserted at p = {max(config.eval.additive_probs, default=0):g}."
  )
  return Report(
    rows=rows,
    summary=_summary(config, arms, results),
    figures={"dgn_snn_study": _figure(config, arms, results)},
    notes=notes,
  )
