"""The one training loop: runs a method's phases with checkpoints, resume, metrics and guards.

Per phase: restore-or-init -> jitted, sharded `step` x N (checkpoint every k steps, metrics and a
progress line every `log_every`, non-finite losses stop the run) -> `evaluate` -> artifacts.
A workdir holds `config.json`, `metrics.jsonl`, `tensorboard/`, `checkpoints/<phase>/`,
`phases/<phase>.json` (a finished phase's evaluation) and, at the end, `results.json`.

Resuming is running the same command again: the batch of step s and the rng of step s are pure
functions of (config.seed, phase, s), so a restored run continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

import methods
from experiments import checkpoints as checkpoints_lib
from experiments import metrics as metrics_lib
from experiments import reports
from experiments import sharding as sharding_lib
from methods.base import ConfigError, Phase, lookup, require, require_positive_int

StopRequest = Callable[[str, int], bool]


class NonFiniteLossError(FloatingPointError):
  """The loss turned NaN or inf; the last checkpoint on disk predates it."""


class Interrupted(Exception):
  """The run stopped on request (preemption) after saving a checkpoint at `step`."""

  def __init__(self, phase: str, step: int):
    super().__init__(
      f"stopped in phase {phase!r} at step {step}; run the same command again to resume"
    )
    self.phase, self.step = phase, step


class BadBatchError(ValueError):
  """A batch from a data source whose fields do not match the first batch or hold NaN/inf."""


@dataclasses.dataclass
class RunSummary:
  results: dict[str, float]
  step_traces: dict[str, int]  # how many times each phase's step was traced (1 = compiled once)


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


def validate(config: ml_collections.ConfigDict, data_devices: int) -> None:
  """The loop's own checks, then the method's; raises `ConfigError` naming the field."""
  require("method" in config, "method", f"missing; known methods: {methods.known_methods()}")
  method = methods.get_method(config.method)
  require(isinstance(lookup(config, "seed"), int), "seed", f"must be an int, got {config.seed!r}")
  for field in ("loop.log_every", "loop.checkpoint_every", "loop.max_to_keep"):
    require_positive_int(config, field)
  require(
    config.get("sharding", "replicate") in sharding_lib.STRATEGIES,
    "sharding",
    f"must be one of {sharding_lib.STRATEGIES}, got {config.get('sharding')!r}",
  )
  if "batch_size" in config:
    require_positive_int(config, "batch_size")
    require(
      config.batch_size % data_devices == 0,
      "batch_size",
      f"{config.batch_size} is not divisible by the {data_devices} devices of the mesh's data axis",
    )
  if "steps" in config:
    require_positive_int(config, "steps")
  method.validate(config)


def prepare_workdir(workdir: str, config: ml_collections.ConfigDict, is_writer: bool) -> None:
  """Creates the workdir, refusing one that holds a run of another method."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    with open(path) as f:
      previous = json.load(f)
    if previous.get("method") != config.method:
      raise ConfigError(
        f"workdir {workdir} holds a run of method {previous.get('method')!r}, not {config.method!r}; "
        "choose another --workdir"
      )
    if previous != json.loads(config.to_json()):
      logging.warning("config differs from the one in %s; resuming with the new one", path)
  if is_writer:
    os.makedirs(workdir, exist_ok=True)
    with open(path, "w") as f:
      f.write(config.to_json(indent=2, sort_keys=True))


# ---------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------


def run(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  devices: Sequence[jax.Device] | None = None,
  should_stop: StopRequest = lambda phase, step: False,
) -> RunSummary:
  """Runs (or resumes) every phase of `config.method` in `workdir`; returns the evaluation results.

  `devices` (default: all) carry the mesh of `config.mesh`. `should_stop(phase, step)` is asked after
  every step (with several processes: every `log_every` steps, agreed by all); when it answers yes the
  loop saves a checkpoint, waits for it and raises `Interrupted`.
  """
  try:
    mesh = sharding_lib.make_mesh(config.get("mesh", sharding_lib.DEFAULT_MESH), devices)
  except sharding_lib.MeshError as error:
    raise ConfigError(str(error)) from None
  validate(config, sharding_lib.data_size(mesh))
  is_writer = jax.process_index() == 0
  prepare_workdir(workdir, config, is_writer)
  writer = metrics_lib.MetricWriter(workdir, enabled=is_writer)
  method = methods.get_method(config.method)
  inputs: dict[str, Any] = {}
  results: dict[str, float] = {}
  traces: dict[str, int] = {}
  phases = list(method.phases(config))
  _check_phase_names(phases)
  try:
    for index, phase in enumerate(phases):
      runner = _PhaseRunner(phase, config, workdir, mesh, writer, [p.name for p in phases[:index]])
      state, phase_results, traces[phase.name] = runner.run(
        jax.random.fold_in(jax.random.key(config.seed), index), inputs, should_stop
      )
      inputs[phase.name] = phase.outputs(state, inputs) if phase.outputs else state
      _merge_results(results, phase_results, phase.name)
  finally:
    writer.close()
  if is_writer:
    _write_json(os.path.join(workdir, "results.json"), results)
  return RunSummary(results, traces)


