"""The one training loop: runs a method's phases with checkpoints, resume, metrics and guards.

Per phase: restore-or-init -> jitted, sharded `step` x N (checkpoint every k steps, metrics and a
progress line every `log_every`, non-finite losses stop the run) -> `evaluate` -> artifacts.
A workdir holds `config.json`, `metrics.jsonl`, `tensorboard/`, `checkpoints/<phase>/`,
`phases/<phase>.json` (a finished phase's evaluation), `phases/<phase>/<chunk>.json` (the finished
chunks of an evaluation in chunks) and, at the end, `results.json`.

Resuming is running the same command again: the batch of step s and the rng of step s are pure
functions of (config.seed, phase, s), so a restored run continues exactly where it stopped.

Before a phase's `init` and `step` first run, their compiled programs' memory (XLA's
`memory_analysis()`: arguments, outputs, temporaries) is compared with the device's; a program that
cannot fit stops the run with one line naming the phase, the bytes and the config fields that size
it (`Phase.sized_by`), instead of an out-of-memory error from inside XLA.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

import methods
from experiments import checkpoints as checkpoints_lib
from experiments import metrics as metrics_lib
from experiments import reports
from experiments import sharding as sharding_lib
from methods.base import (
  ConfigError,
  EvaluationChunks,
  Phase,
  lookup,
  require,
  require_positive_int,
)

StopRequest = Callable[[str, int], bool]


class NonFiniteLossError(FloatingPointError):
  """The loss turned NaN or inf; the last checkpoint on disk predates it."""


class Interrupted(Exception):
  """The run stopped on request (preemption) after saving: a checkpoint at `step`, or the chunks of
  the phase's evaluation finished so far (`chunk` names the last)."""

  def __init__(self, phase: str, step: int, chunk: str | None = None, saved_in: str = ""):
    where = f"at step {step}" if chunk is None else f"after evaluation chunk {chunk!r}"
    saved = f" (saved in {saved_in})" if saved_in else ""
    super().__init__(
      f"stopped in phase {phase!r} {where}{saved}; run the same command again to resume"
    )
    self.phase, self.step, self.chunk = phase, step, chunk


class _LastSaved:
  """What the loop saved last, in words, for a launcher that must exit without waiting for the loop
  (`experiments/stopping.py`)."""

  def __init__(self):
    self.text = "nothing yet"

  def note(self, text: str) -> None:
    self.text = text

  def __call__(self) -> str:
    return self.text


LAST_SAVED = _LastSaved()

