"""Token-Guard: token-, segment- and global-level self-checking decoding, and its baselines.

"Token-Guard: Towards Token-Level Hallucination Control via Self-Checking Decoding" (Zhu, Rong, Luo;
ICLR 2026, arXiv 2601.21969; official code github.com/rhq945/Token-Guard, `guard/`). Everything works
on token ids of `core.nn.transformer.Transformer` and batches of questions; the model calls are jitted
(`core/decoding.py` for generation, one teacher-forced forward for scoring) and the scores are pure
`jnp` functions of fixed-shape arrays.

Scores (Sec. 3; `score_chains` computes all of them from one forward of prompt + chain):
  anchor      h_x = mean penultimate-layer hidden state over the context (Eq. 1).
  token       F_tok(i) = lam cos(h_i, hbar_<i) + (1 - lam) p(a_i | a_<i, x) (Eq. 3), lam = 0.6; the
              running mean hbar starts at h_x with count 1 in every segment and takes h_i only when
              F_tok(i) >= tau_token (Eq. 4; the official code's gate: low tokens are not deleted).
  segment     w = softmax(F_tok) over the segment, H_k = sum_i w_i h_i, e_k = mean input embedding;
              F_seg = alpha sum_i w_i F_tok(i) + beta Consistency + gamma cos(H_k, h_x) (Eq. 5-9),
              (alpha, beta, gamma) = (0.5, 0.3, 0.2); Consistency = max(0, mean cos(h_i, h_i+1))
              (latest code) or max(0, 1 - mean ||h_i+1 - h_i||) (first code).
  global      F_fact = sum_k (||F_tok,k|| / sum_j ||F_tok,j||) F_seg,k; F_logic = mean_k
              (1 + cos(e_k, e_k+1)) / 2 cos(H_k, H_k+1) (1 for one segment) (Eq. 11-12);
              F_global = F_fact F_logic / (F_fact + F_logic - F_fact F_logic) (paper, Eq. 13) or the
              latest code's softmin -0.1 log(exp(-F_fact / 0.1) + exp(-F_logic / 0.1)) in [0, 1].

Decoding (`token_guard_decode`, the official `beam_search.py` scaffold, phi-Decoding style): per
reasoning step every beam samples `rollouts` next segments (a segment ends at "." or <eos>); each is
scored; segments with F_seg in [tau_low - adj, tau_high + adj) are refined up to `max_refine` times
(Eq. 10: resample the window {i-1, i, i+1} of the lowest-F_tok token i keeping both sides, or with
`refine = "suffix"` the code's cut-and-resample-the-rest; keep it if F_seg rises, stop at
tau_high + adj); those below tau_low - adj are discarded; the rest are width
pruned (mean log-prob > mean - 0.8 std); advantage = mean log-prob - parent value + 2.0 F_global of
the chain with the candidate; candidates are clustered (the code's TF-IDF + k-means, or identical
segments with `clustering = "exact"`) and `beams` of them drawn
without replacement with weights (softmax(cluster share) + softmax(advantage)) / 2. Eq. 15 moves `adj`
after each step from the first beam's F_fact/F_logic: +0.1 (wider refine band) when F_fact < 0.5 and
F_logic > 0.6, -0.1 when the reverse, else 0. A question stops branching when its largest cluster
holds `stop_share` of the candidates or all beams ended; unfinished beams are completed, the final
answer comes from the largest cluster of the beams' answers (highest advantage within it), and while
its F_global < tau_global the worst segment is refined the same way (at most
`global_iterations` times, kept when F_global rises). If F_fact and F_logic are both below
`tau_abstain` the answer is "No answer" (the paper's fallback; the code's only fires without a chain).

Baselines: `greedy`, `sampling` (one draw), `self_consistency` (majority answer of `num_samples`
draws) and `rollout_prune` (the same scaffold with every Token-Guard score switched off: advantage =
log-prob only, no refinement, no discarding, no global iteration), which isolates the score from the
sampling-and-selection machinery around it.

Choices where the paper is open: segments are single reasoning steps (the code's foresight completion
of the whole remaining answer per candidate is not used: a step is scored when it is written); the
refinement trigger phrases of the code ("Wait, let me double check...") are not inserted, because
a model trained here has never seen them; the window is drawn given its left side (an
autoregressive model cannot condition on the right) and judged by F_seg / F_global with both sides;
ties and fallbacks of the code's selection (too few valid candidates) keep the best-scoring discarded
ones; the final pick within the largest answer cluster is its highest advantage, not a draw.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core import decoding
from core.nn import attention
from core.nn.transformer import Transformer

EPS = 1e-8


class Thresholds(NamedTuple):
  """The paper's thresholds (Sec. 3, the code's `TokenGuardConfig`); arrays at the jit boundary."""

  tau_token: float = 0.4
  tau_low: float = 0.55
  tau_high: float = 0.75
  tau_global: float = 0.7
  tau_abstain: float = 0.5


class Guard(NamedTuple):
  """Static settings of the scores and the decoder (hashable: a jit static argument)."""

  lam: float = 0.6
  alpha: float = 0.5
  beta: float = 0.3
  gamma: float = 0.2
  delta_tau: float = 0.1
  consistency: str = "cosine"  # "cosine" (latest code) | "distance" (first code)
  fusion: str = "harmonic"  # "harmonic" (paper Eq. 13) | "softmin" (latest code)
  softmin_temperature: float = 0.1
  use_token: bool = True  # token-level scores (else F_seg without its token term)
  use_segment: bool = True  # refine band, discarding
  use_global: bool = True  # F_global in the advantage, Eq. 15, global iteration, abstention
  beams: int = 2
  rollouts: int = 4
  max_steps: int = 3
  segment_length: int = 6  # most tokens of one segment
  max_refine: int = 3  # N_max
  global_iterations: int = 2  # M_max
  sigma_rate: float = 0.8  # width pruning: keep mean log-prob > mean - sigma_rate std
  advantage_weight: float = 2.0
  stop_share: float = 0.75  # early stop when the largest cluster holds this share
  temperature: float = 0.7
  top_p: float = 0.95
  top_k: int = 50
  refine_top_p: float = 0.9
  refine: str = "window"  # "window" (paper Eq. 10: rewrite {i-1, i, i+1}) | "suffix" (code)
  clustering: str = "tfidf_kmeans"  # "tfidf_kmeans" (code) | "exact" (identical segments)
  num_clusters: int = 3  # k-means clusters of the candidates (code CLI default 2)

  @property
  def scored(self) -> bool:
    return self.use_token or self.use_segment or self.use_global


TOKEN_GUARD = Guard()
PAPER_THRESHOLDS = Thresholds()
ROLLOUT_PRUNE = Guard(use_token=False, use_segment=False, use_global=False)


class ChainScores(NamedTuple):
  token: jax.Array  # [N, C] F_tok (0 past the chain)
  prob: jax.Array  # [N, C] p(a_i | a_<i, x)
  cosine: jax.Array  # [N, C] cos(h_i, hbar_<i)
  segment: jax.Array  # [N, S] F_seg
  segment_valid: jax.Array  # [N, S] bool
  segment_start: jax.Array  # [N, S] int32 chain index of each segment's first token
  num_segments: jax.Array  # [N] int32
  fact: jax.Array  # [N]
  logic: jax.Array  # [N]
  glob: jax.Array  # [N] F_global


# ---------------------------------------------------------------------------------------------------
# Scores (pure jnp)
# ---------------------------------------------------------------------------------------------------


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
  """Cosine similarity over the last axis."""
  dot = jnp.sum(a * b, axis=-1)
  return dot / jnp.maximum(jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1), EPS)


def token_scores(hidden, probs, anchor, starts, valid, lam, tau_token):
  """F_tok (Eq. 3) of one chain's tokens `[C]` and the cosines to the gated running mean (Eq. 4).

  hidden [C, D], probs [C], anchor [D], starts [C] (first token of a segment: the mean restarts
  at the anchor with count 1), valid [C]."""

  def body(carry, x):
    mean, count = carry
    h, p, start, ok = x
    mean = jnp.where(start, anchor, mean)
    count = jnp.where(start, 1.0, count)
    cos = cosine(h, mean)
    score = lam * cos + (1.0 - lam) * p
    take = ok & (score >= tau_token)
    mean = jnp.where(take, (mean * count + h) / (count + 1.0), mean)
    return (mean, count + take), (score, cos)

  _, (scores, cosines) = jax.lax.scan(
    body, (anchor, jnp.float32(1.0)), (hidden, probs, starts, valid)
  )
  return jnp.where(valid, scores, 0.0), jnp.where(valid, cosines, 0.0)


def segment_scores(guard: Guard, token, hidden, embeds, anchor, members):
  """F_seg (Eq. 9) and the segment vectors of one chain: `members [S, C]` says which tokens form
  each segment. Returns (F_seg [S], H [S, D], e [S, D], ||F_tok|| [S], valid [S])."""
  count = members.sum(-1)
  valid = count > 0
  if guard.use_token:
    logits = jnp.where(members, token[None], -jnp.inf)
    weights = jnp.where(valid[:, None], jax.nn.softmax(logits, axis=-1), 0.0)
    weights = jnp.nan_to_num(weights)
  else:
    weights = members / jnp.maximum(count, 1)[:, None]
  token_part = jnp.sum(weights * token[None], -1)
  big_h = weights @ hidden
  e_mean = (members @ embeds) / jnp.maximum(count, 1)[:, None]
  pairs = members[:, :-1] & members[:, 1:]
  if guard.consistency == "cosine":
    steps = cosine(hidden[:-1], hidden[1:])
  else:
    steps = -jnp.linalg.norm(hidden[1:] - hidden[:-1], axis=-1)
  mean_step = jnp.sum(pairs * steps[None], -1) / jnp.maximum(pairs.sum(-1), 1)
  consistency = mean_step if guard.consistency == "cosine" else 1.0 + mean_step
  consistency = jnp.where(pairs.sum(-1) > 0, jnp.maximum(consistency, 0.0), 1.0)
  align = cosine(big_h, anchor[None])
  if guard.use_token:
    f_seg = guard.alpha * token_part + guard.beta * consistency + guard.gamma * align
  else:
    f_seg = (guard.beta * consistency + guard.gamma * align) / (guard.beta + guard.gamma)
  norms = jnp.sqrt(members @ (token**2)) if guard.use_token else count.astype(jnp.float32)
  return jnp.where(valid, f_seg, 0.0), big_h, e_mean, norms, valid


def fuse(guard: Guard, fact, logic):
  """F_global from F_fact and F_logic (Eq. 13, or the code's softmin)."""
  if guard.fusion == "harmonic":
    denominator = fact + logic - fact * logic
    safe = jnp.where(jnp.abs(denominator) < 1e-6, 1.0, denominator)
    return jnp.where(jnp.abs(denominator) < 1e-6, 0.0, fact * logic / safe)
  t = guard.softmin_temperature
  a, b = jnp.maximum(fact, EPS), jnp.maximum(logic, EPS)
  return jnp.clip(-t * jnp.logaddexp(-a / t, -b / t), 0.0, 1.0)


def global_scores(guard: Guard, f_seg, big_h, e_mean, norms, valid):
  """(F_fact, F_logic, F_global) of one chain's segments (Eq. 11-13); evidence weights 1."""
  weights = jnp.where(valid, norms, 0.0)
  fact = jnp.sum(weights * f_seg) / (jnp.sum(weights) + EPS)
  pair = valid[:-1] & valid[1:]
  context = (1.0 + cosine(e_mean[:-1], e_mean[1:])) / 2.0
  logic_terms = context * cosine(big_h[:-1], big_h[1:])
  logic = jnp.where(pair.sum() > 0, jnp.sum(pair * logic_terms) / jnp.maximum(pair.sum(), 1), 1.0)
  return fact, logic, fuse(guard, fact, logic)


def segment_ids(chain, lengths, stop_tokens):
  """Per chain token `[N, C]`: its segment index (segments end with a stop token) and whether it
  starts a segment; tokens past a row's length get index -1."""
  is_stop = jnp.isin(chain, jnp.asarray(stop_tokens, jnp.int32))
  before = jnp.cumsum(is_stop, axis=1) - is_stop
  valid = jnp.arange(chain.shape[1])[None] < lengths[:, None]
  starts = jnp.concatenate([jnp.ones_like(is_stop[:, :1]), is_stop[:, :-1]], axis=1) & valid
  return jnp.where(valid, before, -1), starts


@functools.partial(jax.jit, static_argnames=("guard",))
def threshold_adjustment(guard: Guard, fact, logic):
  """Eq. 15: +delta_tau (wider refine band) for low F_fact with high F_logic, -delta_tau for the
  reverse, else 0."""
  up = (fact < 0.5) & (logic > 0.6)
  down = (logic < 0.5) & (fact > 0.6)
  return jnp.where(up, guard.delta_tau, jnp.where(down, -guard.delta_tau, 0.0))


# ---------------------------------------------------------------------------------------------------
# Model calls (jitted)
# ---------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("model", "head_at_chain"))
def chain_states(
  model: Transformer, params, prompts, prompt_lengths, chain, chain_lengths, head_at_chain=False
):
  """One teacher-forced forward of prompt + chain: chain-token probabilities `[N, C]`, their
  penultimate-layer states and input embeddings `[N, C, D]`, and the context anchor `[N, D]`.
  `head_at_chain` applies the output head only where the chain's tokens are predicted, so that a
  large vocabulary (Llama 3's 128k) never has logits over the whole prompt (XLA drops the unused
  full head); the values are the same up to rounding."""
  sequence = decoding.concatenate(prompts, prompt_lengths, chain, chain_lengths)
  width = chain.shape[1]
  index = prompt_lengths[:, None] + jnp.arange(width)[None]
  prev = jnp.clip(index - 1, 0, sequence.shape[1] - 1)
  out = model.apply(
    params,
    sequence,
    mask=attention.causal_mask(),
    logits_at=prev if head_at_chain else None,
    return_hidden=True,
  )
  if head_at_chain:
    log_probs = jax.nn.log_softmax(out.logits)
    token_lp = jnp.take_along_axis(log_probs, chain[..., None], 2)
  else:
    log_probs = jax.nn.log_softmax(out.logits)
    token_lp = jnp.take_along_axis(
      jnp.take_along_axis(log_probs, prev[..., None], 1), chain[..., None], 2
    )
  gather = lambda states: jnp.take_along_axis(  # noqa: E731
    states, jnp.clip(index, 0, sequence.shape[1] - 1)[..., None], axis=1
  )
  penultimate, embeds = out.hidden_states[-2], out.hidden_states[0]
  context = jnp.arange(sequence.shape[1])[None] < prompt_lengths[:, None]
  anchor = jnp.sum(penultimate * context[..., None], 1) / prompt_lengths[:, None]
  return jnp.exp(token_lp[..., 0]), gather(penultimate), gather(embeds), anchor


@functools.partial(
  jax.jit, static_argnames=("model", "guard", "stop_tokens", "max_segments", "head_at_chain")
)
def score_chains(
  model,
  params,
  prompts,
  prompt_lengths,
  chain,
  chain_lengths,
  thresholds,
  *,
  guard,
  stop_tokens,
  max_segments,
  head_at_chain=False,
) -> ChainScores:
  """Every Token-Guard score of each row's chain (module docstring) from one forward."""
  probs, hidden, embeds, anchor = chain_states(
    model, params, prompts, prompt_lengths, chain, chain_lengths, head_at_chain
  )
  ids, starts = segment_ids(chain, chain_lengths, stop_tokens)
  valid = ids >= 0
  lam = guard.lam if guard.use_token else 0.0
  token, cos = jax.vmap(token_scores, in_axes=(0, 0, 0, 0, 0, None, None))(
    hidden, probs, anchor, starts, valid, lam, thresholds.tau_token
  )
  members = ids[:, None, :] == jnp.arange(max_segments)[None, :, None]
  f_seg, big_h, e_mean, norms, seg_valid = jax.vmap(functools.partial(segment_scores, guard))(
    token, hidden, embeds, anchor, members
  )
  fact, logic, glob = jax.vmap(functools.partial(global_scores, guard))(
    f_seg, big_h, e_mean, norms, seg_valid
  )
  first = jnp.argmax(members, axis=-1).astype(jnp.int32)
  return ChainScores(
    token,
    probs,
    cos,
    f_seg,
    seg_valid,
    first,
    seg_valid.sum(-1).astype(jnp.int32),
    fact,
    logic,
    glob,
  )


class Extension(NamedTuple):
  chain: jax.Array  # [N, C]
  lengths: jax.Array  # [N]
  new_tokens: jax.Array  # [N] tokens added
  log_prob: jax.Array  # [N] sum of the added tokens' log-probs
  done: jax.Array  # [N] the chain holds <eos> or is full


@functools.partial(
  jax.jit, static_argnames=("model", "max_new", "sampling", "stop_tokens", "eos_id")
)
def extend(
  model,
  params,
  prompts,
  prompt_lengths,
  chain,
  chain_lengths,
  rng,
  *,
  max_new,
  sampling,
  stop_tokens,
  eos_id,
) -> Extension:
  """Appends up to `max_new` sampled tokens to each row's chain (stopping after a stop token),
  one prefill of prompt + chain and a KV-cached decode loop."""
  sequence = decoding.concatenate(prompts, prompt_lengths, chain, chain_lengths)
  lengths = prompt_lengths + chain_lengths
  logits, cache = decoding.prefill(model, params, sequence, lengths, sequence.shape[1] + max_new)
  gen = decoding.decode_loop(
    model,
    params,
    logits,
    cache,
    lengths,
    rng,
    max_new_tokens=max_new,
    sampling=sampling,
    stop_tokens=stop_tokens,
  )
  width = chain.shape[1]
  room = jnp.maximum(width - chain_lengths, 0)
  added = jnp.minimum(gen.lengths, room)
  slots = chain_lengths[:, None] + jnp.arange(max_new)[None]
  keep = jnp.arange(max_new)[None] < added[:, None]
  rows = jnp.arange(chain.shape[0])[:, None]
  chain = chain.at[rows, jnp.where(keep, slots, width)].set(gen.tokens, mode="drop")
  new_lengths = chain_lengths + added
  log_prob = jnp.sum(jnp.where(keep, gen.log_probs, 0.0), axis=1)
  return Extension(chain, new_lengths, added, log_prob, chain_done(chain, new_lengths, eos_id))


@functools.partial(jax.jit, static_argnames=("eos_id",))
def chain_done(chain, lengths, eos_id):
  last = jnp.take_along_axis(chain, jnp.maximum(lengths - 1, 0)[:, None], 1)[:, 0]
  return ((lengths > 0) & (last == eos_id)) | (lengths >= chain.shape[1])


@functools.partial(jax.jit, static_argnames=("stop_tokens", "width"))
def last_segment(chain, lengths, stop_tokens, width: int):
  """The tokens of each row's last segment, `[N, width]` padded with -1 (a cluster key)."""
  ids, _ = segment_ids(chain, lengths, stop_tokens)
  last = jnp.take_along_axis(ids, jnp.maximum(lengths - 1, 0)[:, None], 1)
  member = (ids == last) & (ids >= 0)
  order = jnp.argsort(~member, axis=1, stable=True)[:, :width]
  picked = jnp.take_along_axis(chain, order, 1)
  return jnp.where(jnp.take_along_axis(member, order, 1), picked, -1)


def cluster_shares(keys, pool):
  """For candidates `keys [Q, M, L]` in `pool [Q, M]`: the share of the pool holding an identical
  key, `[Q, M]` (cluster labels `[Q, M, 1]` give the share of each candidate's cluster)."""
  same = jnp.all(keys[:, :, None] == keys[:, None, :], axis=-1) & pool[:, None, :]
  return same.sum(-1) / jnp.maximum(pool.sum(-1, keepdims=True), 1)


def semantic_clusters(keys, num_clusters: int, seed: int = 0) -> np.ndarray:
  """The official `beam_search.py`'s clustering of candidate texts: TF-IDF vectors (each token id
  a word) and k-means with `min(num_clusters, distinct candidates)` clusters, per question.
  `keys [Q, M, L]` token ids padded with -1; returns labels `[Q, M, 1]` (a `cluster_shares` key).
  With at most `num_clusters` distinct candidates every distinct one is its own cluster."""
  from sklearn.cluster import KMeans
  from sklearn.feature_extraction.text import TfidfVectorizer

  keys = np.asarray(keys)
  labels = np.zeros(keys.shape[:2], np.int32)
  for q, rows in enumerate(keys):
    texts = [" ".join(f"t{t}" for t in row if t >= 0) or "empty" for row in rows]
    distinct, inverse = np.unique(texts, return_inverse=True)
    if len(distinct) <= num_clusters:
      labels[q] = inverse
      continue
    vectors = TfidfVectorizer(token_pattern=r"\S+", lowercase=False).fit_transform(texts)
    kmeans = KMeans(num_clusters, n_init=1, max_iter=50, random_state=seed)
    labels[q] = kmeans.fit_predict(vectors)
  return labels[..., None]


def cluster_keys(guard: Guard, keys, seed: int = 0):
  """The keys `select_beams` / `cluster_shares` compare: the segments themselves (`exact`) or
  their TF-IDF k-means labels."""
  if guard.clustering == "exact":
    return keys
  return jnp.asarray(semantic_clusters(keys, guard.num_clusters, seed))


@functools.partial(jax.jit, static_argnames=("beams",))
def select_beams(keep, valid, advantage, keys, rng, *, beams: int):
  """Draws `beams` of the `[Q, M]` candidates without replacement with weights (softmax(cluster
  share) + softmax(advantage)) / 2 over the kept ones; discarded but valid candidates fill any
  missing slots by advantage. Returns (indices [Q, beams], largest cluster share [Q])."""
  pool = jnp.where(keep.any(-1, keepdims=True), keep, valid)
  share = cluster_shares(keys, pool)
  w_cluster = jax.nn.softmax(jnp.where(pool, share, -jnp.inf), axis=-1)
  w_adv = jax.nn.softmax(jnp.where(pool, advantage, -jnp.inf), axis=-1)
  log_w = jnp.log((w_cluster + w_adv) / 2 + 1e-30) + jax.random.gumbel(rng, keep.shape)
  score = jnp.where(pool, log_w, jnp.where(valid, -1e6 + advantage, -2e6))
  return jax.lax.top_k(score, beams)[1], jnp.max(jnp.where(pool, share, 0.0), axis=-1)


class Decoded(NamedTuple):
  chain: np.ndarray  # [Q, C] generated tokens after the prompt
  lengths: np.ndarray  # [Q]
  abstain: np.ndarray  # [Q] bool: the decoder answers "No answer" whatever the chain says
  forward_passes: np.ndarray  # [Q] single-sequence forward calls (prefill, decode, scoring)


class Decoder:
  """The model and token conventions shared by every decoder below."""

  def __init__(
    self,
    model,
    params,
    *,
    chain_width: int,
    stop_tokens,
    eos_id: int,
    max_segments,
    head_at_chain: bool = False,
  ):
    self.model, self.params = model, params
    self.width, self.eos_id = chain_width, eos_id
    self.stop_tokens = tuple(int(t) for t in stop_tokens)
    self.max_segments = max_segments
    self.head_at_chain = head_at_chain  # `chain_states`: for large vocabularies

  def extend(self, prompts, prompt_lengths, chain, lengths, rng, max_new, sampling, stops=None):
    return extend(
      self.model,
      self.params,
      prompts,
      prompt_lengths,
      chain,
      lengths,
      rng,
      max_new=max_new,
      sampling=sampling,
      stop_tokens=stops or self.stop_tokens,
      eos_id=self.eos_id,
    )

  def score(self, prompts, prompt_lengths, chain, lengths, thresholds, guard) -> ChainScores:
    return score_chains(
      self.model,
      self.params,
      prompts,
      prompt_lengths,
      chain,
      lengths,
      Thresholds(*(jnp.float32(t) for t in thresholds)),
      guard=guard,
      stop_tokens=self.stop_tokens,
      max_segments=self.max_segments,
      head_at_chain=self.head_at_chain,
    )

  def empty(self, rows: int):
    return jnp.zeros((rows, self.width), jnp.int32), jnp.zeros((rows,), jnp.int32)


def _per_question(values, group: int) -> np.ndarray:
  return np.asarray(values, np.float64).reshape(-1, group).sum(-1)


def sample_chains(decoder: Decoder, prompts, prompt_lengths, rng, sampling, num_samples: int = 1):
  """`num_samples` whole answers per question: `(chains [Q * n, C], lengths, passes [Q])`."""
  prompts = jnp.repeat(prompts, num_samples, 0)
  prompt_lengths = jnp.repeat(prompt_lengths, num_samples, 0)
  chain, lengths = decoder.empty(prompts.shape[0])
  ext = decoder.extend(
    prompts, prompt_lengths, chain, lengths, rng, decoder.width, sampling, (decoder.eos_id,)
  )
  return ext.chain, ext.lengths, _per_question(1 + ext.new_tokens, num_samples)


def greedy_decode(decoder: Decoder, prompts, prompt_lengths, rng) -> Decoded:
  chain, lengths, passes = sample_chains(decoder, prompts, prompt_lengths, rng, decoding.GREEDY)
  return Decoded(np.asarray(chain), np.asarray(lengths), np.zeros(len(passes), bool), passes)


def sampling_decode(decoder: Decoder, prompts, prompt_lengths, rng, sampling) -> Decoded:
  chain, lengths, passes = sample_chains(decoder, prompts, prompt_lengths, rng, sampling)
  return Decoded(np.asarray(chain), np.asarray(lengths), np.zeros(len(passes), bool), passes)


def abstain_decode(decoder: Decoder, prompts) -> Decoded:
  """The trivial policy: "No answer" to every question, no forward pass."""
  q = prompts.shape[0]
  chain, lengths = decoder.empty(q)
  return Decoded(np.asarray(chain), np.asarray(lengths), np.ones(q, bool), np.zeros(q))


def self_consistency_decode(decoder, prompts, prompt_lengths, rng, sampling, num_samples):
  """Majority answer of `num_samples` draws (Wang et al. 2023); the chain shown is the first draw
  with that answer."""
  chain, lengths, passes = sample_chains(
    decoder, prompts, prompt_lengths, rng, sampling, num_samples
  )
  keys = last_segment(chain, lengths, decoder.stop_tokens, decoder.width)
  q = prompts.shape[0]
  keys = keys.reshape(q, num_samples, -1)
  share = cluster_shares(keys, jnp.ones(keys.shape[:2], bool))
  pick = jnp.argmax(share, axis=-1)
  rows = jnp.arange(q) * num_samples + pick
  return Decoded(np.asarray(chain[rows]), np.asarray(lengths[rows]), np.zeros(q, bool), passes)


# ---------------------------------------------------------------------------------------------------
# Token-Guard decoding
# ---------------------------------------------------------------------------------------------------


def _last(values, counts):
  """`values [N, S]` at index `counts - 1` per row."""
  return jnp.take_along_axis(values, jnp.maximum(counts - 1, 0)[:, None], 1)[:, 0]


@jax.jit
def _segment_log_prob(scores: ChainScores, lengths, segment: jax.Array):
  """Mean log-prob of the tokens of segment `segment [N]` of each chain (teacher-forced)."""
  start = jnp.take_along_axis(scores.segment_start, segment[:, None], 1)
  end = jnp.where(
    segment + 1 < scores.num_segments,
    jnp.take_along_axis(
      scores.segment_start, jnp.minimum(segment + 1, scores.segment.shape[1] - 1)[:, None], 1
    )[:, 0],
    lengths,
  )
  index = jnp.arange(scores.prob.shape[1])[None]
  inside = (index >= start) & (index < end[:, None])
  log_p = jnp.log(jnp.maximum(scores.prob, 1e-30))
  return jnp.sum(inside * log_p, 1) / jnp.maximum(inside.sum(1), 1)


@functools.partial(jax.jit, static_argnames=("use_token",))
def refine_cut(scores: ChainScores, lengths, segment, use_token: bool):
  """Eq. 10's window start: one token before the lowest-F_tok token of segment `segment [N]`
  (the segment's start without token scores)."""
  start = jnp.take_along_axis(scores.segment_start, segment[:, None], 1)[:, 0]
  if not use_token:
    return start
  ids = jnp.arange(scores.token.shape[1])[None]
  end = _segment_end(scores, lengths, segment)
  inside = (ids >= start[:, None]) & (ids < end[:, None])
  lowest = jnp.argmin(jnp.where(inside, scores.token, jnp.inf), axis=1)
  return jnp.maximum(start, lowest - 1).astype(jnp.int32)


def _segment_end(scores: ChainScores, lengths, segment):
  """One past the last token of segment `segment [N]`."""
  next_start = jnp.take_along_axis(
    scores.segment_start, jnp.minimum(segment + 1, scores.segment.shape[1] - 1)[:, None], 1
  )[:, 0]
  return jnp.where(segment + 1 < scores.num_segments, next_start, lengths)


def window_width(guard: Guard) -> int:
  """Most tokens one window rewrite replaces: {i-1, i, i+1} with token scores, else the segment."""
  return 3 if guard.use_token else guard.segment_length


def rewrite_window(
  decoder, guard, prompts, plens, chain, lengths, scores, segment, need, rng, sampling
):
  """Eq. 10 as the paper states it: resample only the window {i-1, i, i+1} around the lowest-F_tok
  token i of segment `segment [N]` (the whole segment without token scores), keeping every token on
  both sides; the segment's stop tokens stay in place and a draw that writes a stop token inside
  the window is dropped. Returns (chain, lengths, rewritten tokens [N], tried [N])."""
  stops = decoder.stop_tokens + (decoder.eos_id,)
  cut, window = _window(scores, lengths, segment, chain, need, guard.use_token, stops)
  ext = decoder.extend(prompts, plens, chain, cut, rng, window_width(guard), sampling, (-1,))
  new, rewritten, tried = _keep_window(window, need, ext.chain, chain, stops)
  return new, lengths, rewritten, tried


@functools.partial(jax.jit, static_argnames=("use_token", "stops"))
def _window(scores: ChainScores, lengths, segment, chain, need, use_token: bool, stops):
  """`rewrite_window`'s cut per row (the chain's length where not `need`) and its window mask
  `[N, C]`: the segment's tokens from the cut, at most three with token scores, stop tokens left out."""
  start = jnp.take_along_axis(scores.segment_start, segment[:, None], 1)[:, 0]
  end = _segment_end(scores, lengths, segment)
  cut = refine_cut(scores, lengths, segment, use_token)
  win_end = jnp.minimum(cut + 3, end) if use_token else end
  ids = jnp.arange(chain.shape[1])[None]
  window = (ids >= cut[:, None]) & (ids < win_end[:, None]) & ~jnp.isin(chain, jnp.asarray(stops))
  window &= need[:, None] & (ids >= start[:, None])
  return jnp.where(need, cut, lengths), window


@functools.partial(jax.jit, static_argnames=("stops",))
def _keep_window(window, need, drawn, chain, stops):
  """The drawn window where it was tried and wrote no stop token; (chain, rewritten [N], tried [N])."""
  writes_stop = jnp.any(window & jnp.isin(drawn, jnp.asarray(stops)), -1)
  tried = need & window.any(-1) & ~writes_stop
  return jnp.where(window & tried[:, None], drawn, chain), window.sum(-1), tried


def rewrite(
  decoder,
  guard,
  prompts,
  plens,
  chain,
  lengths,
  scores,
  segment,
  need,
  rng,
  sampling,
  suffix_tokens,
  suffix_stops=None,
):
  """A refinement draw of segment `segment [N]` of the `need` rows: the window rewrite
  (`guard.refine = "window"`) or, as the official code does, cut at the window start and
  resample up to `suffix_tokens` new tokens (stopping at `suffix_stops`)."""
  if guard.refine == "window":
    return rewrite_window(
      decoder, guard, prompts, plens, chain, lengths, scores, segment, need, rng, sampling
    )
  cut = jnp.where(need, refine_cut(scores, lengths, segment, guard.use_token), lengths)
  ext = decoder.extend(prompts, plens, chain, cut, rng, suffix_tokens, sampling, suffix_stops)
  return ext.chain, ext.lengths, ext.new_tokens, need


class _Beams(NamedTuple):
  chain: jax.Array  # [Q * B, C]
  lengths: jax.Array
  value: jax.Array  # the last step's mean log-prob (the code's "previous value")
  advantage: jax.Array
  done: jax.Array


@jax.jit
def _where_rows(mask, new, old):
  return jax.tree.map(
    lambda a, b: jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b), new, old
  )