class _PhaseRunner:
  """Restore-or-init, steps, evaluation and artifacts of one phase."""

  def __init__(self, phase: Phase, config, workdir: str, mesh, writer, phases_done: list[str]):
    self.phase, self.config, self.workdir, self.mesh, self.writer = (
      phase,
      config,
      workdir,
      mesh,
      writer,
    )
    self.phases_done = phases_done
    self.is_writer = jax.process_index() == 0
    self.evaluation_path = os.path.join(workdir, "phases", f"{phase.name}.json")
    self.checkpoints = checkpoints_lib.PhaseCheckpoints(
      os.path.join(workdir, "checkpoints", phase.name), config.loop.max_to_keep
    )

  def run(self, rng, inputs, should_stop: StopRequest):
    init_rng, step_rng, eval_rng = jax.random.split(rng, 3)
    try:
      # init and step are traced under the mesh so that Pallas kernels can split themselves per
      # device (kernels/partitioning.py): XLA cannot partition a kernel call over devices
      with jax.set_mesh(self.mesh):
        state, start = self._restore_or_init(init_rng, inputs)
        traces = 0
        if start < self.phase.num_steps:
          state, traces = self._train(state, start, step_rng, inputs, should_stop)
      results = self._evaluate(state, eval_rng, inputs)
    finally:
      self.checkpoints.wait()
      self.checkpoints.close()
    return state, results, traces

  def _restore_or_init(self, rng, inputs):
    abstract = jax.eval_shape(self.phase.init, rng, inputs)
    shardings = sharding_lib.state_shardings(
      self.mesh,
      abstract,
      self.config.get("sharding", "replicate"),
      self.config.get("fsdp_min_size", 2**14),
    )
    self.shardings = shardings
    latest = self.checkpoints.latest_step()
    if latest is None:
      # `inputs` are arguments, not closed-over constants XLA would try to fold at compile time.
      state = jax.jit(self.phase.init, out_shardings=shardings)(rng, inputs)
      self._save(0, state)
      return state, 0
    target = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    state, record = self.checkpoints.restore(latest, target)
    logging.info(
      "[%s] resumed from step %d (%s)", self.phase.name, record["step"], self.checkpoints.directory
    )
    self.writer.truncate_after(self.phases_done, self.phase.name, record["step"])
    return state, record["step"]

  def _save(self, step: int, state) -> None:
    self.checkpoints.save(
      step, state, {"phase": self.phase.name, "step": step, "data_position": step}
    )

  def _train(self, state, start: int, rng, inputs, should_stop: StopRequest):
    phase, loop_config = self.phase, self.config.loop
    source = phase.data(inputs) if phase.data else None
    data_devices = sharding_lib.data_size(self.mesh)
    if source is not None and source.global_batch_size % data_devices:
      raise ConfigError(
        f"phase {phase.name}: batch size {source.global_batch_size} is not divisible by the "
        f"{data_devices} devices of the mesh's data axis"
      )
    traces = [0]

    def counted_step(state, batch, step_rng):
      traces[0] += 1
      return phase.step(state, batch, step_rng)

    step_fn = jax.jit(
      counted_step,
      out_shardings=(self.shardings, sharding_lib.replicated(self.mesh)),
      donate_argnums=0,
    )
    checker = _BatchChecker(phase.name)
    progress = _Progress(phase.name, start, phase.num_steps)
    pending: list[tuple[int, Mapping[str, jax.Array]]] = []
    for step in range(start, phase.num_steps):
      batch = None
      if source is not None:
        local = source.batch(step, jax.process_index(), jax.process_count())
        checker.check(local, step)
        batch = sharding_lib.global_batch(local, self.mesh)
      state, step_metrics = step_fn(state, batch, jax.random.fold_in(rng, step))
      pending.append((step + 1, step_metrics))
      done = step + 1
      checkpoint_due = done % loop_config.checkpoint_every == 0 or done == phase.num_steps
      stop = _agreed_stop(should_stop, phase.name, done, done % loop_config.log_every == 0)
      if checkpoint_due or stop or done % loop_config.log_every == 0:
        self._flush(pending, progress)
        pending = []
      if checkpoint_due or stop:
        self._save(done, state)
      if stop and done < phase.num_steps:
        self.checkpoints.wait()
        raise Interrupted(phase.name, done)
    return state, traces[0]

  def _flush(self, pending, progress: _Progress) -> None:
    """Fetches pending step metrics, stops on a non-finite loss, writes the rows and a progress line."""
    fetched = jax.device_get(pending)
    for step, values in fetched:
      if "loss" not in values:
        raise KeyError(
          f"phase {self.phase.name}: step metrics must include 'loss', got {sorted(values)}"
        )
      if not np.all(np.isfinite(values["loss"])):
        raise NonFiniteLossError(
          f"phase {self.phase.name}: loss is {values['loss']} at step {step}; stopped, the last "
          f"checkpoint (step {self.checkpoints.latest_step()}) is from before it"
        )
    for step, values in fetched:
      self.writer.write(self.phase.name, step, {k: np.mean(v) for k, v in values.items()})
    last_step, last_values = fetched[-1]
    progress.report(last_step, float(np.mean(last_values["loss"])))

  def _evaluate(self, state, rng, inputs) -> dict[str, float]:
    if os.path.exists(self.evaluation_path):
      with open(self.evaluation_path) as f:
        return json.load(f)
    results = {}
    if self.phase.evaluate is not None:
      results = {
        name: _result_value(value)
        for name, value in self.phase.evaluate(state, rng, inputs).items()
      }
      logging.info("[%s] evaluation: %s", self.phase.name, _format(results))
    if self.phase.artifacts is not None and self.is_writer:
      for stem, artifact in self.phase.artifacts(state, jax.random.fold_in(rng, 1), inputs).items():
        reports.write_artifact(self.workdir, stem, artifact)
    if self.is_writer:
      scalars = {f"eval/{k}": v for k, v in results.items() if isinstance(v, float)}
      self.writer.write(self.phase.name, self.phase.num_steps, scalars)
      _write_json(self.evaluation_path, results)
    return results


