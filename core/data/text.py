"""Multi-source Markov-chain text: a generated corpus whose best possible perplexity is known exactly.

Each source `s` is a first-order Markov chain over `V` symbols with transition matrix
`P_s = softmax_rows(beta_s * G_s)`, `G_s ~ N(0, 1)` drawn from `(seed, s)`; `beta_s` is found by
bisection so that the chain's entropy rate

  H_s = -sum_i pi_s(i) sum_j P_s(i, j) log P_s(i, j)        (pi_s: the stationary distribution)

equals `entropy_fractions[s] * log V` (0 = deterministic, 1 = uniform). A sequence picks a source
`s ~ weights`, draws `x_1 ~ pi_s` (so every position is stationary) and `x_{t+1} ~ P_s(x_t, .)`.
FastMix reads the sources as its data domains.

Best possible losses:
  * `mixture_log_likelihood(x)`: `log sum_s w_s pi_s(x_1) prod_t P_s(x_t, x_{t+1})`, the exact
    log-likelihood under the generating process. Its mean over sequences, per token, is the loss of
    the Bayes-optimal predictor that knows the chains but not which one wrote the sequence: the
    best any model can do on those tokens.
  * `entropy_rate(P)`: per-token loss of a predictor that also knows the source, `sum_s w_s H_s`, a
    lower bound that the Bayes loss approaches on long sequences of distinguishable sources.

Data-mixture search (FastMix, "Fast Data Mixture Optimization via Gradient Descent", ICLR 2026)
reads the sources as its data domains. `mixture_search_sources` builds a search with a known answer:
relevant chains, a uniform "noise" chain, an "adversarial" copy of the first chain with permuted
next-symbol columns, and an "irrelevant" chain; the target is a mixture `w*` of the relevant ones.
Its provably best training mixture is `w*`: a model trained on sources mixed by `alpha` converges
to the predictor of the `alpha`-mixture, and its loss on `w*`-data is the cross-entropy
`H(p_w*, p_alpha) = H(p_w*) + KL(p_w* || p_alpha)`, smallest exactly at `alpha = w*` (Gibbs) for
linearly independent chains. Both the full-context model (`-log sum_s alpha_s p_s(x)`, i.e.
`with_weights(alpha).mixture_log_likelihood`) and the context-1 (bigram) model
(`bigram_cross_entropy`, exact, no sampling) have that optimum.

`MarkovText` is a resumable data source (`core/data/batching.py`): the batch of step `n` is drawn
from `(seed, split, n)` and holds `tokens int32 [B, L + 1]` = `<bos>`, then the symbols shifted by
`token_offset` (the tokenizer's special tokens come first), and `source int32 [B]`; with
`stratified`, every source fills `B / S` consecutive rows (uniform per-source sampling, the
sources in order). Symbol `i` reads as the pseudo-word `symbol_words(V)[i]`, so a
`WordTokenizer(symbol_words(V))` maps text to the same ids.

Tokenised domains on disk (a paper-scale mixture search): `token_file` names
`<data_dir>/<split>/<domain>.npy` (1-D token ids), `load_tokens` memory-maps one, `token_windows`
draws random windows of it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np

from core.data import batching, tokenizers

_SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")


def symbol_words(vocab_size: int) -> list[str]:
  """Distinct pseudo-words for symbols `0..vocab_size-1` ("ba", "be", ..., then two syllables)."""
  n = len(_SYLLABLES)
  if vocab_size > n * (n + 1):
    raise ValueError(f"symbol_words: at most {n * (n + 1)} symbols, got {vocab_size}")
  return [
    _SYLLABLES[i] if i < n else _SYLLABLES[i // n - 1] + _SYLLABLES[i % n]
    for i in range(vocab_size)
  ]


def stationary_distribution(transition: np.ndarray) -> np.ndarray:
  """`pi` with `pi P = pi`, `sum pi = 1` (the eigenvector of P^T for eigenvalue 1)."""
  values, vectors = np.linalg.eig(transition.T)
  pi = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
  return pi / pi.sum()


def entropy_rate(transition: np.ndarray) -> float:
  """`-sum_i pi_i sum_j P_ij log P_ij` in nats per symbol."""
  pi = stationary_distribution(transition)
  with np.errstate(divide="ignore", invalid="ignore"):
    row_entropy = -np.sum(np.where(transition > 0, transition * np.log(transition), 0.0), axis=1)
  return float(pi @ row_entropy)


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
  z = np.exp(logits - logits.max(axis=1, keepdims=True))
  return z / z.sum(axis=1, keepdims=True)


def chain_with_entropy(
  vocab_size: int, entropy_fraction: float, seed: int, source: int
) -> np.ndarray:
  """A `[V, V]` transition matrix `softmax(beta G)` whose entropy rate is `fraction * log V`."""
  if not 0.0 < entropy_fraction < 1.0:
    raise ValueError(f"entropy_fraction must be in (0, 1), got {entropy_fraction}")
  gaussian = np.random.default_rng([seed, source]).standard_normal((vocab_size, vocab_size))
  target = entropy_fraction * math.log(vocab_size)
  low, high = 0.0, 1.0
  while entropy_rate(_softmax_rows(high * gaussian)) > target:
    low, high = high, 2 * high
  for _ in range(60):
    beta = 0.5 * (low + high)
    low, high = (
      (beta, high) if entropy_rate(_softmax_rows(beta * gaussian)) > target else (low, beta)
    )
  return _softmax_rows(0.5 * (low + high) * gaussian)


def uniform_chain(vocab_size: int) -> np.ndarray:
  """The `[V, V]` chain of i.i.d. uniform symbols (entropy rate `log V`): pure noise."""
  return np.full((vocab_size, vocab_size), 1.0 / vocab_size)


def permuted_chain(transition: np.ndarray, seed: int) -> np.ndarray:
  """`transition` with its next-symbol columns permuted (same entropy rate, wrong successors)."""
  order = np.random.default_rng([seed, 7919]).permutation(transition.shape[-1])
  return transition[:, order]


@dataclasses.dataclass(frozen=True)
class MarkovSources:
  """The chains, their mixture weights and their exact statistics."""

  transitions: np.ndarray  # [S, V, V]
  weights: np.ndarray  # [S]

  @functools.cached_property
  def stationary(self) -> np.ndarray:  # [S, V]
    return np.stack([stationary_distribution(p) for p in self.transitions])

  @functools.cached_property
  def entropy_rates(self) -> np.ndarray:  # [S] nats per symbol
    return np.array([entropy_rate(p) for p in self.transitions])

  @property
  def mixture_entropy_rate(self) -> float:
    return float(self.weights @ self.entropy_rates)

  @property
  def num_sources(self) -> int:
    return len(self.weights)

  @property
  def vocab_size(self) -> int:
    return self.transitions.shape[-1]

  def with_weights(self, weights: Sequence[float]) -> MarkovSources:
    """The same chains mixed by `weights` (normalised)."""
    weights = np.asarray(weights, np.float64)
    if weights.shape != (self.num_sources,) or np.any(weights < 0) or weights.sum() <= 0:
      raise ValueError(f"weights must be {self.num_sources} non-negative numbers, got {weights}")
    mixed = dataclasses.replace(self, weights=weights / weights.sum())
    for name in ("stationary", "entropy_rates", "_cdfs"):  # the chains' statistics carry over
      if name in self.__dict__:
        mixed.__dict__[name] = self.__dict__[name]
    return mixed

  @functools.cached_property
  def _cdfs(self) -> tuple[np.ndarray, np.ndarray]:
    return np.cumsum(self.stationary, axis=1), np.cumsum(self.transitions, axis=2)

  def sample(
    self, rng: np.random.Generator, batch: int, length: int, source: np.ndarray | None = None
  ) -> tuple[np.ndarray, np.ndarray]:
    """`(symbols int32 [batch, length], source int32 [batch])`; the sources are drawn from the
    weights unless given (`source [batch]`)."""
    if source is None:
      source = rng.choice(self.num_sources, size=batch, p=self.weights)
    source = np.asarray(source)
    uniforms = rng.random((batch, length))
    first_cdf, step_cdf = self._cdfs
    first_cdf = first_cdf[source]
    symbols = np.empty((batch, length), np.int32)
    last = self.vocab_size - 1
    symbols[:, 0] = np.minimum((first_cdf < uniforms[:, :1]).sum(1), last)
    for t in range(1, length):
      cdf = step_cdf[source, symbols[:, t - 1]]
      symbols[:, t] = np.minimum((cdf < uniforms[:, t : t + 1]).sum(1), last)
    return symbols, source.astype(np.int32)

  def log_likelihoods(self, symbols: np.ndarray) -> np.ndarray:
    """`[S, N]`: `log pi_s(x_1) + sum_t log P_s(x_t, x_{t+1})` of each sequence under each chain."""
    symbols = np.asarray(symbols)
    first = np.log(self.stationary[:, symbols[:, 0]])
    steps = np.log(self.transitions[:, symbols[:, :-1], symbols[:, 1:]]).sum(-1)
    return first + steps

  def mixture_log_likelihood(self, symbols: np.ndarray) -> np.ndarray:
    """`[N]`: `log sum_s w_s p_s(x)`, the exact log-likelihood of each sequence."""
    with np.errstate(divide="ignore"):
      joint = self.log_likelihoods(symbols) + np.log(self.weights)[:, None]
    peak = joint.max(0)
    return peak + np.log(np.exp(joint - peak).sum(0))

  def bigram_predictor(self) -> tuple[np.ndarray, np.ndarray]:
    """The best context-1 predictor of the mixture: `(first [V], next [V, V])` with
    `first = sum_s w_s pi_s` and `next(y | x) = sum_s w_s pi_s(x) P_s(x, y) / sum_s w_s pi_s(x)`
    (every position is stationary, so `x_t` has marginal `pi_s` under source `s`)."""
    first = self.weights @ self.stationary
    joint = np.einsum("s,sx,sxy->xy", self.weights, self.stationary, self.transitions)
    return first, joint / first[:, None]


def markov_sources(
  vocab_size: int,
  entropy_fractions: Sequence[float],
  weights: Sequence[float] = (),
  seed: int = 0,
) -> MarkovSources:
  """One chain per entry of `entropy_fractions`, mixed by `weights` (default uniform)."""
  count = len(entropy_fractions)
  weights = np.full(count, 1.0 / count) if len(weights) == 0 else np.asarray(weights, np.float64)
  if weights.shape != (count,) or np.any(weights < 0) or weights.sum() <= 0:
    raise ValueError(f"weights must be {count} non-negative numbers, got {weights.tolist()}")
  transitions = np.stack(
    [chain_with_entropy(vocab_size, f, seed, s) for s, f in enumerate(entropy_fractions)]
  )
  return MarkovSources(transitions, weights / weights.sum())


def bigram_cross_entropy(
  sources: MarkovSources, model_weights: Sequence[float], length: int
) -> float:
  """Per-symbol loss, on sequences of `length` symbols from `sources` (mixed by `sources.weights`),
  of the best context-1 model of the `model_weights`-mixture (`bigram_predictor`): exact, nats.

  `(H(q, q_a) + (length - 1) sum_x q(x) H(P_q(.|x), P_a(.|x))) / length`, with `q` the target's
  stationary marginal and `P_q` its conditional; smallest exactly at `model_weights = weights`.
  """
  target_first, target_next = sources.bigram_predictor()
  model_first, model_next = sources.with_weights(model_weights).bigram_predictor()
  first = -np.sum(target_first * np.log(model_first))
  rest = -np.sum(target_first[:, None] * target_next * np.log(model_next))
  return float((first + (length - 1) * rest) / length)


MIXTURE_SEARCH_ROLES = ("relevant", "noise", "adversarial", "irrelevant")


def mixture_search_sources(
  vocab_size: int,
  relevant_fractions: Sequence[float] = (0.3, 0.4, 0.5),
  irrelevant_fraction: float = 0.5,
  seed: int = 0,
) -> tuple[MarkovSources, tuple[str, ...]]:
  """The data domains of a mixture search, uniformly weighted, and their names.

  One chain per entry of `relevant_fractions` (entropy rate `f log V`), then "noise" (uniform
  symbols), "adversarial" (the first chain with permuted successors) and "irrelevant" (another
  chain at `irrelevant_fraction`). A target mixes the relevant chains only.
  """
  relevant = [chain_with_entropy(vocab_size, f, seed, s) for s, f in enumerate(relevant_fractions)]
  irrelevant = chain_with_entropy(vocab_size, irrelevant_fraction, seed, len(relevant))
  chains = relevant + [uniform_chain(vocab_size), permuted_chain(relevant[0], seed), irrelevant]
  names = tuple(f"relevant_{s}" for s in range(len(relevant))) + MIXTURE_SEARCH_ROLES[1:]
  return MarkovSources(np.stack(chains), np.full(len(chains), 1.0 / len(chains))), names


@dataclasses.dataclass(frozen=True)
class MarkovText:
  """Batches of `{"tokens": [B, L + 1], "source": [B]}` as a pure function of the step."""

  sources: MarkovSources
  length: int  # symbols per sequence (the model predicts all of them after <bos>)
  global_batch_size: int
  seed: int
  split: int = 0  # 0 train, 1 validation: disjoint random streams
  token_offset: int = len(tokenizers.SPECIAL_TOKENS)
  bos_id: int = tokenizers.BOS_ID
  stratified: bool = False  # B / S rows of every source, in order, instead of sources ~ weights

  def __post_init__(self):
    if self.stratified and self.global_batch_size % self.sources.num_sources:
      raise ValueError(
        f"stratified batches need a batch size divisible by the {self.sources.num_sources} "
        f"sources, got {self.global_batch_size}"
      )

  def generate(self, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, self.split, step])
    source = None
    if self.stratified:
      rows = self.global_batch_size // self.sources.num_sources
      source = np.repeat(np.arange(self.sources.num_sources), rows)
    symbols, source = self.sources.sample(rng, self.global_batch_size, self.length, source)
    bos = np.full((self.global_batch_size, 1), self.bos_id, np.int32)
    return {"tokens": np.concatenate([bos, symbols + self.token_offset], axis=1), "source": source}

  def batch(
    self, step: int, process_index: int = 0, process_count: int = 1
  ) -> dict[str, np.ndarray]:
    return batching.GeneratedBatches(self.generate, self.global_batch_size).batch(
      step, process_index, process_count
    )

  def symbols(self, tokens: np.ndarray) -> np.ndarray:
    """The chain symbols of `tokens` (drops `<bos>`, removes the offset)."""
    return np.asarray(tokens)[:, 1:] - self.token_offset


# ---------------------------------------------------------------------------------------------------
# Tokenised domains on disk (paper-scale mixture search)
# ---------------------------------------------------------------------------------------------------


def token_file(data_dir: str, split: str, domain: str) -> str:
  """`<data_dir>/<split>/<domain>.npy`: one domain's token ids, a 1-D integer array."""
  import os

  return os.path.join(data_dir, split, f"{domain}.npy")


def load_tokens(path: str) -> np.ndarray:
  """A domain's token ids, memory-mapped (never read whole)."""
  tokens = np.load(path, mmap_mode="r")
  if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f"{path}: expected a 1-D integer array of token ids, got {tokens.dtype}")
  return tokens


def token_windows(
  tokens: np.ndarray, length: int, count: int, rng: np.random.Generator, bos_id: int | None = None
) -> np.ndarray:
  """`int32 [count, length + 1]` random windows of `tokens` (with `bos_id`, a `<bos>` and `length`
  tokens)."""
  width = length if bos_id is not None else length + 1
  if len(tokens) <= width:
    raise ValueError(f"a domain of {len(tokens)} tokens is shorter than a window of {width}")
  starts = rng.integers(0, len(tokens) - width, count)
  windows = np.stack([np.asarray(tokens[s : s + width]) for s in starts]).astype(np.int32)
  if bos_id is None:
    return windows
  return np.concatenate([np.full((count, 1), bos_id, np.int32), windows], axis=1)
