"""MARC's students and what the students of both scales share: the named objectives and visual inputs
(`STUDENTS`), the optimiser, and the per-step reward curves kept in a student's state."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import optax


class Student(NamedTuple):
  objective: str  # "sft" or "grpo"
  mode: str  # the visual input (inputs.MODES)
  alpha: float | None = None  # None: config.rl.alpha
  tau: float | None = None  # None: config.rl.tau
  target: str | None = (
    None  # what a correct rollout matches (REWARD_TARGETS); None: rl.reward_target
  )


STUDENTS = {
  "sft": Student("sft", "vmr_merge"),
  "grpo": Student("grpo", "vmr_merge", alpha=0.0),
  "cgrpo_novmr": Student("grpo", "merge"),
  "marc": Student("grpo", "vmr_merge"),
  "marc_tau04": Student("grpo", "vmr_merge", tau=0.4),
  "marc_tau08": Student("grpo", "vmr_merge", tau=0.8),
  "marc_teacher": Student("grpo", "vmr_merge", target="teacher"),
}
# "ground_truth": the question's answer; "teacher": the teacher's greedy full-input answer (a_full
# then is the share of the teacher's own rollouts that agree with it)
REWARD_TARGETS = ("ground_truth", "teacher")
CURVES = ("reward", "accuracy", "compression", "eta")  # per RL step, kept in the state


def adam(learning_rate: float, steps: int, warmup: int = 0) -> optax.GradientTransformation:
  """Adam on a warmup-cosine schedule with global-norm clipping at 1."""
  warmup = min(warmup, max(steps // 2, 1))
  schedule = optax.warmup_cosine_decay_schedule(
    0.0 if warmup else learning_rate, learning_rate, max(warmup, 1), max(steps, warmup + 1)
  )
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))


def record_rl_step(state: dict, metrics: dict) -> tuple[dict, dict]:
  """The step's row of the reward curves (`state["curves"]`: reward, accuracy, compression, eta) and
  the step count; the students of both scales keep them."""
  row = jnp.stack([metrics[k] for k in ("reward", "reward_accuracy", "reward_compression", "eta")])
  state = {**state, "curves": state["curves"].at[state["step"]].set(row), "step": state["step"] + 1}
  return state, metrics


def student_curves(name: str, state) -> dict:
  if "curves" not in state:
    return {}
  curves = np.asarray(state["curves"])
  return {f"{name}_{key}_curve": curves[:, i] for i, key in enumerate(CURVES)}