def _agreed_stop(should_stop: StopRequest, phase: str, step: int, at_log_step: bool) -> bool:
  """Asks `should_stop`; with several processes only at log steps, and stops if any process says so."""
  if jax.process_count() == 1:
    return should_stop(phase, step)
  if not at_log_step:
    return False
  from jax.experimental import multihost_utils

  votes = multihost_utils.process_allgather(np.asarray(should_stop(phase, step), np.int32))
  return bool(np.any(votes))


class _BatchChecker:
  """The first batch fixes each field's shape and dtype; later batches must match and be finite."""

  def __init__(self, phase: str):
    self.phase, self.spec = phase, None

  def check(self, batch: Mapping[str, np.ndarray], step: int) -> None:
    spec = {name: (np.shape(value), np.asarray(value).dtype) for name, value in batch.items()}
    if self.spec is None:
      self.spec = spec
    elif spec != self.spec:
      bad = sorted(set(spec) ^ set(self.spec)) or [n for n in spec if spec[n] != self.spec[n]]
      raise BadBatchError(
        f"phase {self.phase}: batch of step {step}, field {bad[0]!r}: got "
        f"{spec.get(bad[0])}, expected {self.spec.get(bad[0])} (shape, dtype)"
      )
    for name, value in batch.items():
      value = np.asarray(value)
      if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
        raise BadBatchError(
          f"phase {self.phase}: batch of step {step}, field {name!r} holds NaN or inf"
        )


class _Progress:
  """A progress line: step, loss, steps/s over the last window, ETA."""

  def __init__(self, phase: str, start: int, total: int):
    self.phase, self.total = phase, total
    self.last_step, self.last_time = start, time.perf_counter()

  def report(self, step: int, loss: float) -> None:
    now = time.perf_counter()
    rate = (step - self.last_step) / max(now - self.last_time, 1e-9)
    eta = (self.total - step) / rate if rate > 0 else math.inf
    logging.info(
      "[%s] step %d/%d  loss %.5g  %.2f steps/s  ETA %s",
      self.phase,
      step,
      self.total,
      loss,
      rate,
      _clock(eta),
    )
    self.last_step, self.last_time = step, now


def _clock(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  minutes, seconds = divmod(int(seconds), 60)
  return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


def _check_phase_names(phases: Sequence[Phase]) -> None:
  names = [p.name for p in phases]
  if len(set(names)) != len(names):
    raise ValueError(f"phase names must be unique, got {names}")


def _merge_results(results: dict, phase_results: Mapping[str, float], phase: str) -> None:
  clash = sorted(set(results) & set(phase_results))
  if clash:
    raise ValueError(
      f"phase {phase} reports metric names already reported by an earlier phase: {clash}"
    )
  results.update(phase_results)


def _result_value(value) -> float | list:
  """A scalar as a float; an array as nested lists of floats (results.json only, not metrics)."""
  array = np.asarray(value, np.float64)
  return float(array) if array.ndim == 0 else array.tolist()


def _format(results: Mapping[str, float | list]) -> str:
  return ", ".join(
    f"{k}={v:.5g}" if isinstance(v, float) else f"{k}=[{np.size(v)} values]"
    for k, v in results.items()
  )


def _write_json(path: str, payload) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=2, sort_keys=True, default=metrics_lib.to_json_number)
  os.replace(tmp, path)


CheckpointError = checkpoints_lib.CheckpointError
# What a launcher reports as one line (`error: ...`) instead of a traceback: bad input, not bugs.
RUN_ERRORS = (ConfigError, NonFiniteLossError, BadBatchError, CheckpointError)