def _refine_segments(
  decoder, guard, thresholds, prompts, plens, cand, scores, active, adj, rng, passes
):
  """Local refinement (Eq. 10) of the last segment of `active` rows whose F_seg lies in the refine
  band: up to `max_refine` resamples from the window start, each kept when F_seg rises."""
  chain, lengths = cand
  refine = decoding.Sampling(guard.temperature, guard.top_k, guard.refine_top_p)
  for attempt in range(guard.max_refine):
    need = active & _in_band(scores, thresholds, adj)
    if not bool(jnp.any(need)):
      break
    segment = jnp.maximum(scores.num_segments - 1, 0)
    (chain, lengths), scores, cost = _rewrite_where_it_scores_higher(
      decoder,
      guard,
      thresholds,
      (prompts, plens),
      (chain, lengths),
      scores,
      (segment, need, jax.random.fold_in(rng, attempt)),
      (refine, guard.segment_length, None),
      lambda s: _last(s.segment, s.num_segments),
    )
    passes += cost
  return (chain, lengths), scores


def _rewrite_where_it_scores_higher(
  decoder, guard, thresholds, prompt, cand, scores, target, draw, score_of
):
  """One refinement attempt, shared by the local (Eq. 10) and global iterations: rewrite segment
  `target = (segment, need, key)` (`rewrite`, drawn with `draw = (sampling, suffix_tokens,
  suffix_stops)`), rescore, and keep the rewrite on the rows where `score_of` rises. Returns the kept
  candidates, their scores and the forward passes spent per row."""
  (prompts, plens), (chain, lengths), (segment, need, key) = prompt, cand, target
  new_chain, new_lengths, rewritten, tried = rewrite(
    decoder, guard, prompts, plens, chain, lengths, scores, segment, need, key, *draw
  )
  new_scores = decoder.score(prompts, plens, new_chain, new_lengths, thresholds, guard)
  better = tried & (score_of(new_scores) > score_of(scores))
  kept = _where_rows(better, (new_chain, new_lengths), (chain, lengths))
  return kept, _where_rows(better, new_scores, scores), np.asarray(need * (2 + rewritten))


