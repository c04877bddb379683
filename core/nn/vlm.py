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

The paper-scale model, Qwen2.5-VL (`QwenVL`, built from a checkpoint folder by `load_qwen_vl`), runs
through the same decoder class and decoding loop: its vision tower (`core.nn.qwen_vision`) turns the
processor's pixel rows into visual tokens that replace the video's placeholder tokens
(`embeddings_at`), the M-RoPE ids of the prompt come from `qwen_vision.rope_index` (host side, one
per row), and decoding continues each row at cache slot + its rope delta (`qwen_generate`).
`qwen_completion_log_probs` scores given completions in one forward, as `completion_log_probs` does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core import decoding
from core.nn import attention, qwen_vision
from core.nn import qwen_vl_convert as qwen_convert
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
  logits, cache = prefill_decoder(
    vlm.decoder, params["decoder"], tokens, embeddings, at, prompt_lengths, max_new_tokens
  )
  return logits, cache, prompt_lengths


def prefill_decoder(
  decoder, params, tokens, embeddings, at, prompt_lengths, max_new_tokens, rope_positions=None
):
  """`(next-token logits [B, V], cache)` after one causal pass over right-padded prompts `tokens
  [B, L]` whose slots `at` take `embeddings`; only each row's last prompt position is projected to
  the vocabulary. The cache has room for `max_new_tokens` more."""
  batch, length = tokens.shape
  positions = jnp.arange(length, dtype=jnp.int32)[None]
  out = decoder.apply(
    params,
    tokens,
    embeddings,
    embeddings_at=at,
    positions=positions,
    rope_positions=rope_positions,
    mask=attention.causal_mask(q_positions=positions),
    cache=init_cache(decoder, batch, length + max_new_tokens),
    logits_at=(jnp.asarray(prompt_lengths) - 1)[:, None],
  )
  return out.logits[:, 0], out.cache


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


# ---------------------------------------------------------------------------------------------------
# Qwen2.5-VL (the paper-scale model)
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class QwenVL:
  """Qwen2.5-VL as modules and special ids; params are `{"decoder", "vision"}`."""

  decoder: Transformer
  tower: qwen_vision.VisionTower
  video_id: int
  eos_id: int
  start_id: int  # <|vision_start|>, before a video's placeholders
  end_id: int  # <|vision_end|>, after them
  pad_id: int = 0
  rope_rule: str = "max"  # qwen_vision.rope_index

  @classmethod
  def from_hf_config(cls, hf_config: dict, dtype=jnp.float32, **kwargs) -> QwenVL:
    ids = qwen_convert.special_ids(hf_config)
    decoder = Transformer(**qwen_convert.text_settings(hf_config), dtype=dtype, param_dtype=dtype)
    tower = qwen_vision.VisionTower(qwen_convert.vision_settings(hf_config), dtype, dtype)
    named = ("video_token_id", "eos_token_id", "vision_start_token_id", "vision_end_token_id")
    return cls(decoder, tower, *(ids[name] for name in named), **kwargs)

  def video_prompt(self, tokens: int, before: Sequence[int], after: Sequence[int]) -> np.ndarray:
    """`[*before, <|vision_start|>, <|video_pad|> x tokens, <|vision_end|>, *after]`: the
    processor's expansion of one video in a tokenized chat prompt."""
    video = [self.start_id] + [self.video_id] * tokens + [self.end_id]
    return np.array([*before, *video, *after], np.int32)

  def visual_tokens(self, params, pixels, grid: qwen_vision.Grid) -> jax.Array:
    """The processor's pixel rows of the videos of `grid` -> `[tokens, width]`, in order."""
    return self.tower.apply(params["vision"], pixels, grid)

  def positions(
    self, input_ids, prompt_lengths, grid: qwen_vision.Grid, seconds_per_grid=None, temporal=None
  ):
    """Host-side M-RoPE ids `[3, B, L]` and rope deltas `[B]` of right-padded prompts, row b
    holding the video `grid[b]` (padding slots keep id 0: the causal mask never shows them);
    `temporal[b]`: that video's temporal-patch coordinates (`qwen_vision.rope_index`)."""
    input_ids, lengths = np.asarray(input_ids), np.asarray(prompt_lengths)
    c = self.tower.config
    rope = np.zeros((3,) + input_ids.shape, np.int32)
    deltas = np.zeros(input_ids.shape[:1], np.int32)
    for row, (ids, length) in enumerate(zip(input_ids, lengths, strict=True)):
      seconds = None if seconds_per_grid is None else (seconds_per_grid[row],)
      rope[:, row, :length], deltas[row] = qwen_vision.rope_index(
        ids[:length],
        self.video_id,
        (grid[row],),
        merge=c.spatial_merge_size,
        tokens_per_second=c.tokens_per_second,
        seconds_per_grid=seconds,
        rule=self.rope_rule,
        temporal=None if temporal is None else (temporal[row],),
      )
    return rope, deltas


