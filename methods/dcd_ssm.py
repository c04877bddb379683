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
  here                        one phase: train (or, for E1, only evaluate) and measure length
                              generalisation; the study's E1/E2/E3 arms and their report.

Metrics. `accuracy_at_<L>` is the per-position accuracy over positions `(L - window, L]` of the fixed
evaluation sequences (the models are causal, so one pass over the longest length gives every L);
`accuracy_at_train_length` is that at the training length; `longest_length_over_90` is the largest
evaluation length L such that the accuracy exceeds `eval.threshold` at every evaluation length <= L
(0: it fails already at the training length, the paper's "x"); `accuracy_all_positions` averages all
positions of the longest length (E1's "100% at T = 10^4").

Choices where the paper is open: fixed-length training sequences with the loss at every position (this
covers every prefix length 1..train_length, as lengths drawn from U{1..60} would); one shared evaluation
set per group (`data.eval_seed`) so seeds and models are compared on the same sequences; E3's noise is
relative to each weight matrix's RMS (`dcd_constructions.perturb`); a cell of the E2 grid is one run (1
seed on CPU). The CPU study trains a smaller model (d_model 32, d_state 16, batch 32, 1000 steps, Adam
1e-2) than the E2 grid was first planned with (64 / 32 / 64, <= 1500 steps, Adam 1e-3) to fit ~10
minutes, E3 uses 2 seeds instead of 5 and 300 steps at Adam 1e-3, and the GRU baseline runs at one layer
only; the `gpu` variant restores the paper's scale. The construction's logits have margin
`model.logit_scale = 5` (loss ~0.03), so E3's training from it sees gradients rather than a saturated
loss.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import dcd_constructions, optim
from core.data import groups as groups_lib
from core.nn import precision, ssm
from experiments.reports import figure_grid, markdown_table
from methods.base import (
  ConfigError,
  Method,
  Phase,
  Report,
  cached_per_config,
  config_key,
  require,
  require_choice,
  require_positive_int,
  with_changes,
)

SCAN_IMPLEMENTATIONS = ("auto", "pallas", "xla", "sequential")
INITS = ("random", "construction")


# ---------------------------------------------------------------------------------------------------
# Model, data, construction
# ---------------------------------------------------------------------------------------------------


def group_of(config: ml_collections.ConfigDict) -> groups_lib.FiniteGroup:
  try:
    return groups_lib.by_name(config.data.group)
  except ValueError as error:
    raise ConfigError(f"config.data.group: {error}") from None


def model_of(config: ml_collections.ConfigDict, group: groups_lib.FiniteGroup) -> ssm.StateTracker:
  m = config.model
  implementation = None if m.scan_implementation == "auto" else m.scan_implementation
  return ssm.StateTracker(
    vocab_size=group.order,
    num_classes=group.order,
    d_model=m.d_model,
    d_state=m.d_state,
    d_hidden=m.d_hidden,
    num_layers=m.num_layers,
    kind=m.kind,
    scan_implementation=implementation,
    dtype=precision.compute_dtype(m.dtype),
  )


def cascade_of(config: ml_collections.ConfigDict) -> dcd_constructions.Cascade:
  """The exact construction for `config` (Thm 1 / Thm 2), or a ConfigError saying why there is none."""
  try:
    return dcd_constructions.construction_for(
      config.data.group, config.model.kind, config.model.num_layers
    )
  except ValueError as error:
    raise ConfigError(f"config.model.init: 'construction' impossible here: {error}") from None


def optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam with linear warmup and cosine decay (E2), global-norm clipping."""
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip)


def initial_params(config, model, group, rng) -> dict:
  """Random init, or the construction plus `model.init_noise` relative noise (E1, E3)."""
  init_rng, noise_rng = jax.random.split(rng)
  dummy = jnp.zeros((1, config.data.train_length), jnp.int32)
  random_params = model.init(init_rng, dummy)
  if config.model.init == "random":
    return random_params
  shapes = jax.eval_shape(model.init, init_rng, dummy)
  exact = dcd_constructions.construction_params(
    cascade_of(config), model, shapes, config.model.logit_scale
  )
  if config.model.init_noise == 0:
    return jax.tree.map(jnp.asarray, exact)
  return dcd_constructions.perturb(exact, random_params, config.model.init_noise, noise_rng)


def init_state(config, model, group, rng, inputs=None) -> dict:
  del inputs
  params = initial_params(config, model, group, rng)
  return {"params": params, "opt_state": optimizer(config).init(params)}


def cross_entropy(model, params, batch) -> tuple[jax.Array, jax.Array]:
  """Mean cross-entropy and accuracy of the prefix-product labels at every position."""
  logits = model.apply(params, batch["x"])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["y"])
  return loss, accuracy


def train_step(config, model, state, batch, rng):
  del rng
  (loss, accuracy), grads = jax.value_and_grad(
    lambda p: cross_entropy(model, p, batch), has_aux=True
  )(state["params"])
  updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads)}
  return {"params": params, "opt_state": opt_state}, metrics


# ---------------------------------------------------------------------------------------------------
# Evaluation: length generalisation
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=16)
def _correct_fn(config: ml_collections.ConfigDict):
  """Jitted `(params, x, y) -> [batch, T] bool` correctness of every position."""
  model = model_of(config, group_of(config))
  return jax.jit(lambda params, x, y: jnp.argmax(model.apply(params, x), -1) == y)


_CURVES: dict = {}  # the last curve per config, so the figure reuses the evaluation's pass


def _fingerprint(params) -> float:
  return float(sum(np.sum(np.asarray(leaf, np.float64)) for leaf in jax.tree.leaves(params)))


def accuracy_by_position(config: ml_collections.ConfigDict, params) -> np.ndarray:
  """Accuracy at each position 1..max(eval.lengths) over the fixed evaluation set, `[T]`."""
  key = (config_key(config), _fingerprint(params))
  if key not in _CURVES:
    _CURVES.clear()
    _CURVES[key] = _accuracy_by_position(config, params)
  return _CURVES[key]


def _accuracy_by_position(config: ml_collections.ConfigDict, params) -> np.ndarray:
  group, lengths = group_of(config), config.eval.lengths
  data = groups_lib.evaluation_set(
    group, max(lengths), config.eval.num_sequences, config.data.eval_seed
  )
  correct_fn, size = _correct_fn(config), config.eval.batch_size
  hits = np.zeros(max(lengths))
  for start in range(0, config.eval.num_sequences, size):
    x, y = data["x"][start : start + size], data["y"][start : start + size]
    hits += np.asarray(correct_fn(params, x, y)).sum(0)
  return hits / config.eval.num_sequences


def length_metrics(config: ml_collections.ConfigDict, curve: np.ndarray) -> dict[str, float]:
  """`accuracy_at_<L>` per evaluation length, the train-length accuracy and the longest length whose
  accuracy (and that of every shorter evaluation length) exceeds `eval.threshold`."""
  window, threshold = config.eval.window, config.eval.threshold
  at = {L: float(curve[max(L - window, 0) : L].mean()) for L in sorted(config.eval.lengths)}
  train_length = config.data.train_length
  longest = 0
  for L, accuracy in at.items():
    if accuracy <= threshold:
      break
    longest = L
  results = {f"accuracy_at_{L}": accuracy for L, accuracy in at.items()}
  results["accuracy_at_train_length"] = float(
    curve[max(train_length - window, 0) : train_length].mean()
  )
  results["longest_length_over_90"] = float(longest)
  results["accuracy_all_positions"] = float(curve.mean())
  return results


def evaluate(config, state) -> dict[str, float]:
  return length_metrics(config, accuracy_by_position(config, state["params"]))


def accuracy_figure(config, state):
  curve = accuracy_by_position(config, state["params"])
  fig, ((ax,),) = figure_grid(figsize=(6, 3))
  ax.plot(np.arange(1, len(curve) + 1), curve)
  ax.axvline(config.data.train_length, color="gray", ls="--", label="train length")
  ax.axhline(config.eval.threshold, color="C3", ls=":", label=f"{config.eval.threshold:.0%}")
  ax.set(xlabel="position t", ylabel="accuracy of p_t", ylim=(0, 1.02), xscale="log")
  ax.set_title(f"{config.data.group}, {config.model.kind}, {config.model.num_layers} layer(s)")
  ax.legend()
  fig.tight_layout()
  return fig


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  group = group_of(config)
  model = model_of(config, group)
  return [
    Phase(
      name="evaluate" if config.evaluate_only else "train",
      num_steps=0 if config.evaluate_only else config.steps,
      init=functools.partial(init_state, config, model, group),
      step=functools.partial(train_step, config, model),
      data=lambda inputs: groups_lib.tracking_batches(
        group, config.data.train_length, config.batch_size, config.seed
      ),
      evaluate=lambda state, rng, inputs: evaluate(config, state),
      artifacts=(
        (lambda state, rng, inputs: {"accuracy_by_position": accuracy_figure(config, state)})
        if config.eval.write_figure
        else None
      ),
    )
  ]


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


def validate(config: ml_collections.ConfigDict) -> None:
  group_of(config)
  require_choice(config, "model.kind", ssm.RECURRENCES)
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
  if config.model.init == "construction":
    _validate_construction(config)


def _validate_construction(config) -> None:
  cascade = cascade_of(config)
  for field, need in cascade.required_sizes().items():
    have = config.model[field]
    require(
      have >= need, f"model.{field}", f"{have} is too small for the construction, need >= {need}"
    )


# ---------------------------------------------------------------------------------------------------
# Study: E1 exact constructions, E2 training grid, E3 learnability gap
# ---------------------------------------------------------------------------------------------------


def _e1_name(group: str, kind: str, layers: int) -> str:
  return f"e1_{group}_{kind}_{layers}L"


def _e2_name(group: str, kind: str, layers: int, seed: int) -> str:
  return f"e2_{group}_{kind}_{layers}L_seed{seed}"


def _e3_name(sigma: float, seed: int) -> str:
  return f"e3_S3_aussm_2L_sigma{sigma:g}_seed{seed}"


def study_arms(config: ml_collections.ConfigDict):
  """E1 (exact weights, evaluation only), E2 (grid from random init), E3 (construction + noise)."""
  study = config.study
  arms = []
  for group, kind, layers in study.e1_constructions:
    need = dcd_constructions.construction_for(group, kind, layers).required_sizes()
    arm = with_changes(
      config,
      **{f"model__{field}": max(config.model[field], size) for field, size in need.items()},
      data__group=group,
      model__kind=kind,
      model__num_layers=layers,
      model__init="construction",
      evaluate_only=True,
      eval__lengths=tuple(study.e1_lengths),
      eval__num_sequences=study.e1_num_sequences,
      eval__batch_size=study.e1_num_sequences,
    )
    arms.append((_e1_name(group, kind, layers), arm))
  for group in study.e2_groups:
    for kind, layers in study.e2_models:
      for seed in range(study.e2_seeds):
        arm = with_changes(
          config, seed=seed, data__group=group, model__kind=kind, model__num_layers=layers
        )
        arms.append((_e2_name(group, kind, layers, seed), arm))
  for sigma in study.e3_sigmas:
    for seed in range(study.e3_seeds):
      arm = with_changes(
        config,
        seed=seed,
        steps=study.e3_steps,
        optim__learning_rate=study.e3_learning_rate,
        data__group="S3",
        model__kind="aussm",
        model__num_layers=2,
        model__init="construction",
        model__init_noise=float(sigma),
        eval__lengths=tuple(study.e3_lengths),
      )
      arms.append((_e3_name(sigma, seed), arm))
  return arms


def _row(experiment, group, kind, layers, init, runs, success=None) -> dict:
  """One table row; over several runs: mean accuracies, the (lower) median longest length."""
  return {
    "experiment": experiment,
    "group": group,
    "model": kind,
    "layers": layers,
    "init": init,
    "accuracy_at_train_length": float(np.mean([r["accuracy_at_train_length"] for r in runs])),
    "accuracy_at_250": (
      float(np.mean([r["accuracy_at_250"] for r in runs])) if "accuracy_at_250" in runs[0] else None
    ),
    "longest_length_over_90": float(
      np.percentile([r["longest_length_over_90"] for r in runs], 50, method="lower")
    ),
    "runs": len(runs),
    "success_rate": success,
  }


def _e2_runs(config, results, group, kind, layers) -> list:
  names = (_e2_name(group, kind, layers, s) for s in range(config.study.e2_seeds))
  return [results[n] for n in names if n in results]


def _e3_runs(config, results, sigma) -> list:
  names = (_e3_name(sigma, s) for s in range(config.study.e3_seeds))
  return [results[n] for n in names if n in results]


def _e3_success(config, runs) -> float:
  key = f"accuracy_at_{config.study.e3_success_length}"
  return float(np.mean([r[key] > config.eval.threshold for r in runs]))


def _rows(config, results) -> list[dict]:
  study, rows = config.study, []
  for group, kind, layers in study.e1_constructions:
    name = _e1_name(group, kind, layers)
    if name in results:
      rows.append(_row("e1", group, kind, layers, "construction", [results[name]]))
  for group in study.e2_groups:
    for kind, layers in study.e2_models:
      runs = _e2_runs(config, results, group, kind, layers)
      if runs:
        rows.append(_row("e2", group, kind, layers, "random", runs))
  for sigma in study.e3_sigmas:
    runs = _e3_runs(config, results, sigma)
    if runs:
      init = f"construction+{sigma:g}"
      rows.append(_row("e3", "S3", "aussm", 2, init, runs, _e3_success(config, runs)))
  return rows


def _longest(config, results, group, kind, layers):
  runs = _e2_runs(config, results, group, kind, layers)
  return (
    float(np.percentile([r["longest_length_over_90"] for r in runs], 50, method="lower"))
    if runs
    else None
  )


def _length_cell(longest) -> str:
  if longest is None:
    return ""
  return "x" if longest == 0 else f"{longest:.0f}"


def _pivot(config, results) -> str:
  """The paper-style table: longest length with accuracy > threshold, group x (model, layers)."""
  columns = [tuple(c) for c in config.study.e2_models]
  return markdown_table(
    [
      {"group": group}
      | {f"{k} {L}L": _length_cell(_longest(config, results, group, k, L)) for k, L in columns}
      for group in config.study.e2_groups
    ]
  )


def _group_facts(names) -> dict[str, dict]:
  facts = {}
  for name in names:
    group = groups_lib.by_name(name)
    facts[name] = {
      "abelian": group.is_abelian(),
      "derived_length": groups_lib.derived_length(group),
    }
  return facts


def _summary(config, results) -> dict:
  """The expected outcomes of E1-E3, as measured (not asserted)."""
  study = config.study
  facts = _group_facts(sorted(set(study.e2_groups) | {"A5"}))
  e1 = [results[n] for n in (_e1_name(*c) for c in study.e1_constructions) if n in results]
  top = float(max(config.eval.lengths))
  dcd_models = [(k, L) for k, L in study.e2_models if k != "gru"]
  abelian = [g for g in study.e2_groups if facts[g]["abelian"]]
  non_abelian = [g for g in study.e2_groups if not facts[g]["abelian"]]
  longest = functools.partial(_longest, config, results)
  return {
    "e1_min_accuracy_all_positions": min((r["accuracy_all_positions"] for r in e1), default=None),
    "e1_length": max(study.e1_lengths),
    "derived_lengths": {g: f["derived_length"] for g, f in facts.items()},
    "A5_solvable": facts["A5"]["derived_length"] is not None,
    "abelian_aussm_1L_longest": {g: longest(g, "aussm", 1) for g in abelian},
    "non_abelian_dcd_1L_reaching_max_length": [
      f"{g}/{k}" for g in non_abelian for k, L in dcd_models if L == 1 and longest(g, k, 1) == top
    ],
    "dcd_cells_tracking_A5_at_train_length": [
      f"{k}/{L}L" for k, L in dcd_models if (longest("A5", k, L) or 0) > 0
    ],
    "gru_accuracy_at_train_length": {
      f"{g}/{L}L": float(np.mean([r["accuracy_at_train_length"] for r in runs]))
      for g in study.e2_groups
      for k, L in study.e2_models
      if k == "gru" and (runs := _e2_runs(config, results, g, k, L))
    },
    "e3_success_rate_by_sigma": {
      f"{s:g}": _e3_success(config, runs)
      for s in study.e3_sigmas
      if (runs := _e3_runs(config, results, s))
    },
  }


def _figures(config, results):
  study = config.study
  columns = [tuple(c) for c in study.e2_models]
  grid = np.array(
    [[_longest(config, results, g, k, L) or 0.0 for k, L in columns] for g in study.e2_groups]
  )
  fig, (axes,) = figure_grid(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [3, 1]})
  image = axes[0].imshow(grid, cmap="viridis", vmin=0, vmax=max(config.eval.lengths), aspect="auto")
  axes[0].set_xticks(range(len(columns)), [f"{k}\n{L}L" for k, L in columns], fontsize=7)
  axes[0].set_yticks(range(len(study.e2_groups)), study.e2_groups)
  for (i, j), value in np.ndenumerate(grid):
    label = _length_cell(value)
    axes[0].text(j, i, label, ha="center", va="center", color="w", fontsize=7)
  axes[0].set_title(
    f"E2: longest length with accuracy > {config.eval.threshold:.0%} "
    f"(train length {config.data.train_length})"
  )
  fig.colorbar(image, ax=axes[0])
  sigmas = [s for s in study.e3_sigmas if _e3_runs(config, results, s)]
  rates = [_e3_success(config, _e3_runs(config, results, s)) for s in sigmas]
  axes[1].plot(sigmas, rates, "o-")
  axes[1].set(
    xlabel="init noise sigma (relative to weight RMS)",
    ylabel=f"success: accuracy > {config.eval.threshold:.0%} at L={study.e3_success_length}",
    ylim=(-0.05, 1.05),
    title="E3: S3, 2-layer AUSSM from the construction",
  )
  fig.tight_layout()
  return {"dcd_ssm_study": fig}


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  notes = (
    f"Longest length with accuracy > {config.eval.threshold:.0%} (E2, median over seeds; "
    "x = fails already at the training length):\n\n"
  )
  return Report(
    rows=_rows(config, results),
    summary=_summary(config, results),
    figures=_figures(config, results),
    notes=notes + _pivot(config, results),
  )


METHOD = Method(
  name="dcd_ssm", phases=phases, validate=validate, study_arms=study_arms, report=report
)
