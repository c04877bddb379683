"""Token-Guard's phases: `train` (a small causal LM on the factual world, or a converted checkpoint)
and `decode` (every decoder side by side on the same test questions, the threshold calibration on a
dev split and the token-score AUROC; or, with a checkpoint, every decoder on the official
benchmark files with the model's own tokenizer)."""

from __future__ import annotations

import collections
import functools
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from core import decoding, optim
from core import token_guard as tg
from core.data import batching, factual_world, halu_benchmarks, tokenizers
from core.nn import attention, hf_convert
from core.nn.transformer import Transformer
from methods.base import ConfigError, Phase, cached_per_config

SCAFFOLD_DECODERS = ("rollout_prune", "token_guard", "token_guard_calibrated", "token_guard_code")
# Token-Guard with abstention forbidden (tau_abstain = 0), with the code's suffix refinement and
# with exact-identity clustering: what the scores and the selection do without the fallback
VARIANT_DECODERS = ("token_guard_no_abstain", "token_guard_suffix", "token_guard_exact")
ABLATIONS = ("no_token", "no_segment", "no_global")
CALIBRATED_ABLATIONS = tuple(f"{name}_calibrated" for name in ABLATIONS)
TRIVIAL = ("always_abstain",)  # the trivial policy: "No answer" to every question
NO_PROMPT = "no_prompt"  # Token-Guard without stage 0's self-checking prompt (benchmarks only)
DECODERS = ("greedy", "sampling", "self_consistency") + SCAFFOLD_DECODERS + VARIANT_DECODERS
DECODERS += ABLATIONS + CALIBRATED_ABLATIONS + TRIVIAL + (NO_PROMPT,)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


# ---------------------------------------------------------------------------------------------------
# World, tokenizer, model
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=4)
def world_of(config: ml_collections.ConfigDict) -> factual_world.World:
  d = config.data
  return factual_world.make_world(
    d.num_persons, d.num_cities, d.num_companies, d.num_ages, d.married_fraction, d.world_seed
  )


@functools.lru_cache(maxsize=2)
def tokenizer_file(path: str) -> tokenizers.ByteLevelBPETokenizer:
  """The model's own `tokenizer.json` (read once per path)."""
  return tokenizers.ByteLevelBPETokenizer.from_file(path)


@cached_per_config(maxsize=4)
def tokenizer_of(config: ml_collections.ConfigDict):
  """The checkpoint's byte-level BPE (`model.tokenizer`) or the world's word tokenizer."""
  if config.model.tokenizer:
    return tokenizer_file(config.model.tokenizer).with_eos(config.model.eos_token)
  return tokenizers.WordTokenizer(factual_world.vocabulary(world_of(config)))


def example_options(config, counterfactual: float) -> dict:
  d = config.data
  return dict(
    two_hop_fraction=d.two_hop_fraction,
    unanswerable_fraction=d.unanswerable_fraction,
    counterfactual_fraction=counterfactual,
    min_facts=d.min_facts,
    max_facts=d.max_facts,
  )


@cached_per_config(maxsize=4)
def split_of(config: ml_collections.ConfigDict, split: str) -> list[factual_world.Example]:
  """The fixed `test` or `dev` questions (seeded apart from the training stream)."""
  count, seed = (
    (config.data.num_test, config.data.test_seed)
    if split == "test"
    else (config.data.num_dev, config.data.dev_seed)
  )
  options = example_options(config, config.data.test_counterfactual)
  return factual_world.make_examples(world_of(config), count, seed, **options)


def make_model(config: ml_collections.ConfigDict, vocab_size: int) -> Transformer:
  m = config.model
  return Transformer(
    vocab_size=vocab_size,
    width=m.width,
    depth=m.depth,
    num_heads=m.num_heads,
    num_kv_heads=m.num_kv_heads or None,
    mlp_hidden=m.mlp_hidden or None,
    tie_embeddings=m.tie_embeddings,
    rope_base=m.rope_base,
    norm_eps=m.norm_eps,
    dtype=DTYPES[m.dtype],
  )


def model_of(config) -> Transformer:
  vocab = config.model.vocab_size or tokenizer_of(config).vocab_size
  return make_model(config, vocab)


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


