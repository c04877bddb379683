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

`MarkovText` is a resumable data source (`core/data/batching.py`): the batch of step `n` is drawn
from `(seed, split, n)` and holds `tokens int32 [B, L + 1]` = `<bos>`, then the symbols shifted by
`token_offset` (the tokenizer's special tokens come first), and `source int32 [B]`. Symbol `i` reads
as the pseudo-word `symbol_words(V)[i]`, so a `WordTokenizer(symbol_words(V))` maps text to the same
ids.
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

  def sample(
    self, rng: np.random.Generator, batch: int, length: int
  ) -> tuple[np.ndarray, np.ndarray]:
    """`(symbols int32 [batch, length], source int32 [batch])`."""
    source = rng.choice(self.num_sources, size=batch, p=self.weights)
    uniforms = rng.random((batch, length))
    first_cdf = np.cumsum(self.stationary, axis=1)[source]
    step_cdf = np.cumsum(self.transitions, axis=2)
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
    joint = self.log_likelihoods(symbols) + np.log(self.weights)[:, None]
    peak = joint.max(0)
    return peak + np.log(np.exp(joint - peak).sum(0))


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

  def generate(self, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, self.split, step])
    symbols, source = self.sources.sample(rng, self.global_batch_size, self.length)
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
