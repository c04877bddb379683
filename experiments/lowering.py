r"""Lowers every phase of a config for GPU or TPU without running it: `train.py --lower_only=...`.

The check to run on a laptop before spending pod time:

  python experiments/train.py --config=configs/dcd_ssm.py:gpu --lower_only=cuda,tpu
  python experiments/train.py --config=configs/quant_diffusion.py:tpu_pod \
    --config.data.data_dir=/data/tfds --lower_only=tpu --lower_devices=256

Per phase, in order, as `loop.py` would run it: the loop's and the method's config checks at the
mesh's data-axis size; `init`'s abstract state from the earlier phases' abstract outputs
(`jax.eval_shape`); its shardings (`config.sharding`, FSDP included) on `config.mesh` laid over N
abstract devices (`jax.sharding.AbstractMesh`; N = `--lower_devices`, default this machine's device
count); one batch of the phase's data, read on the host for its shapes and checked for divisibility
by the data axis; then `init` and `step` jitted as the loop jits them (output shardings, donated
state, batch split over "data") and lowered for each platform, one line each. Kernels follow the
platform lowered for (`lax.platform_dependent`), so a TPU lowering holds the Mosaic kernels (the
line counts them).

Host code that needs values, not shapes (a data source built from an earlier phase's pseudolabels
or mixture weights, an `outputs` that calls NumPy), gets the earlier phases' outputs filled with
zeros, and where zeros are not a valid value (mixture weights that must sum to one) with ones: one
CPU pass of that host code, the only computation besides reading a batch. A data source that accepts
neither is skipped with a note (`skip` line, not a failure), and so is its phase's step.

Each lowered program's line gives its memory per device known before compiling: the bytes of its
arguments and outputs under their shardings. Temporaries are only known after compiling for the
device; the loop compares the compiled total with the device's memory before a phase's first step
(`loop.memory_problem`).

Not lowered: `evaluate` and `artifacts` (host code around their own jitted functions). Not checked:
compilation (XLA's and Mosaic's passes), which needs the device; `kernels/lowering.py` says what
lowering a Pallas kernel does check.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import methods
from experiments import loop
from experiments import sharding as sharding_lib
from kernels import lowering as kernel_lowering
from methods.base import Phase


@dataclasses.dataclass(frozen=True)
class Check:
  """One program (or what it needs) and what lowering said: `error` is None when it lowered."""

  what: str
  platform: str = ""
  error: str | None = None
  kernels: int = 0  # Pallas kernels in the lowered program
  argument_bytes: int | None = None  # per device, under the arguments' shardings
  output_bytes: int | None = None  # per device, under the output shardings
  skipped: str = ""  # why this program was not lowered (not a failure)

  @property
  def ok(self) -> bool:
    return self.error is None

  def line(self) -> str:
    where = f"{self.what} [{self.platform}]" if self.platform else self.what
    if not self.ok:
      return f"FAILED  {where}: {self.error}"
    if self.skipped:
      return f"skip    {where}: {self.skipped}"
    notes = [f"{self.kernels} Pallas kernels"] * bool(self.kernels)
    if self.argument_bytes is not None:
      notes.append(
        f"arguments {loop.format_bytes(self.argument_bytes)}, outputs "
        f"{loop.format_bytes(self.output_bytes)} per device; temporaries after compiling"
      )
    return f"ok      {where}" + (f" ({'; '.join(notes)})" if notes else "")


# As loop.py traces init and step: under the context mesh, so a Pallas kernel splits itself over the
# devices (kernels/partitioning.py) instead of failing to lower on a multi-device TPU step.
TRACE_IN_MESH = True
UNPARTITIONED_KERNEL = "Mosaic kernels cannot be automatically partitioned"
UNPARTITIONED_HINT = (
  "; a kernel traced without a context mesh cannot be split over several devices: trace under "
  "jax.set_mesh(mesh) and the kernels run per device (kernels/partitioning.py)"
)


def _reason(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  reason = f"{type(error).__name__}: {lines[0] if lines else ''}"
  return reason + (UNPARTITIONED_HINT if UNPARTITIONED_KERNEL in reason else "")


def _shapes(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


def _zeros(tree):
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)


def _ones(tree):
  return jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), tree)


def _per_device_bytes(tree) -> int:
  """Bytes of one device's shards of a pytree of placed ShapeDtypeStructs."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.shape
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None:
      try:
        shape = sharding.shard_shape(shape)
      except Exception:  # an abstract sharding that cannot say: count the whole array
        pass
    itemsize = 0 if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf.dtype.itemsize
    total += int(np.prod(shape, dtype=np.int64)) * itemsize
  return total