def optimizer(config) -> optax.GradientTransformation:
  """AdamW on a warmup-cosine schedule with global-norm clipping."""
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip, o.weight_decay, b2=0.95)


def init_state(config, rng, inputs=None) -> dict:
  del inputs
  model = model_of(config)
  params = model.init(rng, jnp.zeros((1, 8), jnp.int32), mask=attention.causal_mask())
  if config.model.checkpoint:
    params = load_checkpoint(config, model)
  return {"params": params, "opt_state": optimizer(config).init(params)}


def load_checkpoint(config, model: Transformer) -> dict:
  """A Hugging Face Llama-layout checkpoint (`.safetensors` file or its `.index.json`) converted by
  `core.nn.hf_convert`; errors name the bad key."""
  try:
    state_dict = hf_convert.read_safetensors(config.model.checkpoint)
    return hf_convert.llama_to_flax(state_dict, model)
  except hf_convert.CheckpointError as error:
    raise ConfigError(f"config.model.checkpoint: {error}") from None


def train_step(config, model, state, batch, rng):
  """AdamW on the next-token cross-entropy over the loss mask (chain of thought and answer of QA
  sequences, every token of closed-book fact sequences)."""
  del rng

  def loss_fn(params):
    logits = model.apply(params, batch["tokens"][:, :-1], mask=attention.causal_mask()).logits
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["tokens"][:, 1:])
    return jnp.sum(ce * batch["loss_mask"]) / jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)

  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  return {"params": params, "opt_state": opt_state}, {"loss": loss}


def train_data(config):
  d = config.data
  world, tokenizer = world_of(config), tokenizer_of(config)
  generate = functools.partial(
    factual_world.training_batch,
    world,
    tokenizer,
    config.seed,
    batch_size=config.batch_size,
    seq_len=d.seq_len,
    fact_fraction=d.fact_fraction,
    facts_per_sequence=d.facts_per_sequence,
    **example_options(config, d.train_counterfactual),
  )
  return batching.GeneratedBatches(lambda step: generate(step), config.batch_size)


# ---------------------------------------------------------------------------------------------------
# Decoders
# ---------------------------------------------------------------------------------------------------


def guard_of(config, name: str) -> tg.Guard:
  """The decoder's settings; a `<ablation>_calibrated` name is that ablation (with the dev-calibrated
  thresholds, which `run_one` passes)."""
  g = config.guard
  name = name.removesuffix("_calibrated") if name in CALIBRATED_ABLATIONS else name
  settings = dict(
    lam=g.lam,
    alpha=g.alpha,
    beta=g.beta,
    gamma=g.gamma,
    delta_tau=g.delta_tau,
    consistency=g.consistency,
    fusion=g.fusion,
    beams=g.beams,
    rollouts=g.rollouts,
    max_steps=g.max_steps,
    segment_length=g.segment_length,
    max_refine=g.max_refine,
    global_iterations=g.global_iterations,
    sigma_rate=g.sigma_rate,
    advantage_weight=g.advantage_weight,
    stop_share=g.stop_share,
    temperature=g.temperature,
    top_p=g.top_p,
    top_k=g.top_k,
    refine_top_p=g.refine_top_p,
    refine=g.refine,
    clustering=g.clustering,
    num_clusters=g.num_clusters,
  )
  if name == "rollout_prune":
    settings.update(use_token=False, use_segment=False, use_global=False)
  elif name == "token_guard_code":  # the latest official code's fusion and consistency
    settings.update(fusion="softmin", consistency="cosine")
  elif name == "token_guard_suffix":  # the code's refinement: cut at the window, resample on
    settings.update(refine="suffix")
  elif name == "token_guard_exact":
    settings.update(clustering="exact")
  elif name in ABLATIONS:
    settings[f"use_{name.removeprefix('no_')}"] = False
  return tg.Guard(**settings)


def paper_thresholds(config) -> tg.Thresholds:
  g = config.guard
  return tg.Thresholds(g.tau_token, g.tau_low, g.tau_high, g.tau_global, g.tau_abstain)


