"""The dcd_ssm studies: E1 exact constructions, E2 training grid, E3 learnability gap (`study`), and the
fidelity sweeps (`gru_sweep`, `aussm_sweep`, `aussm_length`) that vary one training setting per arm."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import ml_collections
import numpy as np

from core import dcd_constructions
from core.data import groups as groups_lib
from methods.base import Report, figure_grid, markdown_table, with_changes

KIND_LABELS = {
  "aussm": "AUSSM",
  "simple_aussm": "Simple AUSSM",
  "neg_mamba": "NegMamba",
  "mamba": "Mamba",
  "s4d": "S4D",
  "gru": "GRU",
}

# ---------------------------------------------------------------------------------------------------
# Study: E1 exact constructions, E2 training grid, E3 learnability gap
# ---------------------------------------------------------------------------------------------------


def _e1_name(group: str, kind: str, layers: int) -> str:
  return f"e1_{group}_{kind}_{layers}L"


def _e2_name(group: str, kind: str, layers: int, seed: int) -> str:
  return f"e2_{group}_{kind}_{layers}L_seed{seed}"


def _e3_name(sigma: float, seed: int) -> str:
  return f"e3_S3_aussm_2L_sigma{sigma:g}_seed{seed}"


def study_arms(config: ml_collections.ConfigDict):
  """E1 (exact weights, evaluation only), E2 (grid from random init), E3 (construction + noise); or,
  when `study.sweep` is set, only the sweep's arms."""
  if config.study.sweep:
    return sweep_arms(config)
  return _e1_arms(config) + _e2_arms(config) + _e3_arms(config)


def _e1_arms(config) -> list:
  study, arms = config.study, []
  for group, kind, layers in study.e1_constructions:
    need = dcd_constructions.construction_for(group, kind, layers).required_sizes()
    arm = with_changes(
      config,
      **{f"model__{field}": max(config.model[field], size) for field, size in need.items()},
      data__group=group,
      model__kind=kind,
      model__num_layers=layers,
      model__init="construction",
      evaluate_only=True,
      eval__lengths=tuple(study.e1_lengths),
      eval__num_sequences=study.e1_num_sequences,
      eval__batch_size=study.e1_num_sequences,
    )
    arms.append((_e1_name(group, kind, layers), arm))
  return arms


def _e2_arms(config) -> list:
  study, arms = config.study, []
  for group in study.e2_groups:
    for kind, layers in study.e2_models:
      for seed in range(study.e2_seeds):
        arm = with_changes(
          config, seed=seed, data__group=group, model__kind=kind, model__num_layers=layers
        )
        arms.append((_e2_name(group, kind, layers, seed), arm))
  return arms


def _e3_arms(config) -> list:
  study, arms = config.study, []
  for sigma in study.e3_sigmas:
    for seed in range(study.e3_seeds):
      arm = with_changes(
        config,
        seed=seed,
        steps=study.e3_steps,
        optim__learning_rate=study.e3_learning_rate,
        data__group="S3",
        model__kind="aussm",
        model__num_layers=2,
        model__init="construction",
        model__init_noise=float(sigma),
        eval__lengths=tuple(study.e3_lengths),
      )
      arms.append((_e3_name(sigma, seed), arm))
  return arms


def _row(experiment, group, kind, layers, init, runs, success=None) -> dict:
  """One table row; over several runs: mean accuracies, the (lower) median longest length."""
  return {
    "experiment": experiment,
    "group": group,
    "model": kind,
    "layers": layers,
    "init": init,
    "accuracy_at_train_length": float(np.mean([r["accuracy_at_train_length"] for r in runs])),
    "accuracy_at_250": (
      float(np.mean([r["accuracy_at_250"] for r in runs])) if "accuracy_at_250" in runs[0] else None
    ),
    "longest_length_over_90": float(
      np.percentile([r["longest_length_over_90"] for r in runs], 50, method="lower")
    ),
    "runs": len(runs),
    "success_rate": success,
  }


def _e2_runs(config, results, group, kind, layers) -> list:
  names = (_e2_name(group, kind, layers, s) for s in range(config.study.e2_seeds))
  return [results[n] for n in names if n in results]


def _e3_runs(config, results, sigma) -> list:
  names = (_e3_name(sigma, s) for s in range(config.study.e3_seeds))
  return [results[n] for n in names if n in results]


