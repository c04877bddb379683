"""The searches' data domains and proxy models: generated Markov text, digits, tokenised domains.

A `Task` gives every phase the same interface: `K` named sources, a per-example loss of the shared
transformer (`core/nn/transformer.py`), uniform per-source (stratified) batches, batches drawn from
a mixture, the target's validation stream (the search's feedback) and its held-out test set.

  markov  `core/data/text.py`'s `mixture_search_sources`: 3 relevant chains, noise, adversarial and
          irrelevant chains over `data.vocab_size` symbols; the target mixes the relevant ones by
          `data.target_weights` (`w*`, the known optimum). The proxy is the shared `Transformer` as
          a causal LM; at `model.depth = 0` it is the context-1 (bigram) model whose ideal loss on
          any mixture is exact (`text.bigram_cross_entropy`).
  digits  `core/data/mixture_sources.py`: clean, two noisy-label, a shifted and a target-domain
          pool; the classifier is the `Transformer` reading the 8 image rows as 8 continuous
          tokens (causal), the class read from the last position by its head (SFT-style: only the
          answer is scored). No known optimum; three reference mixtures are retrained beside the
          found one.
  pile    paper scale: `<data_dir>/train/<domain>.npy` token ids for each of `data.domains` and
          `<data_dir>/validation/<data.target_domain>.npy` (e.g. the 17 Pile domains, target
          Pile-CC, tokenised with the GPT-NeoX tokenizer); a causal LM proxy.

Random streams: the batch of step `n` of stream `s` is a pure function of `(config.seed, s, n)`;
streams 0 (training, shared by every method, so all see the same data), 1 (held-out test), 2 (the
search's validation feedback), 3 (retraining), 4 (the fixed validation set that scores proxies), and
`s + 10 r` for replicate `r`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core.data import mixture_sources, text, tokenizers
from core.nn import attention
from core.nn.transformer import Transformer
from methods.base import cached_per_config

TRAIN, TEST, VALIDATION, RETRAIN, VALIDATION_SET = 0, 1, 2, 3, 4
HEAD = ("params", "unembed")  # the LM head (untied) whose gradients the head-only form dots
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Task:
  """Data and proxy model of one search (module docstring)."""

  name: str
  source_names: tuple[str, ...]
  fields: tuple[str, ...]  # the model's input fields of a batch
  model: Transformer
  init_params: Callable[[jax.Array], dict]
  token_losses: Callable[[dict, dict], jax.Array]  # (params, inputs [B, ...]) -> [B, T] nats
  stratified: Callable[[int, int, int], Batch]  # (stream, step, rows per source) -> fields + source
  mixture: Callable[[np.ndarray, int, int, int], Batch]  # (alpha, stream, step, rows) -> fields
  validation_batch: Callable[[int, int], Batch]  # (step, rows) -> fields: the search's feedback
  validation_set: Batch  # a fixed draw of the feedback distribution (proxies' target losses)
  test_set: Batch  # held-out target data
  optimum: np.ndarray | None = None  # the known best mixture
  references: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  ideal_loss: Callable[[np.ndarray], float] | None = None  # target loss of the ideal proxy
  example_correct: Callable[[dict, dict], jax.Array] | None = None  # classification only
  prior: np.ndarray | None = None  # the sources' share of the available data (RegMix's prior)

  @property
  def num_sources(self) -> int:
    return len(self.source_names)

  def example_losses(self, params, inputs) -> jax.Array:
    """`[B]`: each example's mean loss over its scored positions."""
    return self.token_losses(params, inputs).mean(axis=1)

  @property
  def data_prior(self) -> np.ndarray:
    prior = np.ones(self.num_sources) if self.prior is None else np.asarray(self.prior, float)
    return prior / prior.sum()


def make_model(config: ml_collections.ConfigDict, vocab_size: int, input_dim=None) -> Transformer:
  m = config.model
  return Transformer(
    vocab_size=vocab_size,
    width=m.width,
    depth=m.depth,
    num_heads=m.num_heads,
    mlp_hidden=m.mlp_hidden or None,
    tie_embeddings=False,
    input_dim=input_dim,
    dtype=DTYPES[m.dtype],
  )


def next_token_losses(model: Transformer, params, inputs) -> jax.Array:
  """Next-token cross-entropy of `tokens [B, L + 1]` under a causal mask: `[B, L]` nats."""
  tokens = inputs["tokens"]
  logits = model.apply(params, tokens[:, :-1], mask=attention.causal_mask()).logits
  return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])


def _lm_init(model: Transformer, length: int, rng):
  return model.init(rng, jnp.zeros((1, length), jnp.int32), mask=attention.causal_mask())


