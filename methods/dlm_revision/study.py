"""The DLM-revision study: arms, the report (tables, summary) and the figure.

Arms: "programs" (E1 separation and E2 space at the study's sizes), one E3 arm per
`study.correction_rates` entry: "mdlm" (pi = 0, the plain MDLM loss) and "self_correction" (pi > 0:
the denoiser also scores revealed tokens, which revision and confidence remasking read), and the
paper's case of wider checks, "self_correction_<g>bit" (`study.wide_checks`: g-bit checks learned
with the tied-codeword curriculum at the largest correction rate, with its own exact denoiser).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import ml_collections
import numpy as np

from methods.base import Report, figure_grid, interval_cell, markdown_table, with_changes

E1_PROGRAMS = ("revision", "remasking", "monotone_chain")
TREES = ("monotone", "revision", "remasking")
SAMPLER_STYLE = {
  "ancestral": ("C0", "o"),
  "topk": ("C1", "s"),
  "remask_random": ("C4", "v"),
  "remask_confidence": ("C2", "^"),
  "revision": ("C3", "D"),
  "revision_blocks": ("C5", "P"),
}
HEADLINE = ("validity_vanilla", "validity_revision", "nfe_revision", "nfe_ratio_at_equal_validity")


def arm_name(rate: float) -> str:
  """The arm of correction rate pi: mdlm (0), self_correction (0.1), self_correction_pi<rate>."""
  if rate == 0:
    return "mdlm"
  return "self_correction" if rate == 0.1 else f"self_correction_pi{rate:g}"


def wide_arm_name(group_size: int) -> str:
  return f"self_correction_{group_size}bit"


def study_arms(config: ml_collections.ConfigDict):
  """The arms: programs (E1, E2), then one E3 arm per correction rate at `data.group_size` (the
  exact denoiser's sweep, the same in each of them, runs in the last one only), then the wide-check
  arm when `study.wide_checks.group_size` > 0 (its code differs, so it runs its own exact sweep)."""
  arms = [("programs", with_changes(config, experiments=("separation", "space")))]
  rates = tuple(config.study.correction_rates)
  for i, rate in enumerate(rates):
    arm = with_changes(
      config,
      experiments=("learned",),
      model__correction_rate=float(rate),
      sampling__oracle=config.sampling.oracle and i == len(rates) - 1,
    )
    arms.append((arm_name(rate), arm))
  wide = config.study.wide_checks
  if wide.group_size > 0:
    arm = with_changes(
      config,
      experiments=("learned",),
      data__group_size=wide.group_size,
      data__tied_fraction=wide.tied_fraction,
      data__curriculum_steps=wide.curriculum_steps,
      steps=wide.steps,
      model__correction_rate=float(max(rates, default=config.model.correction_rate)),
    )
    arms.append((wide_arm_name(wide.group_size), arm))
  return arms


def _learned_arms(results: Mapping[str, Mapping]) -> list[str]:
  return [name for name, r in results.items() if "curve_rounds" in r]


def _interval(arm: Mapping, prefix: str, name: str, num_samples: int, index: int):
  """Mean validity and a 95% half-width: 1.96 s.e. over seeds when there are several, else the
  binomial half-width over the samples."""
  mean = float(np.asarray(arm[f"{prefix}curve_{name}_validity"])[index])
  seeds = arm.get(f"{prefix}curve_{name}_validity/seeds")
  if seeds is not None and len(seeds) > 1:
    values = np.asarray(seeds)[:, index]
    return mean, 1.96 * float(np.std(values, ddof=1)) / math.sqrt(len(values))
  return mean, 1.96 * math.sqrt(max(mean * (1 - mean), 1e-12) / num_samples)


def _denoisers(arm: Mapping) -> list[tuple[str, str]]:
  out = [("", "trained")]
  if any(k.startswith("oracle_curve_") for k in arm):
    out.append(("oracle_", "exact"))
  return out


def sampler_rows(config, results: Mapping[str, Mapping]) -> list[dict]:
  """E3: one row per (arm, denoiser, sampler) at the reference round budget, and its NFE to the
  target validity over the whole sweep."""
  s = config.sampling
  ref = list(s.rounds).index(s.reference_rounds)
  rows = []
  for arm_key in _learned_arms(results):
    arm = results[arm_key]
    for prefix, denoiser in _denoisers(arm):
      for name in s.samplers:
        curve = f"{prefix}curve_{name}"
        if f"{curve}_validity" not in arm:
          continue
        mean, half = _interval(arm, prefix, name, s.num_samples * config.num_seeds, ref)
        rows.append(
          {
            "arm": arm_key,
            "denoiser": denoiser,
            "sampler": name,
            f"validity @T={s.reference_rounds}": interval_cell(mean, half),
            f"NFE @T={s.reference_rounds}": float(np.asarray(arm[f"{curve}_nfe"])[ref]),
            f"NFE to validity {s.target_validity:g}": _seed_cell(
              arm, f"{prefix}nfe_at_target_{name}"
            ),
            "fidelity TV": float(np.asarray(arm[f"{curve}_fidelity_tv"])[ref]),
            "unique": float(np.asarray(arm[f"{curve}_unique"])[ref]),
          }
        )
  return rows


def _seed_interval(arm: Mapping, key: str) -> tuple[float, float] | None:
  """Mean and 95% half-width (1.96 s.e.) of `<key>/seeds`, None without several finite seeds."""
  values = np.asarray(arm.get(f"{key}/seeds", []), float)
  values = values[np.isfinite(values)]
  if len(values) < 2:
    return None
  return float(values.mean()), 1.96 * float(values.std(ddof=1)) / math.sqrt(len(values))


def _seed_cell(arm: Mapping, key: str):
  interval = _seed_interval(arm, key)
  return arm.get(key) if interval is None else interval_cell(*interval, digits=2)


def _sep_programs(arm: Mapping) -> list[str]:
  names = [k[len("sep_") : -len("_violation")] for k in arm if k.endswith("_violation")]
  return [n for n in names if n.startswith(E1_PROGRAMS) or n.startswith(("naive_", "global_"))]


def separation_table(arm: Mapping) -> str:
  """E1: per program and n, `violation / TV / rounds` (TV only where enumerated)."""
  lengths = [int(n) for n in arm["sep_lengths"]]
  rows = []
  for name in _sep_programs(arm):
    row = {"program": name}
    for i, n in enumerate(lengths):
      tv = arm[f"sep_{name}_tv"][i]
      tv_text = "-" if tv is None or (isinstance(tv, float) and math.isnan(tv)) else f"{tv:.3f}"
      row[f"n={n}"] = (
        f"{arm[f'sep_{name}_violation'][i]:.3f} / {tv_text} / {arm[f'sep_{name}_rounds'][i]:g}"
      )
    rows.append(row)
  floors = {"program": "exact draws (TV noise floor)"}
  for i, n in enumerate(lengths):
    floor = arm["sep_tv_noise_floor"][i]
    floors[f"n={n}"] = "-" if floor is None or math.isnan(floor) else f"0 / {floor:.3f} / -"
  return markdown_table(rows + [floors])


def space_table(arm: Mapping) -> str:
  """E2: per tree and n, `footprint / rounds / validity`; learned rows: `footprint / validity`."""
  lengths = [int(n) for n in arm["space_lengths"]]
  rows = []
  for kind in TREES:
    row = {"tree": kind}
    for i, n in enumerate(lengths):
      row[f"n={n}"] = (
        f"{arm[f'space_{kind}_footprint'][i]:g} / {arm[f'space_{kind}_rounds'][i]:g} / "
        f"{arm[f'space_{kind}_validity'][i]:.3f}"
      )
    rows.append(row)
  learned = [int(n) for n in arm.get("space_learn_lengths", [])]
  for kind in TREES if learned else ():
    row = {"tree": f"{kind} (learned p)"}
    for n in lengths:
      if n in learned:
        i = learned.index(n)
        row[f"n={n}"] = (
          f"{arm[f'space_learned_{kind}_footprint'][i]:g} / - / "
          f"{arm[f'space_learned_{kind}_validity'][i]:.3f}"
        )
      else:
        row[f"n={n}"] = "-"
    rows.append(row)
  for kind in ("monotone", "revision") if "space_chain_monotone_footprint" in arm else ():
    row = {"tree": f"xor chain, {kind}"}
    for i, n in enumerate(lengths):
      row[f"n={n}"] = (
        f"{arm[f'space_chain_{kind}_footprint'][i]:g} / {arm[f'space_chain_{kind}_rounds'][i]:g} / "
        f"{arm[f'space_chain_{kind}_validity'][i]:.3f}"
      )
    rows.append(row)
  return markdown_table(rows)


def _summary(config, results: Mapping[str, Mapping]) -> dict:
  summary: dict = {}
  programs = results.get("programs", {})
  for key in (
    "sep_max_violation_exact",
    "sep_min_violation_naive",
    "space_footprint_gap_slope",
    "space_chain_footprint_gap_slope",
    "space_chain_max_footprint_revision",
    "space_min_validity_chain",
  ):
    if key in programs:
      summary[key] = programs[key]
  if len(programs.get("sep_lengths", [])) > 1:
    lengths = np.asarray(programs["sep_lengths"], float)
    for name in E1_PROGRAMS:
      rounds = np.asarray(programs[f"sep_{name}_rounds"], float)
      summary[f"sep_rounds_slope_{name}"] = float(np.polyfit(lengths, rounds, 1)[0])
  if "space_lengths" in programs:
    for kind in TREES:
      summary[f"space_footprint_at_max_n_{kind}"] = float(programs[f"space_{kind}_footprint"][-1])
    for key in ("space_min_validity_exact", "space_min_validity_learned"):
      if key in programs:
        summary[key] = programs[key]
  learned = _learned_arms(results)
  for arm_key in learned:
    arm = results[arm_key]
    for key in HEADLINE + ("nfe_ratio_at_equal_validity_is_lower_bound", "nfe_ratio_vs_topk"):
      for prefix in ("", "oracle_"):
        if f"{prefix}{key}" in arm:
          summary[f"{arm_key}/{prefix}{key}"] = arm[f"{prefix}{key}"]
        interval = _seed_interval(arm, f"{prefix}{key}")
        if interval is not None:
          summary[f"{arm_key}/{prefix}{key}_ci95"] = interval[1]
    for key in ("val_nelbo_bits_per_token", "confidence_in_violated_group"):
      summary[f"{arm_key}/{key}"] = arm.get(key)
  if learned:
    wide = wide_arm_name(config.study.wide_checks.group_size)
    # the paper's wide checks when run, else the largest pi: the model that scores revealed tokens
    main = wide if wide in learned else learned[-1]
    summary["headline_arm"] = main
    for key in HEADLINE:
      summary[key] = results[main].get(key)
  return summary


def _plot_validity(ax, config, arm: Mapping, title: str) -> None:
  """Validity against mean NFE per sampler; dashed: the exact denoiser; dotted: the target."""
  for prefix, style in (("", "-"), ("oracle_", "--")):
    for name in config.sampling.samplers:
      key = f"{prefix}curve_{name}"
      if f"{key}_validity" not in arm:
        continue
      color, marker = SAMPLER_STYLE.get(name, ("k", "."))
      ax.plot(
        np.asarray(arm[f"{key}_nfe"]),
        np.asarray(arm[f"{key}_validity"]),
        style,
        color=color,
        marker=marker,
        markersize=3,
        alpha=1.0 if not prefix else 0.45,
        label=name if not prefix else None,
      )
  ax.axhline(config.sampling.target_validity, color="gray", ls=":", lw=1)
  ax.set_xscale("log")
  ax.set_xlabel("NFE (forward passes)")
  ax.set_ylabel("validity (all parity checks hold)")
  ax.set_ylim(-0.02, 1.02)
  ax.set_title(title, fontsize=9)


def validity_figure(config, arms: Mapping[str, Mapping]):
  """One panel per E3 arm: validity vs NFE (solid: trained denoiser, dashed: exact denoiser)."""
  fig, axes = figure_grid(1, len(arms), panel_size=(5.0, 3.6))
  for ax, (name, arm) in zip(axes[0], arms.items(), strict=True):
    _plot_validity(ax, config, arm, f"E3 {name}: validity vs NFE")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  return fig


def _plot_separation(ax_rounds, ax_violation, arm: Mapping) -> None:
  """Rounds of the exact programs against n; violation of every program (naive: the window
  predictor, dashed: the global exact conditional; one color per round budget T)."""
  lengths = np.asarray(arm["sep_lengths"], float)
  budgets = sorted({int(n.split("_T")[1]) for n in _sep_programs(arm) if "_T" in n})
  for name in E1_PROGRAMS:
    ax_rounds.plot(lengths, arm[f"sep_{name}_rounds"], marker="o", markersize=3, label=name)
  worst = np.max([np.asarray(arm[f"sep_{name}_violation"], float) for name in E1_PROGRAMS], 0)
  ax_violation.plot(lengths, worst, "k-", marker="o", markersize=3, label="exact programs (max)")
  for i, rounds in enumerate(budgets):
    for label, style in (("naive", "-"), ("global", "--")):
      key = f"sep_{label}_T{rounds}_violation"
      if key in arm:
        values = np.asarray(arm[key], float)
        ax_violation.plot(lengths, values, style, color=f"C{i}", label=f"{label}, T={rounds}")
  ax_rounds.set_xlabel("n")
  ax_rounds.set_ylabel("rounds")
  ax_rounds.set_title("E1: rounds of the exact samplers of D_n", fontsize=9)
  ax_rounds.legend(fontsize=6)
  ax_violation.set_xlabel("n")
  ax_violation.set_ylabel("parity violation rate")
  ax_violation.set_title("E1: violation (window predictor: naive)", fontsize=9)
  ax_violation.legend(fontsize=5, ncol=2)


def _plot_space(ax, arm: Mapping) -> None:
  lengths = np.asarray(arm["space_lengths"], float)
  for kind in TREES:
    ax.plot(lengths, arm[f"space_{kind}_footprint"], marker="o", markersize=3, label=kind)
  learned = arm.get("space_learn_lengths")
  if learned is not None:
    for kind in TREES:
      ax.plot(learned, arm[f"space_learned_{kind}_footprint"], "x", color="k", markersize=5)
  if "space_chain_monotone_footprint" in arm:
    for kind, style in (("monotone", "s-"), ("revision", "s--")):
      values = arm[f"space_chain_{kind}_footprint"]
      ax.plot(lengths, values, style, color="tab:purple", markersize=3, label=f"chain, {kind}")
  ax.plot(lengths, 2 * lengths - 1, ":", color="gray", lw=1, label="2n - 1 (size)")
  ax.plot(lengths, 1.5 * lengths, "--", color="gray", lw=1, label="1.5 n (width + inputs)")
  ax.set_xlabel("n (tree inputs / chain coins)")
  ax.set_ylabel("peak footprint (non-mask tokens)")
  ax.set_title("E2: CoT footprint, XOR tree and chain (x: learned p)", fontsize=9)
  ax.legend(fontsize=6)


def _plot_nfe_to_target(ax, config, results: Mapping[str, Mapping], learned: list[str]) -> None:
  """Grouped bars: the NFE each sampler needs to reach the target validity, with each arm's trained
  denoiser and the exact one (hatched: never reached in the sweep; the bar is its largest NFE)."""
  sources = [(name, "", name) for name in learned]
  with_exact = [name for name in learned if _denoisers(results[name])[-1][0] == "oracle_"]
  sources += [(name, "oracle_", f"exact p, {name}") for name in with_exact]
  names = list(config.sampling.samplers)
  width = 0.8 / len(sources)
  for j, (arm_key, prefix, label) in enumerate(sources):
    arm = results[arm_key]
    for i, name in enumerate(names):
      value = arm.get(f"{prefix}nfe_at_target_{name}")
      reached = value is not None and not (isinstance(value, float) and math.isnan(value))
      if not reached:
        value = float(np.nanmax(np.asarray(arm[f"{prefix}curve_{name}_nfe"], float)))
      ax.bar(
        i - 0.4 + (j + 0.5) * width,
        value,
        width,
        color=f"C{j}",
        hatch=None if reached else "//",
        edgecolor="k",
        lw=0.4,
        label=label if i == 0 else None,
      )
  ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
  ax.set_ylabel(f"NFE to validity {config.sampling.target_validity:g}")
  ax.set_yscale("log")
  ax.set_title("E3: NFE to the target (hatched: not reached)", fontsize=9)
  ax.legend(fontsize=6)


def study_figure(config, results: Mapping[str, Mapping]):
  learned = _learned_arms(results)
  cols = max(3, len(learned) + 1)
  fig, axes = figure_grid(2, cols, figsize=(3.7 * cols, 6.4))
  programs = results.get("programs", {})
  if "sep_lengths" in programs:
    _plot_separation(axes[0][0], axes[0][1], programs)
  if "space_lengths" in programs:
    _plot_space(axes[0][2], programs)
  for ax, name in zip(axes[1], learned, strict=False):
    _plot_validity(ax, config, results[name], f"E3 {name}: validity vs NFE (dashed: exact p)")
    ax.title.set_fontsize(8)
  if learned:
    axes[1][0].legend(fontsize=6)
    _plot_nfe_to_target(axes[1][-1], config, results, learned)
  for ax in axes.ravel():
    if not ax.has_data():
      ax.axis("off")
  fig.tight_layout()
  return fig


def report(config, results: Mapping[str, Mapping]) -> Report:
  notes = []
  programs = results.get("programs", {})
  if "sep_lengths" in programs:
    notes.append(
      "E1, exact separation on D_n (uniform even parity): violation / TV to D_n / rounds "
      f"({config.separation.num_samples} draws; TV by enumeration for n <= "
      f"{config.separation.tv_max_length}; naive = monotone ancestral decoding with a "
      f"{config.separation.window}-position window predictor, global = the exact non-local "
      "conditional).\n\n" + separation_table(programs)
    )
  if "space_lengths" in programs:
    notes.append(
      "E2, XOR-tree CoT: peak footprint / rounds / validity (learned p: trained on the program's "
      "trace transitions, F from the circuit topology).\n\n" + space_table(programs)
    )
  notes.append(
    f"E3 validity intervals: 95% ({config.num_seeds} seed(s) x {config.sampling.num_samples} "
    "samples; over seeds when there are several, else binomial). NFE counts every forward pass a "
    "sample needed, the verifying pass of a corrective sampler included."
  )
  return Report(
    rows=sampler_rows(config, results),
    summary=_summary(config, results),
    figures={"dlm_revision_study": study_figure(config, results)},
    notes="\n\n".join(notes),
  )
