"""Block-wise feature caching for diffusion transformers (BWCache) and the baselines it is compared with.

BWCache ("Accelerating Video Diffusion Transformers through Block-Wise Caching", ICLR 2026, Sec. 3):
at every computed step, the relative L1 change of each block's output against the last computed step,
`L1_rel(h_i) = ||h_{t,i} - h_{t+1,i}||_1 / ||h_{t+1,i}||_1` (Eq. 6), is averaged over the indicator
blocks (Eq. 7). When it falls below `delta`, the last block's output is cached and reused for the next
`R` steps (Eq. 8) -- the whole block stack is skipped and only the final layer runs with the current
timestep -- then the step after is computed again and the indicator re-evaluated (periodic
recomputation). Once reuse is first triggered at step k, reuse is allowed only in the first half of the
remaining steps; the second half is always computed (final-step protection).

The sampler is one `lax.scan` over the steps of a `diffusion.Sampler` (rectified-flow Euler, or DDIM for
an eps-predicting DDPM model; the caching logic does not depend on which) with a *scalar* `lax.cond`
between "skip the blocks" and "compute the blocks", so skipped blocks are never executed (a batched
predicate would turn the cond into a select and compute both). Policies (`CachePolicy.kind`):
  "none"      every step computed (the reference), block changes recorded for ARL1 and the heat-map;
  "bwcache"   the paper's rule above;
  "schedule"  reuse on a fixed set of steps, no indicator (fixed-interval reuse);
  "teacache"  TeaCache-style: accumulate the relative L1 change of block 0's timestep-modulated input
              and reuse the cached residual `h_N - h_0` while the sum stays below a threshold (the
              polynomial rescaling of TeaCache is left out: the identity is used).
Choices where the paper is open: the indicator compares with the last *computed* step; it is
re-evaluated after each recomputation (`reevaluate`); the protected tail is fixed at the first trigger;
the decision is one scalar per batch; `reuse_mode="residual"` (cache `h_N - h_0`, add it to the fresh
patch embedding) is offered next to the paper's `"output"`.

Measuring a sampler: `step_flops` (XLA's cost analysis of a computed step, a reused step and the
indicator), `flop_speedup` (the indicator counted on every computed step), `wall_speedup` (median of
back-to-back timings against the reference) and `protected_tail_start` (where a trace's tail began).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core import diffusion
from kernels.block_cache import reference, relative_l1_update

KINDS = ("none", "bwcache", "schedule", "teacache")


class BlockwiseModel(NamedTuple):
  """A transformer split for caching; every function takes the parameters first.

  embed(params, x, t) -> (h0 (B, L, D), c); run_blocks(params, h0, c) -> (h_N, all outputs (N, B, L, D));
  head(params, h, c) -> model output shaped like x; modulation(params, h0, c) -> block 0's modulated input.
  """

  embed: Callable
  run_blocks: Callable
  head: Callable
  modulation: Callable
  depth: int


class CachePolicy(NamedTuple):
  """Static description of a caching rule (hashable, so it can be a jit static argument)."""

  kind: str = "none"
  delta: float = 0.15  # BWCache threshold on the mean relative L1 change (Eq. 7)
  reuse_steps: int = 3  # R: steps reused after a trigger before recomputing
  protect_tail: bool = True  # after the first trigger at k, no reuse in the last (T - k) / 2 steps
  reevaluate: bool = True  # re-check the indicator after each recomputation
  indicator_blocks: tuple[int, ...] = ()  # blocks averaged in the indicator; () = all
  reuse_mode: str = "output"  # "output" (reuse h_N) | "residual" (reuse h_N - h_0)
  schedule: tuple[bool, ...] = ()  # "schedule": reuse at these steps
  teacache_threshold: float = 0.1


def validate_policy(policy: CachePolicy, num_steps: int, depth: int) -> None:
  """Checks the static fields; `delta`, `reuse_steps` and `teacache_threshold` may be traced arrays."""
  if policy.kind not in KINDS:
    raise ValueError(f"cache policy kind must be one of {KINDS}, got {policy.kind!r}")
  if policy.reuse_mode not in ("output", "residual"):
    raise ValueError(f"reuse_mode must be 'output' or 'residual', got {policy.reuse_mode!r}")
  if any(not 0 <= b < depth for b in policy.indicator_blocks):
    raise ValueError(f"indicator_blocks {policy.indicator_blocks} out of range for {depth} blocks")
  if policy.kind == "schedule" and len(policy.schedule) != num_steps:
    raise ValueError(f"schedule has {len(policy.schedule)} entries for {num_steps} steps")


def fixed_interval_schedule(num_steps: int) -> tuple[bool, ...]:
  """Reuse every other step in the middle third of the trajectory: a cache with no indicator, the
  fixed-interval baseline BWCache's indicator is compared with."""
  start, stop = num_steps // 3, (2 * num_steps) // 3
  return tuple(start <= j < stop and (j - start) % 2 == 1 for j in range(num_steps))


