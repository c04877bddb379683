"""Masked-diffusion language models (MDLM) with remasking and revision samplers.

For "Diffusion Language Models are Provably Optimal Parallel Samplers" (Jiang, Haghtalab, Chen;
ICLR 2026). The paper's DLM (Sec. 2) decodes in rounds: an unmasking rule F picks positions, a
predictor that factorises over positions, `p(x_0 | x_t) = prod_i p_i(x_0^i | x_t)`, fills them, each
position with its own randomness. A *monotone* DLM never changes a revealed token; *remasking* adds a
rule G that turns revealed tokens back into the mask M; *revision* lets `p_i` rewrite a revealed
token. The theory says remasking or revision buys what monotone decoding cannot (Thms 4.1, 4.2 vs
4.5); this module is the learned, practical side of that claim.

Denoiser (`Denoiser`): the shared `core.nn.transformer.Transformer` in bidirectional mode (no mask),
fed token embeddings of `{0..K-1, M}` plus learned absolute position embeddings (RoPE alone is
relative, and a code's check groups sit at fixed absolute positions), optionally a round embedding
(for transition models that run a fixed program); a linear head gives logits over the K data tokens
(the mask is never predicted) or over K + 1 outputs for programs that may emit M.

Training (`masked_diffusion_loss`): the MDLM objective of Sahoo et al. (2024, "Simple and Effective
Masked Diffusion Language Models", Eq. 10) with the linear schedule `alpha_t = 1 - t`: mask each
token with probability t, and minimise `E_t[(1/t) sum_{i masked} -log p_theta(x_0^i | x_t)] / L`,
an upper bound on the per-token NLL. Self-correction (`correction_rate = pi > 0`, in the spirit of
uniform-noise / GIDD-style diffusion): a further fraction `pi * t` of the unmasked tokens is replaced
by uniform random tokens, and cross-entropy is also put on every unmasked position (weight
`correction_weight`), so that `p_theta(x_t^i | x_t)` scores revealed tokens, which revision needs.

Samplers (`sample`, one compiled `lax.while_loop` over rounds, one forward pass per round):
  reveal rule ("reveal"):
    ancestral   MDLM ancestral sampling: from t = (T-r)/T to s = (T-r-1)/T each masked token is
                revealed with probability (alpha_s - alpha_t) / (1 - alpha_t) = 1 / (T - r), its
                value drawn from p_theta; all are revealed by round T.
    topk        confidence-ordered (LLaDA-style): reveal the ceil(#masked / (T - r)) masked
                positions of highest max-probability (ties broken at random), values drawn from
                p_theta.
  correction ("correction"), applied to the tokens revealed before the round:
    none                plain monotone decoding; a revealed token never changes.
    remask_random       ReMDM-cap (Wang et al. 2025, "Remasking Discrete Diffusion Models with
                        Inference-Time Scaling", Sec. 3): each revealed token is remasked with
                        probability sigma_t = min(eta, (1 - alpha_s) / alpha_t) and masked tokens are
                        revealed with (alpha_s - (1 - sigma_t) alpha_t) / (1 - alpha_t), which keeps
                        the marginal schedule. With `extra_rounds = R > 0`, R "loop" rounds at the
                        fixed alpha_on = 1 - 1/T run before the last round (ReMDM-loop).
    remask_confidence   remask the revealed tokens whose confidence p_theta(x_t^i | x_t) is below
                        `threshold`, at most `cap` per block (lowest confidence first); they are
                        predicted again in a later round.
    revision            re-score the revealed tokens; those with p_theta(x_t^i | x_t) < `threshold`,
                        at most `cap` per block (lowest first), are resampled in the same round from
                        p_theta with their current token excluded (a binary token flips).
  A corrective sampler runs the T base rounds and then up to `extra_rounds` more; a sample stops when
  a forward pass finds no masked token and no revealed token below the threshold (that verifying
  pass is counted). A monotone sample stops when nothing is masked.

NFE counts, per sample, the forward passes it needed: the denoiser has no time input, so a round
that left the sample's state unchanged reuses the previous pass's output (MDLM's caching) and costs
none; with T > L most ancestral rounds reveal nothing. Every sampler reports, per sample, NFE, the
peak footprint (most non-mask tokens held at once) and how many revealed tokens changed (0 for
monotone decoding), and the rounds the batch ran; validity and fidelity are the data language's
(`core/data/parity.py`).

Choices where the paper is open: the caps are per block of an int `[L]` block map so that a caller
may pass a language's constraint blocks (revising every suspect token of one parity check in
parallel flips an even number of them and the check stays violated); one block = a global cap.
A revised token is drawn with its current value excluded: it was judged wrong, and redrawing it from
p_theta would mostly keep it. The loss weight of the self-correction term is 1 by default.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from core.nn.transformer import Transformer

REVEALS = ("ancestral", "topk")
CORRECTIONS = ("none", "remask_random", "remask_confidence", "revision")
LogitsFn = Callable[[jax.Array], jax.Array]


# ---------------------------------------------------------------------------------------------------
# Denoiser
# ---------------------------------------------------------------------------------------------------


class Denoiser(nn.Module):
  """Bidirectional transformer denoiser: `tokens int [B, L]` in `{0..K}` (K = mask) -> logits
  `[B, L, num_outputs]` (module docstring). `rounds int [B]` feeds a round embedding when
  `num_rounds > 0`."""

  num_tokens: int
  num_outputs: int
  length: int
  width: int
  depth: int
  num_heads: int
  mlp: str = "swiglu"
  num_rounds: int = 0

  @nn.compact
  def __call__(self, tokens: jax.Array, rounds: jax.Array | None = None) -> jax.Array:
    init = nn.initializers.normal(self.width**-0.5)
    x = nn.Embed(self.num_tokens + 1, self.width, embedding_init=init, name="token_embed")(tokens)
    x = x + self.param("position_embed", init, (self.length, self.width))
    if self.num_rounds:
      if rounds is None:
        raise ValueError("Denoiser: rounds [B] are required when num_rounds > 0")
      table = nn.Embed(self.num_rounds, self.width, embedding_init=init, name="round_embed")
      x = x + table(rounds)[:, None, :]
    features = Transformer(
      vocab_size=0,
      width=self.width,
      depth=self.depth,
      num_heads=self.num_heads,
      mlp=self.mlp,
      name="transformer",
    )(embeddings=x).features
    return nn.Dense(self.num_outputs, name="head")(features).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------
# Forward process and loss
# ---------------------------------------------------------------------------------------------------


def stratified_times(rng: jax.Array, batch: int, t_min: float = 1e-3) -> jax.Array:
  """`t [B]` in `[t_min, 1]`: one uniform offset plus `i / B` (MDLM's low-discrepancy sampler)."""
  u = (jax.random.uniform(rng) + jnp.arange(batch) / batch) % 1.0
  return t_min + (1.0 - t_min) * u


class Corrupted(NamedTuple):
  tokens: jax.Array  # int32 [B, L]: x_t, M = num_tokens where masked
  masked: jax.Array  # bool [B, L]
  replaced: jax.Array  # bool [B, L]: unmasked tokens replaced by a uniform random token


def corrupt(
  rng: jax.Array, x0: jax.Array, t: jax.Array, num_tokens: int, correction_rate: float = 0.0
) -> Corrupted:
  """`x_t`: each token masked with probability t (alpha_t = 1 - t); of the rest, a fraction
  `correction_rate * t` replaced by a uniform random token (which may equal the original)."""
  mask_rng, pick_rng, token_rng = jax.random.split(rng, 3)
  t = t[:, None]
  masked = jax.random.uniform(mask_rng, x0.shape) < t
  replaced = ~masked & (jax.random.uniform(pick_rng, x0.shape) < correction_rate * t)
  noise = jax.random.randint(token_rng, x0.shape, 0, num_tokens)
  tokens = jnp.where(masked, num_tokens, jnp.where(replaced, noise, x0))
  return Corrupted(tokens.astype(jnp.int32), masked, replaced)


def masked_diffusion_loss(
  logits: jax.Array,
  x0: jax.Array,
  masked: jax.Array,
  t: jax.Array,
  correction_weight: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
  """Per-example `(loss, nelbo)`, both `[B]` in nats per token.

  `nelbo = (1/t) sum_{i masked} -log p(x_0^i | x_t) / L` (MDLM, Eq. 10, alpha_t = 1 - t);
  `loss = nelbo + correction_weight * sum_{i unmasked} -log p(x_0^i | x_t) / L` (self-correction)."""
  ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), x0[..., None], axis=-1)[..., 0]
  length = x0.shape[-1]
  nelbo = jnp.sum(ce * masked, axis=-1) / (t * length)
  revealed = jnp.sum(ce * ~masked, axis=-1) / length
  return nelbo + correction_weight * revealed, nelbo


