"""R-WoM's world, tutorial index, tokenizer and batched environment functions, built once per config."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from core import rwom
from core import tutorial_retrieval as retrieval
from core.data import menuworld as mw
from core.data import tokenizers
from methods.base import cached_per_config

QUERIES = ("raw", "rewrite", "rewrite_rerank")
CONTEXTS = ("none", "retrieved", "oracle", "random")


class World(NamedTuple):
  layouts: mw.Layouts
  moved: np.ndarray  # [apps, 8]
  documents: list[str]
  doc_keys: np.ndarray  # [D, 2] (layout, setting)
  index: retrieval.LexicalIndex
  tokenizer: tokenizers.WordTokenizer
  ids: mw.TokenIds
  layout: rwom.Layout
  rewrite_table: dict


@cached_per_config(maxsize=4)
def world_of(config: ml_collections.ConfigDict) -> World:
  w = config.world
  layouts, moved = mw.make_layouts(w.num_apps, w.world_seed, w.submenu_prob)
  documents, keys = mw.corpus(layouts)
  table = {
    synonym: name for name, words in mw.SYNONYMS.items() for synonym in words[: w.rewrite_known]
  }
  tokenizer = tokenizers.WordTokenizer(mw.vocabulary())
  return World(
    layouts,
    moved,
    documents,
    keys,
    retrieval.LexicalIndex(documents, config.retrieval.k1, config.retrieval.b),
    tokenizer,
    mw.TokenIds(),
    rwom.Layout(config.retrieval.tutorial_len),
    table,
  )


def vocab_size(config) -> int:
  return world_of(config).tokenizer.vocab_size


# ---------------------------------------------------------------------------------------------------
# Retrieval (Eq. 9)
# ---------------------------------------------------------------------------------------------------


def ranking(
  world: World, layout: int, setting: int, wording: int, query: str, k: int
) -> np.ndarray:
  """Document indices, best first, for the request of one target under a query pipeline."""
  text = mw.task_text(layout, setting, wording)
  if query == "raw":
    return world.index.top_k(text, k)[0]
  text = retrieval.rewrite_query(text, world.rewrite_table)
  first, scores = world.index.top_k(text, k)
  if query == "rewrite":
    return first
  app, version = divmod(int(layout), 2)
  words = text.split()
  keys = [*mw.app_name(app).split(), f"v{version + 1}"] + [w for w in words if w in mw.SETTINGS]
  return retrieval.rerank(first, scores, world.documents, keys)


def propose(rng: np.random.Generator, valid: np.ndarray, count: int) -> np.ndarray:
  """`[N, count]` distinct valid actions per row (Gumbel top-k of uniform scores); rows with fewer
  valid actions repeat their first."""
  scores = np.where(valid, rng.random(valid.shape), -1.0)
  order = np.argsort(-scores, 1)[:, :count]
  ok = np.take_along_axis(valid, order, 1)
  return np.where(ok, order, order[:, :1]).astype(np.int32)


def gold_document(layout: int, setting: int) -> int:
  return int(layout) * mw.NUM_SETTINGS + int(setting)


def chunk_ids(config, context: str, layout: int, setting: int, wording: int, rng) -> list[int]:
  """Token ids of the tutorial slot for one target under `context` (module `CONTEXTS`)."""
  world, r = world_of(config), config.retrieval
  if context == "none":
    return []
  if context == "oracle":  # the gold tutorial first, then the best other retrieved one (two chunks)
    gold = gold_document(layout, setting)
    ranked = ranking(world, layout, setting, wording, r.query, r.first_stage_k)
    docs = ([gold] + [int(d) for d in ranked if d != gold])[: r.num_chunks]
  elif context == "random":
    docs = list(rng.integers(len(world.documents), size=r.num_chunks))
  else:
    docs = list(ranking(world, layout, setting, wording, r.query, r.first_stage_k)[: r.num_chunks])
  return [i for d in docs for i in world.tokenizer.encode(world.documents[d])]


def headers(config, tasks: mw.Tasks, context: str, seed: int) -> np.ndarray:
  """`[N, 3, header]`: the world model's header for each task and each of its targets (padded
  targets repeat the last real one)."""
  world = world_of(config)
  rng = np.random.default_rng([seed, 11])
  out = np.zeros((len(tasks.layout), mw.MAX_TARGETS, world.layout.header), np.int32)
  for row, (lay, goal, wording) in enumerate(
    zip(tasks.layout, tasks.goal, tasks.wording, strict=True)
  ):
    for j in range(mw.MAX_TARGETS):
      jj = j if goal[j] >= 0 else max(i for i in range(mw.MAX_TARGETS) if goal[i] >= 0)
      tutorial = chunk_ids(config, context, int(lay), int(goal[jj]), int(wording[jj]), rng)
      out[row, j] = rwom.header(world.ids, world.layout, int(lay), goal, tutorial)
  return out


# ---------------------------------------------------------------------------------------------------
# Batched environment
# ---------------------------------------------------------------------------------------------------


class Env:
  """Jitted, vmapped MenuWorld functions over rows `(layout [N], state [N, 10], ...)`."""

  def __init__(self, world: World):
    self.layouts = jax.tree.map(jnp.asarray, world.layouts)
    lay = self.layouts
    self.step = jax.jit(jax.vmap(functools.partial(mw.step, lay)))
    self.distance = jax.jit(jax.vmap(functools.partial(mw.distance, lay)))
    self.valid = jax.jit(jax.vmap(functools.partial(mw.valid_actions, lay)))
    self.done = jax.jit(jax.vmap(mw.done))
    self.expert = jax.jit(jax.vmap(functools.partial(mw.expert_action, lay)))
    self.reward = jax.jit(jax.vmap(functools.partial(mw.reward, lay)))
    self.tokens = jax.jit(
      jax.vmap(lambda layout, state: mw.state_tokens(lay, layout, state, world.ids))
    )


@functools.lru_cache(maxsize=4)
def _env(key) -> Env:
  return Env(_WORLDS[key])


_WORLDS: dict = {}


def env_of(config) -> Env:
  from methods.base import config_key

  key = config_key(config.world)
  _WORLDS[key] = world_of(config)
  return _env(key)


def pending_index(state: np.ndarray, goal: np.ndarray) -> np.ndarray:
  """Index (0..2) of each row's first target still off; the last real target once all are on."""
  bits = np.take_along_axis(state[:, 2:], np.maximum(goal, 0), 1)
  off = (bits == 0) & (goal >= 0)
  last = (goal >= 0).sum(1) - 1
  return np.where(off.any(1), np.argmax(off, 1), last)