def decoder_of(config, params) -> tg.Decoder:
  """A step ends at "." in the factual world; on real text at a line break (the paper's segment,
  the code's stop string): every token containing one."""
  tokenizer = tokenizer_of(config)
  text = isinstance(tokenizer, tokenizers.ByteLevelBPETokenizer)
  if text:
    stops = tokenizer.ids_containing("\n") + (tokenizer.eos_id,)
  else:
    stops = (tokenizer.ids["."], tokenizer.eos_id)
  return tg.Decoder(
    model_of(config),
    params,
    chain_width=config.eval.chain_width,
    stop_tokens=stops,
    eos_id=tokenizer.eos_id,
    max_segments=config.guard.max_steps + 3,
    head_at_chain=text,
  )


def sampling_of(config) -> decoding.Sampling:
  return decoding.Sampling(config.eval.temperature, config.eval.top_k, config.eval.top_p)


def run_one(config, decoder, name, prompts, lengths, rng, thresholds) -> tg.Decoded:
  if name == "greedy":
    return tg.greedy_decode(decoder, prompts, lengths, rng)
  if name == "sampling":
    return tg.sampling_decode(decoder, prompts, lengths, rng, sampling_of(config))
  if name == "self_consistency":
    return tg.self_consistency_decode(
      decoder, prompts, lengths, rng, sampling_of(config), config.eval.num_samples
    )
  if name == "always_abstain":
    return tg.abstain_decode(decoder, prompts)
  if name in ("token_guard_code", "token_guard_no_abstain"):
    thresholds = thresholds._replace(tau_abstain=0.0)  # the code abstains only without a chain
  return tg.token_guard_decode(
    decoder, prompts, lengths, rng, guard_of(config, name), thresholds, config.guard.min_steps
  )


def run_decoder(config, decoder, name, examples, rng, thresholds):
  """`name` over `examples` in chunks of `eval.chunk` questions (the last one padded); returns the
  outputs and the wall-clock seconds per question of the chunks after the first (which compiles;
  with one chunk its time is used)."""
  prompts, lengths = factual_world.encode_prompts(
    examples, tokenizer_of(config), config.data.prompt_len
  )
  return run_encoded(config, decoder, name, prompts, lengths, rng, thresholds)


