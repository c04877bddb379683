"""The method protocol: what every paper's module hands to the one training loop.

A method is a named list of **phases**. The loop in `experiments/loop.py` runs the phases in order, each
with the same machinery (restore-or-init, jitted sharded steps, checkpoints, metrics, NaN guard,
preemption), and hands each phase the outputs of the phases before it. Shapes that fit the papers:

* minibatch training (QDPM): one phase, `data` gives batches, `step` is one optimiser update;
* multi-phase pipelines (weak-to-strong: teacher -> pseudolabels -> student -> retrain): several phases,
  a later phase's `init`/`data` read `inputs[earlier_phase_name]`;
* estimator pipelines with cross-fitting (front-door HTE): `num_steps = 0` and `evaluate` runs the
  vmapped (fold x replication) fits, or one step per fold;
* RL with rollouts in the step (kernel PPO): `data = None`; the step makes its own data from its rng;
* training-free samplers on a trained model (BWCache): a phase with `num_steps = 0` whose `evaluate` runs
  the sampler on `inputs` from a training phase or on a restored checkpoint.

Everything that crosses `jax.jit` is a pytree of arrays; configuration is closed over when
`Method.phases(config)` builds the phases. Methods never write files: `evaluate` returns numbers,
`artifacts` returns images (arrays), matplotlib figures, `core.data.wav.AudioExamples` or
`core.data.gif.VideoClips`, and the loop writes them (`experiments/reports.write_artifact`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import ml_collections
import numpy as np

PyTree = Any
Metrics = Mapping[str, Any]
Inputs = Mapping[str, Any]


class DataSource(Protocol):
  """Batches as a pure function of the step, so a resumed run reads exactly what it would have read."""

  global_batch_size: int

  def batch(
    self, step: int, process_index: int = 0, process_count: int = 1
  ) -> dict[str, np.ndarray]:
    """This process's contiguous slice of the global batch for `step`."""
    ...


StepFn = Callable[[PyTree, Any, jax.Array], tuple[PyTree, Metrics]]


@dataclasses.dataclass(frozen=True)
class Phase:
  """One stage of a method, run by the shared loop.

  Attributes:
    name: unique within the method; names the checkpoint folder and prefixes nothing (metric names
      are the method's to choose and must not collide across phases).
    num_steps: how many times `step` runs; 0 for phases that only evaluate.
    init: `(rng, inputs) -> state`, a pytree of arrays. `inputs[name]` is `outputs(...)` of an
      earlier phase. Traced under `jax.eval_shape` for restoring, so it must be pure.
    step: `(state, batch, rng) -> (state, metrics)`, pure; jitted by the loop with the state donated,
      the batch sharded over the mesh's data axis, scalars in `metrics` replicated. Must return a
      scalar `loss` in metrics: it is the NaN guard's signal.
    data: `inputs -> DataSource`, or None when the step makes its own data.
    evaluate: `(state, rng, inputs) -> {name: scalar or array}`; goes into `results.json`.
      Scalars also go to the metrics (metrics.jsonl, TensorBoard); arrays (curves, per-seed values)
      are stored as nested lists in `results.json` only. A long evaluation returns
      `EvaluationChunks` instead: the loop runs, saves and resumes it chunk by chunk.
    artifacts: `(state, rng, inputs) -> {file stem: image array, matplotlib figure, AudioExamples or
      VideoClips}`.
    outputs: `(state, inputs) -> pytree` handed to later phases (default: the state).
    sized_by: the config fields that set the memory of `init` and `step` (e.g. `("batch_size",
      "data.max_context")`), named when the compiled program does not fit the device; default:
      `batch_size` where the config has one.
  """

  name: str
  num_steps: int
  init: Callable[[jax.Array, Inputs], PyTree]
  step: StepFn | None = None
  data: Callable[[Inputs], DataSource] | None = None
  evaluate: Callable[[PyTree, jax.Array, Inputs], dict[str, float]] | None = None
  artifacts: Callable[[PyTree, jax.Array, Inputs], dict[str, Any]] | None = None
  outputs: Callable[[PyTree, Inputs], PyTree] | None = None
  sized_by: Sequence[str] = ()


