"""Token-Guard: "Token-Guard: Towards Token-Level Hallucination Control via Self-Checking Decoding"
(Zhu, Rong, Luo; ICLR 2026, arXiv 2601.21969, OpenReview 5fCDEz43ya; official code
github.com/rhq945/Token-Guard).

Claim: a decoder that scores each token by probability and latent consistency with the context (Eq. 3),
each reasoning step by its token scores, smoothness and alignment (Eq. 9) and the chain by factual and
logical consistency (Eq. 11-13), and prunes or regenerates what scores low, hallucinates less than
greedy decoding and sampling, at a higher cost; removing the token-level scores hurts most.

Map to the paper:
  `core/data/factual_world.py`  passage QA over a seeded KB with 1-/2-hop chains of thought,
                                unanswerable and counterfactual passages, exact hallucination labels
                                (the checkable stand-in for HaluEval / RAGTruth / DROP).
  `core/token_guard.py`         the scores (Sec. 3.2-3.4, Eq. 1-15), local and global refinement, the
                                official code's beam scaffold, and the baselines.
  `core/nn/hf_convert.py`       Llama-layout checkpoints (the paper's Llama-3-8B-Instruct) as
                                `core.nn.transformer.Transformer` parameters.
  `core/data/halu_benchmarks.py` the official repository's benchmark files (HaluEval, RAGTruth,
                                FinanceBench, DROP, PubmedQA, CovidQA), its prompts, answer
                                extraction and EM/F1; `core.data.tokenizers.ByteLevelBPETokenizer`
                                reads the model's own `tokenizer.json`.
  `phases.py`                   `train` (a small causal LM on the world, or a converted checkpoint)
                                and `decode` (every decoder on the same questions, dev calibration of
                                the thresholds, token-score AUROC).
  `study.py`                    one arm per seed; the table, the summary and the figure.

Metrics (per decoder, suffix `_<decoder>`): `em`, `f1`; `hallucination_rate` (answers the passage does
not support) and its types (`override`, `misread`, `fabrication`, `unanswerable`);
`step_hallucination_rate` and types; `abstention_accuracy` (abstains iff unanswerable);
`forward_passes` (single-sequence forward calls per question) and `seconds_per_question` (compiled).
The headline keys (`hallucination_rate`, `em`, ...) are `eval.main_decoder`'s, `cost_ratio` its forward
passes over greedy's. On the benchmarks (`data.benchmarks`) there are no hallucination labels: `em`,
`f1`, `answered_rate`, `abstention_rate`, `truncated_rate`, cost, per benchmark (`_<decoder>_<name>`)
and averaged over them (`_<decoder>`).
"""

from __future__ import annotations

import ml_collections

from core.data import halu_benchmarks
from methods.base import (
  Method,
  require,
  require_choice,
  require_file,
  require_positive_int,
)
from methods.token_guard.phases import DECODERS, DTYPES, NO_PROMPT, phases, tokenizer_file
from methods.token_guard.study import report, study_arms

POSITIVE_FIELDS = (
  "data.num_persons",
  "data.num_cities",
  "data.num_companies",
  "data.num_ages",
  "data.min_facts",
  "data.max_facts",
  "data.seq_len",
  "data.prompt_len",
  "data.num_test",
  "data.num_dev",
  "model.width",
  "model.depth",
  "model.num_heads",
  "batch_size",
  "guard.beams",
  "guard.rollouts",
  "guard.max_steps",
  "guard.segment_length",
  "eval.chunk",
  "eval.chain_width",
  "eval.num_samples",
  "eval.analysis_samples",
)
FRACTIONS = (
  "data.married_fraction",
  "data.two_hop_fraction",
  "data.unanswerable_fraction",
  "data.train_counterfactual",
  "data.test_counterfactual",
  "data.fact_fraction",
)


