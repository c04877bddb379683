"""A causal language model on the shared transformer core, the demo of `core/`'s sequence stack.

Claim checked: next-token training of `core.nn.transformer.Transformer` on multi-source Markov text
(`core/data/text.py`) approaches the best possible perplexity of that corpus, which is exact: the
Bayes-optimal predictor's loss `-log sum_s w_s p_s(x) / L` on the same validation tokens
(`best_val_loss`), above the mixture entropy rate `sum_s w_s H_s` (`entropy_rate`). Samples drawn
with the KV-cached decoder (`core/decoding.py`) should have a per-token likelihood under the true
chains close to that of real data (`samples_true_nll` vs `best_val_loss`).

One phase, `train`:
  data       `MarkovText` batches `{"tokens": [B, L + 1], "source": [B]}`, a pure function of the
             step; or windows of a character-level tfds text (`config.data.name`, e.g.
             tiny_shakespeare) read from `config.data.data_dir`.
  step       AdamW on the mean next-token cross-entropy under a causal mask.
  evaluate   val_loss / val_perplexity on a fixed validation set; for Markov data the exact best
             loss and perplexity, the entropy rates, the loss per source; samples (token ids) from
             `eval.prompt_length` validation tokens; `tokens_per_second` = tokens generated per second
             by the KV-cached decoder (compiled, batch `eval.num_samples`),
             `scoring_tokens_per_second` = validation tokens scored per second.
  artifacts  `samples.png`: the decoded samples as text.

Choices: no EMA (the loss is smooth enough at this scale); one tokenizer per corpus (Markov symbols
read as pseudo-words, `WordTokenizer`; tfds text `CharTokenizer` fit on the training split).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import textwrap
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from core import decoding, optim
from core.data import batching, text, tokenizers
from core.nn import attention
from core.nn.transformer import Transformer
from methods.base import (
  ConfigError,
  Method,
  Phase,
  cached_per_config,
  require,
  require_choice,
  require_positive_int,
  require_prepared_tfds,
)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
POSITIVE_FIELDS = (
  "model.width",
  "model.depth",
  "model.num_heads",
  "model.max_len",
  "data.seq_len",
  "eval.batch_size",
  "eval.num_batches",
  "eval.num_samples",
  "eval.prompt_length",
  "eval.sample_length",
)


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Corpus:
  train: object  # a DataSource of {"tokens": int32 [B, L + 1], ...}
  val_tokens: np.ndarray  # int32 [N, L + 1]
  tokenizer: tokenizers.Tokenizer
  sources: text.MarkovSources | None = None  # Markov data only
  val_source: np.ndarray | None = None  # [N] Markov data only


def markov_corpus(config: ml_collections.ConfigDict) -> Corpus:
  data = config.data
  sources = text.markov_sources(
    data.vocab_size, data.entropy_fractions, data.source_weights, data.source_seed
  )
  train = text.MarkovText(sources, data.seq_len, config.batch_size, config.seed, split=0)
  num_val = config.eval.batch_size * config.eval.num_batches
  val = text.MarkovText(sources, data.seq_len, num_val, config.seed, split=1).generate(0)
  tokenizer = tokenizers.WordTokenizer(text.symbol_words(data.vocab_size))
  return Corpus(train, val["tokens"], tokenizer, sources, val["source"])


def read_tfds_text(name: str, split: str, data_dir: str, max_chars: int) -> str:
  """The `text` fields of a prepared tfds split, joined by newlines (never downloads)."""
  import tensorflow_datasets as tfds

  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
  except Exception as error:  # tfds raises several types for a missing or unprepared dataset
    raise ConfigError(
      f"config.data.data_dir: tfds dataset {name!r} split {split!r} is not prepared for random "
      f"access in {data_dir or 'the default data_dir'!r} (prepare it with file_format="
      f"array_record): {type(error).__name__}: {str(error).splitlines()[0]}"
    ) from None
  pieces, total = [], 0
  for i in range(len(source)):
    value = source[i]["text"]
    piece = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    pieces.append(piece)
    total += len(piece) + 1
    if max_chars and total >= max_chars:
      break
  joined = "\n".join(pieces)
  return joined[:max_chars] if max_chars else joined


def _window_batches(ids: np.ndarray, length: int, batch_size: int, seed: int):
  """Random windows of `length + 1` tokens, the offsets drawn from `(seed, step)`."""

  def generate(step: int) -> dict[str, np.ndarray]:
    starts = np.random.default_rng([seed, step]).integers(0, len(ids) - length, batch_size)
    return {"tokens": np.stack([ids[s : s + length + 1] for s in starts]).astype(np.int32)}

  return batching.GeneratedBatches(generate, batch_size)


def tfds_corpus(config: ml_collections.ConfigDict) -> Corpus:
  data, length = config.data, config.data.seq_len
  train_text = read_tfds_text(data.name, data.train_split, data.data_dir, data.max_chars)
  val_text = read_tfds_text(data.name, data.eval_split, data.data_dir, data.max_chars)
  tokenizer = tokenizers.CharTokenizer.fit([train_text])
  train_ids = np.asarray(tokenizer.encode(train_text), np.int32)
  val_ids = np.asarray(tokenizer.encode(val_text), np.int32)
  windows = min((len(val_ids) - 1) // length, config.eval.batch_size * config.eval.num_batches)
  for split, ids, needed in (("train", train_ids, length + 1), ("eval", val_ids, length + 1)):
    require(
      len(ids) > needed,
      "data.seq_len",
      f"{length} does not fit the {len(ids)} tokens of the {split} split",
    )
  val = np.stack([val_ids[i * length : i * length + length + 1] for i in range(max(windows, 1))])
  return Corpus(_window_batches(train_ids, length, config.batch_size, config.seed), val, tokenizer)


@cached_per_config(maxsize=4)
def load_corpus(config: ml_collections.ConfigDict) -> Corpus:
  return markov_corpus(config) if config.data.name == "markov" else tfds_corpus(config)


# ---------------------------------------------------------------------------------------------------
# Model and step
# ---------------------------------------------------------------------------------------------------


def make_model(config: ml_collections.ConfigDict, vocab_size: int) -> Transformer:
  m = config.model
  return Transformer(
    vocab_size=vocab_size,
    width=m.width,
    depth=m.depth,
    num_heads=m.num_heads,
    num_kv_heads=m.num_kv_heads or None,
    mlp=m.mlp,
    mlp_hidden=m.mlp_hidden or None,
    tie_embeddings=m.tie_embeddings,
    attention_implementation=m.attention or None,
    remat=m.remat,
    dtype=DTYPES[m.dtype],
  )


def optimizer(config) -> optax.GradientTransformation:
  """AdamW on a warmup-cosine schedule (warmup capped at half the run), global-norm clipping."""
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip, o.weight_decay, b2=0.95)


def init_state(config, model: Transformer, rng, inputs=None):
  del inputs
  tokens = jnp.zeros((1, config.data.seq_len), jnp.int32)
  params = model.init(rng, tokens, mask=attention.causal_mask())
  return {"params": params, "opt_state": optimizer(config).init(params)}


def sequence_losses(model: Transformer, params, tokens) -> jax.Array:
  """Mean next-token cross-entropy of each sequence of `tokens [B, L + 1]`, in nats: `[B]`."""
  logits = model.apply(params, tokens[:, :-1], mask=attention.causal_mask()).logits
  return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(axis=1)


def train_step(config, model, state, batch, rng):
  del rng

  def loss_fn(params):
    return sequence_losses(model, params, batch["tokens"]).mean()

  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  return {"params": params, "opt_state": opt_state}, {
    "loss": loss,
    "grad_norm": optax.tree.norm(grads),
  }


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=4)
def _losses_fn(config, vocab_size: int):
  return jax.jit(functools.partial(sequence_losses, make_model(config, vocab_size)))


def validation_losses(config, corpus: Corpus, params) -> tuple[np.ndarray, float]:
  """Per-sequence validation losses `[N]` and scoring throughput (tokens/s, compiled batches)."""
  losses_fn = _losses_fn(config, corpus.tokenizer.vocab_size)
  size, tokens = config.eval.batch_size, corpus.val_tokens
  out, seconds, scored = [], 0.0, 0
  for i, start in enumerate(range(0, len(tokens), size)):
    chunk = tokens[start : start + size]
    begin = time.perf_counter()
    out.append(np.asarray(losses_fn(params, jnp.asarray(chunk))))
    if i > 0 or len(tokens) <= size:  # the first call compiles
      seconds += time.perf_counter() - begin
      scored += chunk.size - len(chunk)
  return np.concatenate(out), scored / max(seconds, 1e-9)


def draw_samples(
  config, corpus: Corpus, params, rng, timed: bool = True
) -> tuple[decoding.Generation, np.ndarray, float]:
  """`(generation, prompts, tokens generated per second)`; with `timed`, a second (compiled) call is
  timed, else the rate is NaN."""
  prompts = corpus.val_tokens[: config.eval.num_samples, : config.eval.prompt_length]
  lengths = np.full((len(prompts),), config.eval.prompt_length, np.int32)
  sampling = decoding.Sampling(config.eval.temperature, config.eval.top_k, config.eval.top_p)
  generate = functools.partial(
    decoding.generate,
    make_model(config, corpus.tokenizer.vocab_size),
    params,
    prompts,
    lengths,
    rng,
    max_new_tokens=config.eval.sample_length,
    max_len=config.model.max_len,
    sampling=sampling,
    stop_tokens=(tokenizers.EOS_ID,),
  )
  generation = jax.block_until_ready(generate())
  if not timed:
    return generation, prompts, math.nan
  begin = time.perf_counter()
  generation = jax.block_until_ready(generate())
  seconds = time.perf_counter() - begin
  return generation, prompts, float(np.sum(generation.lengths)) / max(seconds, 1e-9)


def sample_texts(corpus: Corpus, prompts: np.ndarray, generation: decoding.Generation) -> list[str]:
  tokens = np.concatenate([prompts, np.asarray(generation.tokens)], axis=1)
  lengths = prompts.shape[1] + np.asarray(generation.lengths)
  return corpus.tokenizer.decode_batch(tokens, lengths)


def markov_results(config, corpus: Corpus, losses: np.ndarray, generation) -> dict:
  """Exact best losses on the validation tokens, per-source losses, and the samples' true NLL."""
  sources, length = corpus.sources, config.data.seq_len
  symbols = corpus.val_tokens[:, 1:] - len(tokenizers.SPECIAL_TOKENS)
  best = float(-sources.mixture_log_likelihood(symbols).mean() / length)
  per_source = [float(losses[corpus.val_source == s].mean()) for s in range(sources.num_sources)]
  results = {
    "best_val_loss": best,
    "best_val_perplexity": math.exp(best),
    "val_excess_loss": float(losses.mean()) - best,
    "entropy_rate": sources.mixture_entropy_rate,
    "entropy_rate_perplexity": math.exp(sources.mixture_entropy_rate),
    "val_loss_per_source": np.nan_to_num(np.asarray(per_source)),
    "entropy_rate_per_source": sources.entropy_rates,
  }
  if config.eval.prompt_length == 1:  # samples start at <bos>: whole chains
    sampled = np.asarray(generation.tokens) - len(tokenizers.SPECIAL_TOKENS)
    valid = np.all((sampled >= 0) & (sampled < sources.vocab_size), axis=1)
    results["samples_valid_fraction"] = float(valid.mean())
    if valid.any():
      nll = -sources.mixture_log_likelihood(sampled[valid]) / sampled.shape[1]
      results["samples_true_nll"] = float(nll.mean())
  return results