def token_guard_decode(
  decoder: Decoder,
  prompts,
  prompt_lengths,
  rng,
  guard: Guard = TOKEN_GUARD,
  thresholds=PAPER_THRESHOLDS,
  min_steps: int = 1,
) -> Decoded:
  """Token-Guard decoding of a batch of questions (module docstring); `guard = ROLLOUT_PRUNE` is
  the same scaffold without any Token-Guard score."""
  q, b, r = prompts.shape[0], guard.beams, guard.rollouts
  m = b * r
  thresholds = Thresholds(*thresholds)
  passes = np.zeros(q * m)
  sampling = decoding.Sampling(guard.temperature, guard.top_k, guard.top_p)
  cand_prompts, cand_plens = jnp.repeat(prompts, m, 0), jnp.repeat(prompt_lengths, m, 0)
  beam_prompts, beam_plens = jnp.repeat(prompts, b, 0), jnp.repeat(prompt_lengths, b, 0)
  chain, lengths = decoder.empty(q * b)
  zeros = jnp.zeros(q * b)
  beams = _Beams(chain, lengths, zeros, zeros, jnp.zeros(q * b, bool))
  adj, stopped = jnp.zeros(q), jnp.zeros(q, bool)
  first_rollout = (jnp.arange(q * m) % r) == 0
  for step in range(guard.max_steps):
    parent, active = _expand(beams, stopped, r)
    if not bool(jnp.any(active)):
      break
    key = jax.random.fold_in(rng, step)
    ext = decoder.extend(
      cand_prompts, cand_plens, parent.chain, parent.lengths, key, guard.segment_length, sampling
    )
    cand = _where_rows(active, (ext.chain, ext.lengths), (parent.chain, parent.lengths))
    passes += np.asarray(active * (1 + ext.new_tokens))
    log_prob = ext.log_prob / jnp.maximum(ext.new_tokens, 1)
    adj_rows = jnp.repeat(adj, m)
    scores = None
    if guard.scored:
      scores = decoder.score(cand_prompts, cand_plens, *cand, thresholds, guard)
      passes += np.asarray(active)
      if guard.use_segment:
        cand, scores = _refine_segments(
          decoder,
          guard,
          thresholds,
          cand_prompts,
          cand_plens,
          cand,
          scores,
          active,
          adj_rows,
          jax.random.fold_in(key, 1),
          passes,
        )
      log_prob = _segment_log_prob(scores, cand[1], jnp.maximum(scores.num_segments - 1, 0))
    valid = active | (~active & first_rollout)  # a finished or stopped beam stays, once
    keep = kept_candidates(guard, thresholds, scores, log_prob, active, valid, adj_rows, q, m)
    advantage = log_prob - parent.value
    if guard.use_global:
      advantage += guard.advantage_weight * scores.glob
    advantage = jnp.where(active, advantage, parent.advantage)
    keys = last_segment(cand[0], cand[1], decoder.stop_tokens, guard.segment_length)
    picks, share = select_beams(
      keep.reshape(q, m),
      valid.reshape(q, m),
      advantage.reshape(q, m),
      cluster_keys(guard, keys.reshape(q, m, -1), step),
      jax.random.fold_in(key, 2),
      beams=b,
    )
    beams = _next_beams(cand, picks, log_prob, advantage, parent, active, decoder.eos_id)
    if guard.use_global:
      first = jnp.arange(q) * m + picks[:, 0]
      adj = threshold_adjustment(guard, scores.fact[first], scores.logic[first])
    stopped |= (share >= guard.stop_share) & (step + 1 >= min_steps)
  return _finish(decoder, guard, thresholds, beams, beam_prompts, beam_plens, rng, passes, q)


