"""R-WoM: "R-WoM: Retrieval-augmented World Model for Computer-use Agents" (Mei et al., ICLR 2026,
arXiv 2510.11892), its world model, rollouts, listwise reward and planning agent on MenuWorld
(`core/data/menuworld.py`).

Claim: a world model grounded in retrieved tutorials simulates long horizons and environments it
could not have memorised (new apps, updated UIs) better than the same model without them, and an agent
that plans with it succeeds more often.

The world model is the shared `core.nn.transformer.Transformer`, trained from scratch on one
transition per sequence (fixed layout, every row the same length):

  <bos> [tutorial slot: top chunks or `none`, <pad>-filled] sep app(2 words) goal g1 g2 g3 sep
  state(11) act a out state'(11) rwd r

with the loss on `state'` and the milestone flag `r` (the world model: future state and reward), and on
the action `a` where it was the expert's (the model also proposes the imagined continuation of a
rollout, as an LLM world model does in the paper's LongCoT rollout).

  sequences            token arrays of transitions (`header`, `transition_tokens`), the loss mask
                       (the world model's targets, or the milestone flag alone: `OBJECTIVES`).
  loss                 next-token cross-entropy on the masked positions.
  imagine              Eq. 10, one call for a whole k-step future: a `lax.scan` over steps, each a
                       KV-cached `core.decoding.prefill` + `decode_step` loop that forces the given
                       action (or lets the model choose it), generates the next state greedily (tokens
                       restricted to their slot's type) and reads P(milestone); the model consumes its
                       own predicted states.
  next_state_logprob   probe 1: log p(state' | state, action) for candidate next states
                       (`core.decoding.score`).
  milestone_probability  probe 3: P(r = 1) of teacher-forced transitions.
  teacher_forced_readout the model's own action and P(r = 1) of teacher-forced transitions (the
                       home-screen flag diagnostics).
  pairwise_auc         ROC AUC of flag probabilities against true flags.
  judge_sequence, judge_scores, listwise_loss
                       Eq. 11: the listwise reward. All candidates' imagined rollouts in one
                       sequence, one bidirectional pass of a judge transformer, a score per
                       candidate read at its closing token (each depends on all rollouts), their
                       softmax the distribution over candidates, trained with a listwise (ListNet)
                       cross-entropy against the environment's best candidates.
  absolute_choice      the baseline: each rollout scored alone in {0, .5, 1} from its milestone
                       flags (WebDreamer-style absolute rewards).
  value_choice         each rollout's `rollout_value` alone (expected imagined steps before the
                       first non-milestone, `on_track`, plus a bonus for a predicted no-op), argmax:
                       the planner fed the true environment, and an ablation.

Choices where the paper is open or does not apply here:
  * One model serves with and without retrieval (tutorial slot dropped at rate `tutorial_dropout` in
    training): the paper compares the same LLM with and without retrieved tutorials.
  * The listwise judge is a separate small transformer over the world model's vocabulary, trained
    after the world model on its own imagined rollouts (the paper's judge is the same LLM, which
    brings the comparison from pre-training); the candidates' order in the sequence is random.
  * The "LongCoT" rollout is a chain of single-transition calls inside one jitted scan; the state is
    Markov, so the tutorials and goal are re-read at every imagined step instead of carried in one long
    context (which would not fit a 2-layer model's training length).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import decoding
from core.data import menuworld as mw
from core.data import tokenizers
from core.nn import attention
from core.nn.transformer import Transformer

TEMPLATE = 2 + mw.STATE_TOKENS + 2  # a, out, state', rwd, r


class Layout(NamedTuple):
  """Positions in a sequence whose tutorial slot holds `tutorial_len` tokens."""

  tutorial_len: int

  @property
  def header(self) -> int:
    return self.tutorial_len + 9

  @property
  def prompt(self) -> int:  # up to and including `act`
    return self.header + mw.STATE_TOKENS + 1

  @property
  def length(self) -> int:
    return self.prompt + TEMPLATE

  @property
  def next_state(self) -> slice:
    return slice(self.prompt + 2, self.prompt + 2 + mw.STATE_TOKENS)

  @property
  def reward(self) -> int:
    return self.length - 1


# ---------------------------------------------------------------------------------------------------
# Sequences
# ---------------------------------------------------------------------------------------------------


def header(
  ids: mw.TokenIds, layout: Layout, app_layout: int, goal, tutorial: list[int]
) -> np.ndarray:
  """`<bos> tutorial-slot sep app goal g1 g2 g3 sep` `[header]`; `tutorial` are token ids (cut to
  the slot; empty = `none`). The app version is not in the header: the model is trained on version 1
  only, so a `v2` there would be an untrained input; the retrieved tutorials name the version, and
  without them the model falls back on what it memorised (stale knowledge)."""
  slot = np.full((layout.tutorial_len,), tokenizers.PAD_ID, np.int32)
  tutorial = list(tutorial)[: layout.tutorial_len] or [ids.word("none")]
  slot[: len(tutorial)] = tutorial
  app = int(app_layout) // 2
  none = ids.word("none")
  goals = [ids.action(len(mw.MENU_WORDS) + g) if g >= 0 else none for g in goal]
  tail = [ids.word("sep"), *ids.app(app), ids.word("goal"), *goals]
  return np.asarray([tokenizers.BOS_ID, *slot, *tail, ids.word("sep")], np.int32)


def transition_tokens(ids: mw.TokenIds, state_tokens, action, next_tokens, reward) -> jax.Array:
  """`state(11) act a out state'(11) rwd r` (jnp, batched over leading axes)."""
  shape = jnp.shape(action)

  def word(name):
    return jnp.full(shape + (1,), ids.word(name), jnp.int32)

  return jnp.concatenate(
    [
      state_tokens,
      word("act"),
      ids.action(jnp.asarray(action))[..., None],
      word("out"),
      next_tokens,
      word("rwd"),
      (ids.word("0") + jnp.asarray(reward))[..., None],
    ],
    axis=-1,
  ).astype(jnp.int32)


OBJECTIVES = ("world_model", "flag_only")  # what the loss trains (`loss_mask`)


def loss_mask(
  layout: Layout, is_expert, milestone_weight: float = 1.0, objective: str = "world_model"
) -> np.ndarray:
  """float `[..., length - 1]` over next-token targets: the action (where it was the expert's), the
  next state and the milestone flag, the flag weighted by `milestone_weight` (one reward token
  against eleven state tokens and an action; `loss` normalises by the total weight). With
  `objective="flag_only"` the action and the next state weigh 0: the loss is the flag's alone."""
  if objective not in OBJECTIVES:
    raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
  is_expert = np.asarray(is_expert, np.float32)
  mask = np.zeros(is_expert.shape + (layout.length - 1,), np.float32)
  if objective == "world_model":
    mask[..., layout.prompt - 1] = is_expert
    mask[..., layout.next_state.start - 1 : layout.next_state.stop - 1] = 1.0
  mask[..., layout.reward - 1] = milestone_weight
  return mask


def loss(model: Transformer, params, tokens, mask) -> jax.Array:
  """Next-token cross-entropy weighted by `mask [B, L - 1]`, divided by the mask's total."""
  logits = model.apply(params, tokens[:, :-1], mask=attention.causal_mask()).logits
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
  return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0)


