"""The study of "Almost Bayesian: Dynamics of SGD Through Singular Learning Theory": arms, table, figure.

Arms: `toys` (D1 at full CPU size and the LLC check), `toys_n<n>` for each extra sample size of
`config.study.toy_sizes` (occupancy of the low-LLC valley vs n), `digits_sgd` (D2, vanilla SGD at
several learning rates), `digits_adam` (D2 with Adam in the late stage, the paper's contrast) and
`moons` (D3). The table has one row per toy and chain group; the notes carry the LLC, digits and
moons tables; the figure shows chain histograms against their best tempered posteriors, displacement
curves, the digits exponents and the moons cluster masses.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from core import slt
from methods.base import Report, figure_grid, interval_cell, markdown_table, with_changes
from methods.sgd_porous import toys

ARM_SETS = ("toys", "toy_sizes", "digits_sgd", "digits_adam", "moons", "sweep")


def sweep_arm_name(noise_std: float) -> str:
  return f"sweep_noise{noise_std:g}"


def study_arms(config):
  """The arms of `config.study.arms` (a subset of `ARM_SETS`, in that order)."""
  chosen, st = set(config.study.arms), config.study
  arms = []
  if "toys" in chosen:
    arms.append(("toys", with_changes(config, experiments=("toys", "llc"))))
  if "toy_sizes" in chosen:
    for n in st.toy_sizes:
      arms.append((f"toys_n{n}", with_changes(config, experiments=("toys",), toys__n=n)))
  if "digits_sgd" in chosen:
    arms.append(
      ("digits_sgd", with_changes(config, experiments=("digits",), digits__optimizer="sgd"))
    )
  if "digits_adam" in chosen:
    arms.append(
      (
        "digits_adam",
        with_changes(
          config,
          experiments=("digits",),
          digits__optimizer="adam",
          digits__learning_rates=tuple(st.adam_learning_rates),
        ),
      )
    )
  if "moons" in chosen:
    arms.append(("moons", with_changes(config, experiments=("moons",))))
  if "sweep" in chosen:
    for noise in st.sweep_noise_stds:
      arm = with_changes(
        config,
        experiments=("toys",),
        toys__models=tuple(st.sweep_models),
        toys__learning_rates=tuple(st.sweep_learning_rates),
        toys__batch_sizes=tuple(st.sweep_batch_sizes),
        toys__sgld_inits=(),
        toys__chains=st.sweep_chains,
        toys__noise_std=noise,
      )
      arms.append((sweep_arm_name(noise), arm))
  return arms


TOY_COLUMNS = (
  ("t_star", "T* (grid)"),
  ("t_mandt", "T_Mandt"),
  ("kl_bayes", "KL(T=1)"),
  ("kl_star", "KL(T*)"),
  ("kl_valley", "KL valleys"),
  ("kl_access", "KL accessible"),
  ("js_star", "JS(T*)"),
  ("w1_star", "W1(T*)"),
  ("alpha", "alpha"),
  ("alpha_late", "alpha (last decade)"),
  ("occupancy_ratio_sgd", "valley0/valley1 SGD"),
  ("occupancy_ratio_bayes", "valley0/valley1 Bayes"),
)


def toy_rows(config, results: Mapping[str, float], arm: str = "toys") -> list[dict]:
  rows = []
  for model in config.toys.models:
    for b in toys.batch_sizes(config):
      for group in toys.groups_for(config, b):
        prefix = f"{model}_{group.name}_"
        row = {"arm": arm, "toy": model, "group": group.name}
        for key, column in TOY_COLUMNS:
          row[column] = results.get(prefix + key)
        row.update(_refined_cells(results, prefix))
        rows.append(row)
  return rows


def _pm(results, name: str, digits: int = 3) -> str:
  """`"mean ± half"` of a block interval, "-" when missing."""
  mean, half = results.get(name + "_mean"), results.get(name + "_half")
  return "-" if mean is None else interval_cell(mean, half, digits)


def _refined_cells(results, prefix: str) -> dict:
  """T* on the fine grid with its bracket, over chain blocks, and the paper's tempering of SGD's own
  histogram: `KL(h^T / Z || p_1)` at T*, T_M, T_xi = n D_xi / eta and T_M D_xi (95% over blocks)."""
  if prefix + "t_star_refined" not in results:
    return {}
  cells = {
    "T* refined [bracket]": (
      f"{results[prefix + 't_star_refined']:.4g} "
      f"[{results[prefix + 't_star_lo']:.4g}, {results[prefix + 't_star_hi']:.4g}]"
    ),
    "T* over blocks": _pm(results, prefix + "t_star_blocks", 4),
    "s (last decade, blocks)": _pm(results, prefix + "alpha_late"),
  }
  if prefix + "kl_tempered_star" in results:
    cells["T_xi = n D_xi / eta"] = f"{results[prefix + 't_xi_tempering']:.3g}"
    for name, label in (("star", "T*"), ("mandt", "T_M"), ("xi", "T_xi"), ("mandt_xi", "T_M D_xi")):
      cells[f"KL(h^T || p_1), T = {label}"] = _pm(results, prefix + f"kl_tempered_{name}")
  return cells


SWEEP_COLUMNS = (("t_mandt", "T_Mandt"), ("alpha", "s (all lags)"), ("alpha_late_r2", "r2 (late)"))


def sweep_rows(config, results) -> list[dict]:
  """One row per sweep arm (label noise), toy, learning rate and batch size: the late-stage exponent
  with its interval over chain blocks, `d_s = 2 lambda s` at the toy's known coefficient."""
  rows = []
  for name, arm_config in study_arms(config):
    if not name.startswith("sweep_") or name not in results:
      continue
    r = results[name]
    for model in arm_config.toys.models:
      for b in toys.batch_sizes(arm_config):
        for group in toys.groups_for(arm_config, b):
          prefix = f"{model}_{group.name}_"
          if prefix + "alpha_late_mean" not in r:
            continue
          mean, half = r[prefix + "alpha_late_mean"], r[prefix + "alpha_late_half"]
          row = {
            "noise std": arm_config.toys.noise_std,
            "toy": model,
            "eta": group.learning_rate,
            "B": b,
            "s (last decade)": interval_cell(mean, half),
            "s < 1/2 (interval)": bool(mean + half < 0.5),
          }
          row.update({column: r.get(prefix + key) for key, column in SWEEP_COLUMNS})
          row["d_s = 2 lambda s"] = 2 * slt.TOYS[model].llc * mean
          rows.append(row)
  return rows