def _e3_success(config, runs) -> float:
  key = f"accuracy_at_{config.study.e3_success_length}"
  return float(np.mean([r[key] > config.eval.threshold for r in runs]))


def _rows(config, results) -> list[dict]:
  study, rows = config.study, []
  for group, kind, layers in study.e1_constructions:
    name = _e1_name(group, kind, layers)
    if name in results:
      rows.append(_row("e1", group, kind, layers, "construction", [results[name]]))
  for group in study.e2_groups:
    for kind, layers in study.e2_models:
      runs = _e2_runs(config, results, group, kind, layers)
      if runs:
        rows.append(_row("e2", group, kind, layers, "random", runs))
  for sigma in study.e3_sigmas:
    runs = _e3_runs(config, results, sigma)
    if runs:
      init = f"construction+{sigma:g}"
      rows.append(_row("e3", "S3", "aussm", 2, init, runs, _e3_success(config, runs)))
  return rows


def _longest(config, results, group, kind, layers):
  runs = _e2_runs(config, results, group, kind, layers)
  return (
    float(np.percentile([r["longest_length_over_90"] for r in runs], 50, method="lower"))
    if runs
    else None
  )


def _length_cell(longest) -> str:
  if longest is None:
    return ""
  return "x" if longest == 0 else f"{longest:.0f}"


def _pivot(config, results) -> str:
  """The paper-style table: longest length with accuracy > threshold, group x (model, layers)."""
  columns = [tuple(c) for c in config.study.e2_models]
  return markdown_table(
    [
      {"group": group}
      | {f"{k} {L}L": _length_cell(_longest(config, results, group, k, L)) for k, L in columns}
      for group in config.study.e2_groups
    ]
  )


def _group_facts(names) -> dict[str, dict]:
  facts = {}
  for name in names:
    group = groups_lib.by_name(name)
    facts[name] = {
      "abelian": group.is_abelian(),
      "derived_length": groups_lib.derived_length(group),
    }
  return facts


def _summary(config, results) -> dict:
  """The expected outcomes of E1-E3, as measured (not asserted)."""
  study = config.study
  facts = _group_facts(sorted(set(study.e2_groups) | {"A5"}))
  e1 = [results[n] for n in (_e1_name(*c) for c in study.e1_constructions) if n in results]
  top = float(max(config.eval.lengths))
  dcd_models = [(k, L) for k, L in study.e2_models if k != "gru"]
  abelian = [g for g in study.e2_groups if facts[g]["abelian"]]
  non_abelian = [g for g in study.e2_groups if not facts[g]["abelian"]]
  longest = functools.partial(_longest, config, results)
  return {
    "e1_min_accuracy_all_positions": min((r["accuracy_all_positions"] for r in e1), default=None),
    "e1_length": max(study.e1_lengths),
    "derived_lengths": {g: f["derived_length"] for g, f in facts.items()},
    "A5_solvable": facts["A5"]["derived_length"] is not None,
    "abelian_aussm_1L_longest": {g: longest(g, "aussm", 1) for g in abelian},
    "non_abelian_dcd_1L_reaching_max_length": [
      f"{g}/{k}" for g in non_abelian for k, L in dcd_models if L == 1 and longest(g, k, 1) == top
    ],
    "dcd_cells_tracking_A5_at_train_length": [
      f"{k}/{L}L" for k, L in dcd_models if (longest("A5", k, L) or 0) > 0
    ],
    "gru_accuracy_at_train_length": {
      f"{g}/{L}L": float(np.mean([r["accuracy_at_train_length"] for r in runs]))
      for g in study.e2_groups
      for k, L in study.e2_models
      if k == "gru" and (runs := _e2_runs(config, results, g, k, L))
    },
    "e3_success_rate_by_sigma": {
      f"{s:g}": _e3_success(config, runs)
      for s in study.e3_sigmas
      if (runs := _e3_runs(config, results, s))
    },
  }


def _curve(config, run) -> tuple[list[int], list[float]]:
  """(lengths, accuracy at each) of one run's `accuracy_at_<L>`; lengths it lacks are left out."""
  lengths = [L for L in sorted(config.eval.lengths) if f"accuracy_at_{L}" in run]
  return lengths, [run[f"accuracy_at_{L}"] for L in lengths]


def _accuracy_panel(ax, config, title: str, train_length: int | None = None) -> None:
  ax.axhline(config.eval.threshold, color="gray", ls=":", lw=1)
  if train_length:
    ax.axvline(train_length, color="gray", ls="--", lw=1)
  ax.set(title=title, xlabel="length L", ylabel="accuracy at L", ylim=(0, 1.02), xscale="log")