# Every process passes the same barriers in the same order, so a count names each one uniquely.
_BARRIER_COUNT = itertools.count()
_BARRIER_TIMEOUT_MS = 15 * 60 * 1000


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

  `devices` (default: all) carry the mesh of `config.mesh`. `should_stop(phase, step)` is asked
  before each phase (step 0), after every step (with several processes: every `log_every` steps,
  agreed by all) and after each chunk of an `EvaluationChunks` evaluation (step = the phase's
  `num_steps`); when it answers yes the loop saves what it has (a checkpoint, waited for, or the
  finished chunks) and raises `Interrupted`.
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
      if _agreed_stop(should_stop, phase.name, 0, True):
        raise Interrupted(phase.name, 0)
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
      results = self._evaluate(state, eval_rng, inputs, should_stop)
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
      init_fn = jax.jit(self.phase.init, out_shardings=shardings)
      self._check_memory("init", init_fn, rng, inputs)
      state = init_fn(rng, inputs)
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
    LAST_SAVED.note(f"phase {self.phase.name!r} step {step} ({self.checkpoints.directory})")

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

    def batch_at(step):
      if source is None:
        return None
      local = source.batch(step, jax.process_index(), jax.process_count())
      checker.check(local, step)
      return sharding_lib.global_batch(local, self.mesh)

    batch = batch_at(start)
    # compiled here once (the calls below reuse it), so a program too big for the device stops the
    # run with one line before anything is allocated
    self._check_memory("step", step_fn, state, batch, jax.random.fold_in(rng, start))
    progress = _Progress(phase.name, start, phase.num_steps)
    pending: list[tuple[int, Mapping[str, jax.Array]]] = []
    for step in range(start, phase.num_steps):
      if step > start:
        batch = batch_at(step)
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
      if stop:
        self.checkpoints.wait()
        raise Interrupted(phase.name, done, saved_in=self.checkpoints.directory)
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

  def _check_memory(self, program: str, jitted, *args) -> None:
    """Compiles `jitted` for `args` and raises `ConfigError` if it cannot fit the device."""
    compiled = jitted.lower(*args).compile()
    _sync_processes(f"{self.phase.name} {program} compiled")
    problem = memory_problem(
      compiled,
      self.mesh,
      f"phase {self.phase.name!r} {program}",
      sizing_fields(self.phase, self.config),
    )
    if problem:
      raise ConfigError(problem)

  def _evaluate(self, state, rng, inputs, should_stop: StopRequest) -> dict[str, float]:
    if os.path.exists(self.evaluation_path):
      with open(self.evaluation_path) as f:
        return json.load(f)
    results = {}
    if self.phase.evaluate is not None:
      evaluation = self.phase.evaluate(state, rng, inputs)
      if isinstance(evaluation, EvaluationChunks):
        evaluation = self._evaluate_in_chunks(evaluation, should_stop)
      results = {name: _result_value(value) for name, value in evaluation.items()}
      logging.info("[%s] evaluation: %s", self.phase.name, _format(results))
    if self.phase.artifacts is not None and self.is_writer:
      for stem, artifact in self.phase.artifacts(state, jax.random.fold_in(rng, 1), inputs).items():
        reports.write_artifact(self.workdir, stem, artifact)
    if self.is_writer:
      scalars = {f"eval/{k}": v for k, v in results.items() if isinstance(v, float)}
      self.writer.write(self.phase.name, self.phase.num_steps, scalars)
      _write_json(self.evaluation_path, results)
    LAST_SAVED.note(f"phase {self.phase.name!r} evaluation ({self.evaluation_path})")
    return results

  def _evaluate_in_chunks(self, chunks: EvaluationChunks, should_stop: StopRequest) -> Mapping:
    """Runs the chunks not saved yet, saving each; stops between chunks when asked."""
    names = list(chunks.names)
    _check_chunk_names(self.phase.name, names)
    folder = os.path.join(self.workdir, "phases", self.phase.name)
    done: dict[str, dict] = {}
    for position, name in enumerate(names):
      path = os.path.join(folder, f"{name}.json")
      if os.path.exists(path):
        with open(path) as f:
          done[name] = json.load(f)
        continue
      values = {key: _result_value(value) for key, value in chunks.run(name).items()}
      # as read back from disk, so an uninterrupted run combines what a resumed one does
      done[name] = json.loads(json.dumps(values, default=metrics_lib.to_json_number))
      if self.is_writer:
        _write_json(path, values)
      LAST_SAVED.note(
        f"phase {self.phase.name!r} evaluation chunk {name!r} ({position + 1}/{len(names)}, {path})"
      )
      logging.info(
        "[%s] evaluation chunk %d/%d: %s", self.phase.name, position + 1, len(names), name
      )
      last = position + 1 == len(names)
      if not last and _agreed_stop(should_stop, self.phase.name, self.phase.num_steps, True):
        raise Interrupted(self.phase.name, self.phase.num_steps, chunk=name, saved_in=folder)
    if chunks.combine is not None:
      return chunks.combine(done)
    merged: dict[str, Any] = {}
    for name in names:
      _merge_results(merged, done[name], f"{self.phase.name} chunk {name}")
    return merged


def _agreed_stop(should_stop: StopRequest, phase: str, step: int, at_log_step: bool) -> bool:
  """Asks `should_stop`; with several processes only at log steps, and stops if any process says so."""
  if jax.process_count() == 1:
    return should_stop(phase, step)
  if not at_log_step:
    return False
  from jax.experimental import multihost_utils

  _sync_processes(f"{phase} stop vote at step {step}")
  votes = multihost_utils.process_allgather(np.asarray(should_stop(phase, step), np.int32))
  return bool(np.any(votes))


