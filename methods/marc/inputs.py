"""MARC's pieces built from the config: the tokenizer, the VLM and the retriever, the data streams,
and the visual input of every arm (full, retrieved, retrieved and merged, merged, subsampled)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from core import token_merge
from core import video_memory as retrieval
from core.data import batching, eventworld
from core.nn import vlm as vlm_lib
from core.nn.transformer import Transformer
from methods.base import cached_per_config

# the visual input of an arm: what the (teacher or student) VLM sees
MODES = ("full", "vmr_full", "vmr_merge", "merge", "uniform")
STREAMS = {"teacher": 1, "retriever": 2, "sft": 3}  # training-data streams, apart per seed


@functools.lru_cache(maxsize=1)
def tokenizer():
  return eventworld.tokenizer()


def special_ids() -> dict:
  tok = tokenizer()
  return {
    "open": tok.ids[eventworld.ANSWER_OPEN],
    "close": tok.ids[eventworld.ANSWER_CLOSE],
    "answers": tuple(tok.ids[w] for w in eventworld.answer_words()),
  }


@cached_per_config(maxsize=4)
def vlm_of(config: ml_collections.ConfigDict) -> vlm_lib.VLM:
  m, tok = config.model, tokenizer()
  return vlm_lib.VLM(
    encoder=vlm_lib.FrameEncoder(m.width, m.patch, m.pool),
    visual=vlm_lib.VisualTokens(m.width, config.data.num_frames),
    decoder=Transformer(
      vocab_size=tok.vocab_size, width=m.width, depth=m.depth, num_heads=m.num_heads
    ),
    bos_id=tok.bos_id,
    pad_id=tok.pad_id,
    image_id=tok.ids[eventworld.IMAGE],
    question_first=m.question_first,
  )


@cached_per_config(maxsize=4)
def retriever_of(config: ml_collections.ConfigDict) -> retrieval.DualEncoder:
  return retrieval.DualEncoder(
    tokenizer().vocab_size, config.retriever.dim, config.data.question_len
  )


def tokens_per_frame(config) -> int:
  return (eventworld.SIZE // config.model.patch // config.model.pool) ** 2


def completion_of(answer: jax.Array) -> jax.Array:
  """The target completion `<ans> X </ans>` `[B, 3]`."""
  ids = special_ids()
  return jnp.stack(
    [jnp.full_like(answer, ids["open"]), answer, jnp.full_like(answer, ids["close"])], -1
  )


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


def eventworld_batch(config, seed: int, index: int, size: int) -> dict[str, np.ndarray]:
  d = config.data
  return eventworld.batch(
    seed,
    index,
    size,
    num_frames=d.num_frames,
    min_events=d.min_events,
    max_events=d.max_events,
    question_len=d.question_len,
  )


def stream(config, name: str, batch_size: int) -> batching.GeneratedBatches:
  """The training stream `name` of this seed: batch `s` is a pure function of (seed, name, s)."""
  seed = 1000 * config.seed + STREAMS[name]
  return batching.GeneratedBatches(
    lambda step: eventworld_batch(config, seed, step, batch_size), batch_size
  )


@cached_per_config(maxsize=256)
def pool_chunk(config, index: int) -> dict[str, np.ndarray]:
  """RL pool chunk `index` (`rl.prompts` questions), with each question's pool row."""
  size = config.rl.prompts
  chunk = eventworld_batch(config, config.data.pool_seed + 1000 * config.seed, index, size)
  return {**chunk, "row": np.arange(index * size, (index + 1) * size, dtype=np.int32)}


@cached_per_config(maxsize=2)
def test_set(config) -> dict[str, np.ndarray]:
  return eventworld_batch(config, config.data.test_seed, 0, config.data.num_test)


# ---------------------------------------------------------------------------------------------------
# Visual input per mode
# ---------------------------------------------------------------------------------------------------


def retrieved_frames(config, retriever_params, batch, segment) -> jax.Array:
  """The VMR's frame mask `[B, F]`: top-k detected segments by question-clip cosine."""
  num = config.data.num_frames
  query, clips = retriever_of(config).apply(
    retriever_params, batch["question"], batch["question_length"], batch["frames"], segment, num
  )
  scores = jnp.einsum("bd,bsd->bs", query, clips)
  segment_valid = jnp.arange(num)[None] <= jnp.max(segment, -1, keepdims=True)
  return retrieval.retrieve(scores, segment, segment_valid, config.retriever.top_k)


def visual_input(config, encoder_params, retriever_params, batch, mode: str) -> token_merge.Frames:
  """The batched frame buffer an arm's VLM reads (`MODES`); merged modes hold `compress.budget`
  slots, the others all `F` frames (invalid ones at the back)."""
  vlm, c = vlm_of(config), config.compress
  features = vlm.encode({"encoder": encoder_params}, batch["frames"])
  batch_size, num = features.shape[:2]
  times = jnp.broadcast_to(jnp.arange(num, dtype=jnp.float32), (batch_size, num))
  everything = jnp.ones((batch_size, num), bool)
  if mode == "full":
    return token_merge.Frames(features, times, everything)
  if mode == "uniform":
    frames = token_merge.Frames(features, times, everything)
    return jax.vmap(lambda f: token_merge.uniform_subsample(f, c.budget))(frames)
  if mode == "merge":  # MovieChat-style over the whole video: one segment, windows of m
    frames = token_merge.Frames(features, times, everything)
    segment = jnp.zeros((batch_size, num), jnp.int32)
  else:
    segment = retrieval.segment_video(batch["frames"], config.retriever.cut_threshold)
    kept = retrieved_frames(config, retriever_params, batch, segment)
    frames = token_merge.Frames(features, times, kept)
    if mode == "vmr_full":
      return jax.vmap(lambda f: token_merge.compact(f, num))(frames)
  squeeze = functools.partial(token_merge.compress, budget=c.budget, window=c.window, rho=c.rho)
  return jax.vmap(squeeze)(frames, segment)


def answer(config, params, frames, batch, rng, temperature: float = 0.0):
  """Completions `Generation` of `<ans> X </ans>` for a batch of visual inputs."""
  from core import decoding

  return vlm_lib.generate(
    vlm_of(config),
    params,
    frames,
    batch["question"],
    batch["question_length"],
    rng,
    max_new_tokens=3,
    sampling=decoding.Sampling(temperature=temperature),
    stop_tokens=(special_ids()["close"],),
  )
