"""DCD SSMs on group state tracking: "The Expressive Limits of Diagonal SSMs for State-Tracking" (ICLR 2026,
arXiv 2603.01959, OpenReview 5bg5Ru5OML; no official code for the group experiments).

Claim (Thm 1, 2): a k-layer input-dependent complex-valued diagonal (DCD) SSM at finite precision tracks a
finite group G iff G has a subnormal series of length k with Abelian factors; so one layer tracks exactly
the Abelian groups, solvable groups need their derived length in layers, and A5 is tracked at no depth.
Empirically (the paper's length-generalisation table and its 1-vs-2-layer ablation) training finds the
1-layer Abelian solutions (AUSSM) but not the 2-layer cascades for S3/A4 from random init, though it
keeps them when started near them.

Map to the paper:
  `core/nn/ssm.py`            the DCD layer `h_t = diag(lambda(x_t)) h_{t-1} + b(x_t)` with the
                              eigenvalue parameterisations of the paper's table of SSM variants (S4D,
                              Mamba, Negative Mamba, AUSSM), stacks, the GRU baseline.
  `core/data/groups.py`       Cayley tables, prefix-product labels (the state-tracking task), derived
                              series (Thm 2).
  `core/dcd_constructions.py` the exact constructions of Thm 1 and Thm 2 as model weights.
  `kernels/ssm_scan`          the diagonal linear recurrence (sequential, associative and Pallas scans).
  `phases.py`                 one phase: train (or, for E1, only evaluate) and measure length
                              generalisation.
  `study.py`                  the study's E1/E2/E3 arms and their report; the fidelity sweeps
                              (`gru_sweep`, `aussm_sweep`, `aussm_length` variants: one training
                              setting per arm) and theirs.

Metrics. `accuracy_at_<L>` is the per-position accuracy over positions `(L - window, L]` of the fixed
evaluation sequences (the models are causal, so one pass over the longest length gives every L);
`accuracy_at_train_length` is that at the training length; `longest_length_over_90` is the largest
evaluation length L such that the accuracy exceeds `eval.threshold` at every evaluation length <= L
(0: it fails already at the training length, the paper's "x"); `accuracy_all_positions` averages all
positions of the longest length (E1's "100% at T = 10^4"); `state_growth` (DCD kinds) is the largest
ratio over the first layer's state coordinates of the mean `|h_t|` at the longest length to that at the
training length (`phases.state_growth`).

Choices where the paper is open: fixed-length training sequences with the loss at every position (this
covers every prefix length 1..train_length, as lengths drawn from U{1..60} would); one shared evaluation
set per group (`data.eval_seed`) so seeds and models are compared on the same sequences; E3's noise is
relative to each weight matrix's RMS (`dcd_constructions.perturb`); a cell of the E2 grid is one run (1
seed on CPU). The CPU study trains a smaller model (d_model 32, d_state 16, batch 32, 1000 steps, Adam
1e-2) than the E2 grid was first planned with (64 / 32 / 64, <= 1500 steps, Adam 1e-3) to fit ~10 minutes,
E3 uses 2 seeds instead of 5 and 300 steps at Adam 1e-3, and the GRU baseline runs at one layer only (it
needs ~10x the study's steps to learn Z6, `gru_sweep`); the `gpu` variant restores the paper's scale. The
construction's logits have margin `model.logit_scale = 5` (loss ~0.03), so E3's training from it sees
gradients rather than a saturated loss.
"""

from __future__ import annotations

import ml_collections

from core.nn import precision, ssm
from methods.base import Method, require, require_choice, require_positive_int
from methods.dcd_ssm.phases import (
  INITS,
  SCAN_IMPLEMENTATIONS,
  accuracy_by_position,
  cascade_of,
  cross_entropy,
  evaluate,
  group_of,
  init_state,
  initial_params,
  length_metrics,
  model_of,
  optimizer,
  phases,
  train_step,
)
from methods.dcd_ssm.study import report, study_arms, sweep_arms, sweep_report

__all__ = [
  "INITS",
  "METHOD",
  "SCAN_IMPLEMENTATIONS",
  "accuracy_by_position",
  "cascade_of",
  "cross_entropy",
  "evaluate",
  "group_of",
  "init_state",
  "initial_params",
  "length_metrics",
  "model_of",
  "optimizer",
  "phases",
  "report",
  "study_arms",
  "sweep_arms",
  "sweep_report",
  "train_step",
  "validate",
]

# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


def validate(config: ml_collections.ConfigDict) -> None:
  group_of(config)
  require_choice(config, "model.kind", ssm.RECURRENCES)
  require_choice(config, "model.input_term", ssm.INPUT_TERMS)
  require_choice(config, "model.init", INITS)
  require_choice(config, "model.scan_implementation", SCAN_IMPLEMENTATIONS)
  require_choice(config, "model.dtype", precision.DTYPE_NAMES)
  for field in (
    "model.d_model",
    "model.d_state",
    "model.d_hidden",
    "model.num_layers",
    "data.train_length",
    "eval.num_sequences",
    "eval.batch_size",
    "eval.window",
  ):
    require_positive_int(config, field)
  lengths = config.eval.lengths
  require(
    len(lengths) > 0 and all(isinstance(L, int) and L > 0 for L in lengths),
    "eval.lengths",
    f"must be positive ints, got {lengths}",
  )
  require(
    config.data.train_length in lengths,
    "eval.lengths",
    f"must include data.train_length = {config.data.train_length}, got {tuple(lengths)}",
  )
  require(0.0 < config.eval.threshold < 1.0, "eval.threshold", "must be in (0, 1)")
  require(config.model.init_noise >= 0, "model.init_noise", "must be >= 0")
  require(config.model.logit_scale > 0, "model.logit_scale", "must be positive")
  require(isinstance(config.model.block_norm, bool), "model.block_norm", "must be True or False")
  if config.model.init == "construction":
    require(
      not config.model.block_norm, "model.block_norm", "the constructions are built without norms"
    )
    _validate_construction(config)


def _validate_construction(config) -> None:
  cascade = cascade_of(config)
  for field, need in cascade.required_sizes().items():
    have = config.model[field]
    require(
      have >= need, f"model.{field}", f"{have} is too small for the construction, need >= {need}"
    )


METHOD = Method(
  name="dcd_ssm", phases=phases, validate=validate, study_arms=study_arms, report=report
)
