"""Autoregressive decoding and scoring for `core.nn.transformer.Transformer`.

Layout. Prompts are RIGHT-padded: `prompts [B, P]` with `prompt_lengths [B]` (>= 1, e.g. a BOS);
row b's token i sits at position (= RoPE position = cache slot) i, and its generated tokens continue
at slots `prompt_lengths[b], prompt_lengths[b] + 1, ...`. Padding slots of a short prompt are never
seen: the causal mask hides slots after the query, and each is overwritten by that row's next token
before any query reaches it. So every row is decoded exactly as if it were alone, with no padding
inside its sequence and positions that start at 0.

  prefill      one forward of the prompts that fills a preallocated KV cache of static shape
               `[depth, B, max_len, kv_heads, head_dim]` and returns each row's next-token logits.
  decode_step  one token per row at per-row positions, attending over the cache.
  decode_loop  sampling inside ONE jitted `lax.while_loop` (ends when every row is done or after
               `max_new_tokens`): greedy (`temperature = 0`), temperature, top-k and top-p (nucleus,
               Holtzman et al. 2020) sampling; stop tokens set per-row done flags, and done rows
               emit `pad_id` with log-prob 0.
  generate     prefill + decode_loop, jitted.
  score        the log-probability of given continuations after given prompts: one forward of the
               concatenated, right-padded sequences.

Log-probs are the model's own, `log_softmax(logits)` at temperature 1 with no top-k/top-p filter, so
that `score(prompts, generated tokens)` equals the sum of the returned log-probs whatever the
sampling settings were. With `prefix_lengths` the prompt is read with a prefix-LM mask (its first
`prefix_lengths[b]` tokens see each other); generated tokens are always causal.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import attention
from core.nn.transformer import Transformer, init_cache


class Sampling(NamedTuple):
  """How the next token is drawn from the logits."""

  temperature: float = 1.0  # 0 = greedy (argmax)
  top_k: int = 0  # keep the k most likely tokens; 0 = all
  top_p: float = 1.0  # keep the smallest set whose probability reaches top_p; 1 = all


GREEDY = Sampling(temperature=0.0)
DEFAULT_SAMPLING = Sampling()


class Generation(NamedTuple):
  tokens: jax.Array  # [B, max_new_tokens] int32, pad_id after a row's stop token
  # [B, max_new_tokens] float32: the model's log-prob of each token; 0 after stop
  log_probs: jax.Array
  lengths: jax.Array  # [B] int32 tokens generated, the stop token included
  done: jax.Array  # [B] bool: the row emitted a stop token


# ---------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------


def filter_logits(logits: jax.Array, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
  """`logits [..., V]` with tokens outside the top-k and the top-p nucleus set to -inf.

  The nucleus is the smallest set of most likely tokens whose probability reaches `top_p`; the most
  likely token is always kept. Ties at the k-th logit are all kept.
  """
  if top_k and top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  if top_p < 1.0:
    sorted_logits = -jnp.sort(-logits, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    count = jnp.sum(mass_before < top_p, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(sorted_logits, count - 1, axis=-1)
    logits = jnp.where(logits >= threshold, logits, -jnp.inf)
  return logits


def sample_logits(
  rng: jax.Array, logits: jax.Array, sampling: Sampling = DEFAULT_SAMPLING
) -> jax.Array:
  """One token per row of `logits [B, V]`: argmax at temperature 0, else a draw from the tempered,
  top-k/top-p filtered distribution."""
  if sampling.temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  filtered = filter_logits(logits / sampling.temperature, sampling.top_k, sampling.top_p)
  return jax.random.categorical(rng, filtered, axis=-1).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------------
# Prefill and steps
# ---------------------------------------------------------------------------------------------------


def _prompt_mask(prefix_lengths) -> attention.Mask:
  """Causal (or prefix-LM) over the default positions `0..P-1`: the prompt's tokens sit at the cache
  slots of their positions, so a plain causal mask lets attention skip the unwritten slots."""
  if prefix_lengths is None:
    return attention.causal_mask()
  return attention.prefix_lm_mask(prefix_lengths)


def prefill(model: Transformer, params, prompts, prompt_lengths, max_len: int, prefix_lengths=None):
  """Fills a new cache with the prompts; returns `(next-token logits [B, V], cache)`."""
  batch, length = prompts.shape
  last = jnp.asarray(prompt_lengths, jnp.int32) - 1
  out = model.apply(
    params,
    prompts,
    mask=_prompt_mask(prefix_lengths),
    cache=init_cache(model, batch, max_len),
    logits_at=last[:, None],
  )
  return out.logits[:, 0], out.cache


def decode_step(model: Transformer, params, tokens, positions, cache):
  """Feeds `tokens [B]` at `positions [B]`; returns `(next-token logits [B, V], cache)`."""
  positions = jnp.asarray(positions, jnp.int32)[:, None]
  out = model.apply(
    params,
    tokens[:, None],
    positions=positions,
    mask=attention.causal_mask(q_positions=positions),
    cache=cache,
  )
  return out.logits[:, 0], out.cache


def decode_loop(
  model: Transformer,
  params,
  logits,
  cache,
  start_positions,
  rng,
  *,
  max_new_tokens: int,
  sampling: Sampling = DEFAULT_SAMPLING,
  stop_tokens: Sequence[int] = (),
  pad_id: int = 0,
) -> Generation:
  """Samples up to `max_new_tokens` per row from `logits [B, V]` (the prefill's), feeding each token
  back at `start_positions + t`; one `lax.while_loop`."""
  batch = logits.shape[0]
  stops = jnp.asarray(tuple(stop_tokens) or (-1,), jnp.int32)
  start_positions = jnp.asarray(start_positions, jnp.int32)

  def cond(carry):
    t, *_, done, _ = carry
    return (t < max_new_tokens) & ~jnp.all(done)

  def body(carry):
    t, logits, cache, tokens, log_probs, lengths, done, rng = carry
    token = sample_logits(jax.random.fold_in(rng, t), logits, sampling)
    log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], axis=-1)[:, 0]
    active = ~done
    token = jnp.where(active, token, pad_id)
    tokens = tokens.at[:, t].set(token)
    log_probs = log_probs.at[:, t].set(jnp.where(active, log_prob, 0.0))
    lengths = lengths + active
    done = done | (active & jnp.isin(token, stops))
    logits, cache = decode_step(model, params, token, start_positions + t, cache)
    return t + 1, logits, cache, tokens, log_probs, lengths, done, rng

  init = (
    jnp.int32(0),
    logits,
    cache,
    jnp.full((batch, max_new_tokens), pad_id, jnp.int32),
    jnp.zeros((batch, max_new_tokens), jnp.float32),
    jnp.zeros((batch,), jnp.int32),
    jnp.zeros((batch,), bool),
    rng,
  )
  _, _, _, tokens, log_probs, lengths, done, _ = jax.lax.while_loop(cond, body, init)
  return Generation(tokens, log_probs, lengths, done)


def _check_prompts(prompts, prompt_lengths) -> None:
  if np.ndim(prompts) != 2 or not jnp.issubdtype(jnp.asarray(prompts).dtype, jnp.integer):
    raise ValueError(
      f"decoding: prompts must be int [batch, length], got shape {np.shape(prompts)}"
    )
  if np.shape(prompt_lengths) != np.shape(prompts)[:1]:
    raise ValueError(
      f"decoding: prompt_lengths must have shape [batch]={np.shape(prompts)[:1]}, got "
      f"{np.shape(prompt_lengths)}"
    )
  try:
    lengths = np.asarray(prompt_lengths)
  except jax.errors.TracerArrayConversionError:
    return
  if lengths.min() < 1 or lengths.max() > np.shape(prompts)[1]:
    raise ValueError(
      f"decoding: prompt_lengths must be in 1..{np.shape(prompts)[1]}, got {lengths.tolist()}"
    )


@functools.partial(
  jax.jit,
  static_argnames=("model", "max_new_tokens", "max_len", "sampling", "stop_tokens", "pad_id"),
)
def _generate(
  model,
  params,
  prompts,
  prompt_lengths,
  rng,
  prefix_lengths,
  *,
  max_new_tokens,
  max_len,
  sampling,
  stop_tokens,
  pad_id,
):
  logits, cache = prefill(model, params, prompts, prompt_lengths, max_len, prefix_lengths)
  return decode_loop(
    model,
    params,
    logits,
    cache,
    prompt_lengths,
    rng,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    stop_tokens=stop_tokens,
    pad_id=pad_id,
  )


def generate(
  model: Transformer,
  params,
  prompts,
  prompt_lengths,
  rng,
  *,
  max_new_tokens: int,
  max_len: int | None = None,
  sampling: Sampling = DEFAULT_SAMPLING,
  stop_tokens: Sequence[int] = (),
  pad_id: int = 0,
  prefix_lengths=None,
) -> Generation:
  """Continues right-padded `prompts [B, P]` (lengths `prompt_lengths [B]`) by up to
  `max_new_tokens`; the cache holds `max_len >= P + max_new_tokens` slots (default equal)."""
  _check_prompts(prompts, prompt_lengths)
  length = np.shape(prompts)[1]
  max_len = length + max_new_tokens if max_len is None else max_len
  if max_len < length + max_new_tokens:
    raise ValueError(
      f"decoding: max_len={max_len} is shorter than the prompts' {length} + max_new_tokens="
      f"{max_new_tokens}"
    )
  return _generate(
    model,
    params,
    jnp.asarray(prompts, jnp.int32),
    jnp.asarray(prompt_lengths, jnp.int32),
    rng,
    prefix_lengths,
    max_new_tokens=max_new_tokens,
    max_len=max_len,
    sampling=Sampling(*sampling),
    stop_tokens=tuple(int(t) for t in stop_tokens),
    pad_id=pad_id,
  )


# ---------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------


def concatenate(prompts, prompt_lengths, continuations, continuation_lengths, pad_id: int = 0):
  """Row b: its prompt, then its continuation, then `pad_id`s; `[B, P + C]`."""
  prompt_len, cont_len = prompts.shape[1], continuations.shape[1]
  index = jnp.arange(prompt_len + cont_len)[None]
  plen = jnp.asarray(prompt_lengths, jnp.int32)[:, None]
  clen = jnp.asarray(continuation_lengths, jnp.int32)[:, None]
  from_prompt = jnp.take_along_axis(prompts, jnp.clip(index, 0, prompt_len - 1), axis=1)
  from_cont = jnp.take_along_axis(continuations, jnp.clip(index - plen, 0, cont_len - 1), axis=1)
  sequence = jnp.where(index < plen, from_prompt, from_cont)
  return jnp.where(index < plen + clen, sequence, pad_id).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("model",))
def _score(model, params, prompts, prompt_lengths, continuations, continuation_lengths, prefix):
  sequence = concatenate(prompts, prompt_lengths, continuations, continuation_lengths)
  logits = model.apply(params, sequence, mask=_prompt_mask(prefix)).logits
  log_probs = jax.nn.log_softmax(logits[:, :-1])
  token_log_probs = jnp.take_along_axis(log_probs, sequence[:, 1:, None], axis=-1)[..., 0]
  cont_len = continuations.shape[1]
  index = jnp.asarray(prompt_lengths, jnp.int32)[:, None] - 1 + jnp.arange(cont_len)[None]
  per_token = jnp.take_along_axis(token_log_probs, index, axis=1)
  valid = jnp.arange(cont_len)[None] < jnp.asarray(continuation_lengths)[:, None]
  per_token = jnp.where(valid, per_token, 0.0)
  return per_token.sum(axis=1), per_token


def score(
  model: Transformer,
  params,
  prompts,
  continuations,
  *,
  prompt_lengths=None,
  continuation_lengths=None,
  prefix_lengths=None,
) -> tuple[jax.Array, jax.Array]:
  """`log p(continuation | prompt)` per row `[B]` and per continuation token `[B, C]` (0 past a
  row's length), from one forward. Both inputs are right-padded; lengths default to full."""
  prompts, continuations = jnp.asarray(prompts, jnp.int32), jnp.asarray(continuations, jnp.int32)
  batch = np.shape(prompts)[0]
  if prompt_lengths is None:
    prompt_lengths = np.full((batch,), np.shape(prompts)[1], np.int32)
  if continuation_lengths is None:
    continuation_lengths = np.full((batch,), np.shape(continuations)[1], np.int32)
  _check_prompts(prompts, prompt_lengths)
  if np.ndim(continuations) != 2 or np.shape(continuations)[0] != batch:
    raise ValueError(
      f"decoding: continuations must be int [batch={batch}, length], got {np.shape(continuations)}"
    )
  if np.shape(continuation_lengths) != (batch,):
    raise ValueError(
      f"decoding: continuation_lengths must have shape [{batch}], got "
      f"{np.shape(continuation_lengths)}"
    )
  return _score(
    model,
    params,
    prompts,
    jnp.asarray(prompt_lengths, jnp.int32),
    continuations,
    jnp.asarray(continuation_lengths, jnp.int32),
    prefix_lengths,
  )
