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
# ("oracle_full": all frames of the question's true relevant events, a diagnostic of the VMR)
MODES = ("full", "vmr_full", "vmr_merge", "merge", "uniform", "oracle_full")
# the training-data streams of a seed, each one part of a single split of the seed's data key
STREAMS = ("retriever", "teacher", "sft", "pool")
# the first entropy word of EventWorld's generator: training streams and the test set live in
# different domains, so no seed's training stream can draw the test set's items
TRAIN_DOMAIN, TEST_DOMAIN = 1, 0
DATA_TAG = 0x5EED  # folded into `jax.random.key(config.seed)`: the data key, apart from the loop's


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
    balanced_counts=d.balanced_counts,
  )


def stream_seeds(seed: int) -> dict[str, tuple[int, ...]]:
  """Every training stream's generator entropy for `config.seed = seed`: one
  `jax.random.split` of the seed's data key, one part per stream of `STREAMS`, in the training
  domain (the test set is `test_seed_of`, in its own domain)."""
  keys = jax.random.split(jax.random.fold_in(jax.random.key(seed), DATA_TAG), len(STREAMS))
  words = np.asarray(jax.random.key_data(keys)).reshape(len(STREAMS), -1)
  return {name: (TRAIN_DOMAIN, *map(int, w)) for name, w in zip(STREAMS, words, strict=True)}


def test_seed_of(config) -> tuple[int, int]:
  return (TEST_DOMAIN, config.data.test_seed)


def stream(config, name: str, batch_size: int) -> batching.GeneratedBatches:
  """The training stream `name` of this seed: batch `s` is a pure function of (seed, name, s)."""
  seed = stream_seeds(config.seed)[name]
  return batching.GeneratedBatches(
    lambda step: eventworld_batch(config, seed, step, batch_size), batch_size
  )


@cached_per_config(maxsize=256)
def pool_chunk(config, index: int) -> dict[str, np.ndarray]:
  """RL pool chunk `index` (`rl.prompts` questions), with each question's pool row."""
  size = config.rl.prompts
  chunk = eventworld_batch(config, stream_seeds(config.seed)["pool"], index, size)
  return {**chunk, "row": np.arange(index * size, (index + 1) * size, dtype=np.int32)}


@cached_per_config(maxsize=2)
def test_set(config) -> dict[str, np.ndarray]:
  return eventworld_batch(config, test_seed_of(config), 0, config.data.num_test)


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
  if mode == "oracle_full":
    kept = jnp.take_along_axis(batch["relevant"], batch["event_of_frame"], 1)
    return jax.vmap(lambda f: token_merge.compact(f, num))(
      token_merge.Frames(features, times, kept)
    )
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