@dataclasses.dataclass(frozen=True)
class EvaluationChunks:
  """An evaluation in named pieces (replications, samplers, n values, sample batches), for phases
  whose evaluation runs long: the loop runs the chunks in order, saves each finished one
  (`phases/<phase>/<chunk>.json`), asks whether to stop between them, and on resume runs only the
  chunks not saved. `evaluate` returns it without computing anything.

  Attributes:
    names: the chunks, in order; unique, made of letters, digits and `._-` (they name files).
    run: `name -> {result name: scalar or array}`, the chunk's results; must depend only on the
      chunk (its own rng, e.g. `fold_in(rng, index)`), never on which chunks ran in this process.
    combine: `{name: chunk results} -> {result name: scalar or array}`, the phase's results. It
      receives each chunk as saved (scalars as floats, arrays as nested lists), so a resumed run
      combines exactly what an uninterrupted one does. Default: the union of the chunks' results
      (their names must not clash).
  """

  names: Sequence[str]
  run: Callable[[str], Mapping[str, Any]]
  combine: Callable[[Mapping[str, Mapping[str, Any]]], Mapping[str, Any]] | None = None


@dataclasses.dataclass(frozen=True)
class Report:
  """What a method's study makes of its arms' results: a table, a summary and figures."""

  rows: Sequence[Mapping[str, Any]]
  summary: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  figures: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # as a phase's artifacts
  notes: str = ""


# ---------------------------------------------------------------------------------------------------
# What a Report is made of: Markdown tables, table cells and matplotlib figure grids (writing them to
# files is the launcher's, experiments/reports.py)
# ---------------------------------------------------------------------------------------------------


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Rows of equal keys as a Markdown table; floats to 4 significant digits."""
  if not rows:
    return "(no rows)\n"
  columns = list(rows[0])
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(format_cell(row.get(c)) for c in columns) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def mean_std_cell(values, scale: float = 1.0, digits: int = 1) -> str:
  """`"m ± s"`: mean and population std of `values` times `scale`; missing (None) values are skipped,
  and "-" stands for none at all."""
  values = [scale * v for v in values if v is not None]
  if not values:
    return "-"
  return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def interval_cell(mean: float, half_width: float, digits: int = 3) -> str:
  """`"m ± h"` for an estimate and the half-width of its interval."""
  return f"{mean:.{digits}f} ± {half_width:.{digits}f}"


def figure_grid(rows: int = 1, cols: int = 1, panel_size=(5.0, 3.5), **subplots_kw):
  """A matplotlib figure (non-interactive backend) and its axes as a `[rows, cols]` array; each panel
  `panel_size` inches unless `figsize` is given."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  subplots_kw.setdefault("figsize", (panel_size[0] * cols, panel_size[1] * rows))
  return plt.subplots(rows, cols, squeeze=False, **subplots_kw)


def format_cell(value) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return "" if value is None else str(value)


def t_interval_cell(values, digits: int = 3) -> str:
  """`"mean ± half-width"` of a 95% Student-t interval over `values` (seeds); one value is printed
  alone, and non-finite values are left out and counted."""
  from scipy import stats

  values = np.asarray(values, np.float64)
  undefined = int(np.sum(~np.isfinite(values)))
  values = values[np.isfinite(values)]
  if not len(values):
    cell = "-"
  elif len(values) < 2:
    cell = f"{values.mean():.{digits}f}"
  else:
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    cell = interval_cell(values.mean(), half, digits)
  return cell + (f" ({undefined} undefined)" if undefined else "")