# ---------------------------------------------------------------------------------------------------
# Samplers
# ---------------------------------------------------------------------------------------------------


class SamplerSpec(NamedTuple):
  """A sampler (module docstring) as a pytree of numbers: pass it to a jitted function as an
  argument and every sampler shares one compiled program. Build it with `sampler_spec`."""

  reveal: jax.Array | int  # index into REVEALS
  correction: jax.Array | int  # index into CORRECTIONS
  threshold: jax.Array | float  # confidence below which a revealed token is suspect
  cap: jax.Array | int  # most tokens corrected per block per round
  eta: jax.Array | float  # remask_random: ReMDM's sigma_max


def sampler_spec(
  reveal: str = "ancestral",
  correction: str = "none",
  threshold: float = 0.9,
  cap: int = 1,
  eta: float = 0.05,
) -> SamplerSpec:
  if reveal not in REVEALS:
    raise ValueError(f"sampler_spec: reveal must be one of {REVEALS}, got {reveal!r}")
  if correction not in CORRECTIONS:
    raise ValueError(f"sampler_spec: correction must be one of {CORRECTIONS}, got {correction!r}")
  return SamplerSpec(
    REVEALS.index(reveal), CORRECTIONS.index(correction), float(threshold), int(cap), float(eta)
  )


class SampleResult(NamedTuple):
  tokens: jax.Array  # int32 [B, L]
  nfe: jax.Array  # int32 [B]: forward passes this sample needed
  footprint: jax.Array  # int32 [B]: peak number of non-mask tokens
  changed: jax.Array  # int32 [B]: revealed tokens that changed (revised or remasked), summed
  rounds: jax.Array  # int32 []: rounds the batch ran