# ---------------------------------------------------------------------------------------------------
# Rollouts (Eq. 10)
# ---------------------------------------------------------------------------------------------------


def slot_vocabulary(ids: mw.TokenIds, vocab_size: int) -> np.ndarray:
  """bool `[TEMPLATE, V]`: the tokens each generated position may take (actions, path words or
  `none`, a setting or `none`, bits, the flag); structure tokens are forced anyway."""
  allowed = np.ones((TEMPLATE, vocab_size), bool)
  menu = [ids.action(a) for a in range(len(mw.MENU_WORDS))] + [ids.word("none")]
  settings = [ids.action(len(mw.MENU_WORDS) + s) for s in range(mw.NUM_SETTINGS)]
  bits = [ids.word("0"), ids.word("1")]
  kinds = [[ids.action(a) for a in range(mw.NUM_ACTIONS)], None, menu, menu]
  kinds += [settings + [ids.word("none")]] + [bits] * mw.NUM_SETTINGS + [None, bits]
  for t, kind in enumerate(kinds):
    if kind is not None:
      allowed[t] = False
      allowed[t, kind] = True
  return allowed


class Imagined(NamedTuple):
  states: jax.Array  # [B, K, 11] predicted state tokens
  actions: jax.Array  # [B, K] action ids (forced or the model's)
  milestone: jax.Array  # [B, K] P(r = 1) of each imagined transition