def validate(config: ml_collections.ConfigDict) -> None:
  for field in POSITIVE_FIELDS:
    require_positive_int(config, field)
  for field in FRACTIONS:
    section, name = field.split(".")
    value = config[section][name]
    require(0.0 <= value <= 1.0, field, f"must be in [0, 1], got {value}")
  _validate_model(config)
  _validate_guard(config)
  _validate_eval(config)
  if config.model.checkpoint or config.variant == "gpu" or config.data.benchmarks:
    _validate_pretrained(config)
  else:
    _validate_world(config)


def _validate_world(config) -> None:
  """The factual world's prompt and answer lengths."""
  d = config.data
  require(d.min_facts <= d.max_facts, "data.max_facts", f"must be >= min_facts {d.min_facts}")
  require(
    d.num_persons >= d.num_companies + 2,
    "data.num_persons",
    f"needs more persons than companies ({d.num_companies}) + 1",
  )
  longest_prompt = 4 * (d.max_facts + 1) + 7  # <bos> Passage: facts Question: s r r ?
  require(
    d.prompt_len >= longest_prompt,
    "data.prompt_len",
    f"{d.prompt_len} is shorter than the longest prompt ({longest_prompt} tokens)",
  )
  require(
    d.seq_len + 1 >= longest_prompt + 13,
    "data.seq_len",
    f"{d.seq_len} cannot hold a prompt of {longest_prompt} tokens and a 2-hop answer",
  )
  needed = 4 * (config.guard.max_steps - 1) + 6
  require(
    config.eval.chain_width >= needed,
    "eval.chain_width",
    f"{config.eval.chain_width} cannot hold {config.guard.max_steps} steps and an answer "
    f"({needed})",
  )


