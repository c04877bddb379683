"""The study: every mixture search on the same Markov domains, side by side, and the digits analogue.

Arms (all from `configs/fastmix.py:study`; the same proxy, optimiser, steps and training stream):
  fastmix, fastmix_head, fastmix_beta   FastMix with the full / LM-head-only hypergradient, and the
                                        beta = 0.1 training term; `study.fastmix_seeds` vmapped
                                        replicates each
  uniform, regmix, climb, doremi, sweep the baselines (`baselines.py`), RegMix with
                                        `study.regmix_proxies` proxies and its quality-cost curve
  digits_fastmix                        FastMix on the digits domains (post-training analogue)
Each arm retrains fresh models on its mixture and on the known optimum (paired seeds), so
`target_loss` and `oracle_loss` come from the same run.

Summary: FastMix's L1 error to the optimum (mean and standard error over replicates), the cost in
proxy training steps of every method relative to FastMix's, the RegMix proxies needed to match
FastMix's L1 error (`cost_ratio_vs_regmix`; a lower bound when even all of them do not), the
retrained target loss against the oracle's, whether the sweep's best lattice point is the analytic
optimum, and on digits the weight FastMix leaves on the noisy-label sources.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from methods.base import Report, figure_grid, interval_cell, with_changes

MARKOV_ARMS = (
  "fastmix",
  "fastmix_head",
  "fastmix_beta",
  "uniform",
  "regmix",
  "climb",
  "doremi",
  "sweep",
)
FASTMIX_ARMS = ("fastmix", "fastmix_head", "fastmix_beta")
NOISY = ("noisy_40", "noisy_80")


def study_arms(config):
  s = config.study
  search = dict(compare_regmix=False, fastmix__num_seeds=s.fastmix_seeds)
  arms = [
    ("fastmix", with_changes(config, mixer="fastmix", **search)),
    (
      "fastmix_head",
      with_changes(config, mixer="fastmix", fastmix__hypergradient="head", **search),
    ),
    ("fastmix_beta", with_changes(config, mixer="fastmix", fastmix__beta=0.1, **search)),
    ("uniform", with_changes(config, mixer="uniform")),
    (
      "regmix",
      with_changes(
        config,
        mixer="regmix",
        regmix__num_proxies=s.regmix_proxies,
        regmix__proxy_counts=tuple(s.regmix_proxy_counts),
      ),
    ),
    ("climb", with_changes(config, mixer="climb")),
    ("doremi", with_changes(config, mixer="doremi")),
    ("sweep", with_changes(config, mixer="sweep")),
  ]
  if s.digits:
    digits = with_changes(
      config,
      mixer="fastmix",
      data__name="digits",
      model__depth=s.digits_depth,
      data__rows_per_source=s.digits_rows_per_source,
      steps=s.digits_steps,
      optim__learning_rate=s.digits_learning_rate,
      optim__weight_decay=s.digits_weight_decay,
      **search,
    )
    arms.append(("digits_fastmix", digits))
  return arms


# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------


def _interval(arm: Mapping, key: str) -> str:
  stderr = arm.get(f"{key}_stderr")
  return interval_cell(arm[key], 1.96 * stderr, 4) if stderr is not None else f"{arm[key]:.4f}"


def _mixture_cell(mixtures) -> str:
  mean = np.mean(np.asarray(mixtures, float), axis=0)
  return "(" + ", ".join(f"{w:.2f}" for w in mean) + ")"


def _rows(results: Mapping, fastmix_cost: float) -> list[dict]:
  rows = []
  for name in MARKOV_ARMS:
    if name not in results:
      continue
    r = results[name]
    rows.append(
      {
        "method": name,
        "mixture": _mixture_cell(r["mixture"]),
        "l1_to_optimum": _interval(r, "mixture_l1_error"),
        "unused_weight": r["unused_source_weight"],
        "ideal_target_loss": r.get("ideal_target_loss"),
        "retrained_target_loss": r["target_loss"],
        "minus_oracle": _interval(r, "target_minus_oracle_loss"),
        "cost_steps": r["search_cost_steps"],
        "cost_vs_fastmix": r["search_cost_steps"] / fastmix_cost,
        "seconds": r["search_seconds"],
      }
    )
  return rows


def _regmix_rows(regmix: Mapping, fastmix_cost: float) -> list[dict]:
  rows = []
  for i, n in enumerate(regmix["curve_counts"]):
    rows.append(
      {
        "method": f"regmix@{int(n)}",
        "mixture": _mixture_cell([regmix["curve_mixtures"][i]]),
        "l1_to_optimum": f"{regmix['curve_l1_error'][i]:.4f}",
        "unused_weight": None,
        "ideal_target_loss": regmix["curve_ideal_target_loss"][i],
        "retrained_target_loss": None,
        "minus_oracle": "",
        "cost_steps": regmix["curve_cost_steps"][i],
        "cost_vs_fastmix": regmix["curve_cost_steps"][i] / fastmix_cost,
        "seconds": None,
      }
    )
  return rows


def regmix_match(config, regmix: Mapping, fastmix_l1: float, fastmix_cost: float) -> dict:
  """RegMix's cost to reach FastMix's L1 error (+ slack), relative to FastMix's cost."""
  errors = np.asarray(regmix["curve_l1_error"])
  reached = np.nonzero(errors <= fastmix_l1 + config.regmix.quality_slack)[0]
  index = int(reached[0]) if len(reached) else len(errors) - 1
  return {
    "regmix_matched": bool(len(reached)),
    "regmix_proxies_to_match": int(regmix["curve_counts"][index]),
    "cost_ratio_vs_regmix": float(regmix["curve_cost_steps"][index] / fastmix_cost),
  }


