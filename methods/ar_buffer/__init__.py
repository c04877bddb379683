"""AR buffer: "Efficient Autoregressive Inference for Transformer Probabilistic Models" (Hassan, Loka
et al., ICLR 2026; arXiv 2510.09477).

Claim: a transformer neural process with a causal autoregressive buffer (targets that attend to a
once-encoded, cached context and to earlier buffer entries) matches the joint log-likelihood of
autoregressive re-encoding (TNP-D-AR) closely, is well above independent marginal predictions, and
samples joint draws much faster (up to 20x on GPU at N ~ 1024) with much less activation memory,
since the context is encoded once for all sample streams instead of once per stream and step.

Phases (`phases.py`):
  train      meta-learning on GP tasks (`core/data/gp_tasks.py`: RBF and Matern-5/2 kernels,
             random lengthscale) or sawtooth tasks (`core/data/sawtooth.py`: random frequency,
             direction, phase and amplitude; `data.task`); every step draws its tasks from its
             rng and trains the mix of set mode (half of the targets see only the context) and
             buffer mode (the rest see a random buffer prefix) in one forward
             (`core/neural_process.py`). Evaluation: per-target joint log-likelihoods on
             held-out tasks of independent marginals, AR re-encoding, the
             one-pass buffer density (and K ablation, sorted decode order) and the oracle (GP: the
             exact joint; sawtooth: the known-parameter noise density, an upper bound).
  benchmark  (if `benchmark.context_sizes`) joint sampling of B streams with the buffer vs AR
             re-encoding, padded (every step N + M tokens, one scanned step) and unpadded (step k:
             N + k tokens, one compiled pass per length), at each context size N, compiled, each
             timed `benchmark.repeats` times side by side; peak activation memory from XLA's
             buffer assignment; ratios.
The study (`study.py`) runs the experiment for each of `study.tasks` and `study.seeds` and reports
intervals over seeds per task.

Choices where the paper is open are listed in `core/neural_process.py`; here: tasks drawn inside the
jitted step (the data are generated, so `data = None`); evaluation tasks drawn from `eval.seed`, the
same for every training seed, so seeds compare paired; orders averaged in log space (mean of the
per-order joint log-likelihoods).
"""

from __future__ import annotations

import ml_collections

from methods.ar_buffer.phases import TASKS, phases
from methods.ar_buffer.study import report, study_arms
from methods.base import Method, require, require_choice, require_positive_int

IMPLEMENTATIONS = ("", "xla", "cudnn", "pallas", "reference")
SHARED_IMPLEMENTATIONS = ("", "xla", "pallas", "reference")
POSITIVE_FIELDS = (
  "model.width",
  "model.depth",
  "model.num_heads",
  "model.mlp_hidden",
  "model.max_buffer",
  "model.embed_hidden",
  "model.num_components",
  "data.min_context",
  "data.max_context",
  "data.num_targets",
  "eval.num_tasks",
  "eval.num_context",
  "eval.num_targets",
  "eval.num_orders",
  "eval.lengthscale_bins",
  "eval.num_plot_samples",
  "eval.plot_context",
  "benchmark.num_samples",
  "benchmark.num_targets",
  "benchmark.repeats",
  "benchmark.ablation_context",
)


def validate(config: ml_collections.ConfigDict) -> None:
  for field in POSITIVE_FIELDS:
    require_positive_int(config, field)
  d, m = config.data, config.model
  require_choice(config, "data.task", TASKS)
  require(
    0 < d.frequency_min <= d.frequency_max,
    "data.frequency_min",
    f"need 0 < frequency_min <= frequency_max, got {d.frequency_min}, {d.frequency_max}",
  )
  require(
    0 < d.amplitude_min <= d.amplitude_max,
    "data.amplitude_min",
    f"need 0 < amplitude_min <= amplitude_max, got {d.amplitude_min}, {d.amplitude_max}",
  )
  require(
    bool(config.study.tasks) and set(config.study.tasks) <= set(TASKS),
    "study.tasks",
    f"must be a non-empty subset of {TASKS}, got {tuple(config.study.tasks)!r}",
  )
  require(
    bool(d.kernels) and all(k in ("rbf", "matern52") for k in d.kernels),
    "data.kernels",
    f"must be a non-empty subset of ('rbf', 'matern52'), got {d.kernels!r}",
  )
  require(
    0 < d.lengthscale_min <= d.lengthscale_max,
    "data.lengthscale_min",
    f"need 0 < lengthscale_min <= lengthscale_max, got {d.lengthscale_min}, {d.lengthscale_max}",
  )
  require(d.noise_std > 0, "data.noise_std", f"must be positive, got {d.noise_std}")
  require(d.x_min < d.x_max, "data.x_min", f"need x_min < x_max, got {d.x_min}, {d.x_max}")
  require(
    d.min_context <= d.max_context,
    "data.min_context",
    f"must not exceed data.max_context={d.max_context}, got {d.min_context}",
  )
  require(
    m.width % m.num_heads == 0 and (m.width // m.num_heads) % 2 == 0,
    "model.num_heads",
    f"must divide model.width={m.width} into even head dims, got {m.num_heads}",
  )
  require(m.min_std > 0, "model.min_std", f"must be positive, got {m.min_std}")
  require_choice(config, "model.attention", IMPLEMENTATIONS)
  require_choice(config, "model.shared_attention", SHARED_IMPLEMENTATIONS)
  for field in ("eval.buffer_sizes", "benchmark.buffer_sizes"):
    sizes = config
    for part in field.split("."):
      sizes = sizes[part]
    require(
      all(isinstance(s, int) and s >= 1 for s in sizes),
      field,
      f"must be positive ints, got {tuple(sizes)!r}",
    )
  require(
    all(isinstance(n, int) and n >= 1 for n in config.benchmark.context_sizes),
    "benchmark.context_sizes",
    f"must be positive ints, got {tuple(config.benchmark.context_sizes)!r}",
  )
  require(
    len(config.study.seeds) >= 1 and all(isinstance(s, int) for s in config.study.seeds),
    "study.seeds",
    f"must be a non-empty tuple of ints, got {config.study.seeds!r}",
  )


METHOD = Method(
  name="ar_buffer", phases=phases, validate=validate, study_arms=study_arms, report=report
)
