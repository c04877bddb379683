"""A tiny video-language model: a frame encoder to visual tokens and the shared decoder-only
`core.nn.transformer.Transformer`, decoded with `core.decoding`'s KV-cache loop. The small-scale
stand-in for Qwen2.5-VL in "MARC: Memory-Augmented RL Token Compression for Efficient Video
Understanding" (ICLR 2026), where the teacher sees every frame and the student the compressed ones.

  FrameEncoder   16 x 16 RGB frame -> 4 x 4 px patches -> MLP (+ patch position) -> 2 x 2 average
                 pooling -> P = 4 tokens of width d, plus a frame-level MLP so each token sees the
                 whole frame. This is where MARC's merge reads its features `[F, P, d]`.
  FrameProbe     linear heads on one frame's tokens (the teacher's auxiliary frame-attribute loss).
  VisualTokens   a frame buffer (`core.token_merge.Frames`: features, times, validity) -> the
                 decoder's visual embeddings: features + a time embedding (sinusoids of the frame
                 time, a merged frame's being the mean of its sources) + a per-token embedding.
  layout         one right-padded sequence per row: `<bos>`, that row's visual tokens (valid frames
                 are at the front of the buffer), the question words, then the completion (or the
                 question first: the visual tokens can then attend to it, which a decoder trained
                 from scratch learns far faster than looking the question up from the end). Visual
                 slots hold the `<img>` word and are replaced by embeddings (`embeddings_at`), so
                 every row starts at position 0 and needs no mask besides the causal one.
  generate       prefill with the visual embeddings into a KV cache, then `core.decoding.decode_loop`
                 (the completion is words only).
  completion_log_probs  log pi(o_t | prompt, o_<t) of given completions, one forward, differentiable
                 (SFT, GRPO); equals the log-probs `generate` returns for its own samples.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from core import decoding
from core.nn import attention
from core.nn.transformer import Transformer, init_cache
from core.token_merge import Frames


class FrameEncoder(nn.Module):
  """`frames [..., H, W, C]` -> `[..., P, width]` with P = (H/patch/pool) (W/patch/pool)."""

  width: int
  patch: int = 4
  pool: int = 2

  @nn.compact
  def __call__(self, frames: jax.Array) -> jax.Array:
    *lead, h, w, c = frames.shape
    p, q = self.patch, self.pool
    gh, gw = h // p, w // p
    x = frames.reshape(*lead, gh, p, gw, p, c).swapaxes(-4, -3).reshape(*lead, gh, gw, p * p * c)
    position = self.param("patch_position", nn.initializers.normal(0.02), (gh, gw, self.width))
    x = nn.gelu(nn.Dense(self.width, name="patch_in")(x) + position)
    x = nn.Dense(self.width, name="patch_out")(x)
    x = x.reshape(*lead, gh // q, q, gw // q, q, self.width).mean((-4, -2))
    tokens = x.reshape(*lead, -1, self.width)
    count = tokens.shape[-2]
    mixed = nn.Dense(count * self.width, name="frame_mix")(
      nn.gelu(tokens.reshape(*lead, count * self.width))
    )
    return tokens + mixed.reshape(tokens.shape)


class VisualTokens(nn.Module):
  """Frame features `[B, N, P, d]` at `times [B, N]` -> decoder embeddings `[B, N * P, d]`."""

  width: int
  num_frames: int
  time_features: int = 16

  @nn.compact
  def __call__(self, features: jax.Array, times: jax.Array) -> jax.Array:
    batch, frames, per_frame, width = features.shape
    freqs = jnp.exp(jnp.linspace(0.0, math.log(self.num_frames), self.time_features // 2))
    angles = (times / self.num_frames)[..., None] * freqs * math.pi
    stamp = nn.Dense(width, name="time")(jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], -1))
    token = self.param("token_embedding", nn.initializers.normal(0.02), (per_frame, width))
    x = features + stamp[:, :, None] + token
    return x.reshape(batch, frames * per_frame, width)


class FrameProbe(nn.Module):
  """Linear heads reading what a frame shows from its `[..., P, d]` features (one logit vector per
  entry of `classes`): an auxiliary loss that makes the from-scratch frame encoder informative, in
  place of the pretrained vision tower of a real VLM."""

  classes: tuple[int, ...]

  @nn.compact
  def __call__(self, features: jax.Array) -> list[jax.Array]:
    flat = features.reshape(*features.shape[:-2], -1)
    return [nn.Dense(n, name=f"head_{i}")(flat) for i, n in enumerate(self.classes)]


@dataclasses.dataclass(frozen=True)
class VLM:
  """The modules and special ids; params are `{"encoder", "visual", "decoder"}`."""

  encoder: FrameEncoder
  visual: VisualTokens
  decoder: Transformer
  bos_id: int
  pad_id: int
  image_id: int
  question_first: bool = False  # the question before the visual tokens (module docstring)

  def init(self, rng: jax.Array, frame_shape: Sequence[int], question_len: int) -> dict:
    enc_rng, vis_rng, dec_rng = jax.random.split(rng, 3)
    encoder = self.encoder.init(enc_rng, jnp.zeros((1, *frame_shape), jnp.float32))
    features = self.encoder.apply(encoder, jnp.zeros((1, 1, *frame_shape), jnp.float32))
    visual = self.visual.init(vis_rng, features, jnp.zeros((1, 1), jnp.float32))
    tokens = jnp.zeros((1, question_len), jnp.int32)
    decoder = self.decoder.init(dec_rng, tokens, mask=attention.causal_mask())
    return {"encoder": encoder, "visual": visual, "decoder": decoder}

  def encode(self, params, frames: jax.Array) -> jax.Array:
    """`frames [B, F, H, W, C]` -> features `[B, F, P, d]`."""
    return self.encoder.apply(params["encoder"], frames)

  def visual_embeddings(self, params, frames: Frames) -> tuple[jax.Array, jax.Array]:
    """`(embeddings [B, N * P, d], visual token count [B])` of a batched, compacted buffer."""
    per_frame = frames.features.shape[2]
    tokens = self.visual.apply(params["visual"], frames.features, frames.times)
    return tokens, jnp.sum(frames.valid, -1).astype(jnp.int32) * per_frame


def layout(vlm: VLM, visual, visual_count, question, question_length, completion=None):
  """Right-padded rows `[<bos>, visual x n, question, completion]`, or with `vlm.question_first`
  `[<bos>, question, visual x n, completion]` (module docstring).

  Returns `(tokens [B, L], embeddings [B, L, d], embeddings_at [B, L], prompt_lengths [B])` with
  `L = 1 + visual slots + question slots (+ completion slots)`."""
  batch, slots, width = visual.shape
  q_slots = question.shape[1]
  c_slots = 0 if completion is None else completion.shape[1]
  index = jnp.arange(1 + slots + q_slots + c_slots)[None]
  n_vis, n_q = visual_count[:, None], question_length[:, None]
  v_start, q_start = (1 + n_q, 1) if vlm.question_first else (1, 1 + n_vis)
  v_index, q_index = index - v_start, index - q_start
  is_visual = (v_index >= 0) & (v_index < n_vis)
  is_question = (q_index >= 0) & (q_index < n_q)
  tokens = jnp.where(index == 0, vlm.bos_id, vlm.pad_id)
  tokens = jnp.where(is_visual, vlm.image_id, tokens)
  tokens = jnp.where(
    is_question, jnp.take_along_axis(question, jnp.clip(q_index, 0, q_slots - 1), 1), tokens
  )
  if completion is not None:
    c_index = index - 1 - n_vis - n_q
    is_completion = (c_index >= 0) & (c_index < c_slots)
    picked = jnp.take_along_axis(completion, jnp.clip(c_index, 0, c_slots - 1), 1)
    tokens = jnp.where(is_completion, picked, tokens)
  gather = jnp.broadcast_to(jnp.clip(v_index, 0, slots - 1), (batch, index.shape[1]))
  embeddings = jnp.take_along_axis(visual, gather[..., None], 1)
  return tokens.astype(jnp.int32), embeddings, is_visual, (1 + visual_count + question_length)


def completion_log_probs(vlm: VLM, params, frames: Frames, question, question_length, completion):
  """`log pi(completion_t | ...)` per token `[B, C]` under `params` (teacher forcing)."""
  visual, count = vlm.visual_embeddings(params, frames)
  tokens, embeddings, at, prompt_lengths = layout(
    vlm, visual, count, question, question_length, completion
  )
  logits = vlm.decoder.apply(
    params["decoder"], tokens, embeddings, embeddings_at=at, mask=attention.causal_mask()
  ).logits
  index = prompt_lengths[:, None] - 1 + jnp.arange(completion.shape[1])[None]
  picked = jnp.take_along_axis(logits, index[..., None], 1)  # [B, C, V]
  log_probs = jax.nn.log_softmax(picked)
  return jnp.take_along_axis(log_probs, completion[..., None], -1)[..., 0]


def prefill(vlm: VLM, params, frames: Frames, question, question_length, max_new_tokens: int):
  """`(next-token logits [B, V], cache, prompt_lengths [B])` after reading the prompts."""
  visual, count = vlm.visual_embeddings(params, frames)
  tokens, embeddings, at, prompt_lengths = layout(vlm, visual, count, question, question_length)
  batch, length = tokens.shape
  positions = jnp.arange(length, dtype=jnp.int32)[None]
  out = vlm.decoder.apply(
    params["decoder"],
    tokens,
    embeddings,
    embeddings_at=at,
    positions=positions,
    mask=attention.causal_mask(q_positions=positions),
    cache=init_cache(vlm.decoder, batch, length + max_new_tokens),
  )
  last = (prompt_lengths - 1)[:, None, None]
  return jnp.take_along_axis(out.logits, last, 1)[:, 0], out.cache, prompt_lengths


def generate(
  vlm: VLM,
  params,
  frames: Frames,
  question,
  question_length,
  rng,
  *,
  max_new_tokens: int,
  sampling: decoding.Sampling,
  stop_tokens: Sequence[int],
) -> decoding.Generation:
  """Prefill, then `core.decoding.decode_loop` over the decoder's KV cache."""
  logits, cache, prompt_lengths = prefill(
    vlm, params, frames, question, question_length, max_new_tokens
  )
  return decoding.decode_loop(
    vlm.decoder,
    params["decoder"],
    logits,
    cache,
    prompt_lengths,
    rng,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    stop_tokens=tuple(stop_tokens),
    pad_id=vlm.pad_id,
  )
