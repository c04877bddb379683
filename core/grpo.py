"""Group-relative policy optimisation with MARC's compression reward (C-GRPO), from "MARC:
Memory-Augmented RL Token Compression for Efficient Video Understanding" (ICLR 2026, Sec. 3.3),
on the GRPO of Shao et al. 2024 ("DeepSeekMath") as used by Video-R1's trainer.

For a query q with G rollouts o_1..o_G of the student on the compressed input:
  base reward      r_i = accuracy_i + format_i (the answer word is right / the completion is exactly
                   `<ans> X </ans>`), as in Video-R1's accuracy and format rewards;
  maintenance      eta = a_comp / a_full, a_comp the fraction of the G rollouts that are correct,
                   a_full the frozen full-input teacher's accuracy on q (from its own rollouts);
  compression      r_c = alpha * max(0, eta - tau), and only correct rollouts receive it:
                   R_i = r_i + 1[o_i correct] * r_c  (no r_c where a_full = 0: eta is undefined);
  advantage        A_i = (R_i - mean_G R) / (std_G R + eps);
  objective        per completion token, min(rho A, clip(rho, 1 - eps_c, 1 + eps_c) A) - beta KL,
                   rho = pi_theta / pi_old, KL the k3 estimator exp(l_ref - l) - (l_ref - l) - 1
                   (Schulman 2020) to the frozen initial student; the mean over a completion's
                   tokens, then over completions (the GRPO loss of TRL / Video-R1).
Vanilla GRPO is the same with alpha = 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Rewards(NamedTuple):
  total: jax.Array  # [P, G] R_i
  accuracy: jax.Array  # [P, G] 1[o_i correct]
  format: jax.Array  # [P, G]
  compression: jax.Array  # [P, G] the gated r_c each rollout received
  eta: jax.Array  # [P] maintenance ratio (0 where a_full = 0)


def completion_checks(tokens, lengths, target, open_id: int, close_id: int, answer_ids):
  """`(correct, well_formed)` of completions `tokens [..., C]` with `lengths [...]`: well formed is
  exactly `<ans> X </ans>` with X an answer word; correct is well formed with X == `target [...]`."""
  opens = tokens[..., 0] == open_id
  closes = (lengths == 3) & (tokens[..., 2] == close_id)
  word_ok = jnp.isin(tokens[..., 1], jnp.asarray(answer_ids))
  well_formed = opens & closes & word_ok
  return well_formed & (tokens[..., 1] == target), well_formed


def compression_reward(correct, a_full, alpha: float, tau: float):
  """`(r_c per rollout [P, G] (correctness-gated), eta [P])` from `correct [P, G]`, `a_full [P]`."""
  a_comp = jnp.mean(correct.astype(jnp.float32), -1)
  defined = a_full > 0
  eta = jnp.where(defined, a_comp / jnp.where(defined, a_full, 1.0), 0.0)
  r_c = jnp.where(defined, alpha * jnp.maximum(0.0, eta - tau), 0.0)
  return correct.astype(jnp.float32) * r_c[:, None], eta


def c_grpo_rewards(correct, well_formed, a_full, *, alpha, tau, format_weight=1.0) -> Rewards:
  """All of MARC's rewards for a `[P, G]` group of rollouts (module docstring)."""
  accuracy = correct.astype(jnp.float32)
  formatted = well_formed.astype(jnp.float32)
  gated, eta = compression_reward(correct, a_full, alpha, tau)
  return Rewards(accuracy + format_weight * formatted + gated, accuracy, formatted, gated, eta)


def group_advantages(rewards: jax.Array, eps: float = 1e-4) -> jax.Array:
  """`(R - mean_G R) / (std_G R + eps)` over the last axis (the group)."""
  mean = jnp.mean(rewards, -1, keepdims=True)
  std = jnp.std(rewards, -1, keepdims=True)
  return (rewards - mean) / (std + eps)


def k3_kl(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
  """Per-token `exp(l_ref - l) - (l_ref - l) - 1 >= 0`, an unbiased estimator of KL(pi || pi_ref)."""
  delta = ref_log_probs - log_probs
  return jnp.exp(delta) - delta - 1.0


def grpo_loss(
  log_probs, old_log_probs, ref_log_probs, advantages, mask, *, clip: float, beta: float
):
  """The clipped GRPO objective, negated: `log_probs, old, ref, mask [N, C]`, `advantages [N]`.

  Returns `(loss, {"kl", "clip_fraction"})`."""
  mask = mask.astype(jnp.float32)
  ratio = jnp.exp(log_probs - old_log_probs)
  adv = advantages[:, None]
  surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * adv)
  kl = k3_kl(log_probs, ref_log_probs)
  per_token = -(surrogate - beta * kl)
  tokens = jnp.maximum(mask.sum(-1), 1.0)
  loss = jnp.mean(jnp.sum(per_token * mask, -1) / tokens)
  stats = {
    "kl": jnp.mean(jnp.sum(kl * mask, -1) / tokens),
    "clip_fraction": jnp.sum((jnp.abs(ratio - 1.0) > clip) * mask) / jnp.maximum(mask.sum(), 1.0),
  }
  return loss, stats


def step_metrics(loss: jax.Array, rewards: Rewards, stats: dict) -> dict:
  """What a GRPO step logs: the loss, the mean reward and each of its parts, eta, and the loss's own
  statistics (`stats`, e.g. from `grpo_loss`)."""
  return {
    "loss": loss,
    "reward": jnp.mean(rewards.total),
    "reward_accuracy": jnp.mean(rewards.accuracy),
    "reward_format": jnp.mean(rewards.format),
    "reward_compression": jnp.mean(rewards.compression),
    "eta": jnp.mean(rewards.eta),
    **stats,
  }
