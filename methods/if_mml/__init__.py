"""IID: "Supporting Multimodal Intermediate Fusion with Informatic Constraint and Distribution Coherence"
(Li, Song, Zheng, Li; ICLR 2026).

Claim: intermediate fusion (IF, a weighted sum of modality latents under one linear head) generalises
better than late fusion (LF, a weighted sum of per-modality predictions) once the head is in the
parameter set the paper's existence result describes (Sec. 3.2), which the informatic constraint L_ic
steers training towards; the IF generalisation bound (Sec. 3.3) grows with the distribution
incoherence D(mu_m, mu) of the modality latents, which the distribution-coherence loss L_dc (FFT
sparsification, a RIP projection and unbalanced Sinkhorn) removes. The objective (Sec. 4.3) is
  L = CE(g(z), y) + alpha L_ic + beta L_dc.

One phase per model named in `config.models` (each trains and evaluates one model; the phases share
nothing):
  lf      late fusion, CE on the fused logits plus each head's CE (`lf.unimodal_weight`).
  if      intermediate fusion, CE.
  concat  a linear head on [z^1; z^2] (the reviewers' Concat foil).
  if_ic   IF + alpha L_ic;  if_dc  IF + beta L_dc;  full  IF + alpha L_ic + beta L_dc (IID).
`config.ic.unimodal_sign` is the sign of L_ic's unimodal term (+1 as printed, -1 as the prose says).
The maths is in `core/fusion.py`, the networks in `core/nn/fusion.py`, the data in
`core/data/multimodal.py`.

Replicates. Every phase trains P = len(data.deltas) x data.num_seeds independent replicates as one
vmapped step: replicate p has incoherence deltas[p // num_seeds] and seed index p % num_seeds. The data
(design and samples) depend on the seed index only (common random numbers across deltas), and so do
the initial weights and the RIP matrix, so every model, delta and seed is compared paired.

Evaluation. With `eval.select_best` (synthetic data) every `eval.select_every` steps the step scores
each replicate on the validation split and keeps its best weights (the benchmark protocol of the
paper's baselines: test at the best validation epoch). Per phase `<m>` the results are, for those
weights, `accuracy_<m>` (mean test accuracy over replicates), `gap_<m>` (train - test accuracy),
`incoherence_<m>` (exact W_2 between the test latents z^1 and z^2), `relative_incoherence_<m>` (that
W_2 over the RMS spread of the pooled latents: scale-free), cross-entropies, unimodal accuracies, and
the same for the weights after all steps as `final_<metric>_<m>`; arrays of shape (deltas, seeds)
under `<metric>_<m>/replicates` feed the study's intervals.

Fusion weights (`model.weighting`, `core.fusion.fusion_weights`): static w = (1/2, 1/2) by default
(IID-L), QMF's energy weights (IID-Q) or PDF's co-belief weights (IID-P: confidence networks on the
fixed latents regress each modality's true-class probability with an L1 loss of weight
`model.confidence_weight`, added to L; training fuses with the uncalibrated co-belief, evaluation
with the relatively calibrated one, as the official PDF code does).

Choices where the paper is open: see `core/fusion.py` (sign, KL fit, sparsification, normalised cost,
Danskin gradients). Here: Adam without weight decay on shuffled minibatches; the Gaussian RIP matrix is
drawn once per replicate and fixed; alpha and beta were chosen from the paper's grid (alpha) and a
normalised-cost grid (beta) by validation accuracy on data seeds 100-102 (`data.first_seed`), disjoint
from the study's seeds 0-4.

Layout: `phases.py` (data, models, losses, step, evaluation), `study.py` (arms, table, figure), this
file (validation and `METHOD`).
"""

from __future__ import annotations

import ml_collections

from core.nn import fusion as fusion_nn
from methods.base import (
  Method,
  require,
  require_choice,
  require_positive_int,
  with_changes,
)
from methods.if_mml import phases
from methods.if_mml.phases import (
  MODELS,
  REPLICATES,
  evaluate,
  is_synthetic,
  load_data,
  model_of,
  replicate_loss,
  train_step,
)
from methods.if_mml.study import arm_changes, paired, report, study_arms, t_interval

__all__ = [
  "METHOD",
  "MODELS",
  "REPLICATES",
  "evaluate",
  "load_data",
  "model_of",
  "paired",
  "phases",
  "replicate_loss",
  "report",
  "study_arms",
  "t_interval",
  "train_step",
  "validate",
]


