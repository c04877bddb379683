r"""Does the KV cache pay? Decode tokens/s with the cache vs re-running the full forward per token.

  python experiments/bench_decode.py [--lengths=128,512,2048] [--new_tokens=32] [--width=64]
  python experiments/bench_decode.py --measures=attention --batch=8 --width=256 --lengths=512,2048

For each sequence length L, a prompt of `L - new_tokens` tokens is continued by `new_tokens` greedy
tokens two ways, each as one jitted loop:
  cached    `core.decoding`: prefill once (not timed), then one token per step attending over the
            KV cache of L slots (`decode_loop`);
  uncached  a fixed `[B, L]` buffer; every step re-runs the full causal forward over all L positions,
            reads the logits at the last filled position and writes the next token.
It prints both rates and their ratio (cached / uncached) measured in the same run, so the ratio does
not depend on the machine's speed; it should exceed 1 and grow with L (a cached step costs O(L)
attention, an uncached one O(L^2) attention plus L tokens through the MLPs). Then the attention
implementations available on the backend (`core.nn.attention`) side by side on causal self-attention
over L tokens, in milliseconds. Every time is the fastest of `--repeats` compiled calls: on a shared
machine the minimum is the least disturbed by other work.
"""

from __future__ import annotations

import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags, logging

_LENGTHS = flags.DEFINE_list("lengths", ["128", "512", "2048"], "Sequence lengths L.")
_NEW = flags.DEFINE_integer("new_tokens", 32, "Tokens generated per measurement.")
_BATCH = flags.DEFINE_integer("batch", 1, "Sequences decoded together.")
_WIDTH = flags.DEFINE_integer("width", 64, "Model width.")
_DEPTH = flags.DEFINE_integer("depth", 2, "Blocks.")
_HEADS = flags.DEFINE_integer("heads", 4, "Attention heads.")
_VOCAB = flags.DEFINE_integer("vocab", 64, "Vocabulary size.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per measurement (the fastest counts).")
_MEASURES = flags.DEFINE_list(
  "measures", ["decode", "attention"], "Which of decode, attention to time."
)


