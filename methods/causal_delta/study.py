"""The causal-delta study: baselines, the CDE loss ablations, and global vs patch-wise deltas.

Arms (`config.study`), each `num_seeds` seeds as one array axis:
  single-object scenes  `vanilla` (ResPair, CE), `icm` (ResPair + object adversary), `sms` (ResPair +
                        Causal Triplet's block-invariance loss), `cde_ce` (delta, CE only),
                        `cde_ce_supcon`, `cde_ce_l1`, `cde` (CE + 2 SupCon + 1 L1),
                        `cde_l1_sum` (L1 summed over the delta's coordinates, the formula as
                        written), and when listed the other sparsity choices `cde_l1_schedule`,
                        `cde_l1_normalised`, `cde_topk` (`core/causal_delta.py`),
                        `cde_no_ramp` (SupCon and L1 at full weight from step 0) and
                        `cde_warmup` (after the masked-reconstruction warm-up);
  multi-object scenes   `multi_<arm>` for `study.multi_arms`: `cde_global`, `cde_patch` (Top-K
                        mean) and `cde_patch_per_patch` (per-patch losses); `vanilla` when listed;
  digit objects         `digits_<arm>` for `study.digit_arms` (none by default): single-object scenes
                        whose classes are the 8 shapes and the 10 scikit-learn digits, with
                        `study.digit_num_syst_objects` classes held out for OOD-syst.
The report tabulates accuracies (mean ± std over seeds), the gap and the probes, states each of the
paper's claims as a number, and draws accuracies, the antonym cosine matrix, 2-D projections of the
embeddings and example pairs with their predicted actions.
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np
from scipy import stats

from core.data import shape_triplets as triplets
from methods.base import Report, figure_grid, interval_cell, mean_std_cell, with_changes
from methods.causal_delta import phases as phases_lib

_CE_ONLY = dict(loss__supcon=0.0, loss__sparsity=0.0)
ARM_FIELDS = {
  "vanilla": dict(model__kind="vanilla", **_CE_ONLY),
  "icm": dict(model__kind="icm", **_CE_ONLY),
  "sms": dict(model__kind="sms", **_CE_ONLY),
  "cde_ce": dict(model__kind="cde_global", **_CE_ONLY),
  "cde_ce_supcon": dict(model__kind="cde_global", loss__sparsity=0.0),
  "cde_ce_l1": dict(model__kind="cde_global", loss__supcon=0.0),
  "cde": dict(model__kind="cde_global"),
  "cde_global": dict(model__kind="cde_global"),
  "cde_l1_sum": dict(model__kind="cde_global", loss__sparsity_kind="l1_sum"),
  "cde_l1_schedule": dict(model__kind="cde_global", loss__sparsity_kind="l1_schedule"),
  "cde_l1_normalised": dict(model__kind="cde_global", loss__sparsity_kind="l1_normalised"),
  "cde_topk": dict(model__kind="cde_global", loss__sparsity_kind="topk"),
  "cde_no_ramp": dict(model__kind="cde_global", loss__ramp_fraction=0.0),
  "cde_warmup": dict(model__kind="cde_global", warmup__steps=300),
  "cde_patch": dict(model__kind="cde_patch", model__patch_loss="aggregate"),
  "cde_patch_per_patch": dict(model__kind="cde_patch", model__patch_loss="per_patch"),
}
SPLIT_COLUMNS = (("iid", "IID"), ("ood_comp", "OOD-comp"), ("ood_syst", "OOD-syst"))
SPLIT_COLUMNS += (("ood_scene", "OOD-scene"),)


def study_arms(config: ml_collections.ConfigDict):
  arms = [(name, with_changes(config, **ARM_FIELDS[name])) for name in config.study.single_arms]
  for name in config.study.multi_arms:
    arms.append((f"multi_{name}", with_changes(config, data__scene="multi", **ARM_FIELDS[name])))
  digits = dict(
    data__objects="shapes_digits", data__num_syst_objects=config.study.digit_num_syst_objects
  )
  for name in config.study.digit_arms:
    arms.append((f"digits_{name}", with_changes(config, **digits, **ARM_FIELDS[name])))
  return arms


def _cell(result, key: str, scale: float = 100.0, digits: int = 1) -> str:
  return mean_std_cell(np.ravel(result[f"{key}_per_seed"]), scale=scale, digits=digits)


def _losses(arm_config) -> str:
  kind = arm_config.model.kind
  if kind == "sms":
    return f"CE + {arm_config.loss.sms:g} block MSE"
  if kind in ("vanilla", "icm"):
    return "CE" + (f" - {arm_config.loss.adversary:g} adv" if kind == "icm" else "")
  parts = ["CE"]
  if arm_config.loss.supcon:
    parts.append(f"{arm_config.loss.supcon:g} SupCon")
  if arm_config.loss.sparsity:
    kind = arm_config.loss.sparsity_kind
    detail = f" top-{arm_config.loss.sparsity_top_k}" if kind == "topk" else ""
    parts.append(f"{arm_config.loss.sparsity:g} {kind}{detail}")
  if kind == "cde_patch":
    parts.append(arm_config.model.patch_loss)
  return " + ".join(parts)


def _row(name: str, arm_config, result) -> dict:
  row = {
    "arm": name,
    "scene": arm_config.data.scene,
    "objects": arm_config.data.objects,
    "model": arm_config.model.kind,
    "loss": _losses(arm_config),
  }
  for key, label in SPLIT_COLUMNS:
    row[f"{label} %"] = _cell(result, f"{key}_accuracy")
  row["gap (pts)"] = _cell(result, "gap")
  row["train %"] = _cell(result, "train_accuracy")
  row["sparsity"] = _cell(result, "delta_sparsity", 1.0, 2)
  row["invariance"] = _cell(result, "invariance_ratio", 1.0, 2)
  row["object dep."] = _cell(result, "object_dependence_ratio", 1.0, 3)
  row["antonym cos"] = _cell(result, "antonym_cosine", 1.0, 2)
  row["Top-K in target %"] = (
    _cell(result, "topk_in_target_iid") if "topk_in_target_iid_per_seed" in result else "-"
  )
  return row


def _difference(results, a: str, b: str, key: str) -> float | None:
  if a in results and b in results:
    return 100.0 * (results[a][key] - results[b][key])
  return None


def paired_interval(results, a: str, b: str, key: str) -> tuple[float, float] | None:
  """Mean of `a - b` over seeds (seed s of both arms shares its data and initial key) and the
  half-width of its 95% Student-t interval; None when an arm is missing."""
  if a not in results or b not in results:
    return None
  diff = np.ravel(results[a][f"{key}_per_seed"]) - np.ravel(results[b][f"{key}_per_seed"])
  if diff.size < 2:
    return float(diff.mean()), float("nan")
  return float(diff.mean()), float(stats.t.ppf(0.975, diff.size - 1) * stats.sem(diff))


def verdict(interval: tuple[float, float], better: int) -> str:
  """ "better" / "worse" when the interval excludes 0 on that side (`better` = +1: higher is better),
  else "no difference resolved"."""
  mean, half = interval
  if not np.isfinite(half):
    return "one seed"
  if better * mean - half > 0:
    return "better"
  if better * mean + half < 0:
    return "worse"
  return "no difference resolved"


INVARIANCE_COMPARISONS = (("cde", "vanilla"), ("cde", "cde_ce"), ("cde_ce", "vanilla"))


def _invariance_summary(results) -> dict:
  """Invariance ratio (lower: more invariant) of CDE against vanilla and the CE-only delta, paired
  over seeds, with a verdict."""
  out = {}
  for a, b in INVARIANCE_COMPARISONS:
    interval = paired_interval(results, a, b, "invariance_ratio")
    if interval is not None:
      out[f"invariance_{a}_minus_{b}"] = interval_cell(*interval)
      out[f"invariance_{a}_vs_{b}"] = verdict(interval, better=-1)
  return out


def _summary(results: Mapping[str, Mapping]) -> dict:
  summary = _invariance_summary(results)
  headline = ("cde", "vanilla", "icm", "sms", "cde_ce")
  for arm in headline + tuple(f"digits_{name}" for name in ("cde", "vanilla", "sms")):
    if arm in results:
      for key in ("iid_accuracy", "ood_comp_accuracy", "ood_syst_accuracy", "gap"):
        summary[f"{arm}_{key}"] = results[arm][key]
      summary[f"{arm}_antonym_cosine"] = results[arm]["antonym_cosine"]
  for split in ("ood_comp", "ood_syst", "ood_scene"):
    for baseline in ("vanilla", "sms"):
      summary[f"{split}_gain_cde_vs_{baseline}_pts"] = _difference(
        results, "cde", baseline, f"{split}_accuracy"
      )
      summary[f"digits_{split}_gain_cde_vs_{baseline}_pts"] = _difference(
        results, "digits_cde", f"digits_{baseline}", f"{split}_accuracy"
      )
  for prefix in ("", "digits_"):
    for baseline in ("vanilla", "sms"):
      cde_arm, base_arm = f"{prefix}cde", f"{prefix}{baseline}"
      if cde_arm in results and base_arm in results:
        summary[f"{prefix}gap_ratio_cde_over_{baseline}"] = results[cde_arm]["gap"] / max(
          results[base_arm]["gap"], 1e-9
        )
  if "cde" in results and "vanilla" in results:
    summary["ood_order_cde_gt_ce_only_gt_vanilla"] = bool(
      "cde_ce" in results
      and results["cde"]["ood_accuracy"]
      > results["cde_ce"]["ood_accuracy"]
      > results["vanilla"]["ood_accuracy"]
    )
  for arm, label in (
    ("cde_ce_supcon", "without_l1"),
    ("cde_ce_l1", "without_supcon"),
    ("cde_l1_sum", "l1_summed_over_coordinates"),
    ("cde_l1_schedule", "l1_scheduled"),
    ("cde_l1_normalised", "l1_of_unit_delta"),
    ("cde_topk", "topk_projector"),
    ("cde_no_ramp", "without_ramp"),
  ):
    summary[f"ood_drop_{label}_pts"] = _difference(results, "cde", arm, "ood_accuracy")
  summary["ood_drop_ce_only_pts"] = _difference(results, "cde", "cde_ce", "ood_accuracy")
  for patch in ("multi_cde_patch", "multi_cde_patch_per_patch"):
    for key in ("iid_accuracy", "ood_accuracy"):
      summary[f"{patch}_minus_global_{key}_pts"] = _difference(
        results, patch, "multi_cde_global", key
      )
  return {k: v for k, v in summary.items() if v is not None}


def report(config, results: Mapping[str, Mapping]) -> Report:
  arms = dict(study_arms(config))
  rows = [_row(name, arms[name], results[name]) for name in arms]
  return Report(
    rows=rows,
    summary=_summary(results),
    figures={"causal_delta_study": _figure(config, arms, results)},
    notes=(
      f"Accuracies and gap in percent (points), mean ± std over {config.num_seeds} seeds. gap = IID - "
      "mean(OOD-comp, OOD-syst). Probes on the IID test split of the classifier's input (CDE: the "
      "delta; vanilla/ICM: the pair embedding z): sparsity = share of |e_j| <= 1% of max_j |e_j|; "
      "invariance = within-action / total variance of the normalised embeddings; object dep. = "
      "variance across objects of per-(action, object) means / total; antonym cos = mean cosine of "
      "the action means of (open, close), (fill, empty), (turn_on, turn_off)."
    ),
  )


# ---------------------------------------------------------------------------------------------------
# Figure
# ---------------------------------------------------------------------------------------------------


def _accuracy_bars(ax, names, results, title: str) -> None:
  width = 0.8 / len(SPLIT_COLUMNS)
  for i, (key, label) in enumerate(SPLIT_COLUMNS):
    values = [100 * np.asarray(results[n][f"{key}_accuracy_per_seed"]) for n in names]
    ax.bar(
      np.arange(len(names)) + (i - 1.5) * width,
      [v.mean() for v in values],
      width,
      yerr=[v.std() for v in values],
      capsize=2,
      label=label,
    )
  ax.set_xticks(np.arange(len(names)), [n.removeprefix("multi_") for n in names], rotation=30)
  ax.set_ylabel("accuracy %")
  ax.set_ylim(0, 105)
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7, ncol=2)


def _cosine_panel(ax, result, title: str) -> None:
  image = ax.imshow(np.asarray(result["cosine_matrix"]), vmin=-1, vmax=1, cmap="RdBu_r")
  ticks = np.arange(len(triplets.ACTIONS))
  ax.set_xticks(ticks, triplets.ACTIONS, rotation=90, fontsize=7)
  ax.set_yticks(ticks, triplets.ACTIONS, fontsize=7)
  ax.set_title(title, fontsize=9)
  ax.figure.colorbar(image, ax=ax, fraction=0.046)


def _examples_panel(ax, arm_config, result) -> None:
  """OOD-comp pairs (before above after) with the true action above and the prediction below."""
  split = phases_lib.load_splits(arm_config.data)["comp"]
  predictions = np.asarray(result["example_prediction_comp"], int)
  k = min(6, len(predictions))
  size = arm_config.data.image_size
  mosaic = np.ones((2 * size + 2, k * (size + 2), 3), np.uint8) * 255
  for i in range(k):
    x = i * (size + 2)
    mosaic[:size, x : x + size] = split["before"][i]
    mosaic[size + 2 :, x : x + size] = split["after"][i]
    truth, guess = triplets.ACTIONS[split["action"][i]], triplets.ACTIONS[predictions[i]]
    ax.text(
      x + size / 2,
      -2,
      f"{truth}\n{triplets.ALL_OBJECTS[split['object'][i]]}",
      ha="center",
      fontsize=6,
    )
    ax.text(
      x + size / 2,
      2 * size + 5,
      guess,
      ha="center",
      va="top",
      fontsize=6,
      color="green" if truth == guess else "red",
    )
  ax.imshow(mosaic, interpolation="nearest")
  ax.axis("off")
  ax.set_title("CDE on OOD-comp pairs: truth (top), prediction (bottom)", fontsize=9, pad=18)


def _figure(config, arms, results):
  single = [n for n in arms if not n.startswith("multi_")]
  multi = [n for n in arms if n.startswith("multi_")]
  fig, axes = figure_grid(2, 3, figsize=(15, 8.5))
  if single:
    _accuracy_bars(axes[0, 0], single, results, "single-object scenes")
  if multi:
    _accuracy_bars(axes[0, 1], multi, results, "multi-object scenes")
  else:
    axes[0, 1].axis("off")
  main = "cde" if "cde" in results else (single or multi)[-1]
  _cosine_panel(axes[0, 2], results[main], f"{main}: cosine of action-mean embeddings")
  baseline = ("digits_" if main.startswith("digits_") else "") + "vanilla"
  baseline = baseline if baseline in results else main
  for ax, name in ((axes[1, 0], main), (axes[1, 1], baseline)):
    phases_lib.scatter_projection(ax, results[name])
    ax.set_title(f"{name}: 2-D PCA of IID embeddings", fontsize=9)
  _examples_panel(axes[1, 2], arms[main], results[main])
  fig.suptitle("Causal delta embeddings on ShapeTriplet pairs", fontsize=11)
  fig.tight_layout()
  return fig