def _validate_model(config) -> None:
  m = config.model
  require(
    m.width % m.num_heads == 0, "model.num_heads", f"{m.num_heads} must divide width {m.width}"
  )
  require(
    (m.width // m.num_heads) % 2 == 0,
    "model.num_heads",
    f"head dim width/num_heads = {m.width // m.num_heads} must be even (RoPE)",
  )
  kv = m.num_kv_heads or m.num_heads
  require(m.num_heads % kv == 0, "model.num_kv_heads", f"{kv} must divide num_heads")
  require(m.depth >= 2, "model.depth", "the token scores read the penultimate block: needs >= 2")
  require_choice(config, "model.dtype", tuple(DTYPES))


def _validate_guard(config) -> None:
  g = config.guard
  require_choice(config, "guard.consistency", ("cosine", "distance"))
  require_choice(config, "guard.fusion", ("harmonic", "softmin"))
  require(0.0 <= g.lam <= 1.0, "guard.lam", f"must be in [0, 1], got {g.lam}")
  require(g.tau_low <= g.tau_high, "guard.tau_low", f"{g.tau_low} exceeds tau_high {g.tau_high}")
  require(g.beta + g.gamma > 0, "guard.gamma", "beta + gamma must be positive")
  require(g.max_refine >= 0, "guard.max_refine", f"must be >= 0, got {g.max_refine}")
  require(g.global_iterations >= 0, "guard.global_iterations", "must be >= 0")
  require(0 < g.top_p <= 1 and 0 < g.refine_top_p <= 1, "guard.top_p", "must be in (0, 1]")
  require(g.temperature > 0, "guard.temperature", f"must be > 0, got {g.temperature}")
  require(g.min_steps >= 0, "guard.min_steps", f"must be >= 0, got {g.min_steps}")
  require_choice(config, "guard.refine", ("window", "suffix"))
  require_choice(config, "guard.clustering", ("tfidf_kmeans", "exact"))
  require(g.num_clusters >= 1, "guard.num_clusters", f"must be >= 1, got {g.num_clusters}")


def _validate_eval(config) -> None:
  ev = config.eval
  unknown = [name for name in ev.decoders if name not in DECODERS]
  require(not unknown, "eval.decoders", f"unknown {unknown}; known: {list(DECODERS)}")
  require(ev.main_decoder in ev.decoders, "eval.main_decoder", "must be one of eval.decoders")
  require("greedy" in ev.decoders, "eval.decoders", "must include 'greedy' (the cost baseline)")
  require(ev.temperature > 0, "eval.temperature", f"must be > 0, got {ev.temperature}")
  require(0 < ev.top_p <= 1, "eval.top_p", f"must be in (0, 1], got {ev.top_p}")
  require(len(config.study.seeds) > 0, "study.seeds", "needs at least one seed")
  require(
    bool(config.data.benchmarks) or NO_PROMPT not in ev.decoders,
    "eval.decoders",
    f"'{NO_PROMPT}' swaps the benchmarks' self-checking system prompt; the factual world's "
    "prompts have none (set data.benchmarks)",
  )
  if config.data.benchmarks:
    unknown = [n for n in config.data.benchmarks if n not in halu_benchmarks.BENCHMARKS]
    require(
      not unknown,
      "data.benchmarks",
      f"unknown {unknown}; known: {list(halu_benchmarks.BENCHMARKS)}",
    )
    labelled = [name for name in ev.decoders if name.endswith("_calibrated")]
    require(
      not labelled,
      "eval.decoders",
      f"{labelled} calibrate on the factual world's hallucination labels, which the benchmarks "
      "do not have",
    )
    require(not ev.auroc, "eval.auroc", "needs the factual world's token labels; set False")


def _validate_pretrained(config) -> None:
  """A converted checkpoint decodes real text: its weights, its own tokenizer and the benchmark
  files, in that order; each missing one stops validation naming its field."""
  require_file(
    config,
    "model.checkpoint",
    "a Llama-layout checkpoint (Meta-Llama-3-8B-Instruct's model.safetensors.index.json or a "
    "single .safetensors file)",
    "download the model on a machine with network access and pass "
    "--config.model.checkpoint=DIR/model.safetensors.index.json",
  )
  require_file(
    config,
    "model.tokenizer",
    "the checkpoint's Hugging Face tokenizer.json (byte-level BPE)",
    "it sits beside the downloaded weights: pass --config.model.tokenizer=DIR/tokenizer.json",
  )
  _validate_tokenizer(config)
  names = config.data.benchmarks
  require(
    bool(names),
    "data.benchmarks",
    f"a checkpoint decodes the benchmarks, not the word-level factual world; name some of "
    f"{list(halu_benchmarks.BENCHMARKS)}",
  )
  problem = halu_benchmarks.benchmark_problem(config.data.data_dir, names)
  files = ", ".join(halu_benchmarks.BENCHMARKS[name][0] for name in names)
  require(
    problem is None,
    "data.data_dir",
    f"{problem}; expected the official Token-Guard repository's data folder ({files}): on a "
    "machine with network access run `git clone https://github.com/rhq945/Token-Guard` and pass "
    "--config.data.data_dir=Token-Guard/data (docs/paper_scale.md)",
  )


def _validate_tokenizer(config) -> None:
  try:
    import regex  # noqa: F401
  except ImportError:
    require(False, "model.tokenizer", "reading tokenizer.json needs `regex`: pip install regex")
  try:
    tokenizer = tokenizer_file(config.model.tokenizer)
  except (OSError, ValueError, KeyError) as error:
    require(False, "model.tokenizer", f"{type(error).__name__}: {error}")
  require(
    config.model.eos_token in tokenizer.added or config.model.eos_token in tokenizer.vocab,
    "model.eos_token",
    f"{config.model.eos_token!r} is not a token of {config.model.tokenizer}",
  )
  vocab = config.model.vocab_size
  require(
    not vocab or tokenizer.vocab_size <= vocab,
    "model.tokenizer",
    f"has {tokenizer.vocab_size} ids, more than model.vocab_size {vocab}",
  )


METHOD = Method(
  name="token_guard", phases=phases, validate=validate, study_arms=study_arms, report=report
)