def _llc_table(config, results) -> str:
  rows = [
    {
      "toy": model,
      "known lambda": slt.TOYS[model].llc,
      "estimate": results[f"llc_{model}"],
      "s.e.": results[f"llc_{model}_stderr"],
      "relative error": results[f"llc_error_{model}"],
    }
    for model in config.llc.models
    if f"llc_{model}" in results
  ]
  return markdown_table(rows)


def _digits_table(arm_config, results, optimizer: str) -> str:
  rows = []
  for i, lr in enumerate(arm_config.digits.learning_rates):
    rows.append(
      {
        "optimizer": optimizer,
        "learning rate": lr,
        "exponent s": results["digits_exponents"][i],
        "r2": results["digits_exponent_r2"][i],
        "mean LLC": results["digits_llc"][i],
        "LLC spread (std/mean)": results["digits_llc_spread"][i],
        "d_s = 2 lambda s": results["digits_spectral_dims"][i],
        "train accuracy": results["digits_final_accuracy"][i],
      }
    )
  return markdown_table(rows)


def _moons_table(config, results) -> str:
  rows = []
  for t in config.moons.sgld_temperatures:
    rows.append(
      {
        "SGD against": f"SGLD ensemble, T = {t:g}",
        "KL(posterior || SGD)": results[f"moons_kl_sgld_T{t:g}"],
        "JS": results[f"moons_js_sgld_T{t:g}"],
        "W1 (Hamming)": results[f"moons_w1_sgld_T{t:g}"],
      }
    )
  for name, label in (
    ("1", "T = 1"),
    ("mandt", "T = T_Mandt"),
    ("xi", "T = T_Mandt D_xi"),
    ("best", "best T"),
  ):
    rows.append(
      {
        "SGD against": f"free-energy masses, {label}",
        "KL(posterior || SGD)": results[f"moons_kl_free_energy_{name}"],
        "JS": None,
        "W1 (Hamming)": None,
      }
    )
  return markdown_table(rows)


