"""MARC's memory-aware temporal compression ("MARC: Memory-Augmented RL Token Compression for
Efficient Video Understanding", ICLR 2026, Sec. 3.2), in a jit-friendly masked form.

Frames are a fixed-size buffer `features [F, P, d]` (P visual tokens per frame) with a validity mask;
merging never changes shapes, it averages one frame into its neighbour and marks the neighbour
invalid. Frame similarity is the patch-aligned mean cosine

  sim(H_a, H_b) = (1/P) sum_p <h_a^p, h_b^p> / (|h_a^p| |h_b^p|).

  Stage 1 (intra-segment, MovieChat-style): inside each group (a retrieved clip cut into short-term
           windows of m frames), repeatedly merge the most similar pair of ADJACENT valid frames into
           (H_a + H_b) / 2 until every group holds at most ceil(rho * its length) frames.
  Stage 2 (cross-segment): while more than `budget` frames remain, merge the most similar adjacent
           pair over the whole buffer, across clips.
Both stages are one `lax.while_loop` each; every iteration masks the pairs that may not merge, takes
the argmax of the adjacent similarities and merges it. `compact` then moves the valid frames to the
front in temporal order (a stable argsort) and keeps `budget` slots.

Choices where the paper is open:
  * Stage 1 stops once the whole buffer is down to the budget, so the output holds exactly
    `min(budget, valid frames)` frames (the budget is "one frame's worth" of tokens, Sec. 4).
  * A merged frame's time stamp is the mean of the two, like its features, so the decoder's time
    embedding still says roughly when the merged content happened.
  * "Adjacent" means the next valid frame of the buffer; frames dropped by the retriever are invalid
    from the start and never merge.

`uniform_subsample` is the no-memory baseline: `budget` frames evenly spaced over the valid ones.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Frames(NamedTuple):
  """A frame buffer: `features [F, P, d]`, `times [F]` (frame index, float), `valid [F]` bool."""

  features: jax.Array
  times: jax.Array
  valid: jax.Array


def frame_similarity(a: jax.Array, b: jax.Array, eps: float = 1e-6) -> jax.Array:
  """Patch-aligned mean cosine of frames `a, b [..., P, d]` -> `[...]` (Sec. 3.2)."""
  dot = jnp.sum(a * b, -1)
  norms = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
  return jnp.mean(dot / jnp.maximum(norms, eps), -1)


def next_valid(valid: jax.Array) -> jax.Array:
  """For each slot, the index of the next valid slot after it (`len(valid)` if none)."""
  size = valid.shape[0]
  index = jnp.where(valid, jnp.arange(size), size)
  after = jax.lax.cummin(index[::-1])[::-1]  # first valid at or after i
  return jnp.concatenate([after[1:], jnp.array([size])])


def _merge_until(frames: Frames, group: jax.Array, allowed_count: jax.Array, budget: int) -> Frames:
  """Merges adjacent same-group frames (most similar first) while some group holds more than its
  `allowed_count [F]` (indexed by group id) and the buffer holds more than `budget` frames."""
  size = frames.valid.shape[0]

  def counts(valid):
    return jax.ops.segment_sum(valid.astype(jnp.int32), group, num_segments=size)

  def candidates(state):
    features, _, valid = state
    partner = next_valid(valid)
    safe = jnp.minimum(partner, size - 1)
    over = counts(valid) > allowed_count
    ok = valid & (partner < size) & (group[safe] == group) & over[group]
    sim = frame_similarity(features, features[safe])
    return jnp.where(ok, sim, -jnp.inf), safe

  def cond(state):
    score, _ = candidates(state)
    return (jnp.sum(state.valid) > budget) & jnp.any(jnp.isfinite(score))

  def body(state):
    score, partner = candidates(state)
    left = jnp.argmax(score)
    right = partner[left]
    features = state.features.at[left].set(0.5 * (state.features[left] + state.features[right]))
    times = state.times.at[left].set(0.5 * (state.times[left] + state.times[right]))
    return Frames(features, times, state.valid.at[right].set(False))

  return jax.lax.while_loop(cond, body, frames)


def window_groups(segment: jax.Array, valid: jax.Array, window: int) -> jax.Array:
  """Group id per frame: the segment cut into consecutive windows of `window` valid frames
  (ids unique over the buffer, in `0..F-1`)."""
  size = segment.shape[0]
  starts = valid & ((jnp.arange(size) == 0) | (segment != jnp.roll(segment, 1)))
  first_of_segment = jax.lax.cummax(jnp.where(starts, jnp.arange(size), 0))
  rank = jnp.cumsum(valid) - jnp.cumsum(valid)[first_of_segment] + valid[first_of_segment]
  window_index = (rank - 1) // window
  return jnp.clip(first_of_segment + window_index, 0, size - 1)


def two_stage_merge(
  frames: Frames, segment: jax.Array, *, budget: int, window: int, rho: float
) -> Frames:
  """Stage 1 within windows of `window` frames of each segment to `ceil(rho * window length)`
  frames, then stage 2 across segments down to `budget` frames; shapes unchanged (module doc)."""
  group = window_groups(segment, frames.valid, window)
  size = frames.valid.shape[0]
  lengths = jax.ops.segment_sum(frames.valid.astype(jnp.int32), group, num_segments=size)
  allowed = jnp.maximum(jnp.ceil(rho * lengths), 1).astype(jnp.int32)
  frames = _merge_until(frames, group, allowed, budget)
  everything = jnp.zeros(size, jnp.int32)
  return _merge_until(frames, everything, jnp.full(size, budget, jnp.int32), budget)


def compact(frames: Frames, slots: int) -> Frames:
  """The valid frames moved to the front in temporal order; the first `slots` kept."""
  order = jnp.argsort(~frames.valid, stable=True)[:slots]
  picked = Frames(frames.features[order], frames.times[order], frames.valid[order])
  return picked._replace(features=jnp.where(picked.valid[:, None, None], picked.features, 0.0))


def compress(frames: Frames, segment: jax.Array, *, budget: int, window: int, rho: float) -> Frames:
  """`two_stage_merge`, then `compact` to `budget` slots: the student's visual input."""
  merged = two_stage_merge(frames, segment, budget=budget, window=window, rho=rho)
  return compact(merged, budget)


def uniform_subsample(frames: Frames, budget: int) -> Frames:
  """`budget` frames evenly spaced over the valid ones (centres of equal spans), in order."""
  count = jnp.sum(frames.valid)
  ranks = jnp.cumsum(frames.valid) - 1
  wanted = jnp.floor((jnp.arange(budget) + 0.5) * count / budget).astype(jnp.int32)
  slot = jnp.argmax((ranks[None] == wanted[:, None]) & frames.valid[None], axis=1)
  valid = jnp.arange(budget) < count
  features = jnp.where(valid[:, None, None], frames.features[slot], 0.0)
  return Frames(features, frames.times[slot], valid)
