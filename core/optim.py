"""Optimisers the methods share: a warmup-cosine learning rate and Adam(W) after global-norm clipping.

Every method builds its optimiser from these two functions and its own config fields, so a schedule
or clipping change is made once. Warmup is capped at half the run, so a short smoke run still
reaches its peak rate and decays.
"""

from __future__ import annotations

import optax


def warmup_cosine(
  peak: float, warmup_steps: int, total_steps: int, end_value: float = 0.0
) -> optax.Schedule:
  """0 -> `peak` linearly over `min(warmup_steps, total / 2)` steps, then cosine decay to
  `end_value` at `total_steps` (at least 1)."""
  total = max(int(total_steps), 1)
  warmup = min(int(warmup_steps), total // 2)
  return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total, end_value=end_value)


def clipped_adam(
  learning_rate: optax.ScalarOrSchedule,
  grad_clip: float | None,
  weight_decay: float | None = None,
  b2: float = 0.999,
) -> optax.GradientTransformation:
  """Adam (AdamW when `weight_decay` is given) after clipping the global gradient norm to
  `grad_clip` (None: no clipping)."""
  if weight_decay is None:
    adam = optax.adam(learning_rate, b2=b2)
  else:
    adam = optax.adamw(learning_rate, b2=b2, weight_decay=weight_decay)
  if grad_clip is None:
    return adam
  return optax.chain(optax.clip_by_global_norm(grad_clip), adam)