def load_qwen_vl(folder: str, dtype=jnp.float32, **kwargs) -> tuple[QwenVL, dict]:
  """`(QwenVL, params)` from a checkpoint folder (config.json and its safetensors)."""
  qvl = QwenVL.from_hf_config(qwen_convert.read_config(folder), dtype, **kwargs)
  state = qwen_convert.read_state_dict(folder)
  return qvl, qwen_convert.convert(state, qvl.decoder, qvl.tower)


def qwen_embeddings(visual, at):
  """`embeddings [B, L, d]` where the placeholder slots `at [B, L]`, row-major, take the visual
  tokens `visual [n, d]` in order (as transformers' `masked_scatter` does)."""
  index = jnp.clip(jnp.cumsum(at.reshape(-1)) - 1, 0, visual.shape[0] - 1).reshape(at.shape)
  return visual[index]


def qwen_prefill(qvl: QwenVL, params, tokens, prompt_lengths, visual, rope, max_new_tokens):
  """`(next-token logits [B, V], cache)` of right-padded prompts `tokens [B, L]` whose video
  placeholders take the visual tokens `visual [n, d]` (`QwenVL.visual_tokens`, row after row),
  at M-RoPE ids `rope [3, B, L]` (`QwenVL.positions`)."""
  at = tokens == qvl.video_id
  embeddings = qwen_embeddings(visual, at)
  return prefill_decoder(
    qvl.decoder, params["decoder"], tokens, embeddings, at, prompt_lengths, max_new_tokens, rope
  )


@dataclasses.dataclass(frozen=True)
class _RopeShifted:
  """The decoder as `core.decoding` calls it, with each row's rotary positions at slot + delta
  (M-RoPE continues text ids past a video's compact ids)."""

  decoder: Transformer
  deltas: jax.Array  # [B]

  def apply(self, params, tokens, *, positions, **kwargs):
    rope = positions + self.deltas[:, None]
    return self.decoder.apply(params, tokens, positions=positions, rope_positions=rope, **kwargs)


def qwen_generate(
  qvl: QwenVL,
  params,
  tokens,
  prompt_lengths,
  visual,
  rope,
  deltas,
  rng,
  *,
  max_new_tokens: int,
  sampling: decoding.Sampling,
  stop_tokens: Sequence[int] = (),
) -> decoding.Generation:
  """Prefill, then `core.decoding.decode_loop` (rotary ids at slot + `deltas [B]`)."""
  logits, cache = qwen_prefill(qvl, params, tokens, prompt_lengths, visual, rope, max_new_tokens)
  return decoding.decode_loop(
    _RopeShifted(qvl.decoder, jnp.asarray(deltas, jnp.int32)),
    params["decoder"],
    logits,
    cache,
    prompt_lengths,
    rng,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    stop_tokens=tuple(stop_tokens) or (qvl.eos_id,),
    pad_id=qvl.pad_id,
  )


def qwen_completion_log_probs(
  qvl: QwenVL, params, tokens, prompt_lengths, visual, rope, deltas, completion
):
  """`log pi(completion_t | prompt, completion_<t)` `[B, C]` in one teacher-forced forward of the
  prompts (right-padded, `[B, L]`) followed by the completions."""
  batch, length = tokens.shape
  steps = completion.shape[1]
  index = jnp.arange(length + steps)[None]
  lengths = jnp.asarray(prompt_lengths)[:, None]
  c_index = jnp.clip(index - lengths, 0, steps - 1)
  sequence = jnp.concatenate([tokens, jnp.full((batch, steps), qvl.pad_id, tokens.dtype)], 1)
  sequence = jnp.where(index >= lengths, jnp.take_along_axis(completion, c_index, 1), sequence)
  text_rope = jnp.broadcast_to(index + jnp.asarray(deltas)[:, None], (3, batch, length + steps))
  padded = jnp.concatenate([rope, jnp.zeros((3, batch, steps), rope.dtype)], -1)
  rope = jnp.where(index >= lengths, text_rope, padded)
  at = (sequence == qvl.video_id) & (index < lengths)
  embeddings = qwen_embeddings(visual, at)
  logits = qvl.decoder.apply(
    params["decoder"],
    sequence,
    embeddings,
    embeddings_at=at,
    rope_positions=rope,
    mask=attention.causal_mask(),
    logits_at=lengths - 1 + jnp.arange(steps)[None],
  ).logits
  log_probs = jax.nn.log_softmax(logits)
  return jnp.take_along_axis(log_probs, completion[..., None], -1)[..., 0]