def _placed(tree, sharding_of: Callable):
  return jax.tree.map(
    lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
    tree,
    sharding_of(tree),
  )


class _Earlier:
  """The earlier phases' outputs: abstract, and zero-filled on demand for host code."""

  def __init__(self):
    self.abstract: dict[str, Any] = {}
    self.is_state: dict[str, bool] = {}  # outputs are the state itself (the loop's default)
    self._filled: dict[tuple[str, str], Any] = {}

  def filled(self, fill: Callable) -> dict[str, Any]:
    for name, value in self.abstract.items():
      if (fill.__name__, name) not in self._filled:
        self._filled[fill.__name__, name] = fill(value)
    return {name: self._filled[fill.__name__, name] for name in self.abstract}

  def call(self, fn: Callable, *args):
    """`fn(*args, inputs)`, on abstract inputs if it traces, else on zeros, else on ones (host code
    that rejects zeros, e.g. mixture weights); raises what the zeros raised if nothing works."""
    try:
      return fn(*args, dict(self.abstract))
    except Exception:
      pass
    try:
      return fn(*(_zeros(a) for a in args), self.filled(_zeros))
    except Exception as error:
      first = error
    try:
      return fn(*(_ones(a) for a in args), self.filled(_ones))
    except Exception:
      raise first from None

  def add(self, phase: Phase, state) -> None:
    if phase.outputs is None:
      self.abstract[phase.name] = state
    else:
      try:
        self.abstract[phase.name] = jax.eval_shape(phase.outputs, state, dict(self.abstract))
      except Exception:
        self.abstract[phase.name] = _shapes(self.call(phase.outputs, state))
    self.is_state[phase.name] = phase.outputs is None


class _Lowerer:
  """Lowers one config's phases for each platform over `num_devices` abstract devices."""

  def __init__(self, config: ml_collections.ConfigDict, num_devices: int):
    self.config, self.num_devices = config, num_devices
    self.names, self.sizes = sharding_lib.mesh_shape(
      config.get("mesh", sharding_lib.DEFAULT_MESH), num_devices
    )
    self.data_devices = self.sizes[self.names.index(sharding_lib.DATA_AXIS)]

  def mesh_description(self) -> str:
    return ", ".join(f"{n}={s}" for n, s in zip(self.names, self.sizes, strict=True))

  def state_shardings(self, mesh, abstract_state):
    return sharding_lib.state_shardings(
      mesh,
      abstract_state,
      self.config.get("sharding", "replicate"),
      self.config.get("fsdp_min_size", 2**14),
    )

  def batch(self, phase: Phase, earlier: _Earlier) -> tuple[Any, Check | None]:
    """One global batch's shapes, or the check that says why there is none."""
    what = f"{phase.name}/data"
    try:
      size, batch = earlier.call(functools.partial(_read_batch, phase.data))
    except Exception as error:
      if not earlier.abstract:
        return None, Check(what, error=_reason(error))
      note = (
        f"not built: it reads earlier phases' values ({', '.join(earlier.abstract)}) and fails on "
        f"stand-ins ({_reason(error)}); its step is not lowered"
      )
      return None, Check(what, skipped=note)
    if size % self.data_devices:
      message = (
        f"batch size {size} is not divisible by the {self.data_devices} devices of the mesh's "
        f"data axis ({self.mesh_description()})"
      )
      return None, Check(what, error=message)
    return batch, None

  def lower_phase(self, phase: Phase, state, batch, earlier: _Earlier, platform: str):
    mesh = kernel_lowering.abstract_mesh(self.sizes, self.names, platform)
    replicated = sharding_lib.replicated(mesh)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    shardings = self.state_shardings(mesh, state)
    inputs = {
      name: _placed(
        value,
        (lambda v: self.state_shardings(mesh, v))
        if earlier.is_state[name]
        else (lambda v: jax.tree.map(lambda _: replicated, v)),
      )
      for name, value in earlier.abstract.items()
    }
    checks = [
      _lower(
        f"{phase.name}/init", platform, mesh, phase.init, (rng, inputs), out_shardings=shardings
      )
    ]
    if phase.step is not None and (batch is not None or phase.data is None):
      if batch is not None:
        batch = _placed(
          batch, lambda b: jax.tree.map(lambda _: sharding_lib.batch_sharding(mesh), b)
        )
      checks.append(
        _lower(
          f"{phase.name}/step",
          platform,
          mesh,
          phase.step,
          (_placed(state, lambda _: shardings), batch, rng),
          out_shardings=(shardings, replicated),
          donate_argnums=0,
        )
      )
    return checks


