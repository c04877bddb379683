"""FGL: "Forest-Based Graph Learning for Semi-Supervised Node Classification" (Li et al., ICLR 2026).

Claim: message passing as transport over spanning trees sampled with P(T) ~ prod_{e in T} s(e),
s an attention-based homophily score, reaches all n^2 node pairs in linear time through a two-pass
tree aggregator (Theorem 1, Eq. 7-8), and beats local GNNs (GCN, GAT) on heterophilous graphs while
staying close to them on homophilous ones.

Phases for `config.model.kind = "fgl"` (each a phase of the shared loop; the graph is full-batch and
closed over, so `data` is None except for the student, whose data are the sampled trees):
  naam       pre-trains the non-attention auxiliary model (the paper's pre-processing): a GCN if the
             homophily estimated on labeled (train + val) edges is > 0.5, else an MLP (`fgl.naam`);
             its outputs are pseudo-labels and G-hat = G + the k most similar nodes per node in
             pseudo-label (softmax) space (`core.graph.augment_with_knn`).
  estimator  (`fgl.scores = "estimator"`) local Q/K/V attention on G-hat trained with cross-entropy on
             the pseudo-labels (Eq. 3, "two-stage" estimator); s(e_ij) = (a_i->j + a_j->i) / 2.
  student    N_T spanning forests of G-hat from the weighted Wilson sampler, resampled every
             `fgl.resample_every` epochs (the phase's DataSource, `core.data.forests.TreeSource`:
             trees as a pure function of the step); per tree the two-pass aggregation with W_A^dist
             (Eq. 7-8, `kernels/tree_aggregate`), RowNorm, mean over trees, fused with the local
             module (Eq. 9-11; `core.nn.gnn.FGLStudent`).
`fgl.scores = "uniform"` (s = 1: uniform spanning trees), `"oracle"` (s = p on same-label edges,
q otherwise, p/q = `fgl.oracle_ratio`; `fgl.oracle_noise` mixes U(0, 1) noise into the same-label
indicator in the exponent, taking the edge AUC from 1 to 1/2) and `"agreement"` (s = sum_c
p_i(c) p_j(c) of the NAAM's predicted class distributions, a baseline estimator without attention)
replace the estimator; `fgl.estimator_labels = "true"` trains the estimator on the true labels of
every node instead of the pseudo-labels (an upper bound of the estimator, for diagnosis).
Baselines (`mlp`, `gcn`, `gat`) are one phase `train` on G, or `naam` then `train` on G-hat
(`model.graph = "augmented"`, the reviewers' "GCN on G-hat"). `config.analysis` selects
evaluate-only runs: `theorem2` (tree homophily against p/q toward 1 - (NHCC - 1)/(n - 1), Theorem 2,
no training) and `scaling` (aggregator vs dense attention time). `study.design = "oracle_noise"`
(`configs/fgl.py:oracle_noise`) is the score-quality study: accuracy gain over FGL-uniform against
the scores' edge AUC.

Layout: `phases.py` (the phases and their steps), `study.py` (the study's arms, tables and figure);
the graphs and splits are `core.data.graphs`, the trees `core.data.forests`, the networks and their
calling convention `core.nn.gnn`, the graph algorithms `core.graph`.

Choices where the paper is open:
* alpha is frozen after the estimator phase (the reviewers' open question); the student's tree edge
  weights are alpha relative to the receiver's most attended neighbour (in [0, 1]), the local
  module's A_alpha is alpha itself (rows sum to 1).
* W_A is diagonal, diag(tanh theta) (`fgl.w_a = "diagonal"`: W_A^dist is then a per-channel scalar
  power inside the kernel's passes), or symmetric U diag(tanh theta) U^T with U orthogonal by the
  Cayley map (`"symmetric"`); either way ||W_A||_2 < 1, so that W_A^dist stays bounded along deep
  trees, and W_A^dist costs one kernel call with per-channel weights. Diagonal is the default: on
  CPU the gradient of the Cayley map's 64 x 64 solve costs more than the tree passes themselves.
* RowNorm is L2 row normalisation; fusion is RowNorm(local) + gamma * mean_k RowNorm(tree_k), gamma
  learnable; local = 2 steps of the softmax-weighted blend of A_alpha, A-hat and I.
* G-hat may stay disconnected: the sampler draws spanning *forests* (one root per component) and
  the aggregator works on forests.
* Early stopping = keeping the parameters of the best validation accuracy (ties: lower validation
  loss); `test_accuracy` is the test accuracy of those parameters.
"""

