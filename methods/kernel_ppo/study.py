"""Kernel PPO's studies. `study.experiment = "schedules"`: the step-size exponents of NN-NPG on each
environment, fixed vs growing n(k) for RFF-kernel NPG, and the throughput of TD-NPG against clip-PPO;
the report's table, summary and figures (learning curves). `"acrobot_mechanism"`: the policy
temperature experiment of `methods/kernel_ppo/mechanism.py`."""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np

from methods.base import Report, figure_grid, with_changes
from methods.kernel_ppo.mechanism import mechanism_arms, mechanism_report
from methods.kernel_ppo.phases import band, curve_of

EXPERIMENTS = ("schedules", "acrobot_mechanism")


def study_arms(config: ml_collections.ConfigDict):
  """(1) nn_npg on each of `study.envs` with every exponent of `study.powers` in one run (vmapped
  over exponent x seed; `study.main_power` first); (2) rff_npg at `study.main_power` with fixed n
  and with n(k) growing at `study.sampling_growth` on each of `study.sampling_envs`; (3) clip-PPO on
  `study.throughput_env`, whose throughput is compared with nn_npg's there. With
  `study.experiment = "acrobot_mechanism"`, the arms of `mechanism.mechanism_arms` instead."""
  if config.study.experiment == "acrobot_mechanism":
    return mechanism_arms(config)
  study, arms = config.study, []
  extra = tuple(p for p in study.powers if p != study.main_power)
  for env_name in study.envs:
    arms.append(
      (
        f"nn_npg_{env_name}",
        with_changes(
          config,
          algorithm="nn_npg",
          env_name=env_name,
          schedule__power=study.main_power,
          schedule__extra_powers=extra,
          eval__compare_with_ppo=env_name == study.throughput_env,
        ),
      )
    )
  for env_name in study.sampling_envs:
    for rule, growth in (("fixed", 0.0), ("growing", study.sampling_growth)):
      arms.append(
        (
          f"rff_npg_{env_name}_{rule}",
          with_changes(
            config,
            algorithm="rff_npg",
            env_name=env_name,
            schedule__power=study.main_power,
            schedule__scale=study.kernel_step_scale,
            schedule__released_convention=False,
            sampling__growth=growth,
            updates_per_step=config.updates_per_step
            if growth == 0
            else study.growing_updates_per_step,
            eval__compare_with_ppo=False,
          ),
        )
      )
  ppo = with_changes(
    config, algorithm="ppo", env_name=study.throughput_env, eval__compare_with_ppo=False
  )
  arms.append((f"ppo_{study.throughput_env}", ppo))
  return arms


def best_of(finals: Mapping[float, float]):
  """The exponent with the highest final return, or "tie" when several share it."""
  top = max(finals.values())
  winners = [p for p, value in finals.items() if value == top]
  return winners[0] if len(winners) == 1 else "tie"


def late_drawdown(results: Mapping[str, float], fraction: float, prefix: str = "") -> float:
  """Mean over the last `fraction` of training of (best seed-mean return so far - current): how far
  the learning curve dips below what it had already reached."""
  _, mean, _ = curve_of(results, prefix)
  start = int(len(mean) * (1 - fraction))
  return float((np.maximum.accumulate(mean) - mean)[start:].mean())


def _prefix(power: float, main_power: float) -> str:
  """The result-key prefix of an exponent in an nn_npg arm, whose `schedule.power` is `main_power`."""
  return "" if power == main_power else f"p{power:g}/"


