"""Block-wise feature caching for diffusion transformers (BWCache) and the baselines it is compared with.

BWCache ("Accelerating Video Diffusion Transformers through Block-Wise Caching", ICLR 2026, Sec. 3):
at every computed step, the relative L1 change of each block's output against the last computed step,
`L1_rel(h_i) = ||h_{t,i} - h_{t+1,i}||_1 / ||h_{t+1,i}||_1` (Eq. 6), is averaged over the indicator
blocks (Eq. 7). When it falls below `delta`, the last block's output is cached and reused for the next
`R` steps (Eq. 8) -- the whole block stack is skipped and only the final layer runs with the current
timestep -- then the step after is computed again and the indicator re-evaluated (periodic
recomputation). Once reuse is first triggered at step k, reuse is allowed only in the first half of the
remaining steps; the second half is always computed (final-step protection).

Readings the paper leaves open are policy fields whose defaults are the paper's text as written:
  `warmup` W            no reuse before step W (default 0: the paper names no warm-up);
  `tail_of`, `tail_fraction`  the protected tail: "remaining" (the last fraction of the steps left
                        after the first trigger k, fixed at k; the paper's "second half of the
                        remaining steps"), "all" (the last fraction of all T steps) or "each_trigger"
                        (the "remaining" tail re-fixed at every trigger, so it shrinks as sampling
                        goes on);
  `indicator_reference` "last_computed" (default: Eq. 8's sequence recomputes at t-R-1 and caches again
                        at once, so that step is compared with the last computed one, R+1 steps back)
                        or "adjacent" (Eq. 6 literally: only a step whose predecessor was computed has
                        an indicator, so every reuse stretch is followed by two computed steps).

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

import math
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
TAIL_READINGS = ("remaining", "all", "each_trigger")
INDICATOR_REFERENCES = ("last_computed", "adjacent")


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
  tail_of: str = "remaining"  # "remaining" | "all" | "each_trigger" (module docstring)
  tail_fraction: float = 0.5  # share of those steps that is always computed
  warmup: int = 0  # W: no reuse before step W
  indicator_reference: str = "last_computed"  # "last_computed" | "adjacent"
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
  if policy.tail_of not in TAIL_READINGS:
    raise ValueError(f"tail_of must be one of {TAIL_READINGS}, got {policy.tail_of!r}")
  if not 0.0 <= policy.tail_fraction <= 1.0:
    raise ValueError(f"tail_fraction must lie in [0, 1], got {policy.tail_fraction}")
  if policy.warmup < 0:
    raise ValueError(f"warmup must be >= 0, got {policy.warmup}")
  if policy.indicator_reference not in INDICATOR_REFERENCES:
    raise ValueError(
      f"indicator_reference must be one of {INDICATOR_REFERENCES}, "
      f"got {policy.indicator_reference!r}"
    )
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
  previous_computed: jax.Array  # whether step j - 1 ran the blocks ("adjacent" indicator)
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
    previous_computed=jnp.array(False),
    reuse_left=jnp.array(0),
    limit=jnp.array(initial_limit(policy, num_steps)),
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
      state = carry._replace(
        reuse_left=carry.reuse_left - 1, accumulated=accumulated, previous_computed=False
      )
      return h_n, state, jnp.full((blocks.shape[0],), jnp.nan), jnp.nan

    def compute(_):
      h_n, outputs = model.run_blocks(params, h0, c)
      change, previous = relative_l1_update(outputs[blocks], carry.previous)
      indicator = jnp.where(_comparable(policy, carry), jnp.mean(change), jnp.nan)
      state = _after_compute(
        policy, carry, j, num_steps, indicator, h_n - h0 if residual else h_n, previous
      )
      return h_n, state, jnp.where(carry.has_previous, change, jnp.nan), indicator

    h_n, state, change, indicator = jax.lax.cond(reuse, skip, compute, None)
    model_out = model.head(params, h_n, c)
    state = state._replace(x=sampler.step(carry.x, model_out, t, t_next), modulated=modulated)
    trace = {"computed": ~reuse, "indicator": indicator, "block_change": change}
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


def protected_steps(fraction: float, steps_left):
  """Steps of a tail that is `fraction` of `steps_left` (rounded up: half of 29 protects 15, as the
  paper's k + (T - k) / 2 with integer division leaves 15 of 29 steps to compute); an int for an int
  `steps_left`, an array for a traced one."""
  # the small offset keeps float rounding of fraction * steps (0.2 * 25 = 5.0000001) from adding one
  if isinstance(steps_left, int):
    return math.ceil(fraction * steps_left - 1e-4)
  return jnp.ceil(jnp.asarray(fraction * steps_left, jnp.float32) - 1e-4).astype(jnp.int32)


def initial_limit(policy: CachePolicy, num_steps: int) -> int:
  """Reuse is allowed at steps `< limit`; before any trigger only the "all" tail is known."""
  if policy.kind == "bwcache" and policy.protect_tail and policy.tail_of == "all":
    return num_steps - protected_steps(policy.tail_fraction, num_steps)
  return num_steps


def _comparable(policy: CachePolicy, carry: _Carry) -> jax.Array:
  """Whether a computed step has an indicator: a previous computed step, and under the "adjacent"
  reading that step must be the one just before (Eq. 6's h_{t+1})."""
  if policy.indicator_reference == "adjacent":
    return carry.has_previous & carry.previous_computed
  return carry.has_previous


def _after_compute(
  policy: CachePolicy, carry: _Carry, j, num_steps: int, indicator, cache, previous
) -> _Carry:
  """State after a computed step: refresh the cache; BWCache decides whether the next R steps reuse
  (Eqs. 7-8), subject to the warm-up and the protected tail."""
  state = carry._replace(
    cache=cache,
    previous=previous,
    has_previous=jnp.array(True),
    previous_computed=jnp.array(True),
    accumulated=jnp.array(0.0),
  )
  if policy.kind != "bwcache":
    return state
  below = _comparable(policy, carry) & (indicator < policy.delta)
  limit = carry.limit
  if policy.protect_tail and policy.tail_of == "each_trigger":
    limit = num_steps - protected_steps(policy.tail_fraction, num_steps - j)
  allowed = (j + 1 >= policy.warmup) & (j < limit)
  trigger = (below | (carry.triggered & (not policy.reevaluate))) & allowed
  first = trigger & ~carry.triggered
  if policy.protect_tail and policy.tail_of == "remaining":
    limit = jnp.where(
      first, num_steps - protected_steps(policy.tail_fraction, num_steps - j), limit
    )
  elif policy.protect_tail and policy.tail_of == "each_trigger":
    limit = jnp.where(trigger, limit, carry.limit)
  return state._replace(
    reuse_left=jnp.where(trigger, policy.reuse_steps, 0),
    limit=limit,
    triggered=carry.triggered | trigger,
  )


# ---------------------------------------------------------------------------------------------------
# Measuring a sampler: FLOPs, wall-clock speedup, the protected tail
# ---------------------------------------------------------------------------------------------------


def protected_tail_start(computed: np.ndarray, policy: CachePolicy | None = None) -> int:
  """The step where the protected tail of a `"bwcache"` trace begins, from its `computed` mask (T when
  nothing was reused). A trigger k is the step before a reused stretch; "remaining" protects the last
  `tail_fraction` of the T - k steps after the first one, "each_trigger" those after the last one,
  "all" the last `tail_fraction` of all T steps."""
  policy = policy or CachePolicy()
  num_steps = len(computed)
  reused = np.flatnonzero(~computed)
  if reused.size == 0:
    return num_steps
  if policy.tail_of == "all":
    return initial_limit(policy._replace(kind="bwcache", protect_tail=True), num_steps)
  starts = reused[np.r_[True, np.diff(reused) > 1]]
  k = int(starts[0 if policy.tail_of == "remaining" else -1]) - 1
  return num_steps - protected_steps(policy.tail_fraction, num_steps - k)


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