def _summary(config, results: Mapping) -> dict:
  fast = results["fastmix"]
  cost = fast["search_cost_steps"]
  summary = {
    "fastmix_l1_error": fast["mixture_l1_error"],
    "fastmix_l1_error_stderr": fast.get("mixture_l1_error_stderr"),
    "fastmix_within_0.15": bool(fast["mixture_l1_error"] < 0.15),
    "fastmix_target_loss": fast["target_loss"],
    "oracle_loss": fast["oracle_loss"],
    "fastmix_excess_over_oracle": fast["target_excess_over_oracle"],
    "fastmix_cost_steps": cost,
    "fastmix_seconds": fast["search_seconds"],
  }
  for name in MARKOV_ARMS[1:]:
    if name in results:
      summary[f"{name}_l1_error"] = results[name]["mixture_l1_error"]
      summary[f"{name}_target_loss"] = results[name]["target_loss"]
      summary[f"{name}_cost_vs_fastmix"] = results[name]["search_cost_steps"] / cost
  if "regmix" in results:
    summary.update(regmix_match(config, results["regmix"], fast["mixture_l1_error"], cost))
    summary["regmix_at_least_10x"] = summary["cost_ratio_vs_regmix"] >= 10
    summary["wallclock_ratio_regmix_full"] = results["regmix"]["search_seconds"] / max(
      fast["search_seconds"], 1e-9
    )
  if "climb" in results:
    summary["climb_matches_fastmix"] = bool(
      results["climb"]["mixture_l1_error"] <= fast["mixture_l1_error"]
    )
  if "sweep" in results:
    sweep = results["sweep"]
    summary["sweep_best"] = _mixture_cell(sweep["mixture"])
    summary["sweep_ideal_best"] = _mixture_cell([sweep["ideal_best_mixture"]])
  if "digits_fastmix" in results:
    summary.update(_digits_summary(results["digits_fastmix"]))
  return summary


def _digits_summary(digits: Mapping) -> dict:
  from core.data.mixture_sources import SOURCE_NAMES

  mean = np.mean(np.asarray(digits["mixture"], float), axis=0)
  weights = dict(zip(SOURCE_NAMES, mean, strict=True))
  out = {f"digits_alpha_{k}": float(v) for k, v in weights.items()}
  out["digits_noisy_weight"] = float(sum(weights[k] for k in NOISY))
  out["digits_target_accuracy"] = digits["target_accuracy"]
  for reference in ("uniform", "target_only", "clean_and_target"):
    out[f"digits_{reference}_accuracy"] = digits[f"{reference}_accuracy"]
  out["digits_target_loss"] = digits["target_loss"]
  out["digits_uniform_loss"] = digits["uniform_loss"]
  return out


def report(config, results: Mapping[str, Mapping]) -> Report:
  cost = results["fastmix"]["search_cost_steps"]
  rows = _rows(results, cost)
  if "regmix" in results:
    rows += _regmix_rows(results["regmix"], cost)
  summary = _summary(config, results)
  notes = (
    "L1 to optimum: ||alpha - w*||_1 with w* = "
    f"{tuple(config.data.target_weights)} (mean ± 1.96 s.e. over {config.study.fastmix_seeds} "
    "FastMix replicates). unused_weight: alpha on sources w* does not use. ideal_target_loss: the "
    "target loss of the ideal proxy trained on the mixture (exact). retrained_target_loss: fresh "
    f"models ({config.retrain.num_seeds} seeds) trained on mixture samples, held-out target data; "
    "minus_oracle: paired difference to the models trained on w*. cost: proxy training steps "
    "(forward + backward over one batch = 1, forward only = 1/3); seconds: median compiled step "
    "time x steps on this machine. regmix@n: RegMix's regression fitted on its first n proxies."
  )
  figures = {"fastmix_study": _figure(config, results)}
  return Report(rows=rows, summary=summary, figures=figures, notes=notes)


# ---------------------------------------------------------------------------------------------------
# Figure
# ---------------------------------------------------------------------------------------------------