def _summary(config, results) -> dict:
  s = {}
  t = results.get("toys", {})
  head = toys.headline_group(config)
  for key in (
    "kl_regular",
    "kl_regular_bayes",
    "t_star_regular",
    "t_mandt_regular",
    "kl_singular",
    "kl_singular_valley",
    "kl_singular_access",
    "kl_singular_bayes",
  ):
    if key in t:
      s[key] = t[key]
  if "t_star_regular" in t:
    s["regular_t_star_over_t_mandt"] = t["t_star_regular"] / t["t_mandt_regular"]
    bracket = np.asarray(t["t_star_regular_bracket"]) / t["t_mandt_regular"]
    s["regular_t_star_over_t_mandt_bracket"] = [round(float(v), 4) for v in bracket]
  for model in config.toys.models:
    if f"{model}_{head}_alpha" in t:
      s[f"alpha_{model}"] = t[f"{model}_{head}_alpha"]
      s[f"alpha_late_{model}"] = t[f"{model}_{head}_alpha_late"]
  for key in ("occupancy_ratio_sgd", "occupancy_ratio_bayes", "occupancy_ratio_star"):
    if f"B_{head}_{key}" in t:
      s[f"B_{key}"] = t[f"B_{head}_{key}"]
  sgld = [k for k in t if k.startswith("R_sgld") and k.endswith("_kl_bayes")]
  for key in sgld + [k.replace("R_", f"{m}_", 1) for k in sgld for m in ("A", "A0", "B")]:
    if key in t:
      s[f"sgld_{key}"] = t[key]
  if "llc_errors" in t:
    s["llc_errors_R_A_B"] = [round(float(v), 3) for v in t["llc_errors"]]
    s["llc_A0_error"] = t.get("llc_error_A0")
  for n in config.study.toy_sizes:
    arm = results.get(f"toys_n{n}", {})
    if f"B_{head}_occupancy_ratio_sgd" in arm:
      s[f"B_occupancy_sgd_n{n}"] = arm[f"B_{head}_occupancy_ratio_sgd"]
      s[f"B_occupancy_bayes_n{n}"] = arm[f"B_{head}_occupancy_ratio_bayes"]
  for arm in ("digits_sgd", "digits_adam"):
    if arm in results:
      r = results[arm]
      s[f"{arm}_exponents"] = [round(float(v), 4) for v in r["digits_exponents"]]
      s[f"{arm}_spectral_dims"] = [round(float(v), 3) for v in r["digits_spectral_dims"]]
      s[f"{arm}_llc"] = [round(float(v), 2) for v in r["digits_llc"]]
      s[f"{arm}_ds_below_llc_fraction"] = r["digits_ds_below_llc_fraction"]
  if "moons" in results:
    r = results["moons"]
    keys = ["moons_num_clusters", "moons_sgd_clusters", "moons_exponent", "moons_d_xi"]
    keys += ["moons_t_mandt", "moons_t_xi", "moons_t_best_sgld", "moons_t_best_free_energy"]
    keys += [f"moons_js_sgld_T{t:g}" for t in config.moons.sgld_temperatures]
    keys += [f"moons_kl_sgld_T{t:g}" for t in config.moons.sgld_temperatures]
    keys += [f"moons_kl_free_energy_{name}" for name in ("1", "mandt", "xi", "best")]
    for key in keys:
      s[key] = r[key]
  return s


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  rows = toy_rows(config, results.get("toys", {}))
  for n in config.study.toy_sizes:
    name = f"toys_n{n}"
    if name in results:
      rows += toy_rows(study_arm_config(config, name), results[name], name)
  notes = []
  if "toys" in results and "llc_errors" in results["toys"]:
    notes.append(
      "LLC on the toys (localised SGLD at each toy's reference point):\n\n"
      + _llc_table(config, results["toys"])
    )
  for arm, optimizer in (("digits_sgd", "sgd"), ("digits_adam", "adam")):
    if arm in results:
      arm_config = study_arm_config(config, arm)
      notes.append(
        f"D2 late stage ({optimizer}):\n\n" + _digits_table(arm_config, results[arm], optimizer)
      )
  if "moons" in results:
    notes.append("D3 moons ensemble, cluster masses:\n\n" + _moons_table(config, results["moons"]))
  sweep = sweep_rows(config, results)
  if sweep:
    notes.append(
      "Late-stage exponent sweep on the toys (label noise x learning rate x batch size; 95% "
      "intervals over chain blocks):\n\n" + markdown_table(sweep)
    )
  return Report(
    rows=rows,
    summary=_summary(config, results),
    figures={"sgd_porous_study": study_figure(config, results)},
    notes="\n".join(notes),
  )


