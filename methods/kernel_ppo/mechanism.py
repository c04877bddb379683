"""Kernel PPO's Acrobot study (`study.experiment = "acrobot_mechanism"`): why NN-NPG's policy
collapses on Acrobot-v1 and whether a policy temperature prevents it.

The released learner (conniemessi/TD-and-PPO-in-RKHS, `main_discrete.py`) reads one head f both as
the critic Q and as the policy logits, pi = softmax(Q). Its policy term -<pi, Qbar> pushes the logit,
and so the Q-value, of the preferred action up and the others down; only the critic term, on the
actions taken, pulls f back towards TD targets. The arms log per update the Q-gap (max - min of f
over actions, mean over the batch) and the policy entropy, for the paper's policy (tau = 1, the
default), for pi = softmax(Q / tau) at each of `study.temperatures`, for the port with the released
code's quirks, and for clip-PPO on the same environment; optionally the paper's policy on a
reference environment where it learns (`study.reference_env`).
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np

from methods.base import Report, figure_grid, with_changes
from methods.kernel_ppo.phases import curve_of


def _tau_name(tau: float) -> str:
  return f"tau{tau:g}"


def mechanism_arms(config: ml_collections.ConfigDict):
  """NN-NPG at `study.main_power` on `study.mechanism_env` with tau = 1 (the paper's policy) and
  each of `study.temperatures`; tau = 1 with the entropy coefficient c_ent at each of
  `study.entropy_coefs`; tau = 1 with the released code's quirks; clip-PPO there; NN-NPG with each
  of `study.reference_temperatures` on `study.reference_env` unless it is ""."""
  study = config.study
  env_name = study.mechanism_env

  def nn_npg(env=env_name, **fields):
    return with_changes(
      config,
      algorithm="nn_npg",
      env_name=env,
      schedule__power=study.main_power,
      schedule__extra_powers=(),
      eval__compare_with_ppo=False,
      **fields,
    )

  arms = [(f"nn_npg_{env_name}_{_tau_name(1.0)}", nn_npg(nn__policy_temperature=1.0))]
  for tau in study.temperatures:
    arms.append((f"nn_npg_{env_name}_{_tau_name(tau)}", nn_npg(nn__policy_temperature=tau)))
  for coef in study.entropy_coefs:
    arm = nn_npg(nn__policy_temperature=1.0, nn__entropy_coef=coef)
    arms.append((f"nn_npg_{env_name}_{_tau_name(1.0)}_ent{coef:g}", arm))
  released = nn_npg(
    nn__policy_temperature=1.0,
    nn__quirk_bootstrap_current_state=True,
    nn__quirk_time_limit_terminal=True,
    nn__quirk_separate_old_init=True,
  )
  arms.append((f"nn_released_{env_name}_{_tau_name(1.0)}", released))
  ppo = with_changes(config, algorithm="ppo", env_name=env_name, eval__compare_with_ppo=False)
  arms.append((f"ppo_{env_name}", ppo))
  if study.reference_env:
    for tau in study.reference_temperatures:
      reference = nn_npg(study.reference_env, nn__policy_temperature=tau)
      arms.append((f"nn_npg_{study.reference_env}_{_tau_name(tau)}", reference))
  return arms


def _arm_tau(arm_config) -> float | None:
  return arm_config.nn.policy_temperature if arm_config.algorithm == "nn_npg" else None


def _row(name: str, arm_config, r: Mapping) -> dict:
  return {
    "arm": name,
    "env": arm_config.env_name,
    "tau": _arm_tau(arm_config),
    "entropy_coef": arm_config.nn.entropy_coef if arm_config.algorithm == "nn_npg" else None,
    "final_return_mean": r["final_return_mean"],
    "final_return_std": r["final_return_std"],
    "best_window_return_per_seed": " / ".join(f"{v:.0f}" for v in r["window_return_best_per_seed"]),
    "last_window_return_mean": r["window_return_last_mean"],
    "final_policy_entropy": r["final_policy_entropy"],
    "final_policy_entropy_min_seed": float(np.min(r["final_policy_entropy_per_seed"])),
    "final_q_gap": r.get("final_q_gap"),
  }


def mechanism_report(config, results: Mapping[str, Mapping]) -> Report:
  """Table per arm (final return of fresh episodes, best and last training running means, final
  policy entropy and Q-gap); summary per arm; one figure of return, entropy and Q-gap curves."""
  arms = mechanism_arms(config)
  rows = [_row(name, arm_config, results[name]) for name, arm_config in arms]
  summary = {}
  for row in rows:
    for field in ("final_return_mean", "last_window_return_mean", "final_policy_entropy"):
      summary[f"{row['arm']}_{field}"] = row[field]
    if row["final_q_gap"] is not None:
      summary[f"{row['arm']}_final_q_gap"] = row["final_q_gap"]
  window = config.eval.return_window
  notes = (
    "final_return: fresh episodes with the final stochastic policy, mean (std) over seeds. "
    f"best/last window return: the best and the last mean of {window} consecutive training "
    "episodes (whole updates), per seed / mean over seeds. final entropy and Q-gap: mean over the "
    "last loop step's updates of the policy entropy and of max_a Q - min_a Q on each update's "
    "batch, measured with pi_k before the update; mean over seeds (and the lowest seed's entropy)."
  )
  figures = {"acrobot": _figure(config, arms, results)}
  return Report(rows=rows, summary=summary, figures=figures, notes=notes)


def _label(name: str, arm_config) -> str:
  tau = _arm_tau(arm_config)
  if arm_config.algorithm == "ppo":
    return f"clip-PPO, {arm_config.env_name}"
  kind = "NN-NPG released quirks" if arm_config.nn.quirk_bootstrap_current_state else "NN-NPG"
  return f"{kind}, {arm_config.env_name}, tau = {tau:g}, c_ent = {arm_config.nn.entropy_coef:g}"


def _diag(results: Mapping, name: str):
  get = lambda field: np.asarray(results[field], np.float64)
  return get("diag/env_steps"), get(f"diag/{name}_mean"), get(f"diag/{name}_std")


def _figure(config, arms, results):
  """Training return (arms on `study.mechanism_env`), policy entropy (log scale, mean over seeds)
  and Q-gap (mean +- std over seeds) against env steps; one colour per arm in every panel."""
  fig, axes = figure_grid(1, 3, panel_size=(5.0, 3.6))
  ret_ax, ent_ax, gap_ax = axes[0]
  for index, (name, arm_config) in enumerate(arms):
    label, r, colour = _label(name, arm_config), results[name], f"C{index}"
    if arm_config.env_name == config.study.mechanism_env:
      steps, mean, std = curve_of(r)
      ret_ax.plot(steps / 1000, mean, color=colour, label=label, lw=1)
      ret_ax.fill_between(steps / 1000, mean - std, mean + std, color=colour, alpha=0.12)
    steps, mean, _ = _diag(r, "policy_entropy")
    ent_ax.plot(steps / 1000, np.maximum(mean, 1e-8), color=colour, label=label, lw=1)
    if "diag/q_gap_mean" in r:
      steps, mean, std = _diag(r, "q_gap")
      gap_ax.plot(steps / 1000, mean, color=colour, lw=1)
      gap_ax.fill_between(steps / 1000, mean - std, mean + std, color=colour, alpha=0.12)
  step = config.study.main_power
  ret_ax.set_title(f"training return, {config.study.mechanism_env} (Delta_k = k^{step:g})")
  ent_ax.set_title("policy entropy on each update's batch")
  ent_ax.set_yscale("log")
  gap_ax.set_title("Q-gap: max_a Q - min_a Q, NN-NPG")
  for ax in axes[0]:
    ax.set_xlabel("environment steps per seed (thousands)")
  ent_ax.legend(fontsize=6, loc="lower left")
  fig.tight_layout()
  return fig
