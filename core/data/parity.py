"""Parity languages for "Diffusion Language Models are Provably Optimal Parallel Samplers" (Jiang,
Haghtalab, Chen; ICLR 2026).

* The uniform even-parity distribution `D_n^xor = Unif{x in {0,1}^n : x_1 xor ... xor x_n = 0}` of the
  paper's separation (Sec. 4, Thms 4.1, 4.2, 4.5): `sample_even_parity`, `even_parity_strings`, and
  `even_parity_tv`, the total-variation distance of samples to it by enumeration of all `2^n`
  strings (small n).
* The parity-code language of the learned-model experiment: `L` positions split by a fixed random
  permutation into `L / g` check groups of `g` positions; a codeword is uniform over the strings whose
  every group has even parity (`2^(L - L/g)` codewords, entropy `(g - 1) / g` bits per token). A
  sampler that reveals the last two unknown bits of a group in the same round with independent
  coins violates that check with probability 1/2: the language measures exactly the failure of
  parallel, factorised decoding that remasking and revision repair. `ParityCode` holds the groups;
  `check_satisfied`, `validity`, `pattern_tv` and `unique_fraction` score samples.

Tokens are ints: 0 and 1 are the bits; any other value (the mask token of a sampler) fails every
check it touches. Everything here is a pure function of its arguments and seeds.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from core.data import batching

# ---------------------------------------------------------------------------------------------------
# D_n^xor, the uniform even-parity distribution
# ---------------------------------------------------------------------------------------------------


def sample_even_parity(rng: np.random.Generator, n: int, num: int) -> np.ndarray:
  """`num` exact draws of `D_n^xor`: `n - 1` fair bits and their parity, int32 `[num, n]`."""
  free = rng.integers(0, 2, (num, n - 1), dtype=np.int32)
  return np.concatenate([free, free.sum(1, keepdims=True) % 2], axis=1).astype(np.int32)


def even_parity_strings(n: int) -> np.ndarray:
  """All `2^(n-1)` strings of `D_n^xor`'s support, int32 `[2^(n-1), n]`, in increasing binary order."""
  codes = np.arange(2**n)
  bits = (codes[:, None] >> np.arange(n - 1, -1, -1)) & 1
  return bits[bits.sum(1) % 2 == 0].astype(np.int32)


def string_codes(x) -> jnp.ndarray:
  """Binary strings `[..., n]` as ints (first position = most significant bit)."""
  n = x.shape[-1]
  return jnp.sum(jnp.asarray(x, jnp.int32) << jnp.arange(n - 1, -1, -1), axis=-1)


def parity_violation(x) -> jnp.ndarray:
  """1.0 where a string `[..., n]` has odd parity or holds a non-bit token, else 0.0."""
  x = jnp.asarray(x)
  is_bits = jnp.all((x == 0) | (x == 1), axis=-1)
  return jnp.where(is_bits, jnp.sum(x, axis=-1) % 2 == 1, True).astype(jnp.float32)


def even_parity_tv(samples) -> jnp.ndarray:
  """Total variation between the empirical law of `samples [N, n]` (bits) and `D_n^xor`, over all
  `2^n` strings (odd strings have target mass 0): `1/2 sum_x |p_hat(x) - p(x)|`. For n <= ~16."""
  n = samples.shape[-1]
  counts = jnp.bincount(string_codes(samples), length=2**n)
  empirical = counts / samples.shape[0]
  target = jnp.asarray(np.bincount(string_codes_np(even_parity_strings(n)), minlength=2**n))
  return 0.5 * jnp.sum(jnp.abs(empirical - target / target.sum()))


def string_codes_np(x: np.ndarray) -> np.ndarray:
  n = x.shape[-1]
  return np.sum(np.asarray(x, np.int64) << np.arange(n - 1, -1, -1), axis=-1)


# ---------------------------------------------------------------------------------------------------
# The parity-code language
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ParityCode:
  """`groups int32 [G, g]`: the positions of each check group (a partition of `0..L-1`)."""

  groups: np.ndarray

  @property
  def length(self) -> int:
    return int(self.groups.size)

  @property
  def group_size(self) -> int:
    return int(self.groups.shape[1])

  @property
  def num_groups(self) -> int:
    return int(self.groups.shape[0])

  @property
  def entropy_bits_per_token(self) -> float:
    """The language's exact entropy rate: `(g - 1)` free bits per group of `g` tokens."""
    return (self.group_size - 1) / self.group_size

  def group_ids(self) -> np.ndarray:
    """int32 `[L]`: the check group of each position (the "constraint blocks" of a sampler)."""
    ids = np.empty(self.length, np.int32)
    ids[self.groups.reshape(-1)] = np.repeat(np.arange(self.num_groups), self.group_size)
    return ids

  def sample(self, rng: np.random.Generator, num: int) -> np.ndarray:
    """`num` uniform codewords, int32 `[num, L]`: each group's first `g - 1` members fair bits, the
    last their parity (uniform over the group's even patterns, groups independent)."""
    free = rng.integers(0, 2, (num, self.num_groups, self.group_size - 1), dtype=np.int32)
    blocks = np.concatenate([free, free.sum(-1, keepdims=True) % 2], axis=-1)
    out = np.empty((num, self.length), np.int32)
    out[:, self.groups.reshape(-1)] = blocks.reshape(num, -1)
    return out

  def batches(self, batch_size: int, seed: int) -> batching.GeneratedBatches:
    """Training batches `{"tokens": int32 [B, L]}`, the batch of step `s` drawn from `(seed, s)`."""

    def generate(step: int) -> dict[str, np.ndarray]:
      return {"tokens": self.sample(np.random.default_rng([seed, step]), batch_size)}

    return batching.GeneratedBatches(generate, batch_size)