def run_encoded(config, decoder, name, prompts, lengths, rng, thresholds):
  """`run_decoder` on right-padded prompt ids `[N, prompt_len]` and their lengths."""
  count = len(prompts)
  chunk = config.eval.chunk
  total = -(-count // chunk) * chunk
  prompts = np.concatenate([prompts, np.repeat(prompts[:1], total - len(prompts), 0)])
  lengths = np.concatenate([lengths, np.repeat(lengths[:1], total - len(lengths), 0)])
  parts, times = [], []
  for i in range(total // chunk):
    begin = time.perf_counter()
    out = run_one(
      config,
      decoder,
      name,
      jnp.asarray(prompts[i * chunk : (i + 1) * chunk]),
      jnp.asarray(lengths[i * chunk : (i + 1) * chunk]),
      jax.random.fold_in(rng, i),
      thresholds,
    )
    parts.append(out)
    times.append(time.perf_counter() - begin)
  merged = tg.Decoded(*(np.concatenate(field)[:count] for field in zip(*parts, strict=True)))
  timed = times[1:] or times
  return merged, sum(timed) / (chunk * len(timed))


# ---------------------------------------------------------------------------------------------------
# Labels and metrics
# ---------------------------------------------------------------------------------------------------


def output_words(tokenizer, chain, length, abstain: bool = False) -> list[str]:
  """The generated words up to <eos> (one word per token, special tokens kept in place)."""
  if abstain:
    return ["Answer:", "No", "answer"]
  words = []
  for token in chain[:length]:
    if int(token) == tokenizer.eos_id:
      break
    words.append(tokenizer.tokens[int(token)])
  return words


def label_outputs(config, examples, decoded: tg.Decoded) -> list[factual_world.Labels]:
  tokenizer, world = tokenizer_of(config), world_of(config)
  return [
    factual_world.label_output(e, world, output_words(tokenizer, c, n, a))
    for e, c, n, a in zip(examples, decoded.chain, decoded.lengths, decoded.abstain, strict=True)
  ]


def metrics_of(examples, labels, decoded: tg.Decoded, seconds: float) -> dict[str, float]:
  """EM, F1, answer- and step-level hallucination rates by type, abstention accuracy, cost."""
  verdicts = [label.answer_label for label in labels]
  counts = collections.Counter(verdicts)
  n = len(examples)
  steps = [s for label in labels for s in label.step_labels]
  step_counts = collections.Counter(steps)
  abstained = np.array([label.answer == factual_world.NO_ANSWER for label in labels])
  unanswerable = np.array([e.unanswerable for e in examples])
  hallucinated = np.array([v in factual_world.HALLUCINATION_TYPES for v in verdicts])
  counterfactual = np.array([e.counterfactual for e in examples])
  answered = ~abstained
  out = {
    "em": np.mean(
      [
        factual_world.exact_match(lab.answer, e.answer)
        for e, lab in zip(examples, labels, strict=True)
      ]
    ),
    "f1": np.mean(
      [
        factual_world.f1_score(lab.answer, e.answer)
        for e, lab in zip(examples, labels, strict=True)
      ]
    ),
    "hallucination_rate": hallucinated.mean(),
    # abstaining cannot lower this one: hallucinations among the questions the decoder answered
    "answered_hallucination_rate": hallucinated[answered].mean() if answered.any() else np.nan,
    "answered_rate": answered.mean(),
    "counterfactual_hallucination_rate": hallucinated[counterfactual].mean()
    if counterfactual.any()
    else 0.0,
    "step_hallucination_rate": sum(s is not None for s in steps) / max(len(steps), 1),
    "abstention_accuracy": np.mean(abstained == unanswerable),
    "false_abstention_rate": counts["abstained"] / n,
    "malformed_rate": counts["malformed"] / n,
    "forward_passes": float(np.mean(decoded.forward_passes)),
    "seconds_per_question": seconds,
  }
  for kind in factual_world.HALLUCINATION_TYPES:
    out[f"{kind}_rate"] = counts[kind] / n
  for kind in factual_world.STEP_TYPES:
    out[f"step_{kind}_rate"] = step_counts[kind] / max(len(steps), 1)
  return {k: float(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------------
# Scored samples: the threshold calibration (dev) and the token-score AUROC (test)
# ---------------------------------------------------------------------------------------------------


def scored_samples(config, decoder, examples, rng, thresholds) -> dict[str, np.ndarray]:
  """Draws `eval.analysis_samples` answers per question at `eval.analysis_temperature`, labels them
  and scores them with Token-Guard (teacher-forced). Returns flat arrays: object-token scores and
  labels, segment scores and labels, chain scores and answer verdicts."""
  tokenizer, world = tokenizer_of(config), world_of(config)
  n = config.eval.analysis_samples
  sampling = decoding.Sampling(config.eval.analysis_temperature, 0, 1.0)
  prompts, lengths = factual_world.encode_prompts(examples, tokenizer, config.data.prompt_len)
  chain, chain_lengths, _ = tg.sample_chains(
    decoder, jnp.asarray(prompts), jnp.asarray(lengths), rng, sampling, n
  )
  rows_prompts = jnp.repeat(jnp.asarray(prompts), n, 0)
  rows_lengths = jnp.repeat(jnp.asarray(lengths), n, 0)
  scores = jax.device_get(
    decoder.score(
      rows_prompts, rows_lengths, chain, chain_lengths, thresholds, guard_of(config, "token_guard")
    )
  )
  chain, chain_lengths = np.asarray(chain), np.asarray(chain_lengths)
  stops = np.isin(chain, decoder.stop_tokens)
  seg_ids = np.cumsum(stops, 1) - stops
  keys = ("token_label", "token_token", "token_prob", "token_cosine", "segment_label")
  keys += ("segment_score", "answer_verdict", "chain_global", "chain_fact", "chain_logic")
  out = {key: [] for key in keys}
  for row in range(len(chain)):
    example = examples[row // n]
    words = output_words(tokenizer, chain[row], chain_lengths[row])
    labels = factual_world.label_output(example, world, words)
    flagged = np.flatnonzero(labels.token_labels >= 0)
    out["token_label"] += list(labels.token_labels[flagged])
    for name in ("token", "prob", "cosine"):
      out[f"token_{name}"] += list(getattr(scores, name)[row, flagged])
    for position in flagged:
      out["segment_label"].append(labels.token_labels[position])
      out["segment_score"].append(scores.segment[row, seg_ids[row, position]])
    out["answer_verdict"].append(labels.answer_label)
    out["chain_global"].append(scores.glob[row])
    out["chain_fact"].append(scores.fact[row])
    out["chain_logic"].append(scores.logic[row])
  return {k: np.asarray(v) for k, v in out.items()}


def auroc(labels, scores) -> float:
  """AUROC of `scores` for flagging `labels == 1` (NaN with one class)."""
  from sklearn.metrics import roc_auc_score

  labels = np.asarray(labels)
  if labels.size == 0 or labels.min() == labels.max():
    return float("nan")
  return float(roc_auc_score(labels, scores))


def youden_threshold(good, scores, fallback: float) -> float:
  """The score threshold maximising TPR - FPR for telling `good` (scores above) from the rest;
  `fallback` without both classes."""
  from sklearn.metrics import roc_curve

  good = np.asarray(good, bool)
  if good.all() or not good.any():
    return float(fallback)
  fpr, tpr, cut = roc_curve(good, scores)
  return float(np.clip(cut[np.argmax(tpr - fpr)], -1.0, 2.0))


def _percentile(values, q: float, fallback: float) -> float:
  return float(np.percentile(values, q)) if np.size(values) else float(fallback)


def calibrate(config, decoder, rng) -> tg.Thresholds:
  """Thresholds re-calibrated on the dev split's sampled answers: tau_token, tau_high and
  tau_global where TPR - FPR peaks for supported vs hallucinated tokens, segments and answers;
  tau_low at the 5th percentile of supported segments (discarding drops <= 5% of them);
  tau_abstain at the 5th percentile of max(F_fact, F_logic) over correct answers."""
  paper = paper_thresholds(config)
  samples = scored_samples(config, decoder, split_of(config, "dev"), rng, paper)
  tau_token = youden_threshold(samples["token_label"] == 0, samples["token_token"], paper.tau_token)
  good_segment = samples["segment_label"] == 0
  tau_high = youden_threshold(good_segment, samples["segment_score"], paper.tau_high)
  tau_low = min(_percentile(samples["segment_score"][good_segment], 5, paper.tau_low), tau_high)
  verdicts = samples["answer_verdict"]
  judged = np.isin(verdicts, ("correct",) + factual_world.HALLUCINATION_TYPES)
  correct = verdicts == "correct"
  tau_global = youden_threshold(correct[judged], samples["chain_global"][judged], paper.tau_global)
  best = np.maximum(samples["chain_fact"], samples["chain_logic"])[correct]
  return tg.Thresholds(tau_token, tau_low, tau_high, tau_global, _percentile(best, 5, 0.0))


def token_auroc(config, decoder, rng) -> dict[str, float]:
  """The mechanism check: AUROC of F_tok, of p alone and of the cosine alone for flagging the
  object tokens of hallucinated steps and answers in sampled test answers; F_seg for segments."""
  samples = scored_samples(config, decoder, split_of(config, "test"), rng, paper_thresholds(config))
  labels = samples["token_label"]
  verdicts = samples["answer_verdict"]
  correct = (verdicts == "correct").reshape(-1, config.eval.analysis_samples)
  judged = np.isin(verdicts, ("correct",) + factual_world.HALLUCINATION_TYPES)
  chain_global = samples["chain_global"].reshape(correct.shape)
  picked = np.take_along_axis(correct, np.argmax(chain_global, 1)[:, None], 1)
  return {
    "auroc_chain_global": auroc(
      np.isin(verdicts[judged], factual_world.HALLUCINATION_TYPES), -samples["chain_global"][judged]
    ),
    # what a selection by F_global alone would reach among the same draws
    "samples_best_global_correct_rate": float(np.mean(picked)) if correct.size else float("nan"),
    "auroc_token_score": auroc(labels, -samples["token_token"]),
    "auroc_probability": auroc(labels, -samples["token_prob"]),
    "auroc_cosine": auroc(labels, -samples["token_cosine"]),
    "auroc_segment_score": auroc(samples["segment_label"], -samples["segment_score"]),
    "auroc_hallucinated_tokens": float(labels.sum()),
    "auroc_tokens": float(labels.size),
    # headroom of any sample-and-select decoder: how often one of the draws is right
    "samples_correct_rate": float(np.mean(correct)) if correct.size else float("nan"),
    "samples_any_correct_rate": float(np.mean(correct.any(1))) if correct.size else float("nan"),
  }


# ---------------------------------------------------------------------------------------------------
# The official benchmarks (a converted checkpoint and its own tokenizer)
# ---------------------------------------------------------------------------------------------------


# Stage 0's "w/o prompt" ablation (Sec. 3.1, Table 4): no self-checking instructions (rely on the
# passage, do not make up information, the dataset's answer format), only the answer line the
# extraction reads
PLAIN_SYSTEM = "Answer the question.\nAt the end, output: Answer:[your answer here]."


def benchmark_prompts(config, name: str, self_check: bool = True):
  """The first `data.num_test` records of benchmark `name` and their prompt ids: the official
  prompt (`halu_benchmarks.chat_prompt`; stage 0's self-checking system prompt, or `PLAIN_SYSTEM`
  without `self_check`), its passage cut so that the prompt fits `data.prompt_len`.
  Returns `(records, ids [N, prompt_len], lengths [N], truncated [N] bool)`."""
  tokenizer = tokenizer_of(config)
  path = halu_benchmarks.benchmark_path(config.data.data_dir, name)
  family = halu_benchmarks.BENCHMARKS[name][1]
  records = halu_benchmarks.read_benchmark(path)[: config.data.num_test]
  system = halu_benchmarks.system_prompt(family) if self_check else PLAIN_SYSTEM
  texts, truncated = [], []
  for record in records:
    text = halu_benchmarks.chat_prompt(system, halu_benchmarks.user_message(record, family))
    size = len(tokenizer.encode(text))
    cut = size > config.data.prompt_len
    if cut:  # re-encoding at the seam may add a token or two: keep a margin of 8
      empty = halu_benchmarks.user_message(record, family, passage="")
      room = config.data.prompt_len - len(
        tokenizer.encode(halu_benchmarks.chat_prompt(system, empty))
      )
      passage = halu_benchmarks.prompt_passage(record, family)
      kept = tokenizer.decode(tokenizer.encode(passage)[: max(room - 8, 0)], stop_at_eos=False)
      text = halu_benchmarks.chat_prompt(
        system, halu_benchmarks.user_message(record, family, passage=kept)
      )
    texts.append(text)
    truncated.append(cut)
  ids, lengths = tokenizer.encode_batch(texts, config.data.prompt_len)
  return records, ids, lengths, np.array(truncated)


def benchmark_answers(config, decoded: tg.Decoded) -> tuple[list[str], np.ndarray]:
  """The extracted answers ("No answer" where the decoder abstained) and which ones the model
  wrote as an "Answer:" line."""
  tokenizer = tokenizer_of(config)
  answers, found = [], []
  for chain, length, abstain in zip(decoded.chain, decoded.lengths, decoded.abstain, strict=True):
    answer = halu_benchmarks.extract_answer(tokenizer.decode(chain[:length]))
    answers.append("No answer" if abstain else answer)
    found.append(not abstain and bool(answer))
  return answers, np.array(found)


def evaluate_benchmarks(config, params, rng) -> dict:
  """Every decoder on every benchmark of `data.benchmarks`: EM and F1 (eval.py), answered and
  abstention rates, truncated prompts, cost; `_<decoder>` keys average the benchmarks."""
  decoder = decoder_of(config, params)
  thresholds = paper_thresholds(config)
  results, per_decoder = {}, collections.defaultdict(list)
  for b, name in enumerate(config.data.benchmarks):
    prompts = {True: benchmark_prompts(config, name)}
    if NO_PROMPT in config.eval.decoders:
      prompts[False] = benchmark_prompts(config, name, self_check=False)
    for index, decoder_name in enumerate(config.eval.decoders):
      key = jax.random.fold_in(jax.random.fold_in(rng, b), index)
      records, ids, lengths, truncated = prompts[decoder_name != NO_PROMPT]
      decoded, seconds = run_encoded(config, decoder, decoder_name, ids, lengths, key, thresholds)
      answers, found = benchmark_answers(config, decoded)
      metrics = halu_benchmarks.mean_metrics(answers, [r.answer for r in records])
      metrics.update(
        answered_rate=float(found.mean()),
        abstention_rate=float(decoded.abstain.mean()),
        truncated_rate=float(truncated.mean()),
        forward_passes=float(np.mean(decoded.forward_passes)),
        seconds_per_question=seconds,
      )
      logging.info("%s %s: %s", name, decoder_name, {k: round(v, 3) for k, v in metrics.items()})
      results.update({f"{k}_{decoder_name}_{name}": v for k, v in metrics.items()})
      per_decoder[decoder_name].append(metrics)
  for decoder_name, rows in per_decoder.items():
    for key in rows[0]:
      results[f"{key}_{decoder_name}"] = float(np.mean([row[key] for row in rows]))
  return _headline(config, results, ("em", "f1"))


# Headline keys a decoder cannot win by abstaining: hallucination among answered questions, F1 and
# the false abstention rate side by side (the always-abstain policy scores F1 = the unanswerable
# share, false abstention = the answerable share and no answered questions)
HEADLINE = ("answered_hallucination_rate", "f1", "false_abstention_rate", "em")


def _headline(config, results, keys) -> dict:
  main, base = config.eval.main_decoder, "greedy"
  for key in keys:
    results[key] = results[f"{key}_{main}"]
  results["cost_ratio"] = results[f"forward_passes_{main}"] / results[f"forward_passes_{base}"]
  results["time_ratio"] = (
    results[f"seconds_per_question_{main}"] / results[f"seconds_per_question_{base}"]
  )
  return results


# ---------------------------------------------------------------------------------------------------
# The decode phase
# ---------------------------------------------------------------------------------------------------


def evaluate(config, params, rng) -> dict:
  """Every decoder of `eval.decoders` on the same test questions; headline keys for Token-Guard."""
  if config.data.benchmarks:
    return evaluate_benchmarks(config, params, rng)
  decoder = decoder_of(config, params)
  examples = split_of(config, "test")
  thresholds = paper_thresholds(config)
  results = {}
  if any(name.endswith("_calibrated") for name in config.eval.decoders):
    calibrated = calibrate(config, decoder, jax.random.fold_in(rng, 7))
    for field, value in calibrated._asdict().items():
      results[f"calibrated_{field}"] = float(value)
  for index, name in enumerate(config.eval.decoders):
    chosen = calibrated if name.endswith("_calibrated") else thresholds
    decoded, seconds = run_decoder(
      config, decoder, name, examples, jax.random.fold_in(rng, index), chosen
    )
    metrics = metrics_of(examples, label_outputs(config, examples, decoded), decoded, seconds)
    logging.info("%s: %s", name, {k: round(v, 3) for k, v in metrics.items()})
    results.update({f"{key}_{name}": value for key, value in metrics.items()})
  if config.eval.auroc:
    results.update(token_auroc(config, decoder, jax.random.fold_in(rng, 11)))
  return _headline(config, results, HEADLINE)


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  model = model_of(config)
  train = Phase(
    name="train",
    num_steps=0 if config.model.checkpoint else config.steps,
    init=functools.partial(init_state, config),
    step=functools.partial(train_step, config, model),
    data=lambda inputs: train_data(config),
    outputs=lambda state, inputs: state["params"],
  )
  decode = Phase(
    name="decode",
    num_steps=0,
    init=lambda rng, inputs: {"params": inputs["train"]},
    evaluate=lambda state, rng, inputs: evaluate(config, state["params"], rng),
  )
  return [train, decode]