# ---------------------------------------------------------------------------------------------------
# markov
# ---------------------------------------------------------------------------------------------------


def markov_sources(config) -> tuple[text.MarkovSources, tuple[str, ...]]:
  d = config.data
  return text.mixture_search_sources(
    d.vocab_size, d.relevant_entropy, d.irrelevant_entropy, d.source_seed
  )


def markov_task(config) -> Task:
  d = config.data
  sources, names = markov_sources(config)
  target = np.asarray(d.target_weights, np.float64)
  target_sources = sources.with_weights(target)
  length, offset = d.seq_len, len(tokenizers.SPECIAL_TOKENS)
  model = make_model(config, sources.vocab_size + offset)

  def stream(source_mix, split, rows, stratified=False):
    return text.MarkovText(source_mix, length, rows, config.seed, split, stratified=stratified)

  def stratified(split, step, rows_per_source):
    return stream(sources, split, rows_per_source * len(names), True).generate(step)

  def mixture(alpha, split, step, rows):
    return {"tokens": stream(sources.with_weights(alpha), split, rows).generate(step)["tokens"]}

  def validation_batch(step, rows):
    return {"tokens": stream(target_sources, VALIDATION, rows).generate(step)["tokens"]}

  test = stream(target_sources, TEST, config.eval.num_examples).generate(0)
  validation = stream(target_sources, VALIDATION_SET, config.eval.num_examples).generate(0)
  test_symbols = test["tokens"][:, 1:] - offset

  def ideal_loss(alpha):
    if config.model.depth == 0:
      return text.bigram_cross_entropy(target_sources, alpha, length)
    model_sources = sources.with_weights(alpha)
    return float(-model_sources.mixture_log_likelihood(test_symbols).mean() / length)

  return Task(
    name="markov",
    source_names=names,
    fields=("tokens",),
    model=model,
    init_params=functools.partial(_lm_init, model, length),
    token_losses=functools.partial(next_token_losses, model),
    stratified=stratified,
    mixture=mixture,
    validation_batch=validation_batch,
    validation_set={"tokens": validation["tokens"]},
    test_set={"tokens": test["tokens"]},
    optimum=target,
    references={"oracle": target},
    ideal_loss=ideal_loss,
  )


# ---------------------------------------------------------------------------------------------------
# digits
# ---------------------------------------------------------------------------------------------------


def _row_logits(model: Transformer, params, x) -> jax.Array:
  """Class logits `[B, 10]`: the head at the last of the 8 row tokens (causal)."""
  return model.apply(params, embeddings=x, mask=attention.causal_mask()).logits[:, -1]


def digit_losses(model: Transformer, params, inputs) -> jax.Array:
  """`[B, 1]`: the cross-entropy of the class (one scored position per example)."""
  logits = _row_logits(model, params, inputs["x"])
  return optax.softmax_cross_entropy_with_integer_labels(logits, inputs["y"])[:, None]


def digit_correct(model: Transformer, params, inputs) -> jax.Array:
  return (jnp.argmax(_row_logits(model, params, inputs["x"]), -1) == inputs["y"]).astype(
    jnp.float32
  )


def digits_task(config) -> Task:
  domains = mixture_sources.digit_domains(config.data.source_seed)
  names, sizes = domains.names, domains.sizes
  model = make_model(config, 10, input_dim=8)

  def rng(split, step):
    return np.random.default_rng([config.seed, split, step])

  def stratified(split, step, rows_per_source):
    return domains.gather(
      *mixture_sources.stratified_indices(sizes, rows_per_source, rng(split, step))
    )

  def mixture(alpha, split, step, rows):
    batch = domains.gather(*mixture_sources.mixture_indices(sizes, alpha, rows, rng(split, step)))
    return {"x": batch["x"], "y": batch["y"]}

  def validation_batch(step, rows):
    return domains.validation.take(rng(VALIDATION, step).integers(0, len(domains.validation), rows))

  whole = functools.partial(np.arange)
  k = len(names)
  target_only = np.eye(k)[names.index("target")]
  clean_and_target = 0.5 * (np.eye(k)[names.index("clean")] + target_only)
  return Task(
    name="digits",
    source_names=names,
    fields=("x", "y"),
    model=model,
    init_params=lambda r: model.init(
      r, embeddings=jnp.zeros((1, 8, 8)), mask=attention.causal_mask()
    ),
    token_losses=functools.partial(digit_losses, model),
    stratified=stratified,
    mixture=mixture,
    validation_batch=validation_batch,
    validation_set=domains.validation.take(whole(len(domains.validation))),
    test_set=domains.test.take(whole(len(domains.test))),
    references={
      "uniform": np.full(k, 1.0 / k),
      "target_only": target_only,
      "clean_and_target": clean_and_target,
    },
    example_correct=functools.partial(digit_correct, model),
    prior=np.asarray(sizes, np.float64),
  )