def parity_code(length: int, group_size: int, seed: int) -> ParityCode:
  """Check groups from a fixed random permutation of `0..length-1` drawn from `seed`."""
  if length % group_size:
    raise ValueError(f"parity_code: group_size {group_size} must divide length {length}")
  order = np.random.default_rng(seed).permutation(length).astype(np.int32)
  return ParityCode(np.sort(order.reshape(-1, group_size), axis=1))


def check_satisfied(tokens, groups: np.ndarray) -> jnp.ndarray:
  """bool `[B, G]`: group `j` holds only bits and has even parity."""
  members = jnp.asarray(tokens)[:, jnp.asarray(groups)]  # [B, G, g]
  is_bits = jnp.all((members == 0) | (members == 1), axis=-1)
  return is_bits & (jnp.sum(members, axis=-1) % 2 == 0)


def validity(tokens, groups: np.ndarray) -> jnp.ndarray:
  """float32 `[B]`: 1 where every check holds (the sample is a codeword)."""
  return jnp.all(check_satisfied(tokens, groups), axis=-1).astype(jnp.float32)


def pattern_tv(tokens, groups: np.ndarray) -> jnp.ndarray:
  """Fidelity: for each group, the TV distance between the law of its pattern among the samples
  whose check holds and the uniform law over the `2^(g-1)` even patterns; the mean over groups.
  Validity and fidelity are thus separate: a sampler can be valid yet biased, or the reverse."""
  members = jnp.asarray(tokens)[:, jnp.asarray(groups)]  # [B, G, g]
  g = members.shape[-1]
  ok = check_satisfied(tokens, groups)  # [B, G]
  codes = jnp.sum(jnp.clip(members, 0, 1) << jnp.arange(g - 1, -1, -1), axis=-1)  # [B, G]
  one_hot = (codes[..., None] == jnp.arange(2**g)) & ok[..., None]  # [B, G, 2^g]
  counts = one_hot.sum(0).astype(jnp.float32)  # [G, 2^g]
  freq = counts / jnp.maximum(counts.sum(-1, keepdims=True), 1.0)
  even = np.array([bin(c).count("1") % 2 == 0 for c in range(2**g)], np.float32)
  return jnp.mean(0.5 * jnp.sum(jnp.abs(freq - even / even.sum()), axis=-1))


def pattern_tv_noise_floor(code: ParityCode, num: int, seed: int) -> float:
  """`pattern_tv` of `num` exact codewords: what a perfect sampler scores at this sample size."""
  return float(pattern_tv(code.sample(np.random.default_rng(seed), num), code.groups))


def unique_fraction(tokens) -> float:
  """Diversity: distinct rows of `tokens [B, L]` over B."""
  tokens = np.asarray(tokens)
  return len(np.unique(tokens, axis=0)) / len(tokens)


def bayes_denoiser_probs(tokens, groups: np.ndarray, suspect_confidence: float | None = None):
  """The exact denoiser of the parity code, float32 `[B, L, 2]`: a masked bit is the parity of its
  group when it is the group's only masked member, else a fair coin; a revealed bit has confidence
  `suspect_confidence` when its fully revealed group is odd, else 1. The default `(g - 1) / g` is
  the posterior under rare single corruptions (one of the g bits flipped, each equally likely). The
  perfect model that a trained denoiser approaches; samplers are checked against it."""
  if suspect_confidence is None:
    suspect_confidence = (groups.shape[1] - 1) / groups.shape[1]
  tokens = jnp.asarray(tokens)
  groups_j = jnp.asarray(groups)
  members = tokens[:, groups_j]  # [B, G, g]
  masked = (members != 0) & (members != 1)
  revealed_parity = jnp.sum(jnp.where(masked, 0, members), axis=-1, keepdims=True) % 2
  only_masked = jnp.sum(masked, axis=-1, keepdims=True) == 1
  p_one = jnp.where(only_masked, revealed_parity.astype(jnp.float32), 0.5)
  odd_full = ~jnp.any(masked, axis=-1, keepdims=True) & (revealed_parity == 1)
  keep = jnp.where(odd_full, suspect_confidence, 1.0)
  p_one = jnp.where(masked, p_one, jnp.where(members == 1, keep, 1.0 - keep))
  out = jnp.zeros(tokens.shape, jnp.float32).at[:, groups_j].set(p_one)
  return jnp.stack([1.0 - out, out], axis=-1)