def _figure(config, results):
  fig, axes = figure_grid(2, 3, figsize=(15, 8))
  _trajectory_panel(axes[0, 0], config, results["fastmix"])
  _cost_panel(axes[0, 1], results)
  _loss_panel(axes[0, 2], results)
  if "sweep" in results:
    _sweep_panel(axes[1, 0], results["sweep"])
  if "fastmix_head" in results:
    _trajectory_panel(axes[1, 1], config, results["fastmix_head"], "LM-head-only hypergradient")
  if "digits_fastmix" in results:
    _digits_panel(axes[1, 2], results["digits_fastmix"])
  fig.suptitle("FastMix: found mixture vs the known optimum, and what it costs")
  fig.tight_layout()
  return fig


def _trajectory_panel(ax, config, arm, title="alpha trajectory (full hypergradient)"):
  trajectory = np.asarray(arm["trajectory"], float)  # [R, rounds + 1, K]
  steps = np.arange(trajectory.shape[1]) * config.fastmix.inner_steps
  names = ("rel_0", "rel_1", "rel_2", "noise", "advers.", "irrel.")
  for k in range(trajectory.shape[2]):
    line = ax.plot(steps, trajectory[0, :, k], label=names[k] if k < len(names) else str(k))
    for replicate in trajectory[1:]:
      ax.plot(steps, replicate[:, k], color=line[0].get_color(), alpha=0.3, lw=0.8)
    ax.axhline(config.data.target_weights[k], color=line[0].get_color(), ls="--", lw=0.8)
  ax.set_xlabel("proxy steps")
  ax.set_ylabel("alpha")
  ax.set_title(title)
  ax.legend(fontsize=7, ncol=2)


def _cost_panel(ax, results):
  for name, marker in zip(MARKOV_ARMS, "o^sDvP<X", strict=True):
    if name not in results or name == "uniform":
      continue
    r = results[name]
    err = 1.96 * r.get("mixture_l1_error_stderr", 0.0)
    ax.errorbar(
      r["search_cost_steps"],
      r["mixture_l1_error"],
      yerr=err,
      marker=marker,
      label=name,
      ls="none",
      capsize=3,
    )
  if "regmix" in results:
    regmix = results["regmix"]
    ax.plot(
      regmix["curve_cost_steps"],
      regmix["curve_l1_error"],
      color="gray",
      lw=1,
      marker=".",
      label="regmix, first n proxies",
    )
  if "uniform" in results:
    ax.axhline(results["uniform"]["mixture_l1_error"], color="k", ls=":", label="uniform")
  ax.axhline(0.15, color="red", ls="--", lw=0.8, label="L1 = 0.15")
  ax.set_xscale("log")
  ax.set_xlabel("search cost (proxy training steps)")
  ax.set_ylabel("||alpha - w*||_1")
  ax.set_title("quality vs cost")
  ax.legend(fontsize=7)


def _loss_panel(ax, results):
  names = [n for n in MARKOV_ARMS if n in results]
  values = [results[n]["target_loss"] for n in names]
  ax.bar(names, values, color="C0")
  oracle = results["fastmix"]["oracle_loss"]
  ax.axhline(oracle, color="k", ls="--", label="retrained on w* (oracle)")
  ax.set_ylim(oracle - 0.02, max(values) + 0.02)
  ax.set_ylabel("held-out target loss (nats/token)")
  ax.set_title("fresh model trained on each mixture")
  ax.tick_params(axis="x", rotation=45)
  ax.legend(fontsize=7)


def _sweep_panel(ax, sweep):
  losses = np.asarray(sweep["proxy_losses"], float)
  ideal = np.asarray(sweep["proxy_ideal_losses"], float)
  ax.scatter(ideal, losses, s=10)
  best = int(np.argmin(losses))
  ax.scatter(ideal[best], losses[best], color="red", label="sweep's best proxy")
  ax.scatter(
    ideal.min(), losses[int(np.argmin(ideal))], marker="x", color="k", label="analytic optimum w*"
  )
  ax.set_xlabel("ideal proxy's target loss (exact)")
  ax.set_ylabel("trained proxy's validation loss")
  ax.set_title(f"brute-force sweep ({len(losses)} lattice mixtures)")
  ax.legend(fontsize=7)


def _digits_panel(ax, digits):
  from core.data.mixture_sources import SOURCE_NAMES

  mixtures = np.asarray(digits["mixture"], float)
  x = np.arange(len(SOURCE_NAMES))
  ax.bar(x, mixtures.mean(0), yerr=mixtures.std(0), color="C2", capsize=3)
  ax.axhline(1 / len(SOURCE_NAMES), color="k", ls=":", label="uniform")
  ax.set_xticks(x, SOURCE_NAMES, rotation=30)
  ax.set_ylabel("alpha")
  ax.set_title(
    f"digits: FastMix acc {digits['target_accuracy']:.3f} vs uniform "
    f"{digits['uniform_accuracy']:.3f}"
  )
  ax.legend(fontsize=7)
