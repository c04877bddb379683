"""FGL's CPU study (`configs/fgl.py:study`): the claims of "Forest-Based Graph Learning for
Semi-Supervised Node Classification" (ICLR 2026) on contextual SBM graphs of chosen homophily.

* accuracy against edge homophily h: MLP, GCN, GAT, GCN-8, GCN on G-hat, FGL with uniform,
  estimated and oracle scores (the paper's comparison with local GNNs and its score ablation);
* edge homophily of G, G-hat and the sampled trees (sampled trees are more homophilous than uniform
  ones);
* Theorem 2: tree edge-homophily of Wilson trees with binary scores p/q = Delta against the bound
  1 - (NHCC - 1)/(n - 1);
* the N_T (number of trees) ablation, and the aggregator's time against n (linear, Theorem 1)
  next to dense all-pairs attention.

`configs/fgl.py:oracle_noise` (`study.design = "oracle_noise"`) is a second study: at one h, FGL
with oracle scores mixed with noise at several levels, the paper's estimator, the estimator trained
on true labels and the NAAM agreement baseline, each against FGL-uniform on the same seed: the
accuracy gain as a function of the scores' edge AUC, and the AUC at which the gain reaches zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ml_collections
import numpy as np

from methods.base import Report, figure_grid, markdown_table, mean_std_cell, with_changes

ARMS = {  # study method name -> (model.kind, model.num_layers, model.graph, fgl.scores)
  "mlp": ("mlp", 2, "base", "estimator"),
  "gcn": ("gcn", 2, "base", "estimator"),
  "gat": ("gat", 2, "base", "estimator"),
  "gcn_deep": ("gcn", 8, "base", "estimator"),
  "gcn_aug": ("gcn", 2, "augmented", "estimator"),
  "fgl_uniform": ("fgl", 2, "base", "uniform"),
  "fgl": ("fgl", 2, "base", "estimator"),
  "fgl_oracle": ("fgl", 2, "base", "oracle"),
}

# ---------------------------------------------------------------------------------------------------
# Arms
# ---------------------------------------------------------------------------------------------------


def _arm(config, seed: int, homophily: float, **fields) -> ml_collections.ConfigDict:
  return with_changes(
    config, seed=seed, data__graph_seed=seed, data__split_seed=seed, data__homophily=homophily,
    **fields,
  )  # fmt: skip


def _arm_name(homophily: float, seed: int, method: str) -> str:
  return f"h{homophily:g}_s{seed}_{method}"


def study_arms(config: ml_collections.ConfigDict):
  if config.study.design == "oracle_noise":
    return noise_arms(config)
  study, arms = config.study, []
  for homophily in study.homophilies:
    theorem2 = _arm(config, 0, homophily)
    theorem2.analysis = "theorem2"
    arms.append((f"h{homophily:g}_theorem2", theorem2))
    for seed in study.seeds:
      for method in study.methods:
        kind, layers, graph, scores = ARMS[method]
        fields = dict(
          model__kind=kind, model__num_layers=layers, model__graph=graph, fgl__scores=scores
        )
        arms.append((_arm_name(homophily, seed, method), _arm(config, seed, homophily, **fields)))
  for num_trees in study.ablation_num_trees:
    if num_trees == config.fgl.num_trees and "fgl" in study.methods:
      continue  # the main FGL arms already ran with this N_T
    for seed in study.seeds:
      arm = _arm(config, seed, study.ablation_homophily, fgl__num_trees=num_trees)
      arms.append((_arm_name(study.ablation_homophily, seed, f"fgl_nt{num_trees}"), arm))
  scaling = ml_collections.ConfigDict(config.to_dict())
  scaling.analysis = "scaling"
  arms.append(("scaling", scaling))
  return arms


# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------


def _accuracy_cell(values) -> str:
  return mean_std_cell(values, scale=100, digits=1)


def _collect(results, homophily, seeds, method, key):
  return [results.get(_arm_name(homophily, s, method), {}).get(key) for s in seeds]


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  if config.study.design == "oracle_noise":
    return noise_report(config, results)
  study = config.study
  mean = lambda h, m, key="test_accuracy": _nanmean(_collect(results, h, study.seeds, m, key))
  rows = [
    {
      "h": h,
      **{
        m: _accuracy_cell(_collect(results, h, study.seeds, m, "test_accuracy"))
        for m in study.methods
      },
    }
    for h in study.homophilies
  ]
  notes = "\n\n".join(
    [
      "Test accuracy (%) above: mean ± std over seeds " + str(list(study.seeds)) + ".",
      _tree_table(results, study, mean),
      _theorem2_table(config, results),
      _ablation_table(config, results),
      _scaling_table(config, results),
    ]
  )
  summary = _summary(config, results, mean)
  return Report(
    rows=rows, summary=summary, figures={"fgl_study": _figure(config, results, mean)}, notes=notes
  )


def _nanmean(values) -> float:
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else float("nan")


def _titled_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  """`title` over a Markdown table of formatted cells (only its header when there are no rows)."""
  records = [dict(zip(columns, row, strict=True)) for row in rows]
  lines = markdown_table(records or [dict.fromkeys(columns, "")]).rstrip("\n").split("\n")
  return "\n".join([title, *(lines if rows else lines[:2])])


def _tree_table(results, study, mean) -> str:
  columns = ["h", "G", "G-hat", "uniform trees", "FGL trees", "oracle trees", "NHCC bound (G-hat)"]
  rows = []
  for h in study.homophilies:
    cells = [
      mean(h, "fgl", "graph_homophily"),
      mean(h, "fgl", "augmented_homophily"),
      mean(h, "fgl", "uniform_tree_homophily"),
      mean(h, "fgl", "tree_homophily"),
      mean(h, "fgl_oracle", "tree_homophily"),
      mean(h, "fgl", "theorem2_bound"),
    ]
    rows.append([f"{h:g}", *(f"{c:.3f}" for c in cells)])
  title = "Edge homophily of G, G-hat and trees (uniform = Wilson with s = 1 on G-hat):"
  return _titled_table(title, columns, rows)


def _theorem2_table(config, results) -> str:
  ratios = list(config.theorem2.ratios)
  columns = ["h", *(f"Delta={r:g}" for r in ratios), "bound 1-(NHCC-1)/(n-1)", "NHCC"]
  rows = []
  for h in config.study.homophilies:
    r = results.get(f"h{h:g}_theorem2")
    if r:
      cells = [f"{r[f'tree_homophily_delta{x:g}']:.3f}" for x in ratios]
      rows.append([f"{h:g}", *cells, f"{r['theorem2_bound']:.3f}", f"{r['nhcc']:.0f}"])
  title = (
    "Theorem 2: tree edge-homophily of Wilson trees of G with scores p/q = Delta "
    f"({config.theorem2.num_trees} trees each):"
  )
  return _titled_table(title, columns, rows)


def _ablation_table(config, results) -> str:
  study = config.study
  h = study.ablation_homophily
  rows = []
  for num_trees in study.ablation_num_trees:
    method = "fgl" if num_trees == config.fgl.num_trees else f"fgl_nt{num_trees}"
    accuracy = _accuracy_cell(_collect(results, h, study.seeds, method, "test_accuracy"))
    rows.append([f"{num_trees}", accuracy])
  return _titled_table(f"N_T ablation at h = {h:g} (test accuracy %):", ["N_T", "accuracy"], rows)


def _scaling_table(config, results) -> str:
  r = results.get("scaling")
  if not r:
    return ""
  rows = []
  for n in config.scaling.sizes:
    tree, dense = r[f"tree_ms_n{n}"], r[f"dense_ms_n{n}"]
    rows.append([f"{n}", f"{tree:.3g}", f"{dense:.3g}", f"{dense / tree:.3g}"])
  columns = ["n", "tree", "dense attention", "dense / tree"]
  table = _titled_table("Aggregator scaling (forward, ms; CPU):", columns, rows)
  slopes = f"tree {r['tree_loglog_slope']:.2f}, dense {r['dense_loglog_slope']:.2f}"
  return f"{table}\nlog-log slopes: {slopes}"


def _summary(config, results, mean) -> dict:
  hs = list(config.study.homophilies)
  low = [h for h in hs if h <= 0.3]
  high = [h for h in hs if h >= 0.7]
  acc = lambda h, m: mean(h, m)
  summary = {
    "fgl_minus_best_of_gcn_gat_low_h": _nanmean(
      [acc(h, "fgl") - max(acc(h, "gcn"), acc(h, "gat")) for h in low]
    ),
    "fgl_minus_mlp_low_h": _nanmean([acc(h, "fgl") - acc(h, "mlp") for h in low]),
    "fgl_minus_gcn_high_h": _nanmean([acc(h, "fgl") - acc(h, "gcn") for h in high]),
    "fgl_above_uniform_at_every_h": all(acc(h, "fgl") > acc(h, "fgl_uniform") for h in hs),
    "oracle_at_least_fgl_at_every_h": all(acc(h, "fgl_oracle") >= acc(h, "fgl") for h in hs),
    "fgl_trees_more_homophilous_than_uniform_at_every_h": all(
      mean(h, "fgl", "tree_homophily") > mean(h, "fgl", "uniform_tree_homophily") for h in hs
    ),
  }
  scaling = results.get("scaling")
  if scaling:
    summary["tree_loglog_slope"] = scaling["tree_loglog_slope"]
    summary["dense_loglog_slope"] = scaling["dense_loglog_slope"]
  return summary


# ---------------------------------------------------------------------------------------------------
# Figure
# ---------------------------------------------------------------------------------------------------


def _figure(config, results, mean):
  study = config.study
  hs = list(study.homophilies)
  fig, axes = figure_grid(1, 4, figsize=(19, 4))
  axes = axes[0]
  for method in study.methods:
    axes[0].plot(hs, [100 * mean(h, method) for h in hs], marker="o", label=method)
  axes[0].set(xlabel="edge homophily h", ylabel="test accuracy (%)", title="accuracy vs homophily")
  axes[0].legend(fontsize=7)
  for key, method, label in (
    ("graph_homophily", "fgl", "G"),
    ("augmented_homophily", "fgl", "G-hat"),
    ("uniform_tree_homophily", "fgl", "uniform trees"),
    ("tree_homophily", "fgl", "FGL trees"),
    ("tree_homophily", "fgl_oracle", "oracle trees"),
  ):
    axes[1].plot(hs, [mean(h, method, key) for h in hs], marker="o", label=label)
  axes[1].set(xlabel="h", ylabel="edge homophily", title="tree homophily")
  axes[1].legend(fontsize=7)
  _theorem2_panel(axes[2], config, results)
  scaling = results.get("scaling")
  if scaling:
    sizes = list(config.scaling.sizes)
    axes[3].loglog(
      sizes, [scaling[f"tree_ms_n{n}"] for n in sizes], marker="o", label="tree aggregator"
    )
    axes[3].loglog(
      sizes, [scaling[f"dense_ms_n{n}"] for n in sizes], marker="o", label="dense attention"
    )
    axes[3].set(xlabel="n", ylabel="forward ms", title="scaling")
    axes[3].legend(fontsize=7)
  fig.tight_layout()
  return fig


def _theorem2_panel(ax, config, results) -> None:
  ratios = list(config.theorem2.ratios)
  for i, h in enumerate(config.study.homophilies):
    r = results.get(f"h{h:g}_theorem2")
    if r:
      ax.semilogx(
        ratios,
        [r[f"tree_homophily_delta{x:g}"] for x in ratios],
        marker="o",
        color=f"C{i}",
        label=f"h={h:g}",
      )
      ax.axhline(r["theorem2_bound"], color=f"C{i}", ls="--", lw=0.8)
  ax.set(xlabel="p/q", ylabel="tree edge-homophily", title="Theorem 2 (dashed: NHCC bound)")
  ax.legend(fontsize=7)


# ---------------------------------------------------------------------------------------------------
# Score quality (`configs/fgl.py:oracle_noise`): accuracy gain over uniform trees against edge AUC
# ---------------------------------------------------------------------------------------------------

# study method name -> (fgl.scores, fgl.estimator_labels); the oracle-noise arms are added per level
NOISE_BASE_ARMS = {
  "fgl_uniform": ("uniform", "pseudo"),
  "fgl": ("estimator", "pseudo"),
  "fgl_agreement": ("agreement", "pseudo"),
  "fgl_true_estimator": ("estimator", "true"),
}
_NOISE_LABELS = {
  "fgl": "estimator (paper)",
  "fgl_agreement": "NAAM agreement",
  "fgl_true_estimator": "estimator on true labels",
}


def _noise_method(level: float) -> str:
  return f"fgl_noise{level:g}"


def noise_arms(config: ml_collections.ConfigDict):
  """FGL at h = `study.noise_homophily` with uniform, estimated, agreement, true-label-estimator and
  noisy oracle scores (one arm per `study.noise_levels` entry), over `study.seeds`."""
  study, h, arms = config.study, config.study.noise_homophily, []
  methods = {
    name: dict(fgl__scores=s, fgl__estimator_labels=t) for name, (s, t) in NOISE_BASE_ARMS.items()
  }
  for level in study.noise_levels:
    methods[_noise_method(level)] = dict(fgl__scores="oracle", fgl__oracle_noise=float(level))
  for seed in study.seeds:
    for method, fields in methods.items():
      arms.append((_arm_name(h, seed, method), _arm(config, seed, h, model__kind="fgl", **fields)))
  return arms


def gain_interval(gains) -> tuple[float, float]:
  """Mean and 95% Student-t half-width of per-seed paired gains (nan half-width for one seed)."""
  from scipy import stats

  gains = np.asarray([g for g in gains if g is not None], np.float64)
  if gains.size == 0:
    return float("nan"), float("nan")
  if gains.size == 1:
    return float(gains[0]), float("nan")
  half = stats.t.ppf(0.975, gains.size - 1) * gains.std(ddof=1) / np.sqrt(gains.size)
  return float(gains.mean()), float(half)


def break_even_auc(aucs, gains) -> float:
  """AUC where the mean gain first reaches 0 coming down from the best-AUC point (linear
  interpolation between neighbouring levels); nan if the gain never changes sign."""
  order = np.argsort(aucs)[::-1]
  a, g = np.asarray(aucs)[order], np.asarray(gains)[order]
  for i in range(1, len(a)):
    if g[i - 1] > 0 >= g[i]:
      return float(a[i] + (a[i - 1] - a[i]) * (0 - g[i]) / (g[i - 1] - g[i]))
  return float("nan")


def _noise_points(config, results):
  """Per method: mean score AUC, contrast, tree homophily, accuracy, gain over uniform (mean, half)."""
  study, h = config.study, config.study.noise_homophily
  seeds = list(study.seeds)
  uniform = _collect(results, h, seeds, "fgl_uniform", "test_accuracy")
  names = list(NOISE_BASE_ARMS) + [_noise_method(x) for x in study.noise_levels]
  points = {}
  for name in names:
    accuracy = _collect(results, h, seeds, name, "test_accuracy")
    gains = [
      None if a is None or u is None else 100 * (a - u)
      for a, u in zip(accuracy, uniform, strict=True)
    ]
    gain, half = gain_interval(gains)
    points[name] = {
      "auc": _nanmean(_collect(results, h, seeds, name, "score_auc")),
      "contrast": _nanmean(_collect(results, h, seeds, name, "score_contrast")),
      "tree_homophily": _nanmean(_collect(results, h, seeds, name, "tree_homophily")),
      "accuracy": accuracy,
      "gain": gain,
      "half": half,
    }
  return points


def noise_report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  study = config.study
  points = _noise_points(config, results)
  rows = []
  for name, p in points.items():
    level = name.removeprefix("fgl_noise") if name.startswith("fgl_noise") else "-"
    rows.append(
      {
        "scores": _NOISE_LABELS.get(name, "uniform" if name == "fgl_uniform" else "oracle + noise"),
        "noise": level,
        "edge AUC": f"{p['auc']:.3f}",
        "same/cross score": f"{p['contrast']:.2f}",
        "tree homophily": f"{p['tree_homophily']:.3f}",
        "accuracy %": _accuracy_cell(p["accuracy"]),
        "gain vs uniform (pts)": "-"
        if name == "fgl_uniform"
        else f"{p['gain']:+.1f} ± {p['half']:.1f}",
      }
    )
  levels = [_noise_method(x) for x in study.noise_levels]
  aucs = [points[m]["auc"] for m in levels]
  gains = [points[m]["gain"] for m in levels]
  h = study.noise_homophily
  summary = {
    "estimator_auc": points["fgl"]["auc"],
    "agreement_auc": points["fgl_agreement"]["auc"],
    "true_label_estimator_auc": points["fgl_true_estimator"]["auc"],
    "estimator_gain_vs_uniform": points["fgl"]["gain"],
    "agreement_gain_vs_uniform": points["fgl_agreement"]["gain"],
    "true_label_estimator_gain_vs_uniform": points["fgl_true_estimator"]["gain"],
    "break_even_auc": break_even_auc(aucs, gains),
    "agreement_auc_on_estimator_runs": _nanmean(
      _collect(results, h, study.seeds, "fgl", "agreement_score_auc")
    ),
  }
  notes = (
    f"FGL at h = {h:g}; gain = FGL accuracy minus FGL-uniform accuracy on the same seed, mean ± 95% "
    f"t-interval over seeds {list(study.seeds)}; edge AUC = P(s(same-label edge) > s(cross-label "
    "edge)) on G-hat; oracle + noise: s = p/q ** ((1 - noise) 1[same] + noise U(0, 1)), "
    f"p/q = {config.fgl.oracle_ratio:g}."
  )
  figure = _noise_figure(config, points)
  return Report(rows=rows, summary=summary, figures={"fgl_oracle_auc": figure}, notes=notes)


def _noise_figure(config, points):
  fig, axes = figure_grid(1, 1, panel_size=(6.5, 4.5))
  ax = axes[0][0]
  levels = [_noise_method(x) for x in config.study.noise_levels]
  x = [points[m]["auc"] for m in levels]
  y = [points[m]["gain"] for m in levels]
  err = [points[m]["half"] for m in levels]
  ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label="oracle + noise")
  for level, auc_value, gain in zip(config.study.noise_levels, x, y, strict=True):
    ax.annotate(
      f"{level:g}", (auc_value, gain), textcoords="offset points", xytext=(4, 4), fontsize=7
    )
  for i, name in enumerate(_NOISE_LABELS):
    p = points[name]
    ax.errorbar(
      [p["auc"]], [p["gain"]], yerr=[p["half"]], marker="s^D"[i], ls="none", capsize=3,
      color=f"C{i + 1}", label=_NOISE_LABELS[name],
    )  # fmt: skip
  ax.axhline(0.0, color="k", lw=0.8)
  ax.set(
    xlabel="edge AUC of the scores (same- vs cross-label edges of G-hat)",
    ylabel="FGL minus FGL-uniform (test accuracy, points)",
    title=f"score quality vs gain over uniform trees (h = {config.study.noise_homophily:g})",
  )
  ax.legend(fontsize=7)
  fig.tight_layout()
  return fig