def study_arm_config(config, name: str):
  return dict(study_arms(config))[name]


def study_figure(config, results):
  """Row 1-2: SGD histograms and best tempered posteriors of the toys; row 3: displacement curves of
  the toys, R(t) of the digits MLP, d_s against the LLC, moons cluster masses."""
  models = list(config.toys.models)
  cols = max(len(models), 4)
  fig, axes = figure_grid(3, cols, panel_size=(2.5, 2.2))
  t = results.get("toys", {})
  for col, model in enumerate(models):
    if f"{model}_hist" not in t:
      continue
    window = toys.window_of(config, model)
    extent = (window.lo[1], window.hi[1], window.lo[0], window.hi[0])
    for row, key, title in ((0, "hist", "SGD"), (1, "posterior_star", "posterior at T*")):
      toys.plot_log_density(axes[row, col], t[f"{model}_{key}"], extent)
      axes[row, col].set_title(f"{model}: {title}", fontsize=9)
      axes[row, col].set_xlabel("w2", fontsize=8)
      axes[row, col].set_ylabel("w1", fontsize=8)
  for col in range(len(models), cols):
    axes[0, col].axis("off")
    axes[1, col].axis("off")
  _displacement_panel(axes[2, 0], config, t)
  _digits_panel(axes[2, 1], results)
  _spectral_panel(axes[2, 2], results)
  _moons_panel(axes[2, 3], config, results)
  fig.tight_layout()
  return fig


def _displacement_panel(ax, config, t):
  head = toys.headline_group(config)
  lag_steps = toys.lags(config)
  for model in config.toys.models:
    msd = t.get(f"{model}_{head}_msd")
    if msd is not None:
      ax.loglog(lag_steps, np.sqrt(np.maximum(np.asarray(msd), 1e-12)), label=model)
  ax.loglog(lag_steps, 0.02 * np.sqrt(lag_steps), "k:", label="t^1/2")
  ax.set_xlabel("lag (steps)", fontsize=8)
  ax.set_ylabel("RMS along-valley displacement", fontsize=8)
  ax.set_title(f"toys, {head}", fontsize=9)
  ax.legend(fontsize=7)


def _digits_panel(ax, results):
  for arm, style in (("digits_sgd", "-"), ("digits_adam", "--")):
    r = results.get(arm)
    if r is None:
      continue
    for lr, radius in zip(r["digits_learning_rates"], r["digits_radius"], strict=True):
      ax.loglog(r["digits_record_steps"], radius, style, label=f"{arm[7:]} {lr:g}")
  ax.set_xlabel("steps since t0", fontsize=8)
  ax.set_ylabel("R(t) = ||w_t - w_t0||", fontsize=8)
  ax.set_title("digits MLP, late stage", fontsize=9)
  ax.legend(fontsize=7)


def _spectral_panel(ax, results):
  top = 0.0
  for arm, marker in (("digits_sgd", "o"), ("digits_adam", "s")):
    r = results.get(arm)
    if r is None:
      continue
    ax.scatter(r["digits_llc"], r["digits_spectral_dims"], marker=marker, label=arm)
    top = max(top, float(np.max(r["digits_llc"])))
  ax.plot([0, top], [0, top], "k:", label="d_s = lambda")
  ax.set_xlabel("mean LLC", fontsize=8)
  ax.set_ylabel("d_s = 2 lambda s", fontsize=8)
  ax.set_title("spectral dimension vs LLC", fontsize=9)
  ax.legend(fontsize=7)


def _moons_panel(ax, config, results):
  r = results.get("moons")
  if r is None:
    ax.axis("off")
    return
  sgd = np.asarray(r["moons_sgd_masses"])
  top = np.argsort(-sgd, kind="stable")[:10]
  series = [("SGD", sgd)] + [
    (f"SGLD T={t:g}", np.asarray(r[f"moons_sgld_T{t:g}_masses"]))
    for t in config.moons.sgld_temperatures
  ]
  width = 0.8 / len(series)
  for i, (label, masses) in enumerate(series):
    ax.bar(
      np.arange(len(top)) + (i - len(series) / 2 + 0.5) * width, masses[top], width, label=label
    )
  ax.set_xlabel("function cluster (SGD's 10 largest)", fontsize=8)
  ax.set_ylabel("mass", fontsize=8)
  ax.set_title("moons ensembles", fontsize=9)
  ax.legend(fontsize=7)
