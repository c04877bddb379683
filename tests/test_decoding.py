"""KV-cached decoding against the full forward, sampling filters, stop tokens and scoring."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import decoding
from core.nn import attention
from core.nn.transformer import Transformer

VOCAB = 17
MODEL = Transformer(vocab_size=VOCAB, width=32, depth=2, num_heads=4, num_kv_heads=2)
PROMPTS = np.array([[1, 5, 6, 7, 8, 9], [1, 3, 0, 0, 0, 0], [1, 4, 4, 2, 0, 0]], np.int32)
LENGTHS = np.array([6, 2, 4], np.int32)


@functools.lru_cache(maxsize=1)
def params():
  return jax.jit(MODEL.init)(jax.random.key(0), jnp.asarray(PROMPTS))


@jax.jit
def full_logits(params, tokens, prefix=None):
  mask = attention.causal_mask() if prefix is None else attention.prefix_lm_mask(prefix)
  return MODEL.apply(params, tokens, mask=mask).logits


@pytest.mark.parametrize(
  "prefix", [None, pytest.param((3, 1, 2), marks=pytest.mark.slow)], ids=["causal", "prefix_lm"]
)
def test_cached_decoding_equals_the_full_forward_at_every_position(prefix):
  """Prefill right-padded prompts, then feed a fixed continuation token by token: the cached logits
  at each step equal the full forward's logits at that position of the unpadded sequence."""
  continuation = np.array([[3, 11, 12, 2], [7, 7, 8, 9], [10, 1, 15, 16]], np.int32)
  prefix_lengths = None if prefix is None else jnp.asarray(prefix)
  step = jax.jit(functools.partial(decoding.decode_step, MODEL))
  logits, cache = jax.jit(functools.partial(decoding.prefill, MODEL, max_len=12))(
    params(), jnp.asarray(PROMPTS), jnp.asarray(LENGTHS), prefix_lengths=prefix_lengths
  )
  cached = [logits]
  for t in range(continuation.shape[1]):
    logits, cache = step(params(), jnp.asarray(continuation[:, t]), jnp.asarray(LENGTHS + t), cache)
    cached.append(logits)
  for row in range(len(PROMPTS)):
    sequence = np.concatenate([PROMPTS[row, : LENGTHS[row]], continuation[row]])[None]
    row_prefix = None if prefix is None else jnp.asarray(prefix[row : row + 1])
    full = full_logits(params(), jnp.asarray(sequence), row_prefix)[0]
    expected = full[LENGTHS[row] - 1 :]
    got = jnp.stack([c[row] for c in cached])
    chex.assert_trees_all_close(got, expected, atol=2e-5, rtol=2e-5)


def test_greedy_decoding_is_the_argmax_of_the_full_forward():
  out = decoding.generate(
    MODEL, params(), PROMPTS, LENGTHS, jax.random.key(1), max_new_tokens=7, sampling=decoding.GREEDY
  )
  chex.assert_shape(out.tokens, (3, 7))
  np.testing.assert_array_equal(out.lengths, [7, 7, 7])
  for row in range(len(PROMPTS)):
    sequence = np.concatenate([PROMPTS[row, : LENGTHS[row]], out.tokens[row]])[None]
    logits = full_logits(params(), jnp.asarray(sequence))[0, LENGTHS[row] - 1 : -1]
    np.testing.assert_array_equal(np.argmax(logits, -1), out.tokens[row])
    log_probs = jax.nn.log_softmax(logits)[np.arange(7), out.tokens[row]]
    chex.assert_trees_all_close(out.log_probs[row], log_probs, atol=2e-5)


def test_decoding_is_one_while_loop():
  jaxpr = jax.make_jaxpr(
    lambda p: decoding._generate(
      MODEL,
      p,
      jnp.asarray(PROMPTS),
      jnp.asarray(LENGTHS),
      jax.random.key(0),
      None,
      max_new_tokens=5,
      max_len=11,
      sampling=decoding.GREEDY,
      stop_tokens=(),
      pad_id=0,
    )
  )(params())
  (jitted,) = [e for e in jaxpr.eqns if e.primitive.name in ("jit", "pjit")]
  inner = jitted.params["jaxpr"].jaxpr
  loops = [e for e in inner.eqns if e.primitive.name in ("while", "scan")]
  assert len(loops) == 1 and loops[0].primitive.name == "while"


def test_stop_tokens_end_each_row_and_pad_after():
  greedy = decoding.generate(
    MODEL, params(), PROMPTS, LENGTHS, jax.random.key(1), max_new_tokens=6, sampling=decoding.GREEDY
  )
  stop = int(greedy.tokens[0, 2])
  out = decoding.generate(
    MODEL,
    params(),
    PROMPTS,
    LENGTHS,
    jax.random.key(1),
    max_new_tokens=6,
    sampling=decoding.GREEDY,
    stop_tokens=(stop,),
    pad_id=0,
  )
  for row in range(len(PROMPTS)):
    tokens = np.asarray(greedy.tokens[row])
    hits = np.flatnonzero(tokens == stop)
    length = hits[0] + 1 if len(hits) else 6
    assert out.lengths[row] == length and bool(out.done[row]) == bool(len(hits))
    np.testing.assert_array_equal(out.tokens[row, :length], tokens[:length])
    assert np.all(out.tokens[row, length:] == 0) and np.all(out.log_probs[row, length:] == 0)
  assert out.lengths[0] <= 3 and out.done[0]