def _one_step(model, params, ids, layout: Layout, allowed, header, state, forced_action):
  """One transition from `header + state + act`: returns (action, next state tokens, P(r = 1))."""
  batch = header.shape[0]
  prompt = jnp.concatenate([header, state, jnp.full((batch, 1), ids.word("act"), jnp.int32)], 1)
  lengths = jnp.full((batch,), layout.prompt, jnp.int32)
  logits, cache = decoding.prefill(model, params, prompt, lengths, layout.length)
  forced = jnp.full((batch, TEMPLATE), -1, jnp.int32)
  forced = forced.at[:, 0].set(jnp.where(forced_action >= 0, ids.action(forced_action), -1))
  forced = forced.at[:, 1].set(ids.word("out")).at[:, TEMPLATE - 2].set(ids.word("rwd"))
  zero, one = ids.word("0"), ids.word("1")

  def body(carry, t):
    logits, cache = carry
    masked = jnp.where(allowed[t], logits, -jnp.inf)
    token = jnp.where(forced[:, t] >= 0, forced[:, t], jnp.argmax(masked, -1)).astype(jnp.int32)
    pair = jax.nn.log_softmax(jnp.stack([logits[:, zero], logits[:, one]], -1))
    logits, cache = decoding.decode_step(model, params, token, lengths + t, cache)
    return (logits, cache), (token, jnp.exp(pair[:, 1]))

  _, (tokens, p_one) = jax.lax.scan(body, (logits, cache), jnp.arange(TEMPLATE))
  tokens = tokens.T
  action = tokens[:, 0] - ids.action_base
  return action, tokens[:, 2 : 2 + mw.STATE_TOKENS], p_one[TEMPLATE - 1]


def pending_target_index(ids: mw.TokenIds, state, goals) -> jax.Array:
  """Index of the first goal setting `goals [B, T]` (-1 padded) that state tokens `[B, 11]` show off;
  the last real one when all are on."""
  bits = state[:, 3:] - ids.word("0")
  off = (jnp.take_along_axis(bits, jnp.maximum(goals, 0), 1) == 0) & (goals >= 0)
  last = jnp.sum(goals >= 0, 1) - 1
  return jnp.where(jnp.any(off, 1), jnp.argmax(off, 1), last)


@functools.partial(jax.jit, static_argnames=("model", "ids", "layout"))
def imagine(
  model, params, ids, layout: Layout, allowed, headers, goals, state, actions
) -> Imagined:
  """Eq. 10 in one call: `actions [B, K]` (-1 = the model's own) from `state [B, 11]`, the model
  consuming its own predicted states. `headers [B, T, header]` hold the retrieved tutorials of each
  goal setting `goals [B, T]`; each imagined step reads the header of the target its imagined state
  still has to turn on (retrieval follows the imagined progress)."""

  def body(state, action):
    index = pending_target_index(ids, state, goals)
    head = jnp.take_along_axis(headers, index[:, None, None], 1)[:, 0]
    action, nxt, p = _one_step(model, params, ids, layout, allowed, head, state, action)
    return nxt, (nxt, action, p)

  _, (states, acts, p) = jax.lax.scan(body, state, actions.T)
  return Imagined(jnp.swapaxes(states, 0, 1), acts.T, p.T)


def next_state_logprob(model, params, ids, prompts, candidates) -> jax.Array:
  """Probe 1: `log p(state' | prompt)` for `prompts [B, prompt + 1]` (ending with the action) and
  `candidates [B, C, 11]`; returns `[B, C]`."""
  batch, count = candidates.shape[:2]
  out = jnp.full((batch, count, 1), ids.word("out"), jnp.int32)
  continuations = jnp.concatenate([out, candidates], -1).reshape(batch * count, -1)
  rows = jnp.repeat(prompts, count, 0)
  total, _ = decoding.score(model, params, rows, continuations)
  return total.reshape(batch, count)


@functools.partial(jax.jit, static_argnames=("model", "ids"))
def milestone_probability(model, params, ids, sequences) -> jax.Array:
  """Probe 3: P(r = 1) of teacher-forced transitions `sequences [B, length]` (the flag ignored)."""
  logits = model.apply(params, sequences[:, :-1], mask=attention.causal_mask()).logits[:, -1]
  pair = jax.nn.log_softmax(jnp.stack([logits[:, ids.word("0")], logits[:, ids.word("1")]], -1))
  return jnp.exp(pair[:, 1])


@functools.partial(jax.jit, static_argnames=("model", "ids", "layout"))
def teacher_forced_readout(model, params, ids, layout: Layout, sequences):
  """The model's own action at the `act` position (argmax over action tokens, the choice `imagine`
  makes when the action is not forced) and P(r = 1), from one forward pass over teacher-forced
  transitions `sequences [B, length]`; returns `(action [B], p [B])`."""
  logits = model.apply(params, sequences[:, :-1], mask=attention.causal_mask()).logits
  actions = logits[:, layout.prompt - 1, ids.action_base : ids.action_base + mw.NUM_ACTIONS]
  last = logits[:, -1]
  pair = jax.nn.log_softmax(jnp.stack([last[:, ids.word("0")], last[:, ids.word("1")]], -1))
  return jnp.argmax(actions, -1), jnp.exp(pair[:, 1])


def pairwise_auc(scores, labels) -> float:
  """Area under the ROC curve of `scores` for binary `labels` (numpy): the probability that a random
  positive scores above a random negative, ties counted half (Mann-Whitney); nan without both."""
  scores, labels = np.asarray(scores, np.float64), np.asarray(labels, bool)
  pos, neg = scores[labels], scores[~labels]
  if not len(pos) or not len(neg):
    return float("nan")
  greater = (pos[:, None] > neg[None, :]).mean()
  ties = (pos[:, None] == neg[None, :]).mean()
  return float(greater + 0.5 * ties)