@dataclasses.dataclass(frozen=True)
class Method:
  """A paper's entry in the registry.

  Attributes:
    name: the value of `config.method` that selects it.
    phases: `config -> [Phase]`.
    validate: `config -> None`; raises `ConfigError` naming the bad field. Runs before anything compiles,
      after the loop's generic checks.
    study_arms: `config -> [(arm name, config)]`: the runs a study makes, each through the same loop.
    report: `(config, {arm: results}) -> Report`: the study's table, summary and figures.
  """

  name: str
  phases: Callable[[ml_collections.ConfigDict], Sequence[Phase]]
  validate: Callable[[ml_collections.ConfigDict], None] = lambda config: None
  study_arms: (
    Callable[[ml_collections.ConfigDict], Sequence[tuple[str, ml_collections.ConfigDict]]] | None
  ) = None
  report: Callable[[ml_collections.ConfigDict, Mapping[str, Mapping[str, Any]]], Report] | None = (
    None
  )


class ConfigError(ValueError):
  """A configuration value that cannot work; the message names the field."""


def require(condition: bool, field: str, message: str) -> None:
  """Raises `ConfigError("config.<field>: <message>")` unless `condition`."""
  if not condition:
    raise ConfigError(f"config.{field}: {message}")


def require_positive_int(config: ml_collections.ConfigDict, field: str) -> None:
  value = lookup(config, field)
  require(
    isinstance(value, int) and not isinstance(value, bool), field, f"must be an int, got {value!r}"
  )
  require(value > 0, field, f"must be positive, got {value}")


def require_choice(config: ml_collections.ConfigDict, field: str, choices: Sequence[Any]) -> None:
  value = lookup(config, field)
  require(value in choices, field, f"must be one of {list(choices)}, got {value!r}")


def require_prepared_tfds(config: ml_collections.ConfigDict, field: str, name: str) -> None:
  """Raises a one-line `ConfigError` naming `field` (the data_dir) unless the tfds dataset `name` is
  prepared there; the message says how to prepare it (nothing is downloaded at run time)."""
  from core.data import prepared

  data_dir = lookup(config, field)
  problem = prepared.tfds_dataset_problem(name, data_dir)
  require(
    problem is None,
    field,
    f"{problem}; this variant reads tfds {name!r} from a prepared folder: on a machine with network "
    f"access run `{prepared.tfds_build_command(name)}`, copy DIR here and pass --config.{field}=DIR "
    "(docs/paper_scale.md)",
  )


def require_file(config: ml_collections.ConfigDict, field: str, what: str, how: str) -> None:
  """Raises a one-line `ConfigError` naming `field` unless it is a readable file; `what` says what
  the file holds and `how` how to make it."""
  from core.data import prepared

  problem = prepared.file_problem(lookup(config, field))
  require(problem is None, field, f"{problem}; expected {what}; {how} (docs/paper_scale.md)")


def lookup(config: ml_collections.ConfigDict, field: str) -> Any:
  """`config.a.b` for `field = "a.b"`, with an error naming the missing field."""
  node = config
  for part in field.split("."):
    if part not in node:
      raise ConfigError(f"config.{field}: missing (no field {part!r} in {sorted(node.keys())})")
    node = node[part]
  return node


def with_changes(config: ml_collections.ConfigDict, **changes) -> ml_collections.ConfigDict:
  """A copy of `config` with `section__field=value` changes (any depth; `field=value` at the top):
  how a study derives its arms from the study config."""
  arm = ml_collections.ConfigDict(config.to_dict())
  for path, value in changes.items():
    *parents, name = path.split("__")
    node = arm
    for parent in parents:
      node = node[parent]
    node[name] = value
  return arm


def config_key(config: ml_collections.ConfigDict) -> str:
  """A hashable, order-independent copy of `config` (its sorted JSON), for caches keyed by config."""
  return config.to_json(sort_keys=True)


def cached_per_config(maxsize: int = 16):
  """`functools.lru_cache` for a function whose first argument is a config: jitted evaluators,
  samplers and derived data are built once per distinct config (compared by value, not identity).
  The other arguments must be hashable. The function receives a fresh copy of the config."""

  def decorate(fn):
    @functools.lru_cache(maxsize=maxsize)
    def by_key(key: str, *args):
      return fn(ml_collections.ConfigDict(json.loads(key)), *args)

    @functools.wraps(fn)
    def cached(config: ml_collections.ConfigDict, *args):
      return by_key(config_key(config), *args)

    cached.cache_clear = by_key.cache_clear
    return cached

  return decorate