def evaluate(config, state, rng) -> dict:
  corpus, params = load_corpus(config), state["params"]
  losses, scoring_rate = validation_losses(config, corpus, params)
  generation, prompts, decode_rate = draw_samples(
    config, corpus, params, jax.random.fold_in(rng, 1)
  )
  for line in sample_texts(corpus, prompts, generation)[:4]:
    logging.info("sample: %s", line[:200])
  val_loss = float(losses.mean())
  results = {
    "val_loss": val_loss,
    "val_perplexity": math.exp(val_loss),
    "tokens_per_second": decode_rate,
    "scoring_tokens_per_second": scoring_rate,
    "samples": np.asarray(generation.tokens),
  }
  if corpus.sources is not None:
    results.update(markov_results(config, corpus, losses, generation))
  return results


def sample_figure(config, state, rng) -> dict:
  """`samples.png`: the decoded samples (the same draws as `evaluate`'s)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  corpus = load_corpus(config)
  generation, prompts, _ = draw_samples(config, corpus, state["params"], rng, timed=False)
  lines = [
    textwrap.shorten(t.replace("\n", " / "), 150) for t in sample_texts(corpus, prompts, generation)
  ]
  fig = plt.figure(figsize=(11, 0.35 * len(lines) + 0.6))
  fig.text(0.01, 0.98, "\n".join(lines), va="top", family="monospace", fontsize=8)
  return {"samples": fig}


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  corpus = load_corpus(config)
  model = make_model(config, corpus.tokenizer.vocab_size)
  return [
    Phase(
      name="train",
      num_steps=config.steps,
      init=functools.partial(init_state, config, model),
      step=functools.partial(train_step, config, model),
      data=lambda inputs: corpus.train,
      evaluate=lambda state, rng, inputs: evaluate(config, state, rng),
      artifacts=lambda state, rng, inputs: sample_figure(config, state, rng),
    )
  ]


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


def validate(config: ml_collections.ConfigDict) -> None:
  m, data, ev = config.model, config.data, config.eval
  for field in POSITIVE_FIELDS:
    require_positive_int(config, field)
  require(
    m.width % m.num_heads == 0, "model.num_heads", f"{m.num_heads} must divide width {m.width}"
  )
  require(
    (m.width // m.num_heads) % 2 == 0,
    "model.num_heads",
    f"head dim width/num_heads = {m.width // m.num_heads} must be even (RoPE)",
  )
  kv_heads = m.num_kv_heads or m.num_heads
  require(
    kv_heads > 0 and m.num_heads % kv_heads == 0,
    "model.num_kv_heads",
    f"{m.num_kv_heads} must divide num_heads {m.num_heads} (0 = num_heads)",
  )
  require(m.mlp_hidden >= 0, "model.mlp_hidden", f"must be >= 0, got {m.mlp_hidden}")
  require_choice(config, "model.mlp", ("swiglu", "gelu"))
  require_choice(config, "model.dtype", tuple(DTYPES))
  require_choice(config, "model.attention", ("",) + attention.available_implementations())
  require(
    m.max_len >= data.seq_len,
    "model.max_len",
    f"{m.max_len} is shorter than data.seq_len {data.seq_len}",
  )
  require(
    ev.prompt_length + ev.sample_length <= m.max_len,
    "eval.sample_length",
    f"prompt_length {ev.prompt_length} + sample_length {ev.sample_length} exceed model.max_len "
    f"{m.max_len} (the KV cache)",
  )
  require(ev.prompt_length <= data.seq_len, "eval.prompt_length", "must be <= data.seq_len")
  require(
    ev.num_samples <= ev.batch_size * ev.num_batches, "eval.num_samples", "exceeds the val set"
  )
  require(ev.temperature >= 0, "eval.temperature", f"must be >= 0, got {ev.temperature}")
  require(0 < ev.top_p <= 1, "eval.top_p", f"must be in (0, 1], got {ev.top_p}")
  require(ev.top_k >= 0, "eval.top_k", f"must be >= 0, got {ev.top_k}")
  if data.name == "markov":
    _validate_markov(data)
  else:
    require_prepared_tfds(config, "data.data_dir", data.name)


def _validate_markov(data) -> None:
  require(
    isinstance(data.vocab_size, int) and data.vocab_size >= 2,
    "data.vocab_size",
    f"must be an int >= 2, got {data.vocab_size!r}",
  )
  fractions = tuple(data.entropy_fractions)
  require(len(fractions) > 0, "data.entropy_fractions", "needs one entry per source")
  require(
    all(0 < f < 1 for f in fractions),
    "data.entropy_fractions",
    f"each must be in (0, 1), got {fractions}",
  )
  weights = tuple(data.source_weights)
  require(
    not weights
    or (len(weights) == len(fractions) and all(w >= 0 for w in weights) and sum(weights) > 0),
    "data.source_weights",
    f"must be () or {len(fractions)} non-negative weights, got {weights}",
  )


METHOD = Method(name="lm", phases=phases, validate=validate)