# ---------------------------------------------------------------------------------------------------
# Listwise reward (Eq. 11)
# ---------------------------------------------------------------------------------------------------


def on_track(milestones) -> jax.Array:
  """A rollout's value `sum_t prod_{tau <= t} p_tau` over `milestones [..., k]`: the expected number
  of imagined steps before the first one that is not a milestone. A plain sum would reward detours
  (going home and re-entering the right menu are two milestones)."""
  return jnp.sum(jnp.cumprod(milestones, -1), -1)


def rollout_value(milestones, unchanged=None, no_op_value: float = 0.0) -> jax.Array:
  """A rollout's value for Eq. 11: `on_track(milestones)`, plus `no_op_value` where `unchanged
  [..., m]` says the world model predicts the candidate leaves the state as it is. A milestone flag
  alone ties a harmless no-op with a click into a wrong menu (neither is progress), but the wrong click
  costs at least one more step to undo; a value between 0 (off track) and the ~1 of one milestone
  ranks progress > standing still > a detour."""
  value = on_track(milestones)
  if unchanged is not None:
    value = value + no_op_value * jnp.asarray(unchanged, value.dtype)
  return value


def value_choice(milestones, unchanged=None, no_op_value: float = 0.0) -> jax.Array:
  """The best `rollout_value` of candidates' rollouts `milestones [E, m, k]`, each scored alone (a
  per-candidate argmax: the planner of `true_wm`, and the `rwom_value` ablation)."""
  return jnp.argmax(rollout_value(milestones, unchanged, no_op_value), -1)


def judge_sequence(ids: mw.TokenIds, header, state, actions, states) -> jax.Array:
  """Eq. 11's input, every candidate's imagined rollout in one sequence (jnp, batched over leading
  axes): `header state(11)` then, per candidate j of `actions [..., m, k]` / `states [..., m, k,
  11]`, `act a_j1 out s_j1 ... act a_jk out s_jk rwd`; the `rwd` closing each candidate is where the
  judge writes its score (`judge_positions`)."""
  lead = actions.shape[:-1]

  def word(name):
    return jnp.full(lead + (actions.shape[-1], 1), ids.word(name), jnp.int32)

  steps = jnp.concatenate(
    [word("act"), ids.action(actions)[..., None], word("out"), states], axis=-1
  )  # [..., m, k, 14]
  blocks = steps.reshape(lead + (-1,))
  blocks = jnp.concatenate([blocks, jnp.full(lead + (1,), ids.word("rwd"), jnp.int32)], -1)
  flat = blocks.reshape(lead[:-1] + (-1,))
  return jnp.concatenate([header, state, flat], -1).astype(jnp.int32)


def judge_positions(header_len: int, num_candidates: int, imagine_steps: int) -> np.ndarray:
  """Positions of the candidates' `rwd` tokens in a `judge_sequence`."""
  block = imagine_steps * (3 + mw.STATE_TOKENS) + 1
  return header_len + mw.STATE_TOKENS + block * np.arange(1, num_candidates + 1) - 1


def judge_scores(model: Transformer, params, ids: mw.TokenIds, tokens, positions) -> jax.Array:
  """Eq. 11's listwise reward: one bidirectional pass over all candidates' rollouts `tokens [B, L]`;
  candidate j's score is the logit of `1` at its `rwd` token `positions[j]`, so every score depends
  on every rollout (the candidates are compared, not scored alone). Returns `[B, m]`; their softmax
  is the judge's distribution over candidates."""
  logits = model.apply(params, tokens, mask=attention.bidirectional_mask()).logits
  return logits[:, positions, ids.word("1")]


def listwise_loss(scores, target) -> jax.Array:
  """ListNet cross-entropy between the softmax of `scores [B, m]` and a target distribution over
  the candidates `target [B, m]` (rows sum to 1), mean over rows."""
  return jnp.mean(optax.softmax_cross_entropy(scores, target))


def absolute_choice(milestones, rng, unchanged=None, no_op_value: float = 0.0) -> jax.Array:
  """Each rollout scored alone in {0, 0.5, 1} (its `rollout_value` over k, rounded), a uniform
  choice among the best-scored candidates."""
  value = rollout_value(milestones, unchanged, no_op_value)
  scores = jnp.round(2.0 * value / milestones.shape[-1]) / 2.0
  best = scores >= jnp.max(scores, -1, keepdims=True)
  noise = jax.random.uniform(rng, scores.shape)
  return jnp.argmax(jnp.where(best, noise, -1.0), -1)