# ---------------------------------------------------------------------------------------------------
# pile (paper scale)
# ---------------------------------------------------------------------------------------------------


def token_files(config) -> dict[str, str]:
  """The files a tokenised-domains run reads: each training domain and the target's validation."""
  d = config.data
  files = {name: text.token_file(d.data_dir, "train", name) for name in d.domains}
  files["validation"] = text.token_file(d.data_dir, "validation", d.target_domain)
  return files


def missing_token_files(config) -> list[str]:
  if not config.data.data_dir:
    return ["(data_dir not set)"]
  return [path for path in token_files(config).values() if not os.path.isfile(path)]


def pile_task(config) -> Task:
  d = config.data
  files = token_files(config)
  domains = [text.load_tokens(files[name]) for name in d.domains]
  validation = text.load_tokens(files["validation"])
  model = make_model(config, d.vocab_size)
  length = d.seq_len

  def rng(split, step):
    return np.random.default_rng([config.seed, split, step])

  def stratified(split, step, rows_per_source):
    r = rng(split, step)
    tokens = np.concatenate([text.token_windows(t, length, rows_per_source, r) for t in domains])
    return {"tokens": tokens, "source": np.repeat(np.arange(len(domains)), rows_per_source)}

  def mixture(alpha, split, step, rows):
    r = rng(split, step)
    source = r.choice(len(domains), size=rows, p=np.asarray(alpha) / np.sum(alpha))
    counts = np.bincount(source, minlength=len(domains))
    parts = [text.token_windows(t, length, c, r) for t, c in zip(domains, counts, strict=True) if c]
    return {"tokens": np.concatenate(parts)}

  def validation_batch(step, rows):
    return {"tokens": text.token_windows(validation, length, rows, rng(VALIDATION, step))}

  held_out = text.token_windows(validation, length, 2 * config.eval.num_examples, rng(TEST, 0))
  half = config.eval.num_examples
  return Task(
    name="pile",
    source_names=tuple(d.domains),
    fields=("tokens",),
    model=model,
    init_params=functools.partial(_lm_init, model, length),
    token_losses=functools.partial(next_token_losses, model),
    stratified=stratified,
    mixture=mixture,
    validation_batch=validation_batch,
    validation_set={"tokens": held_out[:half]},
    test_set={"tokens": held_out[half:]},
    prior=np.asarray([len(t) for t in domains], np.float64),
  )


TASKS = {"markov": markov_task, "digits": digits_task, "pile": pile_task}


@cached_per_config(maxsize=8)
def load_task(config: ml_collections.ConfigDict) -> Task:
  task = TASKS[config.data.name](config)
  if not config.model.checkpoint:
    return task
  loaded = load_checkpoint(
    config.model.checkpoint, jax.eval_shape(task.init_params, jax.random.key(0))
  )
  return dataclasses.replace(task, init_params=lambda rng: loaded)


def save_checkpoint(path: str, params) -> None:
  """The parameter tree as an .npz keyed by '/'-joined paths (what `model.checkpoint` reads)."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  np.savez(path, **{_path_key(p): np.asarray(v) for p, v in flat})


def load_checkpoint(path: str, template):
  """The .npz of `save_checkpoint` as a tree shaped like `template` (names and shapes checked)."""
  with np.load(path) as stored:
    leaves = []
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]:
      name = _path_key(key_path)
      if name not in stored or stored[name].shape != leaf.shape:
        raise ValueError(f"config.model.checkpoint: {path} lacks {name} of shape {leaf.shape}")
      leaves.append(jnp.asarray(stored[name], leaf.dtype))
  return jax.tree.unflatten(jax.tree.structure(template), leaves)


def _path_key(key_path) -> str:
  return "/".join(str(getattr(k, "key", k)) for k in key_path)


# ---------------------------------------------------------------------------------------------------
# Parameter helpers
# ---------------------------------------------------------------------------------------------------


def head_of(params):
  """The LM head's parameters (the subtree the head-only hypergradient dots)."""
  node = params
  for key in HEAD:
    node = node[key]
  return node


def with_head(params, head):
  """`params` with the head replaced."""
  outer = dict(params)
  inner = dict(outer[HEAD[0]])
  inner[HEAD[1]] = head
  outer[HEAD[0]] = inner
  return outer


def group_by_source(inputs: dict, num_sources: int) -> dict:
  """`[K * b, ...]` stratified rows (sources in order) as `[K, b, ...]`."""
  return jax.tree.map(lambda x: x.reshape((num_sources, -1) + x.shape[1:]), inputs)