def _read_batch(data, inputs):
  """The global batch size and the shapes of the first global batch of `data(inputs)`."""
  source = data(inputs)
  return source.global_batch_size, _shapes(source.batch(0, 0, 1))


def _lower(what, platform, mesh, fn, args, **jit_kwargs) -> Check:
  try:
    lowered = kernel_lowering.lower(
      fn, platform, *args, mesh=mesh, trace_in_mesh=TRACE_IN_MESH, **jit_kwargs
    )
  except Exception as error:
    return Check(what, platform, _reason(error))
  try:
    memory = dict(
      argument_bytes=_per_device_bytes(args), output_bytes=_per_device_bytes(lowered.out_info)
    )
  except Exception:  # the estimate is a note; never let it fail a lowering
    memory = {}
  return Check(what, platform, kernels=kernel_lowering.kernel_calls(lowered, platform), **memory)


def lower_config(
  config: ml_collections.ConfigDict,
  platforms: Sequence[str],
  num_devices: int | None = None,
) -> list[Check]:
  """Lowers `init` and `step` of every phase of `config` for each platform; one `Check` each."""
  unknown = [p for p in platforms if p not in kernel_lowering.PLATFORMS]
  if unknown or not platforms:
    return [Check("--lower_only", error=f"platforms must be in {kernel_lowering.PLATFORMS}")]
  num_devices = num_devices or jax.device_count()
  try:
    lowerer = _Lowerer(config, num_devices)
    loop.validate(config, lowerer.data_devices)
    phases = list(methods.get_method(config.method).phases(config))
  except Exception as error:
    return [Check(f"config at {num_devices} devices", error=_reason(error))]
  checks: list[Check] = []
  earlier = _Earlier()
  for phase in phases:
    try:
      state = jax.eval_shape(phase.init, jax.random.key(0), dict(earlier.abstract))
    except Exception as error:
      return checks + [Check(f"{phase.name}/init", error=f"abstract state: {_reason(error)}")]
    batch, problem = lowerer.batch(phase, earlier) if phase.data else (None, None)
    checks += [problem] if problem else []
    for platform in platforms:
      checks += lowerer.lower_phase(phase, state, batch, earlier, platform)
    try:
      earlier.add(phase, state)
    except Exception as error:
      return checks + [Check(f"{phase.name}/outputs", error=_reason(error))]
  return checks


def main(config: ml_collections.ConfigDict, platforms: Sequence[str], num_devices: int | None):
  """Prints one line per program and a summary; returns the exit status (1 if anything failed)."""
  checks = lower_config(config, platforms, num_devices)
  for check in checks:
    print(check.line())
  failed = sum(not c.ok for c in checks)
  skipped = sum(bool(c.skipped) for c in checks)
  print(
    f"{config.method}:{config.get('variant', 'default')} lowered for {','.join(platforms)} at "
    f"{num_devices or jax.device_count()} devices: {len(checks) - failed - skipped} ok, "
    f"{failed} failed" + (f", {skipped} skipped" if skipped else "")
  )
  return 1 if failed else 0