@pytest.mark.slow
def test_top_k_and_top_p_never_sample_outside_the_allowed_set():
  logits = jnp.log(jnp.array([[0.4, 0.3, 0.15, 0.1, 0.05], [0.05, 0.05, 0.1, 0.2, 0.6]]))
  rngs = jax.random.split(jax.random.key(0), 400)

  def draws(sampling):
    return np.asarray(jax.vmap(lambda r: decoding.sample_logits(r, logits, sampling))(rngs))

  top_k = draws(decoding.Sampling(1.0, top_k=2))
  assert set(top_k[:, 0]) == {0, 1} and set(top_k[:, 1]) == {3, 4}
  top_p = draws(decoding.Sampling(1.0, top_p=0.6))  # nucleus: {0, 1} (0.7) and {4} (0.6)
  assert set(top_p[:, 0]) == {0, 1} and set(top_p[:, 1]) == {4}
  both = draws(decoding.Sampling(2.0, top_k=3, top_p=0.99))
  assert set(both[:, 0]) <= {0, 1, 2} and set(both[:, 1]) <= {2, 3, 4}
  filtered = decoding.filter_logits(logits, top_k=1)
  np.testing.assert_array_equal(np.isfinite(filtered), [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
  sampled = decoding.generate(
    MODEL,
    params(),
    PROMPTS,
    LENGTHS,
    jax.random.key(2),
    max_new_tokens=8,
    sampling=decoding.Sampling(1.0, top_k=1),
  )
  greedy = decoding.generate(
    MODEL, params(), PROMPTS, LENGTHS, jax.random.key(2), max_new_tokens=8, sampling=decoding.GREEDY
  )
  np.testing.assert_array_equal(sampled.tokens, greedy.tokens)


def test_score_equals_summed_log_probs_of_the_full_forward_and_of_sampling():
  out = decoding.generate(
    MODEL,
    params(),
    PROMPTS,
    LENGTHS,
    jax.random.key(3),
    max_new_tokens=5,
    sampling=decoding.Sampling(1.3, top_p=0.9),
    stop_tokens=(2,),
  )
  total, per_token = decoding.score(
    MODEL, params(), PROMPTS, out.tokens, prompt_lengths=LENGTHS, continuation_lengths=out.lengths
  )
  chex.assert_trees_all_close(total, out.log_probs.sum(1), atol=1e-4)
  chex.assert_trees_all_close(per_token, out.log_probs, atol=1e-4)
  for row in range(len(PROMPTS)):
    n = int(out.lengths[row])
    sequence = np.concatenate([PROMPTS[row, : LENGTHS[row]], out.tokens[row, :n]])[None]
    log_probs = jax.nn.log_softmax(full_logits(params(), jnp.asarray(sequence))[0])
    expected = sum(
      float(log_probs[LENGTHS[row] - 1 + j, sequence[0, LENGTHS[row] + j]]) for j in range(n)
    )
    assert float(total[row]) == pytest.approx(expected, abs=1e-4)


def test_bad_decoding_inputs_are_named():
  with pytest.raises(ValueError, match=r"prompt_lengths must be in 1..6, got \[0, 2, 4\]"):
    decoding.generate(MODEL, params(), PROMPTS, [0, 2, 4], jax.random.key(0), max_new_tokens=2)
  with pytest.raises(
    ValueError, match="max_len=7 is shorter than the prompts' 6 \\+ max_new_tokens=2"
  ):
    decoding.generate(
      MODEL, params(), PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=2, max_len=7
    )
  with pytest.raises(ValueError, match=r"prompt_lengths must have shape \[batch\]=\(3,\)"):
    decoding.generate(MODEL, params(), PROMPTS, LENGTHS[:2], jax.random.key(0), max_new_tokens=2)
  with pytest.raises(ValueError, match=r"continuations must be int \[batch=3, length\]"):
    decoding.score(MODEL, params(), PROMPTS, np.zeros((2, 3), np.int32))


def test_decode_benchmark_runs_and_both_decoders_agree():
  from experiments import bench_decode

  results = bench_decode.run(
    [24], new_tokens=4, batch=2, width=16, depth=1, heads=2, vocab=12, repeats=1
  )
  row = results[24]
  assert row["same_tokens"] and row["cached_tokens_per_s"] > 0 and row["uncached_tokens_per_s"] > 0
  assert set(row["attention_ms"]) == set(attention.available_implementations())
  assert "ratio grows with L" in bench_decode.report(results, 4)