from __future__ import annotations

import ml_collections

from core.data.forests import Forest, TreeSource
from core.nn import precision
from methods.base import Method, lookup, require, require_choice, require_positive_int
from methods.fgl.phases import auc, forest_inputs, load_dataset, phases
from methods.fgl.study import ARMS, report, study_arms

__all__ = [
  "ANALYSES",
  "ARMS",
  "IMPLEMENTATIONS",
  "KINDS",
  "METHOD",
  "SCORES",
  "Forest",
  "TreeSource",
  "auc",
  "phases",
  "forest_inputs",
  "load_dataset",
  "report",
  "study_arms",
  "validate",
]

KINDS = ("mlp", "gcn", "gat", "fgl")
SCORES = ("estimator", "agreement", "uniform", "oracle")
ANALYSES = ("", "theorem2", "scaling")
IMPLEMENTATIONS = ("", "xla", "sequential", "pallas")

_auc = auc  # the name tests/test_fgl.py knows


def validate(config: ml_collections.ConfigDict) -> None:
  require_choice(config, "analysis", ANALYSES)
  require_choice(config, "data.source", ("csbm", "planetoid"))
  require_choice(config, "data.split", ("few_label", "public"))
  require_choice(config, "model.kind", KINDS)
  require_choice(config, "model.graph", ("base", "augmented"))
  require_choice(config, "model.dtype", precision.DTYPE_NAMES)
  require_choice(config, "fgl.scores", SCORES)
  require_choice(config, "fgl.naam", ("auto", "gcn", "mlp"))
  require_choice(config, "fgl.estimator_labels", ("pseudo", "true"))
  require_choice(config, "study.design", ("homophily", "oracle_noise"))
  require_choice(config, "fgl.implementation", IMPLEMENTATIONS)
  require_choice(config, "fgl.w_a", ("diagonal", "symmetric"))
  for field in (
    "model.hidden",
    "model.num_layers",
    "model.heads",
    "fgl.num_trees",
    "fgl.resample_every",
    "fgl.naam_steps",
    "fgl.estimator_steps",
    "fgl.estimator_hidden",
    "data.labels_per_class",
    "theorem2.num_trees",
    "eval_every",
  ):
    require_positive_int(config, field)
  require(
    0.0 <= config.data.homophily <= 1.0,
    "data.homophily",
    f"must be in [0, 1], got {config.data.homophily}",
  )
  require(
    0.0 <= config.model.dropout < 1.0,
    "model.dropout",
    f"must be in [0, 1), got {config.model.dropout}",
  )
  require(
    config.model.kind != "gat" or config.model.hidden % config.model.heads == 0,
    "model.heads",
    f"must divide model.hidden={config.model.hidden}, got {config.model.heads}",
  )
  require(
    isinstance(config.fgl.knn, int) and config.fgl.knn >= 0,
    "fgl.knn",
    f"must be an int >= 0, got {config.fgl.knn}",
  )
  require(
    isinstance(config.fgl.local_steps, int) and config.fgl.local_steps >= 0,
    "fgl.local_steps",
    "must be an int >= 0",
  )
  require(
    config.fgl.oracle_ratio > 0,
    "fgl.oracle_ratio",
    f"must be positive, got {config.fgl.oracle_ratio}",
  )
  require(
    0.0 <= config.fgl.oracle_noise <= 1.0,
    "fgl.oracle_noise",
    f"must be in [0, 1], got {config.fgl.oracle_noise}",
  )
  require(
    all(0.0 <= x <= 1.0 for x in config.study.noise_levels),
    "study.noise_levels",
    f"must lie in [0, 1], got {config.study.noise_levels}",
  )
  require(0.0 < config.fgl.eigenvalue_init < 1.0, "fgl.eigenvalue_init", "must be in (0, 1)")
  require(
    len(config.fgl.beta_init) == 3 and min(config.fgl.beta_init) > 0,
    "fgl.beta_init",
    f"needs three positive weights (attention, A-hat, identity), got {config.fgl.beta_init}",
  )
  for field in ("optim.learning_rate", "fgl.learning_rate"):
    value = lookup(config, field)
    require(value > 0, field, f"must be positive, got {value}")
  require(
    config.data.source != "planetoid" or bool(config.data.data_dir),
    "data.data_dir",
    "the planetoid source needs a prepared directory of raw ind.<name>.* files",
  )


METHOD = Method(name="fgl", phases=phases, validate=validate, study_arms=study_arms, report=report)