def ancestral_reveal_probability(r, num_rounds) -> jax.Array:
  """Round `r` of T: `(alpha_s - alpha_t) / (1 - alpha_t) = 1 / (T - r)` for the linear schedule;
  1 past the schedule (tokens remasked after it are revealed at once)."""
  r = jnp.asarray(r, jnp.float32)
  return jnp.where(r < num_rounds, 1.0 / jnp.maximum(num_rounds - r, 1.0), 1.0)


def remdm_schedule(r, num_rounds, loop_rounds, eta: float) -> tuple[jax.Array, jax.Array]:
  """ReMDM-cap (with ReMDM-loop when `loop_rounds > 0`): `(reveal probability of a masked token,
  remask probability sigma of a revealed token)` at round `r`.

  Rounds `0..T-2` step `alpha` from `r/T` to `(r+1)/T`; then `loop_rounds` rounds hold
  `alpha_on = (T-1)/T` fixed; the last round goes to `alpha = 1`. Past the schedule: reveal all."""
  r = jnp.asarray(r, jnp.float32)
  t_count = jnp.asarray(num_rounds, jnp.float32)
  in_loop = (r >= t_count - 1) & (r < t_count - 1 + loop_rounds)
  step = jnp.where(r >= t_count - 1 + loop_rounds, r - loop_rounds, jnp.minimum(r, t_count - 1))
  alpha_t = jnp.where(in_loop, (t_count - 1) / t_count, step / t_count)
  alpha_s = jnp.where(in_loop, alpha_t, jnp.minimum((step + 1) / t_count, 1.0))
  cap = jnp.where(in_loop, (1 - alpha_t) / jnp.maximum(alpha_t, 1e-9), (1 - alpha_s) / alpha_t)
  sigma = jnp.where(alpha_t > 0, jnp.minimum(eta, cap), 0.0)
  reveal = (alpha_s - (1 - sigma) * alpha_t) / jnp.maximum(1 - alpha_t, 1e-9)
  past = r >= t_count + loop_rounds
  return jnp.where(past, 1.0, jnp.clip(reveal, 0.0, 1.0)), jnp.where(past, 0.0, sigma)


def _rank_in_block(key: jax.Array, tiebreak: jax.Array, valid: jax.Array, blocks: jax.Array):
  """For each position of `[B, L]`, how many valid positions of its block come before it in the
  order (key, tiebreak) ascending; invalid positions never count."""
  same = blocks[:, None] == blocks[None, :]  # [L, L]
  before = (key[:, None, :] < key[:, :, None]) | (
    (key[:, None, :] == key[:, :, None]) & (tiebreak[:, None, :] < tiebreak[:, :, None])
  )  # [B, i, j]: j before i
  return jnp.sum(before & same[None] & valid[:, None, :], axis=-1)