def fastest_seconds(fn, *args, repeats: int) -> float:
  """The fastest of `repeats` calls of `fn(*args)`, after one call that compiles it."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return min(times)


def uncached_decode(model, params, buffer, start: int, new_tokens: int):
  """Greedy tokens at `start .. start + new_tokens - 1` of `buffer [B, L]`, one full forward each."""
  from core.nn import attention

  def body(t, buffer):
    logits = model.apply(params, buffer, mask=attention.causal_mask()).logits
    last = jax.lax.dynamic_index_in_dim(logits, start + t - 1, axis=1, keepdims=False)
    token = jnp.argmax(last, axis=-1).astype(buffer.dtype)
    return jax.lax.dynamic_update_index_in_dim(buffer, token, start + t, axis=1)

  return jax.lax.fori_loop(0, new_tokens, body, buffer)


def measure_decode(model, params, length: int, new_tokens: int, batch: int, repeats: int) -> dict:
  """Tokens/s of cached and uncached greedy decoding of `new_tokens` tokens ending at length L."""
  from core import decoding

  start = length - new_tokens
  tokens = jax.random.randint(jax.random.key(length), (batch, length), 5, model.vocab_size)
  lengths = jnp.full((batch,), start, jnp.int32)
  logits, cache = jax.jit(functools.partial(decoding.prefill, model, max_len=length))(
    params, tokens[:, :start], lengths
  )
  cached = jax.jit(
    functools.partial(
      decoding.decode_loop, model, max_new_tokens=new_tokens, sampling=decoding.GREEDY
    )
  )
  uncached = jax.jit(functools.partial(uncached_decode, model, start=start, new_tokens=new_tokens))
  rng = jax.random.key(0)
  cached_s = fastest_seconds(cached, params, logits, cache, lengths, rng, repeats=repeats)
  uncached_s = fastest_seconds(uncached, params, tokens, repeats=repeats)
  generated = batch * new_tokens
  same = jnp.array_equal(
    cached(params, logits, cache, lengths, rng).tokens, uncached(params, tokens)[:, start:]
  )
  return {
    "cached_tokens_per_s": generated / cached_s,
    "uncached_tokens_per_s": generated / uncached_s,
    "ratio": uncached_s / cached_s,
    "same_tokens": bool(same),
  }


def measure_attention(model, length: int, batch: int, repeats: int) -> dict[str, float]:
  """Milliseconds of causal self-attention over L tokens per available implementation."""
  from core.nn import attention

  keys = jax.random.split(jax.random.key(1), 3)
  shape = (batch, length, model.num_heads, model.head_dim)
  q, k, v = (jax.random.normal(key, shape, model.dtype) for key in keys)
  times = {}
  for name in attention.available_implementations():
    fn = jax.jit(
      lambda q, k, v, name=name: attention.attention(
        q, k, v, attention.causal_mask(), implementation=name
      )
    )
    try:
      times[name] = 1e3 * fastest_seconds(fn, q, k, v, repeats=repeats)
    except ValueError as error:  # e.g. cuDNN refuses float32: reported as nan
      logging.warning("attention %s at L=%d: %s", name, length, error)
      times[name] = float("nan")
  return times


def run(
  lengths,
  new_tokens: int,
  batch: int,
  width: int,
  depth: int,
  heads: int,
  vocab: int,
  repeats: int,
  dtype: str = "float32",
  measures=("decode", "attention"),
):
  from core.nn import attention
  from core.nn.transformer import Transformer

  model = Transformer(
    vocab_size=vocab, width=width, depth=depth, num_heads=heads, dtype=jnp.dtype(dtype)
  )
  params = jax.jit(model.init)(
    jax.random.key(0), jnp.zeros((1, 8), jnp.int32), mask=attention.causal_mask()
  )
  results = {}
  for length in lengths:
    results[length] = {}
    if "decode" in measures:
      results[length].update(measure_decode(model, params, length, new_tokens, batch, repeats))
    if "attention" in measures:
      results[length]["attention_ms"] = measure_attention(model, length, batch, repeats)
  return results


def report(results: dict, new_tokens: int) -> str:
  first = next(iter(results.values()))
  lines = [f"backend: {jax.default_backend()}"]
  if "ratio" in first:
    lines += [
      f"{new_tokens} greedy tokens per measurement",
      "| L | cached tok/s | uncached tok/s | ratio (cached/uncached) | same tokens |",
      "|---|---|---|---|---|",
    ]
    for length, r in results.items():
      lines.append(
        f"| {length} | {r['cached_tokens_per_s']:.0f} | {r['uncached_tokens_per_s']:.1f} | "
        f"{r['ratio']:.1f} | {r['same_tokens']} |"
      )
  if "attention_ms" not in first:
    return "\n".join(lines)
  names = list(first["attention_ms"])
  lines += [
    "",
    "| L | " + " | ".join(f"{n} ms" for n in names) + " |",
    "|---|" + "---|" * len(names),
  ]
  for length, r in results.items():
    lines.append(f"| {length} | " + " | ".join(f"{r['attention_ms'][n]:.3f}" for n in names) + " |")
  if "ratio" not in first:
    return "\n".join(lines)
  ratios = [r["ratio"] for r in results.values()]
  grows = all(b > a for a, b in zip(ratios, ratios[1:], strict=False))
  lines.append(f"\ncache wins at every L: {min(ratios) > 1}; ratio grows with L: {grows}")
  return "\n".join(lines)


def main(argv):
  del argv
  from experiments import runtime

  runtime.setup()
  lengths = [int(x) for x in _LENGTHS.value]
  results = run(
    lengths,
    _NEW.value,
    _BATCH.value,
    _WIDTH.value,
    _DEPTH.value,
    _HEADS.value,
    _VOCAB.value,
    _REPEATS.value,
    _DTYPE.value,
    _MEASURES.value,
  )
  print(report(results, _NEW.value))


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  app.run(main)