class _Carry(NamedTuple):
  x: jax.Array
  cache: jax.Array  # h_N ("output") or h_N - h_0 ("residual")
  previous: jax.Array  # indicator blocks' outputs at the last computed step
  has_previous: jax.Array
  reuse_left: jax.Array
  limit: jax.Array  # reuse allowed only at steps < limit
  triggered: jax.Array
  modulated: jax.Array  # TeaCache: block 0's modulated input at the previous step
  accumulated: jax.Array  # TeaCache: accumulated relative change since the last computed step


def _relative_l1(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.sum(jnp.abs(a - b)) / jnp.maximum(jnp.sum(jnp.abs(b)), 1e-12)


def cached_sample(
  model: BlockwiseModel,
  params: Any,
  x_init: jax.Array,
  sampler: diffusion.Sampler,
  policy: CachePolicy,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Runs `sampler` from `x_init` with the caching `policy`; the head's output is the sampler's model
  output (velocity for Euler, eps for DDIM).

  Returns the final sample and a per-step trace: `computed` (T,) bool, `indicator` (T,) (mean relative
  L1 of the indicator blocks; NaN where not computed or no previous step), `block_change` (T, N_ind).
  """
  ts = sampler.times
  num_steps = ts.shape[0] - 1
  validate_policy(policy, num_steps, model.depth)
  blocks = jnp.asarray(policy.indicator_blocks or tuple(range(model.depth)))
  residual = policy.reuse_mode == "residual" or policy.kind == "teacache"
  schedule = jnp.asarray(policy.schedule or (False,) * num_steps)
  h0, _ = model.embed(params, x_init, jnp.full(x_init.shape[:1], ts[0]))
  init = _Carry(
    x=x_init,
    cache=jnp.zeros_like(h0),
    previous=jnp.zeros((blocks.shape[0],) + h0.shape, h0.dtype),
    has_previous=jnp.array(False),
    reuse_left=jnp.array(0),
    limit=jnp.array(num_steps),
    triggered=jnp.array(False),
    modulated=jnp.zeros_like(h0),
    accumulated=jnp.array(0.0),
  )

  def step(carry: _Carry, inputs):
    j, t, t_next = inputs
    h0, c = model.embed(params, carry.x, jnp.full(carry.x.shape[:1], t))
    modulated = model.modulation(params, h0, c) if policy.kind == "teacache" else carry.modulated
    accumulated = carry.accumulated + _relative_l1(modulated, carry.modulated)
    reuse = _reuse_decision(policy, carry, j, schedule, accumulated)

    def skip(_):
      h_n = h0 + carry.cache if residual else carry.cache
      state = carry._replace(reuse_left=carry.reuse_left - 1, accumulated=accumulated)
      return h_n, state, jnp.full((blocks.shape[0],), jnp.nan)

    def compute(_):
      h_n, outputs = model.run_blocks(params, h0, c)
      change, previous = relative_l1_update(outputs[blocks], carry.previous)
      indicator = jnp.where(carry.has_previous, jnp.mean(change), jnp.nan)
      state = _after_compute(
        policy, carry, j, num_steps, indicator, h_n - h0 if residual else h_n, previous
      )
      return h_n, state, jnp.where(carry.has_previous, change, jnp.nan)

    h_n, state, change = jax.lax.cond(reuse, skip, compute, None)
    model_out = model.head(params, h_n, c)
    state = state._replace(x=sampler.step(carry.x, model_out, t, t_next), modulated=modulated)
    trace = {"computed": ~reuse, "indicator": jnp.nanmean(change), "block_change": change}
    return state, trace

  steps = (jnp.arange(num_steps), ts[:-1], ts[1:])
  final, trace = jax.lax.scan(step, init, steps)
  return final.x, trace


def _reuse_decision(policy: CachePolicy, carry: _Carry, j, schedule, accumulated) -> jax.Array:
  if policy.kind == "bwcache":
    return (carry.reuse_left > 0) & (j < carry.limit)
  if policy.kind == "schedule":
    return schedule[j] & carry.has_previous
  if policy.kind == "teacache":
    return carry.has_previous & (accumulated < policy.teacache_threshold)
  return jnp.array(False)


def _after_compute(
  policy: CachePolicy, carry: _Carry, j, num_steps: int, indicator, cache, previous
) -> _Carry:
  """State after a computed step: refresh the cache; BWCache decides whether the next R steps reuse."""
  state = carry._replace(
    cache=cache, previous=previous, has_previous=jnp.array(True), accumulated=jnp.array(0.0)
  )
  if policy.kind != "bwcache":
    return state
  below = carry.has_previous & (indicator < policy.delta)
  trigger = (below | (carry.triggered & (not policy.reevaluate))) & (j < carry.limit)
  first = trigger & ~carry.triggered
  limit = carry.limit
  if policy.protect_tail:
    limit = jnp.where(first, j + (num_steps - j) // 2, carry.limit)
  return state._replace(
    reuse_left=jnp.where(trigger, policy.reuse_steps, 0),
    limit=limit,
    triggered=carry.triggered | trigger,
  )


# ---------------------------------------------------------------------------------------------------
# Measuring a sampler: FLOPs, wall-clock speedup, the protected tail
# ---------------------------------------------------------------------------------------------------


def protected_tail_start(computed: np.ndarray) -> int:
  """The step where the protected tail of a `"bwcache"` trace begins, from its `computed` mask: the
  first trigger k is the step before the first reused one, and the tail is the last (T - k) / 2 steps
  (T when nothing was reused)."""
  reused = np.flatnonzero(~computed)
  if reused.size == 0:
    return len(computed)
  k = int(reused[0]) - 1
  return k + (len(computed) - k) // 2


def compiled_flops(fn: Callable, *args) -> float:
  """FLOPs of `jax.jit(fn)(*args)` from XLA's cost analysis of the compiled program."""
  analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
  if isinstance(analysis, list | tuple):
    analysis = analysis[0]
  return float(analysis["flops"])


def step_flops(model: BlockwiseModel, params: Any, x: jax.Array, t: jax.Array) -> dict[str, float]:
  """FLOPs of one computed step (embed, every block, head), one reused step (embed, head) and the
  indicator over every block's output, at inputs `x` and times `t (B,)`."""

  def computed(p, x):
    h0, c = model.embed(p, x, t)
    h_n, outputs = model.run_blocks(p, h0, c)
    return x - 0.1 * model.head(p, h_n, c), outputs

  def reused(p, x, cache):
    h0, c = model.embed(p, x, t)
    return x - 0.1 * model.head(p, cache, c)

  _, outputs = jax.eval_shape(computed, params, x)
  cache = jnp.zeros(outputs.shape[1:], outputs.dtype)
  previous = jnp.zeros(outputs.shape, outputs.dtype)
  return {
    "computed": compiled_flops(computed, params, x),
    "reused": compiled_flops(reused, params, x, cache),
    "indicator": compiled_flops(reference.relative_l1_update, previous, previous),
  }


def flop_speedup(flops: Mapping[str, float], computed: np.ndarray, reference_steps: int) -> float:
  """FLOPs of `reference_steps` uncached steps over those of a trace whose `computed` mask says which
  steps ran the blocks (each also paying the indicator) and which reused the cache (`step_flops`)."""
  n_computed, n_reused = int(computed.sum()), int((~computed).sum())
  cost = n_computed * (flops["computed"] + flops["indicator"]) + n_reused * flops["reused"]
  return reference_steps * flops["computed"] / cost


def _seconds(fn: Callable, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def wall_speedup(
  reference_fn: Callable, reference_args: tuple, fn: Callable, args: tuple, repeats: int
) -> float:
  """Median over `repeats` of (reference time / `fn` time), the two timed back to back each round so
  that changes in machine load affect both alike. Both are compiled before timing."""
  jax.block_until_ready(reference_fn(*reference_args))
  jax.block_until_ready(fn(*args))
  return statistics.median(
    _seconds(reference_fn, *reference_args) / _seconds(fn, *args) for _ in range(repeats)
  )