def validate(config: ml_collections.ConfigDict) -> None:
  models = tuple(config.models)
  require(len(models) > 0, "models", "must name at least one model")
  unknown = sorted(set(models) - set(MODELS))
  require(not unknown, "models", f"unknown models {unknown}; choose from {list(MODELS)}")
  require(len(set(models)) == len(models), "models", f"names a model twice: {models}")
  _validate_data(config)
  require_choice(config, "model.encoder", fusion_nn.ENCODERS)
  require_choice(config, "model.weighting", fusion_nn.WEIGHTINGS)
  for field in ("model.latent_dim", "dc.keep", "dc.projection_dim", "dc.iterations", "eval.chunk"):
    require_positive_int(config, field)
  weights = tuple(config.model.static_weights)
  require(
    len(weights) == 2 and min(weights) >= 0 and abs(sum(weights) - 1.0) < 1e-6,
    "model.static_weights",
    f"need two non-negative weights summing to 1, got {weights}",
  )
  require_choice(config, "ic.unimodal_sign", (1, -1))
  require(
    config.dc.keep <= config.model.latent_dim,
    "dc.keep",
    f"keeps {config.dc.keep} FFT coefficients of a {config.model.latent_dim}-dim latent",
  )
  for field in (
    "ic.alpha",
    "ic.kl_weight",
    "dc.beta",
    "lf.unimodal_weight",
    "model.confidence_weight",
  ):
    section, key = field.split(".")
    require(config[section][key] >= 0, field, f"must be >= 0, got {config[section][key]}")
  for field in ("dc.epsilon", "dc.marginal_weight", "optim.learning_rate"):
    section, key = field.split(".")
    require(config[section][key] > 0, field, f"must be > 0, got {config[section][key]}")
  require_positive_int(config, "eval.select_every")
  _validate_study(config)
  require_positive_int(config, "eval.incoherence_points")
  require(
    config.eval.incoherence_points <= config.data.num_test,
    "eval.incoherence_points",
    f"{config.eval.incoherence_points} exceeds data.num_test = {config.data.num_test}",
  )


def _validate_study(config) -> None:
  study = config.study
  unknown = sorted(set(study.models) - set(MODELS))
  require(not unknown, "study.models", f"unknown models {unknown}; choose from {list(MODELS)}")
  require(
    set(study.ic_signs) <= {1, -1} and len(study.ic_signs) > 0,
    "study.ic_signs",
    f"need a non-empty subset of (1, -1), got {tuple(study.ic_signs)}",
  )
  for field in ("study.alphas", "study.betas"):
    values = tuple(config.study[field.split(".")[1]])
    require(all(v >= 0 for v in values), field, f"must be >= 0, got {values}")
  dynamic = tuple(w for w in fusion_nn.WEIGHTINGS if w != "static")
  require(
    set(study.weightings) <= set(dynamic),
    "study.weightings",
    f"need a subset of {dynamic}, got {tuple(study.weightings)}",
  )
  weighted = set(study.weighted_models)
  require(
    weighted <= set(MODELS) - {"concat"},
    "study.weighted_models",
    f"need models with fusion weights (not concat), got {tuple(study.weighted_models)}",
  )
  known = [n for n in arm_changes(with_changes(config, study__affine_arms=()))]
  missing = sorted(set(study.affine_arms) - set(known))
  require(not missing, "study.affine_arms", f"unknown arms {missing}; choose from {known}")


def _validate_data(config) -> None:
  d = config.data
  for field in ("data.num_seeds", "data.num_classes", "data.num_test"):
    require_positive_int(config, field)
  deltas = tuple(d.deltas)
  require(
    len(deltas) > 0 and all(v >= 0 for v in deltas), "data.deltas", f"need >= 0, got {deltas}"
  )
  if not is_synthetic(config):
    require(
      bool(d.data_dir),
      "data.data_dir",
      f"{d.name!r} is read from a prepared tfds data_dir (array_record; never downloaded); "
      "set --config.data.data_dir",
    )
    require(deltas == (0.0,), "data.deltas", "the incoherence knob exists for synthetic data only")
    require(len(tuple(d.fields)) == 3, "data.fields", "need (modality 1, modality 2, label)")
    require_positive_int(config, "data.num_train_eval")
    return
  for field in ("data.num_train", "data.semantic_dim", "data.input_dim", "data.view_dim"):
    require_positive_int(config, field)
  require(
    isinstance(d.first_seed, int) and d.first_seed >= 0,
    "data.first_seed",
    f"must be an int >= 0, got {d.first_seed!r}",
  )
  require(d.tail_rate >= 0, "data.tail_rate", f"must be >= 0, got {d.tail_rate}")
  require(
    d.view_dim <= min(d.semantic_dim, d.input_dim),
    "data.view_dim",
    f"must be <= min(semantic_dim, input_dim) = {min(d.semantic_dim, d.input_dim)}, got {d.view_dim}",
  )
  require(d.class_scale > 0, "data.class_scale", f"must be > 0, got {d.class_scale}")
  require(
    config.batch_size <= d.num_train,
    "batch_size",
    f"{config.batch_size} exceeds data.num_train = {d.num_train}",
  )


METHOD = Method(
  name="if_mml", phases=phases.phases, validate=validate, study_arms=study_arms, report=report
)