@functools.partial(jax.jit, static_argnames=("rollouts",))
def _expand(beams: _Beams, stopped, rollouts: int):
  """Each beam repeated once per rollout, and which of them extend (unfinished, not stopped)."""
  beam_stopped = jnp.repeat(stopped, beams.chain.shape[0] // stopped.shape[0])
  parent = jax.tree.map(lambda x: jnp.repeat(x, rollouts, 0), beams)
  return parent, jnp.repeat(~beams.done & ~beam_stopped, rollouts)


@functools.partial(jax.jit, static_argnames=("eos_id",))
def _next_beams(cand, picks, log_prob, advantage, parent: _Beams, active, eos_id: int) -> _Beams:
  """The beams `select_beams` picked (`picks [Q, B]` indexes each question's candidates)."""
  chain, lengths = cand
  m = chain.shape[0] // picks.shape[0]
  rows = (jnp.arange(picks.shape[0])[:, None] * m + picks).reshape(-1)
  value = jnp.where(active, log_prob, parent.value)
  done = chain_done(chain, lengths, eos_id)
  return _Beams(chain[rows], lengths[rows], value[rows], advantage[rows], done[rows])


@functools.partial(jax.jit, static_argnames=("guard", "q", "m"))
def kept_candidates(guard, thresholds, scores, log_prob, active, valid, adj, q: int, m: int):
  """The candidates `select_beams` draws from: valid, past the width pruning and, with the segment
  level, not discarded (a new segment with F_seg < tau_low - adj)."""
  keep = valid & _width_pruned(log_prob, active, q, m, guard.sigma_rate)
  if guard.use_segment:
    f_seg = _last(scores.segment, scores.num_segments)
    keep &= ~(active & (f_seg < thresholds.tau_low - adj))
  return keep


@jax.jit
def _in_band(scores: ChainScores, thresholds: Thresholds, adj):
  f = _last(scores.segment, scores.num_segments)
  return (f >= thresholds.tau_low - adj) & (f < thresholds.tau_high + adj)


def _width_pruned(log_prob, active, q: int, m: int, sigma_rate: float):
  """The code's "low_sigma" width pruning: mean log-prob above mean - sigma_rate std of the
  question's new candidates."""
  lp, act = log_prob.reshape(q, m), active.reshape(q, m)
  n = jnp.maximum(act.sum(-1, keepdims=True), 1)
  mean = jnp.sum(lp * act, -1, keepdims=True) / n
  std = jnp.sqrt(jnp.sum(act * (lp - mean) ** 2, -1, keepdims=True) / n)
  return ((lp > mean - sigma_rate * std - 1e-6) | ~act).reshape(-1)


def _finish(decoder, guard, thresholds, beams, prompts, plens, rng, passes, q) -> Decoded:
  """Completes unfinished beams, picks the answer from the largest answer cluster, then the global
  iteration and the abstention fallback."""
  b = guard.beams
  open_rows = ~beams.done
  sampling = decoding.Sampling(guard.temperature, guard.top_k, guard.top_p)
  beam_passes = np.zeros(q * b)
  ext = decoder.extend(
    prompts,
    plens,
    beams.chain,
    beams.lengths,
    jax.random.fold_in(rng, 10_000),
    decoder.width,
    sampling,
    (decoder.eos_id,),
  )
  chain, lengths = _where_rows(open_rows, (ext.chain, ext.lengths), (beams.chain, beams.lengths))
  beam_passes += np.asarray(open_rows * (1 + ext.new_tokens))
  advantage = jnp.where(
    open_rows, ext.log_prob / jnp.maximum(ext.new_tokens, 1) - beams.value, beams.advantage
  )
  keys = last_segment(chain, lengths, decoder.stop_tokens, guard.segment_length).reshape(q, b, -1)
  share = cluster_shares(cluster_keys(guard, keys), jnp.ones((q, b), bool))
  best = jnp.argmax(share * 1e6 + advantage.reshape(q, b), axis=-1)
  rows = jnp.arange(q) * b + best
  chain, lengths = chain[rows], lengths[rows]
  abstain = jnp.zeros(q, bool)
  beam_passes = np.asarray(beam_passes).reshape(q, b).sum(-1)
  if guard.use_global:
    chain, lengths, abstain, beam_passes = _global_iteration(
      decoder, guard, thresholds, prompts[::b], plens[::b], chain, lengths, rng, beam_passes
    )
  total = _per_question(passes, b * guard.rollouts) + beam_passes
  return Decoded(np.asarray(chain), np.asarray(lengths), np.asarray(abstain), total)


def _global_iteration(decoder, guard, thresholds, prompts, plens, chain, lengths, rng, passes):
  """While F_global < tau_global (at most `global_iterations` times): refine the worst segment at
  its lowest-token window and resample the rest of the chain; kept when F_global rises. Then the
  abstention fallback: F_fact and F_logic both below tau_abstain."""
  scores = decoder.score(prompts, plens, chain, lengths, thresholds, guard)
  passes = passes + 1
  sampling = decoding.Sampling(guard.temperature, guard.top_k, guard.refine_top_p)
  for attempt in range(guard.global_iterations):
    need = scores.glob < thresholds.tau_global
    if not bool(jnp.any(need)):
      break
    masked = jnp.where(scores.segment_valid, scores.segment, jnp.inf)
    worst = jnp.argmin(masked, axis=1).astype(jnp.int32)
    (chain, lengths), scores, cost = _rewrite_where_it_scores_higher(
      decoder,
      guard,
      thresholds,
      (prompts, plens),
      (chain, lengths),
      scores,
      (worst, need, jax.random.fold_in(rng, 20_000 + attempt)),
      (sampling, decoder.width, (decoder.eos_id,)),
      lambda s: s.glob,
    )
    passes = passes + cost
  abstain = (scores.fact < thresholds.tau_abstain) & (scores.logic < thresholds.tau_abstain)
  return chain, lengths, abstain, passes