def _accuracy_figure(config, results):
  """E2's accuracy against length, one panel per group and one line per (kind, layers) (median seed
  by mean over seeds), and E3's success rate against sigma."""
  study = config.study
  groups = list(study.e2_groups)
  cols = min(3, len(groups) + 1)
  rows = math.ceil((len(groups) + 1) / cols)
  fig, axes = figure_grid(rows, cols, panel_size=(4.6, 3.3))
  axes = axes.ravel()
  for ax, group in zip(axes, groups, strict=False):
    for index, (kind, layers) in enumerate(study.e2_models):
      runs = _e2_runs(config, results, group, kind, layers)
      if not runs:
        continue
      curves = [_curve(config, run) for run in runs]
      lengths = curves[0][0]
      mean = np.mean([c[1] for c in curves], axis=0)
      style = "-" if layers == 1 else "--"
      label = f"{KIND_LABELS.get(kind, kind)} {layers}L"
      ax.plot(lengths, mean, style, color=f"C{index // 2 if kind != 'gru' else 9}", label=label)
    chance = 1 / groups_lib.by_name(group).order
    _accuracy_panel(ax, config, f"E2: {group} (chance {chance:.2f})", config.data.train_length)
  if groups:
    axes[0].legend(fontsize=7, ncol=2)
  _e3_panel(axes[len(groups)], config, results)
  for ax in axes[len(groups) + 1 :]:
    ax.axis("off")
  fig.tight_layout()
  return fig


def _e3_panel(ax, config, results) -> None:
  study = config.study
  sigmas = [s for s in study.e3_sigmas if _e3_runs(config, results, s)]
  rates = [_e3_success(config, _e3_runs(config, results, s)) for s in sigmas]
  ax.plot(sigmas, rates, "o-")
  ax.set(
    xlabel="init noise sigma (relative to weight RMS)",
    ylabel=f"success: > {config.eval.threshold:.0%} at L={study.e3_success_length}",
    ylim=(-0.05, 1.05),
    title="E3: S3, 2-layer AUSSM from the construction",
  )


def _longest_figure(config, results):
  study = config.study
  columns = [tuple(c) for c in study.e2_models]
  grid = np.array(
    [[_longest(config, results, g, k, L) or 0.0 for k, L in columns] for g in study.e2_groups]
  )
  fig, ((ax,),) = figure_grid(figsize=(10, 4))
  image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(config.eval.lengths), aspect="auto")
  ax.set_xticks(range(len(columns)), [f"{k}\n{L}L" for k, L in columns], fontsize=7)
  ax.set_yticks(range(len(study.e2_groups)), study.e2_groups)
  for (i, j), value in np.ndenumerate(grid):
    ax.text(j, i, _length_cell(value), ha="center", va="center", color="w", fontsize=7)
  ax.set_title(
    f"E2: longest length with accuracy > {config.eval.threshold:.0%} "
    f"(train length {config.data.train_length})"
  )
  fig.colorbar(image, ax=ax)
  fig.tight_layout()
  return fig


def _figures(config, results):
  figures = {"dcd_ssm_study": _accuracy_figure(config, results)}
  if config.study.e2_groups:
    figures["dcd_ssm_longest"] = _longest_figure(config, results)
  return figures


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  if config.study.sweep:
    return sweep_report(config, results)
  notes = (
    f"Longest length with accuracy > {config.eval.threshold:.0%} (E2, median over seeds; x = below "
    f"it already at the shortest length; below {config.data.train_length}: fails in distribution):\n\n"
  )
  return Report(
    rows=_rows(config, results),
    summary=_summary(config, results),
    figures=_figures(config, results),
    notes=notes + _pivot(config, results),
  )


# ---------------------------------------------------------------------------------------------------
# Fidelity sweeps: one (group, kind, layers) per panel, one training setting per arm
# ---------------------------------------------------------------------------------------------------


SWEEP_DEFAULTS = (0, "")  # an entry's optional (seed, model change)
# a sweep entry's model change: name -> config changes (the name is the arm name's suffix)
MODEL_CHANGES = {
  "": {},
  "b0": {"model__input_term": "none"},
  "norm": {"model__block_norm": True},
}
MODEL_CHANGE_LABELS = {"": "", "b0": ", b = 0", "norm": ", RMSNorm"}


