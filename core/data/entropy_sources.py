"""Quantized images of known entropy, to check that a likelihood bound is a bound.

Two sources of square images on the integer grid 0..K-1, with their exact entropy in bits per
dimension and the exact `-log2 p(x) / D` of every image:

* `iid_levels`: every pixel i.i.d. with `p_k ∝ exp(-(k - (K-1)/2)^2 / (2 std^2))`, a discretised
  Gaussian over the levels. Entropy `H(p)` per dimension.
* `markov_levels`: a stationary Markov chain along the snake (boustrophedon) scan of the image, so
  consecutive pixels of the chain are neighbours in the image. Transition
  `P(j | i) = stay 1[j = i] + (1 - stay) Q(j | i)`, `Q(j | i) ∝ exp(-(j - i)^2 / (2 std^2))`, the
  first pixel drawn from the stationary distribution `pi`. Entropy per dimension
  `(H(pi) + (D - 1) sum_i pi_i H(P(. | i))) / D`.

Flat vectors are in chain order (position `d` of the vector is the `d`-th pixel of the snake scan);
`chain_to_images` puts them back on the square. A valid likelihood bound `B(x)` satisfies
`E[B(x)] >= H` for data from the source (cross-entropy >= entropy), so `mean(B(x_i) + log2 p(x_i))`
over a test sample estimates the bound's excess over the entropy, with a paired standard error.
Everything here is numpy in float64; the sources are pure functions of their arguments and seed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

NAMES = ("iid_levels", "markov_levels")


def discretised_gaussian(num_levels: int, std: float, mean: float | None = None) -> np.ndarray:
  """`p_k ∝ exp(-(k - mean)^2 / (2 std^2))` over `k = 0..K-1` (mean: the middle level)."""
  mean = (num_levels - 1) / 2 if mean is None else mean
  logits = -np.square(np.arange(num_levels) - mean) / (2.0 * std**2)
  probs = np.exp(logits - logits.max())
  return probs / probs.sum()


def sticky_transition(num_levels: int, stay: float, std: float) -> np.ndarray:
  """`P[i, j] = stay 1[i = j] + (1 - stay) Q(j | i)`, rows of `Q` discretised Gaussians around `i`."""
  rows = np.stack([discretised_gaussian(num_levels, std, i) for i in range(num_levels)])
  return stay * np.eye(num_levels) + (1.0 - stay) * rows


def stationary_distribution(transition: np.ndarray) -> np.ndarray:
  """`pi` with `pi P = pi`: the left eigenvector of eigenvalue 1, normalised."""
  values, vectors = np.linalg.eig(transition.T)
  pi = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
  return pi / pi.sum()


def entropy_bits(probs: np.ndarray) -> float:
  """`-sum p log2 p` (0 log 0 = 0)."""
  p = probs[probs > 0]
  return float(-np.sum(p * np.log2(p)))


def snake_order(side: int) -> np.ndarray:
  """Raster indices of a `side x side` image in boustrophedon order (odd rows reversed)."""
  grid = np.arange(side * side).reshape(side, side)
  grid[1::2] = grid[1::2, ::-1]
  return grid.reshape(-1)


def chain_to_images(flat: np.ndarray, side: int) -> np.ndarray:
  """`(N, D)` vectors in chain order -> `(N, side, side)` images."""
  images = np.empty_like(flat)
  images[:, snake_order(side)] = flat
  return images.reshape(len(flat), side, side)


@dataclasses.dataclass(frozen=True)
class KnownEntropySource:
  """A source over `K` levels and `D = side^2` pixels: `initial` is the law of the first chain pixel,
  `transition[i, j]` that of the next pixel given the previous one (i.i.d.: every row is `initial`)."""

  name: str
  side: int
  initial: np.ndarray
  transition: np.ndarray

  @property
  def num_levels(self) -> int:
    return len(self.initial)

  @property
  def dim(self) -> int:
    return self.side * self.side

  @property
  def entropy_bits_per_dim(self) -> float:
    """`(H(X_1) + (D - 1) H(X_2 | X_1)) / D`, exact for a chain started at its stationary law."""
    rate = float(np.dot(self.initial, [entropy_bits(row) for row in self.transition]))
    return (entropy_bits(self.initial) + (self.dim - 1) * rate) / self.dim

  def sample(self, count: int, seed) -> np.ndarray:
    """`(count, D)` int32 vectors in chain order, a pure function of `seed`."""
    rng = np.random.default_rng(seed)
    uniforms = rng.random((count, self.dim))
    cumulative = np.cumsum(self.transition, axis=1)
    out = np.empty((count, self.dim), np.int32)
    out[:, 0] = _inverse_cdf(np.cumsum(self.initial)[None], uniforms[:, 0])
    for d in range(1, self.dim):
      out[:, d] = _inverse_cdf(cumulative[out[:, d - 1]], uniforms[:, d])
    return out

  def nll_bits_per_dim(self, x: np.ndarray) -> np.ndarray:
    """Exact `-log2 p(x) / D` per vector of `x` `(N, D)` in chain order (levels as integers)."""
    k = np.asarray(np.rint(x), np.int64)
    if k.ndim != 2 or k.shape[1] != self.dim or k.min() < 0 or k.max() >= self.num_levels:
      raise ValueError(f"x: need (N, {self.dim}) levels in 0..{self.num_levels - 1}, got {x.shape}")
    log_p = np.log2(self.initial[k[:, 0]]) + np.log2(self.transition[k[:, :-1], k[:, 1:]]).sum(1)
    return -log_p / self.dim


def _inverse_cdf(cumulative: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
  """Index of the first cumulative probability above each uniform (rows of `cumulative` per draw)."""
  return np.minimum((uniforms[:, None] >= cumulative).sum(1), cumulative.shape[1] - 1)


def make_source(
  name: str, num_levels: int, side: int, level_std: float, stay: float = 0.0
) -> KnownEntropySource:
  """`iid_levels` (`level_std`: std of the level distribution) or `markov_levels` (`stay`, and
  `level_std` as the std of the jump kernel `Q`)."""
  if name == "iid_levels":
    probs = discretised_gaussian(num_levels, level_std)
    return KnownEntropySource(name, side, probs, np.tile(probs, (num_levels, 1)))
  if name == "markov_levels":
    transition = sticky_transition(num_levels, stay, level_std)
    return KnownEntropySource(name, side, stationary_distribution(transition), transition)
  raise ValueError(f"unknown known-entropy source {name!r}; known: {', '.join(NAMES)}")