def _sync_processes(name: str) -> None:
  """Waits until every process reaches the barrier `name`, for up to 15 minutes.

  A CPU collective (gloo) gives up after 30 s without its peers, the first one of each device group
  included; a process that imports or compiles slower than the others would fail it. Meeting first
  at the coordination service's barrier, whose wait the loop sets, starts each one together.
  """
  if jax.process_count() > 1:
    barrier = ocp.multihost.get_barrier_sync_fn()
    barrier(key=f"loop {next(_BARRIER_COUNT)}: {name}", timeout_ms=_BARRIER_TIMEOUT_MS)


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


_CHUNK_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _check_chunk_names(phase: str, names: Sequence[str]) -> None:
  bad = [n for n in names if not isinstance(n, str) or not _CHUNK_NAME.fullmatch(n)]
  if bad or len(set(names)) != len(names):
    raise ValueError(
      f"phase {phase}: evaluation chunk names must be unique and made of letters, digits and "
      f"'._-' (they name files), got {list(names)}"
    )


# ---------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MemoryNeed:
  """Per device, from XLA's `memory_analysis()` of a compiled program (donated arguments counted once)."""

  arguments: int
  outputs: int
  temporaries: int
  aliased: int

  @property
  def total(self) -> int:
    return self.arguments + self.outputs + self.temporaries - self.aliased

  def describe(self) -> str:
    return (
      f"{format_bytes(self.total)} per device (arguments {format_bytes(self.arguments)}, outputs "
      f"{format_bytes(self.outputs)}, temporaries {format_bytes(self.temporaries)}, donated "
      f"{format_bytes(self.aliased)})"
    )


def memory_need(compiled) -> MemoryNeed | None:
  """The compiled program's per-device memory, or None where the backend does not say."""
  try:
    stats = compiled.memory_analysis()
  except Exception:  # some backends do not implement it
    return None
  if stats is None:
    return None
  return MemoryNeed(
    int(stats.argument_size_in_bytes),
    int(stats.output_size_in_bytes),
    int(stats.temp_size_in_bytes),
    int(stats.alias_size_in_bytes),
  )


def device_memory(mesh) -> tuple[int, str] | None:
  """Bytes one device of `mesh` may use, and where that number comes from. Accelerators report
  `bytes_limit`; CPU devices share the host's available memory (/proc/meminfo, else sysconf)."""
  local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  try:
    stats = local[0].memory_stats()
  except Exception:  # a backend without memory statistics
    stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), f"{local[0].platform} device memory"
  available = host_available_memory()
  if available is None:
    return None
  return available // len(local), f"available host memory / {len(local)} local devices"


def host_available_memory() -> int | None:
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError):
    return None


def sizing_fields(phase: Phase, config) -> str:
  """`config.a=1, config.b=2`: the fields that size the phase's programs (`Phase.sized_by`)."""
  fields = list(phase.sized_by) or [f for f in ("batch_size",) if f in config]
  shown = []
  for field in fields:
    try:
      shown.append(f"config.{field}={lookup(config, field)!r}")
    except ConfigError:
      shown.append(f"config.{field}")
  shown.append(f"config.mesh={config.get('mesh', sharding_lib.DEFAULT_MESH)!r}")
  return ", ".join(shown)


def memory_problem(compiled, mesh, what: str, sized_by: str) -> str | None:
  """One line if `compiled` needs more memory than a device of `mesh` has, else None."""
  need, have = memory_need(compiled), device_memory(mesh)
  if need is None or have is None or need.total <= have[0]:
    return None
  state_bound = need.arguments + need.outputs > need.temporaries
  hint = " (or spread the state over devices: config.sharding='fsdp')" if state_bound else ""
  return (
    f"{what} needs {need.describe()} but {format_bytes(have[0])} are available ({have[1]}); reduce "
    f"{sized_by}{hint}"
  )


def format_bytes(count: int) -> str:
  for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if abs(count) >= size:
      return f"{count / size:.1f} {unit}"
  return f"{count} B"


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