def _row(arm: str, power, r: Mapping[str, float], prefix: str, fraction: float) -> dict:
  return {
    "arm": arm,
    "power": power,
    "final_return_mean": r[f"{prefix}final_return_mean"],
    "final_return_std": r[f"{prefix}final_return_std"],
    "train_return_last_mean": r[f"{prefix}train_return_last_mean"],
    "late_drawdown": late_drawdown(r, fraction, prefix),
    "num_updates": r["num_updates"],
    "env_steps_per_second": r["env_steps_per_second"],
  }


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  """Table per (arm, exponent); summary: best exponent per environment, fixed vs growing n(k),
  throughput ratio TD-NPG / clip-PPO; figures: learning curves. (`mechanism.mechanism_report` for
  `study.experiment = "acrobot_mechanism"`.)"""
  if config.study.experiment == "acrobot_mechanism":
    return mechanism_report(config, results)
  study, fraction = config.study, config.study.late_fraction
  main = study.main_power
  rows, summary = [], {}
  for env_name in study.envs:
    r = results[f"nn_npg_{env_name}"]
    finals = {}
    for p in study.powers:
      prefix = _prefix(p, main)
      rows.append(_row(f"nn_npg_{env_name}", p, r, prefix, fraction))
      finals[p] = r[f"{prefix}final_return_mean"]
      summary[f"{env_name}_nn_npg_p{p:g}_final_return"] = finals[p]
    summary[f"{env_name}_best_power"] = best_of(finals)
  for env_name in study.sampling_envs:
    for rule in ("fixed", "growing"):
      r = results[f"rff_npg_{env_name}_{rule}"]
      rows.append(_row(f"rff_npg_{env_name}_{rule}", main, r, "", fraction))
      summary[f"{env_name}_rff_{rule}_final_return"] = r["final_return_mean"]
      summary[f"{env_name}_rff_{rule}_late_drawdown"] = late_drawdown(r, fraction)
  ppo = results[f"ppo_{study.throughput_env}"]
  rows.append(_row(f"ppo_{study.throughput_env}", None, ppo, "", fraction))
  npg = results.get(f"nn_npg_{study.throughput_env}")
  summary["ppo_final_return"] = ppo["final_return_mean"]
  if npg is not None and "throughput_ratio_vs_ppo" in npg:
    summary["td_npg_env_steps_per_second"] = npg["env_steps_per_second"]
    summary["ppo_env_steps_per_second"] = npg["ppo_env_steps_per_second"]
    summary["throughput_ratio_td_npg_over_ppo"] = npg["throughput_ratio_vs_ppo"]
  figures = {
    "returns_vs_step_size": _powers_figure(study, results),
    "fixed_vs_growing_n": _sampling_figure(study, results),
  }
  notes = (
    "final_return: fresh episodes with the final stochastic policy, mean (std) over seeds of the "
    f"per-seed mean. late_drawdown: mean over the last {fraction:.0%} of training of (best "
    "seed-mean training return so far - current). Throughput: every seed's env steps per second of "
    f"the jitted rollout + update unit ({config.num_seeds} seeds), compile excluded; the ratio "
    "TD-NPG / clip-PPO is timed interleaved in one process (the nn_npg arm's evaluation)."
  )
  return Report(rows=rows, summary=summary, figures=figures, notes=notes)


def _label_axes(ax, title: str) -> None:
  ax.set_title(title)
  ax.set_xlabel("environment steps per seed (thousands)")
  ax.set_ylabel("training return (mean ± std over seeds)")
  ax.legend()


def _powers_figure(study, results):
  fig, axes = figure_grid(1, len(study.envs))
  for ax, env_name in zip(axes[0], study.envs, strict=True):
    for p in study.powers:
      prefix = _prefix(p, study.main_power)
      band(ax, *curve_of(results[f"nn_npg_{env_name}"], prefix), f"Delta_k = k^{p:g}")
    _label_axes(ax, f"NN-NPG, {env_name}")
  fig.tight_layout()
  return fig


def _sampling_figure(study, results):
  envs = study.sampling_envs
  fig, axes = figure_grid(1, len(envs))
  for ax, env_name in zip(axes[0], envs, strict=True):
    for rule in ("fixed", "growing"):
      band(ax, *curve_of(results[f"rff_npg_{env_name}_{rule}"]), f"{rule} n(k)")
    _label_axes(ax, f"RFF-kernel NPG, {env_name}, k^{study.main_power:g}")
  fig.tight_layout()
  return fig
