"""Public entry point of the diagonal linear-recurrence scan, choosing an implementation.

`ssm_scan(a, b, h0)` returns every state of `h_t = a_t * h_{t-1} + b_t` (`h_{-1} = h0`, or 0), the
recurrence of a DCD SSM layer (`core/nn/ssm.py`; "The Expressive Limits of Diagonal SSMs for
State-Tracking", ICLR 2026).

Implementations:
  "pallas"      the Pallas kernel of `pallas.py`: Triton on GPU, Mosaic on TPU, the Pallas
                interpreter on CPU (correctness only);
  "xla"         `lax.associative_scan` (log-depth, O(T log T) work);
  "sequential"  `lax.scan` (T steps, O(T) work);
  None          Pallas where the program runs on GPU/TPU, XLA on CPU.
The choice follows the platform the program is lowered for (`lax.platform_dependent`), not the
machine that traces it, so a program exported or compiled for TPU from a CPU host gets the kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels.ssm_scan import pallas, reference

IMPLEMENTATIONS = ("pallas", "xla", "sequential")


def _xla(a, b, h0, *, reverse, interpret):
  del interpret
  return reference.associative_scan(a, b, h0, reverse=reverse)


def _sequential(a, b, h0, *, reverse, interpret):
  del interpret
  return reference.sequential_scan(a, b, h0, reverse=reverse)


def _per_platform(a, b, h0, *, reverse, interpret):
  """XLA when lowered for CPU, the Pallas kernel for every other platform."""
  kernel = functools.partial(pallas.ssm_scan_pallas, reverse=reverse, interpret=bool(interpret))
  xla = functools.partial(reference.associative_scan, reverse=reverse)
  return jax.lax.platform_dependent(a, b, h0, cpu=xla, default=kernel)


# Jitted so that eager calls compile once instead of dispatching op by op; a no-op under an outer jit.
_IMPLEMENTATION_FNS = {
  name: jax.jit(fn, static_argnames=("reverse", "interpret"))
  for name, fn in (
    ("pallas", pallas.ssm_scan_pallas),
    ("xla", _xla),
    ("sequential", _sequential),
    (None, _per_platform),
  )
}


def default_implementation() -> str:
  """What `implementation=None` runs on the default backend."""
  return "pallas" if jax.default_backend() in ("gpu", "tpu") else "xla"


def _check_dtype(name: str, x) -> None:
  if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.complexfloating)):
    raise TypeError(f"ssm_scan: {name} must be real or complex floating point, got dtype {x.dtype}")


def _validate(a, b, h0):
  if a.ndim != 3:
    raise ValueError(f"ssm_scan: a must have shape [batch, time, dim], got shape {a.shape}")
  if b.shape != a.shape:
    raise ValueError(f"ssm_scan: b must have the shape of a {a.shape}, got shape {b.shape}")
  if a.shape[1] == 0:
    raise ValueError(f"ssm_scan: a needs at least one time step, got shape {a.shape}")
  expected = (a.shape[0], a.shape[2])
  if h0 is not None and h0.shape != expected:
    raise ValueError(
      f"ssm_scan: h0 must have shape [batch, dim] = {expected}, got shape {h0.shape}"
    )
  for name, x in (("a", a), ("b", b), ("h0", h0)):
    if x is not None:
      _check_dtype(name, x)


def ssm_scan(
  a: jax.Array,
  b: jax.Array,
  h0: jax.Array | None = None,
  *,
  reverse: bool = False,
  implementation: str | None = None,
  interpret: bool | None = None,
) -> jax.Array:
  """All states `h` of `h_t = a_t * h_{t-1} + b_t`, shape `[batch, time, dim]`.

  Args:
    a: `[batch, time, dim]` decay/rotation factors, real or complex.
    b: `[batch, time, dim]` inputs, real or complex.
    h0: `[batch, dim]` initial state (`h_{-1}`, or `h_T` when `reverse`); default zeros.
    reverse: run from the last step to the first: `h_t = a_t * h_{t+1} + b_t`.
    implementation: "pallas", "xla", "sequential" or None (Pallas on GPU/TPU, XLA on CPU).
    interpret: for the Pallas kernel: True runs the Pallas interpreter on every platform, False the
      compiled kernel of the platform lowered for, None the interpreter on CPU only.

  Returns:
    `h` in the common dtype of `a`, `b`, `h0` (complex when any of them is).
  """
  a, b = jnp.asarray(a), jnp.asarray(b)
  h0 = None if h0 is None else jnp.asarray(h0)
  _validate(a, b, h0)
  if implementation is not None and implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"ssm_scan: implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}"
    )
  dtype = jnp.result_type(a, b, *([] if h0 is None else [h0]))
  a, b = a.astype(dtype), b.astype(dtype)
  h0 = jnp.zeros((a.shape[0], a.shape[2]), dtype) if h0 is None else h0.astype(dtype)
  return _IMPLEMENTATION_FNS[implementation](a, b, h0, reverse=reverse, interpret=interpret)