def _topk_reveal(rng, probs, masked, num_rounds, r) -> jax.Array:
  """The ceil(#masked / (T - r)) masked positions of highest max-probability (random ties)."""
  remaining = jnp.maximum(num_rounds - r, 1)
  count = -(-jnp.sum(masked, axis=-1) // remaining)  # [B]
  confidence = jnp.where(masked, jnp.max(probs, axis=-1), -1.0)
  tiebreak = jax.random.uniform(rng, masked.shape)
  everything = jnp.zeros(masked.shape[-1], jnp.int32)
  rank = _rank_in_block(-confidence, tiebreak, masked, everything)
  return masked & (rank < count[:, None])


def _resample_excluding(rng, logits, current) -> jax.Array:
  """A draw from p_theta with the current token's probability set to 0."""
  excluded = jax.nn.one_hot(current, logits.shape[-1], dtype=bool)
  return jax.random.categorical(rng, jnp.where(excluded, -jnp.inf, logits)).astype(jnp.int32)


def _round(logits_fn, spec: SamplerSpec, blocks, num_rounds, extra_rounds, mask_id, carry):
  """One round of `sample`: one forward pass, a reveal, a correction."""
  tokens, rng, r, nfe, done, footprint, changed, moved = carry
  rng, reveal_rng, value_rng, fix_rng, tie_rng, remask_rng = jax.random.split(rng, 6)
  correction = jnp.asarray(spec.correction)
  is_random = correction == CORRECTIONS.index("remask_random")
  is_confidence = correction == CORRECTIONS.index("remask_confidence")
  is_revision = correction == CORRECTIONS.index("revision")
  verifies = is_confidence | is_revision

  logits = logits_fn(tokens)
  probs = jax.nn.softmax(logits)
  masked = tokens == mask_id
  revealed = ~masked
  values = jax.random.categorical(value_rng, logits).astype(jnp.int32)
  score = jnp.take_along_axis(probs, jnp.clip(tokens, 0, mask_id - 1)[..., None], -1)[..., 0]

  q_remdm, sigma = remdm_schedule(r, num_rounds, extra_rounds, spec.eta)
  q = jnp.where(is_random, q_remdm, ancestral_reveal_probability(r, num_rounds))
  sigma = jnp.where(is_random, sigma, 0.0)
  by_chance = masked & (jax.random.uniform(reveal_rng, masked.shape) < q)
  by_confidence = _topk_reveal(reveal_rng, probs, masked, num_rounds, r)
  reveal = jnp.where(jnp.asarray(spec.reveal) == REVEALS.index("topk"), by_confidence, by_chance)

  suspect = revealed & (score < spec.threshold) & verifies
  tiebreak = jax.random.uniform(tie_rng, masked.shape)
  chosen = suspect & (_rank_in_block(score, tiebreak, suspect, blocks) < spec.cap)
  remask = revealed & (jax.random.uniform(remask_rng, masked.shape) < sigma)
  new = jnp.where(reveal, values, tokens)
  new = jnp.where(chosen & is_revision, _resample_excluding(fix_rng, logits, tokens), new)
  new = jnp.where((chosen & is_confidence) | remask, mask_id, new)

  running = ~done & (~verifies | jnp.any(masked, -1) | jnp.any(suspect, -1))
  nfe = nfe + (~done & moved).astype(jnp.int32)
  changed = changed + jnp.sum(running[:, None] & revealed & (new != tokens), -1)
  new = jnp.where(running[:, None], new, tokens)
  moved = jnp.any(new != tokens, axis=-1)
  tokens = new
  footprint = jnp.maximum(footprint, jnp.sum(tokens != mask_id, -1))
  complete = ~jnp.any(tokens == mask_id, -1)
  schedule_over = ~is_random | (r + 1 >= num_rounds + extra_rounds)
  done = jnp.where(verifies, ~running, done | (complete & schedule_over))
  return tokens, rng, r + 1, nfe, done, footprint, changed, moved


def sample(
  logits_fn: LogitsFn,
  spec: SamplerSpec,
  rng: jax.Array,
  num_samples: int,
  length: int,
  mask_id: int,
  num_rounds,
  extra_rounds=0,
  blocks: jax.Array | None = None,
) -> SampleResult:
  """Samples `[num_samples, length]` from all-mask in `num_rounds` (T) base rounds plus up to
  `extra_rounds` rounds for a corrective sampler (module docstring). `logits_fn(tokens [B, L]) ->
  [B, L, K]` with `K = mask_id` data tokens. `spec`, `num_rounds`, `extra_rounds` and `blocks`
  (int `[L]`, default one block) may all be traced: one compilation serves a whole sweep."""
  if blocks is None:
    blocks = jnp.zeros(length, jnp.int32)
  extra = jnp.where(jnp.asarray(spec.correction) == 0, 0, extra_rounds)
  zeros = jnp.zeros(num_samples, jnp.int32)
  carry = (
    jnp.full((num_samples, length), mask_id, jnp.int32),
    rng,
    jnp.zeros((), jnp.int32),
    zeros,
    jnp.zeros(num_samples, bool),
    zeros,
    zeros,
    jnp.ones(num_samples, bool),
  )
  body = functools.partial(_round, logits_fn, spec, jnp.asarray(blocks), num_rounds, extra, mask_id)

  def cond(carry):
    return (carry[2] < num_rounds + extra) & ~jnp.all(carry[4])

  tokens, _, rounds, nfe, _, footprint, changed, _ = jax.lax.while_loop(cond, body, carry)
  return SampleResult(tokens, nfe, footprint, changed, rounds)
