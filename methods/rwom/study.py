"""R-WoM's study: one arm per seed (world, data, model), per milestone weight and seed, the
explicit arms of `study.arms` (counterfactual fraction, model size, seed), or the named config changes
of `study.mix_arms` per seed; the table of agents and probes per split (for `study.mix_arms`, one row
per arm) with mean ± std over seeds, the summary (issue keys with 95% intervals) and the figure by
horizon (or, over weights or arm groups, of the milestone flag and agent success)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import ml_collections
import numpy as np

from methods.base import (
  ConfigError,
  Report,
  figure_grid,
  interval_cell,
  lookup,
  mean_std_cell,
  with_changes,
)

PROBES = (
  ("next_state_id", "next-state id %"),
  ("plan_alignment", "plan alignment %"),
  ("full_procedure", "full procedure %"),
  ("milestone_balanced_accuracy", "milestone bal. acc %"),
  ("segment_choice", "segment choice %"),
)
# the home-screen flag diagnostics (phases.home_flag_diagnostics), per tutorial context
DIAGNOSTICS = (("flag_auc", "home flag AUC x100"), ("action_accuracy", "home action acc %"))
DIAGNOSTIC_CONTEXTS = ("none", "retrieved", "gold")
ARM_NAME = re.compile(r"^cf(\d+(?:\.\d+)?)_(small|large)_seed(\d+)$")
CONTEXT_STYLE = {
  "none": "tab:gray",
  "retrieved": "tab:blue",
  "oracle": "tab:green",
  "random": "tab:orange",
}


def explicit_arm(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """The arm `cf<fraction>_<small|large>_seed<seed>` of `study.arms`: `data.counterfactual_fraction`
  = fraction, the config's own model (`small`) or `study.large` (width, depth, heads, steps), the
  seed for world, data and model."""
  match = ARM_NAME.match(name)
  if match is None:
    raise ConfigError(f"config.study.arms: {name!r} is not cf<fraction>_<small|large>_seed<seed>")
  fraction, size, seed = float(match[1]), match[2], int(match[3])
  if fraction > 1:
    raise ConfigError(f"config.study.arms: {name!r} has a fraction above 1")
  # an arm's config does not list its siblings: a finished arm stays finished when the list changes
  changes = {"seed": seed, "world__world_seed": seed, "data__counterfactual_fraction": fraction}
  changes["study__arms"] = ()
  if size == "large":
    large = config.study.large
    changes.update(
      model__width=large.width,
      model__depth=large.depth,
      model__num_heads=large.num_heads,
      steps=large.steps,
    )
  return with_changes(config, **changes)


def mix_arm(config: ml_collections.ConfigDict, name: str, seed: int) -> ml_collections.ConfigDict:
  """The arm `name` of `study.mix_arms` on `seed` (world, data, model): the config with the changes
  `study.mix[name]` (`with_changes` keywords, `data__tutorial_dropout`), each naming a field the
  config has. The arm's config lists no sibling (`study.mix_arms` and `study.mix` empty), so a
  finished arm stays finished when the list changes."""
  if name not in config.study.mix:
    raise ConfigError(
      f"config.study.mix_arms: {name!r} has no changes in config.study.mix "
      f"(known: {sorted(config.study.mix)})"
    )
  changes = config.study.mix[name].to_dict()
  for key in changes:
    try:
      lookup(config, key.replace("__", "."))
    except ConfigError:
      raise ConfigError(f"config.study.mix.{name}: {key!r} names no field of the config") from None
  changes.update(seed=seed, world__world_seed=seed, study__mix_arms=(), study__mix={})
  return with_changes(config, **changes)


def arm_group(name: str) -> str:
  """`cf1_large_seed0` -> `cf1_large` (the arms a report pools over seeds)."""
  return name.rsplit("_seed", 1)[0]


def study_arms(config: ml_collections.ConfigDict):
  """One arm per seed (world, data, model); with `study.milestone_weights`, one per weight and seed,
  named `w<weight>_seed<seed>`; with `study.arms`, exactly those (`explicit_arm`); with
  `study.mix_arms`, one per name and seed, `<name>_seed<seed>` (`mix_arm`)."""
  mix = tuple(config.study.get("mix_arms", ()))
  if mix:
    return [
      (f"{name}_seed{seed}", mix_arm(config, name, seed))
      for name in mix
      for seed in config.study.seeds
    ]
  explicit = tuple(config.study.get("arms", ()))
  if explicit:
    return [(name, explicit_arm(config, name)) for name in explicit]
  weights = tuple(config.study.get("milestone_weights", ()))
  if not weights:
    return [
      (f"seed{seed}", with_changes(config, seed=seed, world__world_seed=seed))
      for seed in config.study.seeds
    ]
  return [
    (
      f"{_weight_prefix(w)}seed{seed}",
      with_changes(config, seed=seed, world__world_seed=seed, milestone_weight=float(w)),
    )
    for w in weights
    for seed in config.study.seeds
  ]


def _weight_prefix(weight) -> str:
  return f"w{float(weight):g}_"


def _values(results, key):
  return [arm[key] for arm in results.values() if key in arm and arm[key] is not None]


def _interval(values) -> tuple[float, float]:
  """Mean and the half-width of a normal 95% interval over seeds (0 with one seed)."""
  values = np.asarray(values, float)
  half = 1.96 * values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
  return float(values.mean()), float(half)


def _rows(config, results) -> list[dict]:
  e = config.eval
  rows = []
  for split in e.splits:
    row = {"split": split}
    for agent in e.agents if split in e.agent_splits else ():
      row[f"success {agent} %"] = mean_std_cell(_values(results, f"success_{agent}_{split}"), 100)
    for context in ("none", "retrieved"):
      acc = _values(results, f"sim_accuracy_{context}_{split}")
      row[f"sim@{e.horizon} {context} %"] = mean_std_cell([a[-1] for a in acc], 100)
      for key, label in PROBES:
        row[f"{label} {context}"] = mean_std_cell(_values(results, f"{key}_{context}_{split}"), 100)
    for key, label in DIAGNOSTICS:
      for context in DIAGNOSTIC_CONTEXTS:
        values = _values(results, f"{key}_{context}_{split}")
        if values:
          row[f"{label} {context}"] = mean_std_cell(values, 100)
    rows.append(row)
  columns = sorted({c for row in rows for c in row}, key=lambda c: (c != "split", c))
  return [{c: row.get(c, "") for c in columns} for row in rows]


def _summary(config, results) -> dict:
  e = config.eval
  summary = {}
  keys = [f"success_{a}" for a in e.agents]
  keys += ["long_horizon_accuracy_gain", "accuracy_gain_at_last_horizon", "full_procedure_gain"]
  keys += [f"{k}_{c}" for k in ("judge_accuracy", "value_accuracy") for c in ("none", "retrieved")]
  keys += ["chance_accuracy"]
  keys += [f"{k}_{c}" for k, _ in DIAGNOSTICS for c in DIAGNOSTIC_CONTEXTS]
  keys += [f"{k}_{c}_{s}" for k, _ in DIAGNOSTICS for c in DIAGNOSTIC_CONTEXTS for s in e.splits]
  keys += [f"success_{a}_{s}" for a in e.agents for s in e.agent_splits]
  keys += [f"recall{k}_{q}" for k in (1, 5) for q in ("raw", "rewrite", "rewrite_rerank")]
  keys += ["rerank_changes_context"]
  for key in keys:
    values = _values(results, key)
    if values:
      summary[key], summary[f"{key}_ci95"] = _interval(values)
      summary[f"{key}_std"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
  for split in e.splits:
    for context in e.contexts:
      curves = _values(results, f"sim_accuracy_{context}_{split}")
      if curves:
        summary[f"sim_accuracy_{context}_{split}"] = np.mean(curves, 0).tolist()
    if f"sim_accuracy_retrieved_{split}" in summary:
      gap = np.subtract(
        summary[f"sim_accuracy_retrieved_{split}"], summary[f"sim_accuracy_none_{split}"]
      )
      summary[f"sim_gain_by_horizon_{split}"] = gap.tolist()
  return summary


def _notes(config, summary) -> str:
  lines = [f"{len(config.study.seeds)} seed(s); table cells are mean ± std over seeds."]
  keys = ("success_rwom", "success_rwom_absolute", "success_wm", "success_none")
  keys += ("long_horizon_accuracy_gain", "accuracy_gain_at_last_horizon", "full_procedure_gain")
  keys += ("judge_accuracy_retrieved", "value_accuracy_retrieved", "chance_accuracy")
  keys += tuple(f"flag_auc_{c}" for c in DIAGNOSTIC_CONTEXTS)
  for key in keys:
    if key in summary:
      cell = interval_cell(summary[key], summary[key + "_ci95"])
      lines.append(f"{key}: {cell} (95% interval; std over arms {summary[key + '_std']:.3f})")
  return "\n".join(lines)


def _figure(config, results, summary):
  e = config.eval
  test_splits = [s for s in e.splits if s != "seen"] or list(e.splits)
  fig, axes = figure_grid(1, len(test_splits) + 2, figsize=(4.6 * (len(test_splits) + 2), 3.8))
  horizons = np.arange(1, e.horizon + 1)
  for ax, split in zip(axes[0, : len(test_splits)], test_splits, strict=True):
    for context in e.contexts:
      curves = np.asarray(_values(results, f"sim_accuracy_{context}_{split}"), float)
      if curves.size == 0:
        continue
      mean = curves.mean(0)
      ax.plot(horizons, 100 * mean, marker="o", color=CONTEXT_STYLE[context], label=context)
      if len(curves) > 1:
        spread = 100 * curves.std(0)
        ax.fill_between(
          horizons,
          100 * mean - spread,
          100 * mean + spread,
          color=CONTEXT_STYLE[context],
          alpha=0.2,
        )
    ax.set_xlabel("simulated step k (open loop)")
    ax.set_ylabel("exact-match state accuracy (%)")
    ax.set_ylim(0, 102)
    ax.set_title(f"simulation, {split} apps")
    ax.legend(fontsize=8, title="tutorial context", title_fontsize=8)
  ax = axes[0, len(test_splits)]
  if e.agent_splits:
    _agent_bars(ax, config, results)
  else:
    _gain_by_horizon(ax, config, results, test_splits)
  ax = axes[0, len(test_splits) + 1]
  labels = [label for _, label in PROBES]
  for j, context in enumerate(("none", "retrieved")):
    values = [
      100
      * np.nanmean(
        [np.mean(_values(results, f"{key}_{context}_{s}") or [np.nan]) for s in test_splits]
      )
      for key, _ in PROBES
    ]
    ax.bar(
      np.arange(len(PROBES)) + 0.4 * j, values, 0.4, color=CONTEXT_STYLE[context], label=context
    )
  ax.set_xticks(np.arange(len(PROBES)) + 0.2, labels, rotation=30, ha="right", fontsize=7)
  ax.set_ylim(0, 105)
  ax.set_title("probes, novel + updated apps")
  ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def _agent_bars(ax, config, results) -> None:
  e = config.eval
  width = 0.8 / len(e.agents)
  for i, agent in enumerate(e.agents):
    means, halves = zip(
      *[_interval(_values(results, f"success_{agent}_{s}") or [np.nan]) for s in e.agent_splits],
      strict=True,
    )
    ax.bar(
      np.arange(len(e.agent_splits)) + i * width,
      100 * np.asarray(means),
      width,
      yerr=100 * np.asarray(halves),
      label=agent,
    )
  ax.set_xticks(np.arange(len(e.agent_splits)) + 0.4 - width / 2, e.agent_splits)
  ax.set_ylabel("task success (%)")
  ax.set_title("agents (95% interval over seeds)")
  ax.legend(fontsize=7, ncol=2)


def _gain_by_horizon(ax, config, results, splits) -> None:
  """Retrieved minus none exact-match accuracy by horizon, mean of `splits`, with its 95% interval
  over the arms."""
  horizons = np.arange(1, config.eval.horizon + 1)
  gains = np.asarray(
    [
      np.mean(
        [
          np.subtract(arm[f"sim_accuracy_retrieved_{s}"], arm[f"sim_accuracy_none_{s}"])
          for s in splits
        ],
        0,
      )
      for arm in results.values()
    ]
  )
  cells = [_interval(gains[:, k]) for k in range(len(horizons))]
  mean, half = (100 * np.asarray(v) for v in zip(*cells, strict=True))
  ax.errorbar(horizons, mean, yerr=half, marker="o", capsize=3)
  ax.axhline(0, color="k", lw=0.5)
  ax.set_xlabel("simulated step k (open loop)")
  ax.set_ylabel("retrieved - none accuracy (points)")
  ax.set_title(f"gain by horizon, {len(gains)} arms (95% interval)")


def _weighted_report(config, results) -> Report:
  """Per milestone weight: the table rows (a `milestone weight` column), the summary keys with a
  `_w<weight>` suffix and the figure of milestone recognition and agent success by weight."""
  groups = {}
  for w in config.study.milestone_weights:
    prefix = _weight_prefix(w)
    group = {k: v for k, v in results.items() if k.startswith(prefix)}
    if group:
      groups[(f"{float(w):g}", prefix[:-1])] = group
  report = _grouped_report(config, groups, "milestone weight")
  names = {f"w = {label}": group for (label, _), group in groups.items()}
  return dataclasses.replace(report, figures={"rwom_reward": _reward_figure(config, names)})


def _arms_report(config, results) -> Report:
  """Per arm group of `study.arms` (`cf<fraction>_<size>`): rows with an `arms` column, summary
  keys with a `_<group>` suffix, and the figure of the home-screen flag AUC and agent success."""
  groups = {}
  for name in config.study.arms:
    group = arm_group(name)
    if name in results:
      groups.setdefault((group, group), {})[name] = results[name]
  report = _grouped_report(config, groups, "arms")
  names = {label: group for (label, _), group in groups.items()}
  figure = _counterfactual_figure(config, names)
  return dataclasses.replace(report, figures={"rwom_counterfactual": figure})


def _grouped_report(config, groups, column) -> Report:
  rows, summary, notes = [], {}, []
  for (label, suffix), group in groups.items():
    rows += [{column: label, **row} for row in _rows(config, group)]
    part = _summary(config, group)
    summary.update({f"{k}_{suffix}": v for k, v in part.items()})
    notes.append(f"{column} {label}: " + _notes(config, part).replace("\n", "; "))
  return Report(rows=rows, summary=summary, figures={}, notes="\n".join(notes))


def _interval_bars(ax, groups, series, scale: float = 1.0) -> None:
  """One bar per (group, series) with its 95% interval over the group's arms (seeds): `series` maps a
  label to `(metric prefix, splits, colour)`, the arm's value the mean of `<prefix>_<split>` over the
  splits; groups along x, series side by side within 0.8 of a slot."""
  width = 0.8 / len(series)
  for i, (label, (prefix, splits, color)) in enumerate(series.items()):
    cells = [
      _interval([np.mean([arm[f"{prefix}_{s}"] for s in splits]) for arm in group.values()])
      for group in groups.values()
    ]
    means, halves = (np.asarray(v) for v in zip(*cells, strict=True))
    x = np.arange(len(groups)) + i * width
    ax.bar(x, scale * means, width, yerr=scale * halves, color=color, label=label)
  ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, list(groups))


def _counterfactual_figure(config, groups):
  """Home-screen flag AUC per tutorial context, and agent success, by arm group (novel + updated);
  wider than 12 inches past four groups."""
  e = config.eval
  test_splits = [s for s in e.splits if s != "seen"] or list(e.splits)
  fig, axes = figure_grid(1, 2, figsize=(max(12.0, 3.2 * len(groups)), 3.8))
  ax = axes[0, 0]
  colors = {"none": "tab:gray", "retrieved": "tab:blue", "gold": "tab:green"}
  _interval_bars(
    ax,
    groups,
    {f"tutorials: {c}": (f"flag_auc_{c}", test_splits, colors[c]) for c in DIAGNOSTIC_CONTEXTS},
  )
  ax.set_ylim(0.3, 1.0)
  ax.axhline(0.5, color="k", lw=0.5)
  ax.set_ylabel("flag AUC, right vs wrong top menu at home")
  ax.set_title("milestone flag where the tutorial decides it")
  ax.legend(fontsize=8)
  _success_bars(axes[0, 1], config, groups)
  fig.tight_layout()
  return fig


def _success_bars(ax, config, groups):
  e = config.eval
  series = {agent: (f"success_{agent}", e.agent_splits, None) for agent in e.agents}
  _interval_bars(ax, groups, series, scale=100)
  ax.set_ylabel("task success (%), novel + updated")
  ax.set_title("agents (95% interval over seeds)")
  ax.legend(fontsize=7, ncol=2)


def _reward_figure(config, groups):
  """Milestone balanced accuracy with and without tutorials, and agent success, by weight (`groups`:
  label -> arms)."""
  e = config.eval
  test_splits = [s for s in e.splits if s != "seen"] or list(e.splits)
  fig, axes = figure_grid(1, 2, figsize=(11, 3.8))
  ax = axes[0, 0]
  series = {
    f"tutorials: {c}": (f"milestone_balanced_accuracy_{c}", test_splits, CONTEXT_STYLE[c])
    for c in ("none", "retrieved")
  }
  _interval_bars(ax, groups, series, scale=100)
  ax.set_ylim(40, 100)
  ax.axhline(50, color="k", lw=0.5)
  ax.set_ylabel("milestone balanced accuracy (%)")
  ax.set_title("milestone flag, novel + updated apps")
  ax.legend(fontsize=8)
  _success_bars(axes[0, 1], config, groups)
  fig.tight_layout()
  return fig


def _mix_report(config, results) -> Report:
  """Per arm of `study.mix_arms` (pooled over its seeds): one row (`_mix_row`), the summary keys with
  a `_<arm>` suffix and the figure of the home-screen flag AUC per context and agent success."""
  groups = {}
  for name in config.study.mix_arms:
    group = {k: v for k, v in results.items() if arm_group(k) == name}
    if group:
      groups[name] = group
  notes = []
  if "flag_only" in groups:
    notes.append(
      "flag_only trains the milestone flag alone: its next states and actions are untrained, so "
      "its simulation, probes 1-2, action accuracy and world-model agents (wm, rwom) measure an "
      "untrained head; its flag AUC is the capacity check."
    )
  summary = {}
  for name, group in groups.items():
    part = _summary(config, group)
    summary.update({f"{k}_{name}": v for k, v in part.items()})
    notes.append(f"arm {name}: " + _notes(config, part).replace("\n", "; "))
  return Report(
    rows=[_mix_row(config, name, group) for name, group in groups.items()],
    summary=summary,
    figures={"rwom_flag_mix": _counterfactual_figure(config, groups)},
    notes="\n".join(notes),
  )


JUDGE_ACCURACIES = (
  ("judge_accuracy_retrieved", "judge acc."),
  ("value_accuracy_retrieved", "value acc."),
  ("chance_accuracy", "chance acc."),
)


def _mix_row(config, name, group) -> dict:
  """The arm's home-screen flag AUC and action accuracy per tutorial context and its agents'
  success (means over the test splits, `headline`), the retrieved simulation accuracy at the
  last horizon (mean over the test splits) and, where the judge ran, the accuracy of the listwise
  judge, of the per-candidate value and of chance at picking a best candidate; cells mean ± std
  over the arm's seeds."""
  e = config.eval
  row = {"arm": name}
  for key, label in DIAGNOSTICS:
    for context in DIAGNOSTIC_CONTEXTS:
      row[f"{label} {context}"] = mean_std_cell(_values(group, f"{key}_{context}"), 100)
  for agent in e.agents:
    row[f"success {agent} %"] = mean_std_cell(_values(group, f"success_{agent}"), 100)
  test_splits = [s for s in e.splits if s != "seen"] or list(e.splits)
  last = [
    np.mean([arm[f"sim_accuracy_retrieved_{s}"][-1] for s in test_splits]) for arm in group.values()
  ]
  row[f"sim@{e.horizon} retrieved %"] = mean_std_cell(last, 100)
  for key, label in JUDGE_ACCURACIES:
    if all(key in arm for arm in group.values()):
      row[f"{label} %"] = mean_std_cell(_values(group, key), 100)
  return row


def report(config, results: Mapping[str, Mapping]) -> Report:
  if config.study.get("mix_arms", ()):
    return _mix_report(config, results)
  if config.study.get("arms", ()):
    return _arms_report(config, results)
  if config.study.get("milestone_weights", ()):
    return _weighted_report(config, results)
  summary = _summary(config, results)
  return Report(
    rows=_rows(config, results),
    summary=summary,
    figures={"rwom_study": _figure(config, results, summary)},
    notes=_notes(config, summary),
  )
