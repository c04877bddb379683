"""Lowering for GPU or TPU from any machine, accelerator or not: `lower(fn, platform, *args)`.

`jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,))` emits the StableHLO a device would
compile, with each Pallas kernel lowered by its backend: Mosaic TPU for "tpu", Triton (or Mosaic GPU)
for "cuda". The kernels choose their implementation with `lax.platform_dependent`, so what is lowered
is what that platform would run. One platform per lowering: a multi-platform lowering keeps every
kernel branch and lowers each for every platform, which Pallas refuses.

What this checks without a chip:
* "tpu": Pallas' Mosaic lowering: block shapes against TPU's (8, 128) tiling, memory spaces, and a
  lowering rule for every operation in the kernel. Pallas reads the chip generation for some rules
  (rank-1 blocks): lowering runs under an abstract mesh whose `AbstractDevice` is a `TPU_DEVICE_KIND`,
  so they do not fail with "Unsupported TPU device kind: cpu" (a limit of lowering on CPU, not of a
  kernel). Mosaic's layout passes and the VMEM fit run in libtpu when the program compiles.
* "cuda": Triton kernels become Triton IR, which `verified_triton()` also runs through the Triton
  dialect's verifier (power-of-two tensor sizes, types); PTX generation, register and shared-memory
  fit happen in XLA when the program compiles. Mosaic GPU kernels lower completely in Python,
  including their shared-memory budget (227 KiB, an H100/H200 block's opt-in maximum).
"""

from __future__ import annotations

import contextlib

import jax
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

PLATFORMS = ("cuda", "tpu")
TPU_DEVICE_KIND = "TPU v5 lite"  # v5e: (8, 128) tiles, 128 MiB of VMEM per core
KERNEL_CALLS = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}


def abstract_mesh(
  sizes: tuple[int, ...] = (1,), names: tuple[str, ...] = ("data",), platform: str = "tpu"
) -> AbstractMesh:
  """A device-free mesh; for "tpu" its devices are `TPU_DEVICE_KIND` chips."""
  device = None
  if platform == "tpu":
    device = AbstractDevice(device_kind=TPU_DEVICE_KIND, num_cores=1, platform="tpu")
  return AbstractMesh(
    tuple(sizes), tuple(names), (AxisType.Auto,) * len(names), abstract_device=device
  )


@contextlib.contextmanager
def verified_triton():
  """Runs the Triton dialect's verifier on every Triton module Pallas lowers in this context."""
  try:
    from jax._src.pallas.triton import pallas_call_registration as registration
  except ImportError:  # no Triton lowering in this jaxlib: nothing to verify
    yield
    return
  original = registration.lowering.lower_jaxpr_to_triton_module

  def lower_and_verify(*args, **kwargs):
    result = original(*args, **kwargs)
    result.module.operation.verify()  # raises MLIRError naming the invalid operation
    return result

  registration.lowering.lower_jaxpr_to_triton_module = lower_and_verify
  try:
    yield
  finally:
    registration.lowering.lower_jaxpr_to_triton_module = original


def lower(
  fn,
  platform: str,
  *args,
  mesh: AbstractMesh | None = None,
  trace_in_mesh: bool = False,
  **jit_kwargs,
):
  """`jax.jit(fn, **jit_kwargs)` lowered for `platform` at `args` (arrays or ShapeDtypeStructs).

  `mesh` (default: one device) is the context mesh of the lowering; `trace_in_mesh` makes it the
  context of tracing too, as under `jax.set_mesh`, where kernels split themselves over it
  (`kernels/partitioning.py`); without it they trace as under a bare `jax.jit`.
  """
  if platform not in PLATFORMS:
    raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
  mesh = abstract_mesh(platform=platform) if mesh is None else mesh
  with contextlib.ExitStack() as stack:
    if trace_in_mesh:
      stack.enter_context(jax.sharding.use_abstract_mesh(mesh))
    traced = jax.jit(fn, **jit_kwargs).trace(*args)
  with jax.sharding.use_abstract_mesh(mesh), verified_triton():
    return traced.lower(lowering_platforms=(platform,))


def kernel_calls(lowered, platform: str) -> int:
  """How many Pallas kernels (custom calls of `platform`'s backend) the lowered program holds."""
  return lowered.as_text().count(KERNEL_CALLS[platform])
