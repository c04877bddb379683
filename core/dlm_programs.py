"""Exact DLM programs: the constructions behind "Diffusion Language Models are Provably Optimal
Parallel Samplers" (Jiang, Haghtalab, Chen; ICLR 2026), run as diffusion decoders.

A program is the paper's DLM (Sec. 2) written out by hand: a state `x in {0, 1, M}^L` (M = `MASK`),
starting all-mask, and per round a *factorised* transition: position i's next value is drawn from its
own distribution `P_i(. | x_t, round)` over `{0, 1, M}`, independently of the other positions. That
one form covers the unmasking rule F and the predictor p (M -> bit), remasking G (bit -> M) and
revision (bit -> other bit); `Program.kind` says which of them a program may use, and `run`
counts every remask and revision so tests can hold each program to its class. Transitions are
time-conditioned (they see the round index, as a DLM sees t) and read a few fixed positions each
(bounded fan-in: NC0-like predictors).

Separation on `D_n^xor` (uniform even-parity strings, Sec. 4):
  revision_parity      Thm 4.1, instantiated with Viola's NC0 construction: round 1 reveals iid fair
                       bits U, round 2 revises x_i <- U_i xor U_{i+1 mod n}. U -> x is linear with
                       kernel {0^n, 1^n} and image the even strings, so x is exactly uniform: 2 rounds
                       for every n.
  remasking_parity     Thm 4.2's two-phase pair construction (6 rounds for every even n): sample the
                       pair parities c_j = U_j xor U_{j+1 mod n/2} (uniform over even c by the same
                       argument), store c_j in the mask pattern of pair j ("M c"), then expand each
                       pair uniformly under its parity ("M0" -> 00/11, "M1" -> 01/10) by
                       remask-and-rewrite.
  monotone_chain_parity  an exact *monotone* sampler that needs n/2 + 1 rounds: pair k reveals its
                       first bit in round k at the slot (left/right) equal to the parity of pairs
                       0..k-2, which it reads from pair k-1's slot and pair k-2's bits; the mask
                       pattern carries the running parity down the chain and the last bit closes it.
  local_monotone_parity  the naive monotone MDLM: ancestral reveals over T rounds with the
                       Bayes-optimal predictor that sees a window of `window` positions. The marginal
                       of D_n^xor on any n - 1 or fewer positions is uniform, so when the window
                       misses a position every revealed bit is a fair coin: violation 1/2 for every T
                       (Thm 4.5's obstruction; `window >= n` gives the exact global conditional).
                       `window_parity_logits` is the same predictor as a denoiser for the MDLM
                       samplers of `core/masked_diffusion.py`.

Space (Thm 3.2): a balanced XOR tree over n = 2^D fair input bits (depth D, size 2n - 1, width n);
the output is (inputs, parity).
  xor_tree_monotone    one position per gate, L = 2n - 1, D + 1 rounds; footprint 2n - 1.
  xor_tree_revision    inputs plus a scratch of n/2 positions; level 1 writes the scratch, level l
                       overwrites the second child's position with the gate (D + 1 rounds);
                       footprint 1.5 n.
  xor_tree_remasking   the same layout without revision: each level l >= 2 takes two rounds. Round
                       B remasks the second child b iff the first child a = 1 (b must change) and
                       remasks a iff b = 0 (a's mask now stores b's old value); round C writes a
                       masked b as NOT(old b), read off a's mask, and frees a. 2D rounds, peak
                       footprint 1.5 n.

Space on a deep narrow circuit: the XOR chain over n fresh coins (a_t = a_{t-1} xor c_t; depth n + 1,
width 2, size 2n). Balanced trees have width and size both Theta(n), so they cannot tell O(width) from
O(size); the chain can.
  xor_chain_monotone   one position per gate, L = 2n, footprint 2n (size).
  xor_chain_revision   four positions rewritten every round, footprint 4 (width) for every n.

`run` samples a program (one `lax.scan` over rounds, the trajectory kept for trace learning),
`exact_output_distribution` propagates the exact law of the state by enumeration (small L), and
`learned_program` replaces a program's transitions by a trained per-position model restricted to the
positions the program's topology makes active in that round (F given, p learned).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

MASK = 2
NUM_VALUES = 3  # 0, 1, M
KINDS = ("monotone", "remasking", "revision")
Transition = Callable[[jax.Array, jax.Array], jax.Array]  # (states [B, L], round) -> [B, L, 3]


@dataclasses.dataclass(frozen=True)
class Program:
  """A DLM program (module docstring).

  Attributes:
    name: what it is.
    kind: "monotone" | "remasking" | "revision": the moves it is allowed.
    length: L, positions of the state (output and scratch).
    num_rounds: rounds it runs.
    transition: `(states int32 [B, L], round) -> probabilities [B, L, 3]` over the next value.
    outputs: int `[m]` positions read as the output.
    active: `round -> bool [L]` (numpy): positions the topology lets change in that round.
  """

  name: str
  kind: str
  length: int
  num_rounds: int
  transition: Transition
  outputs: np.ndarray
  active: Callable[[int], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Run:
  """What `run` returns (arrays): final `states [B, L]`, `outputs [B, m]`, the trajectory
  `trace [rounds + 1, B, L]` (with `keep_trace`), the peak `footprint [B]` (most non-mask
  positions held at once), and per sample the number of `remasks` (bit -> M) and `revisions`
  (bit -> other bit)."""

  states: jax.Array
  outputs: jax.Array
  trace: jax.Array
  footprint: jax.Array
  remasks: jax.Array
  revisions: jax.Array


jax.tree_util.register_dataclass(
  Run,
  data_fields=["states", "outputs", "trace", "footprint", "remasks", "revisions"],
  meta_fields=[],
)


def _one_hot(values: jax.Array) -> jax.Array:
  return jax.nn.one_hot(values, NUM_VALUES, dtype=jnp.float32)


_FAIR = jnp.array([0.5, 0.5, 0.0], jnp.float32)


def _fair_like(states: jax.Array) -> jax.Array:
  return jnp.broadcast_to(_FAIR, (*states.shape, NUM_VALUES))


def _choose(condition, when_true, when_false) -> jax.Array:
  return jnp.where(condition[..., None], when_true, when_false)


def _all_rounds(length: int) -> Callable[[int], np.ndarray]:
  return lambda r: np.ones(length, bool)


# ---------------------------------------------------------------------------------------------------
# D_n^xor: revision (Thm 4.1), remasking (Thm 4.2), monotone chain, naive local monotone (Thm 4.5)
# ---------------------------------------------------------------------------------------------------


def revision_parity(n: int) -> Program:
  """Round 0: x_i ~ fair; round 1: x_i <- x_i xor x_{i+1 mod n} (a revision of every position)."""

  def transition(states, r):
    xor = (states + jnp.roll(states, -1, axis=-1)) % 2
    return jnp.where(r == 0, _fair_like(states), _one_hot(xor))

  return Program("revision", "revision", n, 2, transition, np.arange(n), _all_rounds(n))


def remasking_parity(n: int) -> Program:
  """Pairs (2j, 2j+1) = (left, right), m = n/2 (n even); rounds (module docstring):
  0 left <- U_j; 1 right <- c_j = U_j xor U_{j+1 mod m}; 2 remask left, remask right iff c_j = 0;
  3 left <- V_j; 4 a masked right <- V_j (c_j = 0), right <- M iff (V_j, c_j) = (1, 1);
  5 a masked right <- 0. Final pair: (V, V xor c), uniform under parity c."""
  if n % 2:
    raise ValueError(f"remasking_parity: n must be even, got {n}")

  def transition(states, r):
    pairs = states.reshape(*states.shape[:-1], n // 2, 2)
    left, right = pairs[..., 0], pairs[..., 1]
    keep_left, keep_right = _one_hot(left), _one_hot(right)
    fair = _fair_like(left)
    c = (left + jnp.roll(left, -1, axis=-1)) % 2
    mask = _one_hot(jnp.full_like(left, MASK))
    new_left = [fair, keep_left, mask, fair, keep_left, keep_left]
    new_right = [
      keep_right,
      _one_hot(c),
      _choose(right == 0, mask, keep_right),
      keep_right,
      _choose(right == MASK, _one_hot(left), _choose((right == 1) & (left == 1), mask, keep_right)),
      _choose(right == MASK, _one_hot(jnp.zeros_like(right)), keep_right),
    ]
    index = jnp.clip(r, 0, 5)
    out_left, out_right = jnp.stack(new_left)[index], jnp.stack(new_right)[index]
    return jnp.stack([out_left, out_right], axis=-2).reshape(*states.shape, NUM_VALUES)

  return Program("remasking", "remasking", n, 6, transition, np.arange(n), _all_rounds(n))


def monotone_chain_parity(n: int) -> Program:
  """Pair k reveals its first bit in round k at slot lambda_k = lambda_{k-1} xor parity(pair k-2)
  (parity of pairs 0..k-2), with lambda_{k-1} read as the revealed slot of the half-revealed pair
  k-1; a half-revealed pair reveals its second bit, fair, or for the last pair the bit that makes
  the whole string even. n/2 + 1 rounds, monotone (module docstring)."""
  if n % 2:
    raise ValueError(f"monotone_chain_parity: n must be even, got {n}")
  m = n // 2

  def transition(states, r):
    del r  # the rule reads the round off the mask pattern
    pairs = states.reshape(*states.shape[:-1], m, 2)
    masked = pairs == MASK
    both, half = masked.all(-1), masked.sum(-1) == 1
    slot = masked[..., 0].astype(jnp.int32)  # a half pair's revealed slot: 1 if left is masked
    value = jnp.where(masked[..., 0], pairs[..., 1], pairs[..., 0])  # its revealed bit
    pad = jnp.zeros_like(slot[..., :1])
    prev_half = jnp.concatenate([jnp.ones_like(half[..., :1]), half[..., :-1]], axis=-1)
    prev_slot = jnp.concatenate([pad, slot[..., :-1]], axis=-1)
    full_parity = jnp.where(masked.any(-1), 0, pairs.sum(-1) % 2)
    prev_parity = jnp.concatenate([pad, full_parity[..., :-1]], axis=-1)
    before_prev = jnp.concatenate([pad, prev_parity[..., :-1]], axis=-1)
    label = (prev_slot + before_prev) % 2  # lambda_k
    closing = (slot + prev_parity + value) % 2  # the last pair's second bit: the total is even
    is_last = jnp.arange(m) == m - 1
    keep = _one_hot(pairs)
    fair = _fair_like(pairs)
    first = both & prev_half
    slots = jnp.arange(2)
    first_probs = _choose(slots == label[..., None], fair, keep)
    second_value = jnp.where(is_last, closing, 0)
    second_probs = (
      jnp.where(is_last[..., None, None], _one_hot(second_value)[..., None, :], fair)
      * masked[..., None]
      + keep * ~masked[..., None]
    )
    first, half = first[..., None, None], half[..., None, None]
    out = jnp.where(first, first_probs, jnp.where(half, second_probs, keep))
    return out.reshape(*states.shape, NUM_VALUES)

  return Program("monotone_chain", "monotone", n, m + 1, transition, np.arange(n), _all_rounds(n))


def local_monotone_parity(n: int, window: int, num_rounds: int) -> Program:
  """Ancestral monotone decoding with the Bayes-optimal window predictor: a masked position is
  revealed in round r with probability 1 / (T - r); its value is the parity of the other n - 1
  bits if the window (cyclic, `window` positions centred on it) holds all of them revealed, else a
  fair coin (the exact conditional of D_n^xor given what the window shows)."""
  radius = window // 2
  sees_all = 2 * radius >= n - 1

  def transition(states, r):
    masked = states == MASK
    q = 1.0 / jnp.maximum(num_rounds - r, 1).astype(jnp.float32)
    others_revealed = jnp.sum(~masked, axis=-1, keepdims=True) - (~masked)
    total = jnp.sum(jnp.where(masked, 0, states), axis=-1, keepdims=True)
    determined = sees_all & (others_revealed == n - 1)
    value = jnp.where(determined[..., None], _one_hot(total % 2), _fair_like(states))
    reveal = q * value + (1 - q) * _one_hot(states)
    return _choose(masked, reveal, _one_hot(states))

  name = f"local_monotone_w{window}_T{num_rounds}"
  return Program(name, "monotone", n, num_rounds, transition, np.arange(n), _all_rounds(n))


def window_parity_logits(tokens: jax.Array, radius) -> jax.Array:
  """The same Bayes-optimal window predictor as a denoiser for `core.masked_diffusion.sample`:
  logits `[B, n, 2]`; a masked position is determined (the parity of the others) only when the
  cyclic window of `radius` on each side covers all n - 1 other positions and they are revealed,
  else a fair coin. Revealed positions get their own value. `radius` may be traced."""
  n = tokens.shape[-1]
  masked = tokens == MASK
  others_revealed = jnp.sum(~masked, axis=-1, keepdims=True) - (~masked)
  total = jnp.sum(jnp.where(masked, 0, tokens), axis=-1, keepdims=True) % 2
  determined = (2 * radius >= n - 1) & (others_revealed == n - 1)
  p_one = jnp.where(masked, jnp.where(determined, total, 0.5), tokens).astype(jnp.float32)
  return jnp.log(jnp.clip(jnp.stack([1 - p_one, p_one], axis=-1), 1e-9, 1.0))


# ---------------------------------------------------------------------------------------------------
# XOR-tree circuits (space, Thm 3.2)
# ---------------------------------------------------------------------------------------------------


def _tree_depth(n: int) -> int:
  depth = int(round(math.log2(n)))
  if n < 2 or 2**depth != n:
    raise ValueError(f"xor tree: n must be a power of 2 >= 2, got {n}")
  return depth


def xor_tree_monotone(n: int) -> Program:
  """Monotone CoT: gate g of level l at its own position (level-order after the n inputs); round 0
  reveals the inputs, round l the gates of level l. L = 2n - 1, D + 1 rounds."""
  depth = _tree_depth(n)
  level = np.zeros(2 * n - 1, np.int32)
  left = np.zeros(2 * n - 1, np.int32)
  start, width = 0, n
  for ell in range(1, depth + 1):
    for j in range(width // 2):
      gate = start + width + j
      level[gate], left[gate] = ell, start + 2 * j
    start, width = start + width, width // 2
  level_j, left_j = jnp.asarray(level), jnp.asarray(left)
  is_input = jnp.arange(2 * n - 1) < n

  def transition(states, r):
    xor = (states[..., left_j] + states[..., left_j + 1]) % 2
    fresh = _choose(is_input & (r == 0), _fair_like(states), _one_hot(states))
    return _choose((level_j == r) & ~is_input, _one_hot(xor), fresh)

  def active(r):
    is_gate = np.arange(2 * n - 1) >= n
    return (is_gate & (level == r)) | (~is_gate & (r == 0))

  outputs = np.append(np.arange(n), 2 * n - 2)
  return Program("xor_tree_monotone", "monotone", 2 * n - 1, depth + 1, transition, outputs, active)


def _scratch_roles(n: int, ell: int) -> tuple[np.ndarray, np.ndarray]:
  """Scratch indices `(b, a)` of level l >= 2: gate j sits at b = j 2^(l-1) + 2^(l-1) - 1 (its
  second child's place) and reads a = b - 2^(l-2)."""
  span = 2 ** (ell - 1)
  b = np.arange(span - 1, n // 2, span)
  return b, b - span // 2


def _scratch_masks(n: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
  """bool `[D + 1, L]`: the b and a positions of each level (rows 0 and 1 empty)."""
  length = n + n // 2
  is_b = np.zeros((depth + 1, length), bool)
  is_a = np.zeros((depth + 1, length), bool)
  for ell in range(2, depth + 1):
    b, a = _scratch_roles(n, ell)
    is_b[ell, n + b], is_a[ell, n + a] = True, True
  return is_b, is_a


def _partner(n: int, depth: int) -> np.ndarray:
  """int `[D + 1, L]`: for a b position of level l its a, for an a position its b (else itself)."""
  length = n + n // 2
  partner = np.tile(np.arange(length), (depth + 1, 1))
  for ell in range(2, depth + 1):
    b, a = _scratch_roles(n, ell)
    partner[ell, n + b], partner[ell, n + a] = n + a, n + b
  return partner


def _level_one(states, r, n):
  """Rounds 0 and 1 shared by the in-place trees: inputs fair, then scratch j <- x_2j xor x_2j+1."""
  length = states.shape[-1]
  index = jnp.arange(length)
  scratch = jnp.clip(index - n, 0, n // 2 - 1)
  pair_xor = (states[..., 2 * scratch] + states[..., 2 * scratch + 1]) % 2
  keep = _one_hot(states)
  out = _choose((index < n) & (r == 0), _fair_like(states), keep)
  return _choose((index >= n) & (r == 1), _one_hot(pair_xor), out)


def xor_tree_revision(n: int) -> Program:
  """In-place tree with revision: level l >= 2 (round l) rewrites b <- a xor b. D + 1 rounds,
  L = 1.5 n, output (inputs, root at the last scratch position)."""
  depth = _tree_depth(n)
  is_b, _ = _scratch_masks(n, depth)
  partner = jnp.asarray(_partner(n, depth))
  is_b_j = jnp.asarray(is_b)

  def transition(states, r):
    level = jnp.clip(r, 0, depth)
    xor = (states + states[..., partner[level]]) % 2
    return _choose(is_b_j[level] & (r >= 2), _one_hot(xor), _level_one(states, r, n))

  length = n + n // 2
  active = lambda r: _level_one_active(n, r) | (is_b[min(r, depth)] if r >= 2 else False)
  outputs = np.append(np.arange(n), length - 1)
  return Program("xor_tree_revision", "revision", length, depth + 1, transition, outputs, active)


def _level_one_active(n: int, r: int) -> np.ndarray:
  index = np.arange(n + n // 2)
  return ((index < n) & (r == 0)) | ((index >= n) & (r == 1))


def xor_tree_remasking(n: int) -> Program:
  """In-place tree with remasking: level l >= 2 takes rounds 2l - 2 (B) and 2l - 1 (C) (module
  docstring). 2D rounds, L = 1.5 n, peak footprint 1.5 n."""
  depth = _tree_depth(n)
  is_b, is_a = _scratch_masks(n, depth)
  partner = jnp.asarray(_partner(n, depth))
  is_b_j, is_a_j = jnp.asarray(is_b), jnp.asarray(is_a)
  mask = jnp.asarray([0.0, 0.0, 1.0], jnp.float32)

  def transition(states, r):
    level = jnp.clip(r // 2 + 1, 0, depth)
    other = states[..., partner[level]]
    round_b = (r >= 2) & (r % 2 == 0)
    round_c = (r >= 2) & (r % 2 == 1)
    b_move = jnp.where(round_b, other == 1, False)
    a_move = jnp.where(round_b, other == 0, False)
    rewrite = _one_hot(jnp.where(other == MASK, 1, 0))
    out = _level_one(states, r, n)
    out = _choose(is_b_j[level] & b_move, mask, out)
    out = _choose(is_a_j[level] & a_move, mask, out)
    out = _choose(is_b_j[level] & round_c & (states == MASK), rewrite, out)
    return _choose(is_a_j[level] & round_c & (states != MASK), mask, out)

  length = n + n // 2

  def active(r):
    if r < 2:
      return _level_one_active(n, r)
    level = min(r // 2 + 1, depth)
    return is_a[level] | is_b[level]

  outputs = np.append(np.arange(n), length - 1)
  return Program("xor_tree_remasking", "remasking", length, 2 * depth, transition, outputs, active)


XOR_TREES = {
  "monotone": xor_tree_monotone,
  "revision": xor_tree_revision,
  "remasking": xor_tree_remasking,
}


# ---------------------------------------------------------------------------------------------------
# A deep narrow circuit: the XOR chain (space, Thm 3.2 with width O(1) and size O(n))
# ---------------------------------------------------------------------------------------------------


def _chain_length(n: int) -> int:
  if n < 2:
    raise ValueError(f"xor chain: n must be >= 2, got {n}")
  return n


def xor_chain_monotone(n: int) -> Program:
  """Monotone CoT of the XOR chain: coin c_t (a fresh fair bit, the predictor's own randomness) at
  position t, revealed in round t; accumulator a_t = a_{t-1} xor c_t (a_0 = c_0) at position n + t,
  revealed in round t + 1. Depth n + 1, width 2, size 2n: L = 2n, n + 1 rounds; output
  (a_{n-2}, c_{n-1}, a_{n-1}), valid when the last equals the XOR of the first two."""
  _chain_length(n)
  index = jnp.arange(2 * n)
  is_coin = index < n
  acc = jnp.clip(index - n, 0, n - 1)
  prev = jnp.clip(n + acc - 1, n, 2 * n - 1)

  def transition(states, r):
    before = jnp.where(acc >= 1, states[..., prev], 0)
    value = (before + states[..., acc]) % 2
    out = _choose(is_coin & (index == r), _fair_like(states), _one_hot(states))
    return _choose(~is_coin & (acc + 1 == r), _one_hot(value), out)

  def active(r):
    i = np.arange(2 * n)
    return ((i < n) & (i == r)) | ((i >= n) & (i - n + 1 == r))

  outputs = np.array([2 * n - 2, n - 1, 2 * n - 1])
  return Program("xor_chain_monotone", "monotone", 2 * n, n + 1, transition, outputs, active)


CHAIN_PREV, CHAIN_USED, CHAIN_ACC, CHAIN_NEXT = 0, 1, 2, 3


def xor_chain_revision(n: int) -> Program:
  """The XOR chain in place with revision, four positions (prev, used, acc, next) whatever n:
  round 0 draws the first coin into `next`; round t >= 1 revises prev <- acc, used <- next,
  acc <- acc xor next (acc masked reads 0) and, while coins remain, next <- a fresh coin. n + 1
  rounds, footprint 4; output (prev, used, acc) as for `xor_chain_monotone`."""
  _chain_length(n)
  fresh = jnp.asarray([0, 0, 0, 1], bool)

  def transition(states, r):
    acc = jnp.where(states[..., CHAIN_ACC] == MASK, 0, states[..., CHAIN_ACC])
    step = jnp.stack(
      [
        states[..., CHAIN_ACC],
        states[..., CHAIN_NEXT],
        (acc + states[..., CHAIN_NEXT]) % 2,
        states[..., CHAIN_NEXT],
      ],
      -1,
    )
    out = _choose(jnp.asarray(r >= 1) & jnp.ones(4, bool), _one_hot(step), _one_hot(states))
    return _choose(fresh & (r < n), _fair_like(states), out)

  outputs = np.array([CHAIN_PREV, CHAIN_USED, CHAIN_ACC])
  return Program("xor_chain_revision", "revision", 4, n + 1, transition, outputs, _all_rounds(4))


XOR_CHAINS = {"monotone": xor_chain_monotone, "revision": xor_chain_revision}


def active_table(program: Program) -> np.ndarray:
  """bool `[rounds, L]`: `program.active(r)` for every round."""
  return np.stack([np.asarray(program.active(r), bool) for r in range(program.num_rounds)])


def learned_program(program: Program, probs_fn: Transition) -> Program:
  """`program` with its transition at the active positions replaced by `probs_fn(states, round)`
  (a trained per-position model); inactive positions are copied (F from the topology)."""
  table = jnp.asarray(active_table(program))

  def transition(states, r):
    active = table[jnp.clip(r, 0, program.num_rounds - 1)]
    return _choose(active, probs_fn(states, r), _one_hot(states))

  return dataclasses.replace(program, name=f"learned_{program.name}", transition=transition)


# ---------------------------------------------------------------------------------------------------
# Running and exact enumeration
# ---------------------------------------------------------------------------------------------------


def run(program: Program, rng: jax.Array, num_samples: int, keep_trace: bool = False) -> Run:
  """Samples `num_samples` runs from all-mask: one `lax.scan` over the program's rounds; each
  position draws its next value from its own distribution with its own randomness. The trajectory
  `[rounds + 1, B, L]` is kept only with `keep_trace` (else `trace` is the final state alone)."""
  init = jnp.full((num_samples, program.length), MASK, jnp.int32)
  zeros = jnp.zeros(num_samples, jnp.int32)

  def body(carry, r):
    states, footprint, remasks, revisions = carry
    probs = program.transition(states, r)
    draw = jax.random.categorical(jax.random.fold_in(rng, r), jnp.log(probs)).astype(jnp.int32)
    was_bit = states != MASK
    remasks = remasks + jnp.sum(was_bit & (draw == MASK), -1)
    revisions = revisions + jnp.sum(was_bit & (draw != MASK) & (draw != states), -1)
    footprint = jnp.maximum(footprint, jnp.sum(draw != MASK, -1))
    return (draw, footprint, remasks, revisions), (draw if keep_trace else None)

  carry = (init, zeros, zeros, zeros)
  (final, footprint, remasks, revisions), trace = jax.lax.scan(
    body, carry, jnp.arange(program.num_rounds)
  )
  trace = jnp.concatenate([init[None], trace], axis=0) if keep_trace else final[None]
  outputs = final[:, jnp.asarray(program.outputs)]
  return Run(final, outputs, trace, footprint, remasks, revisions)


def exact_output_distribution(program: Program, max_states: int = 200_000) -> dict[tuple, float]:
  """The exact law of the output, by propagating the law of the state through every round (each
  state's next-state law is the product of the per-position laws). For small L."""
  law = {(MASK,) * program.length: 1.0}
  transition = jax.jit(program.transition)  # one compile per state count, not one per operation
  for r in range(program.num_rounds):
    states = np.array(list(law), np.int32)
    probs = np.asarray(transition(jnp.asarray(states), jnp.asarray(r)))
    new: dict[tuple, float] = {}
    for state, weight, p in zip(law, law.values(), probs, strict=True):
      choices = [
        [(v, p[i, v]) for v in range(NUM_VALUES) if p[i, v] > 0] for i in range(len(state))
      ]
      for combo in itertools.product(*choices):
        key = tuple(v for v, _ in combo)
        new[key] = new.get(key, 0.0) + weight * math.prod(q for _, q in combo)
    if len(new) > max_states:
      raise ValueError(f"exact_output_distribution: more than {max_states} states")
    law = new
  out: dict[tuple, float] = {}
  for state, weight in law.items():
    key = tuple(state[i] for i in program.outputs)
    out[key] = out.get(key, 0.0) + weight
  return out
