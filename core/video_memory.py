"""MARC's Visual Memory Retriever ("MARC: Memory-Augmented RL Token Compression for Efficient Video
Understanding", ICLR 2026, Sec. 3.1): cut the video into events, embed the question and every event
clip in one contrastively trained space, keep the top-k clips in temporal order ("episodic memory").

  segment_video      event segmentation, training-free: a cut wherever the cosine distance between
                     consecutive frames' coarse descriptors (`frame_descriptors`) exceeds a threshold
                     (stands in for the paper's learned shot-boundary detector).
  DualEncoder        question encoder (word + position embeddings, mean, MLP) and clip encoder (a
                     frame MLP averaged over the clip, MLP), both to unit vectors (stands in for the
                     paper's Perception-Encoder-style embedding model).
  info_nce           the contrastive loss with several positives per question:
                     -log sum_pos exp(s/T) / sum_all exp(s/T) over every clip of the batch.
  retrieve           top-k segments by cosine score, as a frame mask (the buffer keeps time order).

Choices where the paper is open: a clip's embedding also reads the clip before it (its own mean
frame feature concatenated with its predecessor's), so that a question about "what comes after X"
can land on the clip after X; k = 2 by default because these videos hold only a few events (the
paper uses k = 3 on long videos).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def frame_descriptors(frames: jax.Array, pool: int = 4) -> jax.Array:
  """`frames [..., H, W, C]` in [0, 1] -> average-pooled and complement-coded `[x, 1 - x]`,
  `[..., 2 (H/pool)(W/pool)C]`: never zero, and a brightness change (grey to white) turns it, which
  plain pixels would only scale; a 1-px motion barely moves it, a scene cut does."""
  *lead, h, w, c = frames.shape
  pooled = frames.reshape(*lead, h // pool, pool, w // pool, pool, c).mean((-4, -2))
  pooled = pooled.reshape(*lead, -1)
  return jnp.concatenate([pooled, 1.0 - pooled], -1)


def cut_scores(frames: jax.Array) -> jax.Array:
  """Cosine distance between each frame's descriptor and the previous one's, `[..., F]` (0 first)."""
  d = frame_descriptors(frames)
  d = d / jnp.linalg.norm(d, axis=-1, keepdims=True)
  dist = 1.0 - jnp.sum(d[..., 1:, :] * d[..., :-1, :], -1)
  return jnp.concatenate([jnp.zeros_like(dist[..., :1]), dist], -1)


def segment_video(frames: jax.Array, threshold: float) -> jax.Array:
  """Segment id per frame `[..., F]` (0, 1, ...): a new segment where `cut_scores > threshold`."""
  return jnp.cumsum(cut_scores(frames) > threshold, axis=-1).astype(jnp.int32)


class DualEncoder(nn.Module):
  """Question and clip encoders into one `dim`-wide unit-norm space."""

  vocab_size: int
  dim: int = 64
  question_len: int = 16

  def setup(self):
    self.word = nn.Embed(self.vocab_size, self.dim)
    self.position = nn.Embed(self.question_len, self.dim)
    self.question_mlp = nn.Sequential([nn.Dense(self.dim), nn.gelu, nn.Dense(self.dim)])
    self.frame_mlp = nn.Sequential([nn.Dense(self.dim), nn.gelu, nn.Dense(self.dim)])
    self.clip_mlp = nn.Sequential([nn.Dense(self.dim), nn.gelu, nn.Dense(self.dim)])

  def encode_question(self, question: jax.Array, length: jax.Array) -> jax.Array:
    """`question [B, Q]` word ids, `length [B]` -> `[B, dim]`."""
    valid = jnp.arange(question.shape[1])[None] < length[:, None]
    h = self.word(question) + self.position(jnp.arange(question.shape[1]))[None]
    pooled = jnp.sum(h * valid[..., None], 1) / jnp.maximum(length[:, None], 1)
    return _unit(self.question_mlp(pooled))

  def encode_clips(self, frames: jax.Array, segment: jax.Array, num_segments: int) -> jax.Array:
    """`frames [B, F, H, W, C]`, `segment [B, F]` ids in `0..num_segments-1` -> `[B, S, dim]`:
    each clip's mean frame feature, joined with the previous clip's (zeros for the first)."""
    feats = self.frame_mlp(frame_descriptors(frames, pool=2))  # [B, F, dim]
    one_hot = jax.nn.one_hot(segment, num_segments)  # [B, F, S]
    means = jnp.einsum("bfs,bfd->bsd", one_hot, feats) / jnp.maximum(one_hot.sum(1)[..., None], 1.0)
    previous = jnp.pad(means, ((0, 0), (1, 0), (0, 0)))[:, :-1]
    return _unit(self.clip_mlp(jnp.concatenate([means, previous], -1)))

  def __call__(self, question, length, frames, segment, num_segments: int):
    return self.encode_question(question, length), self.encode_clips(frames, segment, num_segments)


def _unit(x: jax.Array) -> jax.Array:
  # rsqrt(|x|^2 + eps), not x / max(|x|, eps): an empty (padding) clip maps to exactly 0, where
  # the norm's gradient is NaN
  return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-12)


def info_nce(
  queries: jax.Array,
  clips: jax.Array,
  clip_valid: jax.Array,
  positive: jax.Array,
  temperature: float,
) -> jax.Array:
  """Multi-positive InfoNCE (van den Oord et al. 2018) over every clip of the batch.

  `queries [B, d]`, `clips [B, S, d]`, `clip_valid [B, S]`, `positive [B, S]` (the question's own
  relevant clips). Rows without a positive are left out of the mean."""
  batch, num = clips.shape[:2]
  logits = queries @ clips.reshape(batch * num, -1).T / temperature  # [B, B*S]
  # a large finite floor, not -inf: rows without positives must keep finite gradients
  logits = jnp.where(clip_valid.reshape(1, -1), logits, -1e9)
  own = jnp.eye(batch, dtype=bool)[:, :, None] & positive[None]  # [B, B, S]
  own = own.reshape(batch, batch * num) & clip_valid.reshape(1, -1)
  log_all = jax.nn.logsumexp(logits, -1)
  log_pos = jax.nn.logsumexp(jnp.where(own, logits, -1e9), -1)
  has = jnp.any(own, -1)
  return jnp.sum(jnp.where(has, log_all - log_pos, 0.0)) / jnp.maximum(jnp.sum(has), 1)


def retrieve(scores: jax.Array, segment: jax.Array, segment_valid: jax.Array, k: int) -> jax.Array:
  """Frames of the top-`k` segments: `scores [B, S]`, `segment [B, F]`, `segment_valid [B, S]` ->
  bool `[B, F]` (order is the buffer's, i.e. temporal)."""
  masked = jnp.where(segment_valid, scores, -jnp.inf)
  _, top = jax.lax.top_k(masked, k)  # [B, k]
  chosen = jnp.take_along_axis(segment_valid, top, 1)  # fewer than k segments: drop the padding
  hit = (segment[..., None] == top[:, None, :]) & chosen[:, None, :]
  return jnp.any(hit, -1)