def _entries(config) -> list[tuple]:
  """`study.sweep` as `(group, kind, layers, learning_rate, steps, train_length, seed, change)`
  tuples, the last two defaulting to `SWEEP_DEFAULTS`; `change` names a `MODEL_CHANGES` entry."""
  entries = []
  for entry in config.study.sweep:
    if not 6 <= len(entry) <= 8 or (len(entry) == 8 and entry[7] not in MODEL_CHANGES):
      raise ValueError(
        "config.study.sweep: entries are (group, kind, layers, learning_rate, steps, "
        f"train_length[, seed[, change in {sorted(MODEL_CHANGES)}]]), got {tuple(entry)}"
      )
    entries.append(tuple(entry) + SWEEP_DEFAULTS[len(entry) - 6 :])
  return entries


def _sweep_name(group, kind, layers, learning_rate, steps, train_length, seed, change) -> str:
  name = f"sweep_{group}_{kind}_{layers}L_lr{learning_rate:g}_steps{steps}_T{train_length}"
  return name + (f"_seed{seed}" if seed else "") + (f"_{change}" if change else "")


def sweep_arms(config: ml_collections.ConfigDict) -> list:
  """One arm per `study.sweep` entry `(group, kind, layers, learning_rate, steps, train_length[,
  seed[, model change]])`, evaluated on `eval.lengths` plus its own training length. An arm's config
  holds no sweep (it trains alone), so adding an entry leaves the finished arms finished."""
  arms = []
  for entry in _entries(config):
    group, kind, layers, learning_rate, steps, train_length, seed, change = entry
    arm = with_changes(
      config,
      **MODEL_CHANGES[change],
      seed=seed,
      data__group=group,
      data__train_length=train_length,
      model__kind=kind,
      model__num_layers=layers,
      optim__learning_rate=float(learning_rate),
      steps=steps,
      eval__lengths=tuple(sorted(set(config.eval.lengths) | {train_length})),
      study__sweep=(),
    )
    arms.append((_sweep_name(*entry), arm))
  return arms


def _sweep_rows(config, results) -> list[dict]:
  rows = []
  for entry in _entries(config):
    if _sweep_name(*entry) not in results:
      continue
    run = results[_sweep_name(*entry)]
    group, kind, layers, learning_rate, steps, train_length, seed, change = entry
    rows.append(
      {
        "group": group,
        "model": kind,
        "layers": layers,
        "learning_rate": learning_rate,
        "steps": steps,
        "train_length": train_length,
        "seed": seed,
        "model_change": change or "none",
        "accuracy_at_train_length": run["accuracy_at_train_length"],
        "accuracy_at_1000": run.get("accuracy_at_1000"),
        "longest_length_over_90": run["longest_length_over_90"],
        "state_growth": run.get("state_growth"),
      }
    )
  return rows


def _sweep_figure(config, results):
  entries = _entries(config)
  panels = sorted({entry[:3] for entry in entries})
  fig, axes = figure_grid(1, len(panels), panel_size=(4.6, 3.3))
  for ax, panel in zip(axes.ravel(), panels, strict=True):
    for entry in entries:
      if entry[:3] != panel or _sweep_name(*entry) not in results:
        continue
      lr, steps, train_length, seed, change = entry[3:]
      run = results[_sweep_name(*entry)]
      lengths = sorted(set(config.eval.lengths) | {train_length})
      lengths = [L for L in lengths if f"accuracy_at_{L}" in run]
      label = f"lr {lr:g}, {steps} steps, T {train_length}" + (f", seed {seed}" if seed else "")
      label += MODEL_CHANGE_LABELS[change]
      ax.plot(lengths, [run[f"accuracy_at_{L}"] for L in lengths], label=label)
    group, kind, layers = panel
    _accuracy_panel(ax, config, f"{group}, {KIND_LABELS.get(kind, kind)} {layers}L")
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


def sweep_report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  """The sweep's table (one row per arm), its longest lengths by arm, and accuracy against length."""
  rows = _sweep_rows(config, results)
  names = [_sweep_name(*entry) for entry in _entries(config)]
  summary = {
    "longest_length_over_90": {
      name: results[name]["longest_length_over_90"] for name in names if name in results
    }
  }
  return Report(
    rows=rows,
    summary=summary,
    figures={f"dcd_ssm_{config.variant}": _sweep_figure(config, results)},
    notes=markdown_table(rows) if rows else "",
  )
