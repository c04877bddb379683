"""Input-dependent complex-valued diagonal (DCD) state-space layers and the GRU baseline.

Paper: "The Expressive Limits of Diagonal SSMs for State-Tracking" (Shakerinava, Khavari, Ravanbakhsh,
Chandar; ICLR 2026; arXiv 2603.01959). A DCD layer is

    h_t = diag(lambda(u_t)) h_{t-1} + b(u_t),     h_t in C^{d_state},

run by `kernels.ssm_scan.ssm_scan`, followed by a position-wise decoder. The eigenvalue
parameterisations are the rows of the paper's table of SSM variants, with
`Delta(u) = softplus(W_Delta u + c)`:

    "s4d"           lambda = exp(Delta * Lambda), Delta, Lambda = -exp(l) + i w learned but input-independent
                    (S4D-Lin init): time-invariant, anywhere in the unit disc.
    "mamba"         lambda = exp(Delta(u) * Lambda), Lambda = -exp(l) < 0: real, in (0, 1].
    "neg_mamba"     lambda = 2 exp(Delta(u) * Lambda) - 1: real, in (-1, 1].
    "aussm"         lambda = exp(i Delta(u) * Lambda(u)), Lambda(u) = W_Lambda u + c: the unit circle.
    "simple_aussm"  lambda = exp(i theta(u)), theta(u) = W_theta u + c: the angle read directly from the
                    input without the Delta gate. The paper's definition of "Simple AUSSM" was not
                    recovered from the sources we could read; this is our reading, used as an ablation.

Choices where the paper is open:
* `b(u) = W_b u + c_b` is complex and the same for every parameterisation, so the kinds differ only in
  their eigenvalues, which is what the theorems are about. Mamba's own `Delta * B(u) * u` input scaling
  is not used. `W_b` and `c_b` start at zero, so a unit-modulus scan starts on its circle (the
  regime of the constructions); training grows `b` where it helps. `input_term = "none"` drops `b`
  (`h_t = lambda(u_t) h_{t-1}`, the form of Thm 1's construction): with unit-modulus eigenvalues a
  learned `b` with `lambda ~ 1` makes a coordinate count positions (`|h_t|` grows with t), a feature
  the decoder sees only up to the training length.
* The initial state `h0` is a learned complex vector per layer (initialised to 1): with `b = 0` a
  unit-modulus scan needs a non-zero start, else the state stays at 0.
* `Delta` is per state coordinate (one coordinate = one complex eigenvalue), Mamba's `dt` init
  (log-uniform in [1e-3, 1e-1]) and S4D-real `Lambda = -(1..d)` for the Mamba kinds.
* A `k`-layer stack gives every layer a residual copy of the input embedding (layer `l + 1`
  needs `x_t` itself, not only layer `l`'s output, for the cascade of Thm 2):
  `u^1 = e`, `u^{l+1} = dec_l(h^l, u^l) + e`, logits = `Dense(u^{k+1})`. The decoder is
  `Dense(relu(Dense([Re h, Im h, u])))`, pointwise, so only the scan carries information across time.
* The GRU baseline replaces the scan by a GRU with `2 * d_state` real units (the real size of the
  complex state) and keeps the same decoder and stack.

Precision (`dtype`, `param_dtype`; float32 by default): with `dtype = bfloat16` the embedding, the
input projection `b(u)`, the decoders and the residual stream are bfloat16. Float32 throughout: the
eigenvalue projections (`Delta`, the angle; as Mamba keeps `dt` and `A` in float32: an angle error
compounds over the T steps of the scan), the scan itself (complex64 state accumulation), the GRU's
recurrent state, and the logits.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernels.ssm_scan import ssm_scan

EIGENVALUE_KINDS = ("s4d", "mamba", "neg_mamba", "aussm", "simple_aussm")
INPUT_TERMS = ("affine", "none")  # b(u) = W_b u + c_b, or b = 0
RECURRENCES = EIGENVALUE_KINDS + ("gru",)
DT_MIN, DT_MAX = 1e-3, 1e-1
UNIT_DELTA_BIAS = math.log(math.e - 1.0)  # softplus(UNIT_DELTA_BIAS) = 1: AUSSM's initial Delta


def inverse_softplus(y):
  """`x` with `softplus(x) = y` (y > 0)."""
  return y + jnp.log(-jnp.expm1(-y))


def _dt_bias_init(key, shape, dtype=jnp.float32):
  """Mamba's `dt` bias: `softplus(bias)` log-uniform in [DT_MIN, DT_MAX]."""
  log_dt = jax.random.uniform(key, shape, dtype, math.log(DT_MIN), math.log(DT_MAX))
  return inverse_softplus(jnp.exp(log_dt))


def _log_dt_init(key, shape, dtype=jnp.float32):
  """S4D's time step: `log dt` uniform in [log DT_MIN, log DT_MAX]."""
  return jax.random.uniform(key, shape, dtype, math.log(DT_MIN), math.log(DT_MAX))


def _log_arange_init(key, shape, dtype=jnp.float32):
  """`log(1..d)`: S4D-real `Lambda_n = -(n + 1)`."""
  del key
  return jnp.log(jnp.arange(1, shape[-1] + 1, dtype=dtype))


def _h0_init(key, shape, dtype=jnp.float32):
  """`h0 = 1 + 0i` as stacked (real, imaginary) planes."""
  del key
  return jnp.zeros(shape, dtype).at[0].set(1.0)


class DCDLayer(nn.Module):
  """`u [B, T, d_in] -> h [B, T, d_state]` (complex64): one DCD recurrence.

  Attributes:
    d_state: number of complex state coordinates.
    kind: one of `EIGENVALUE_KINDS`.
    scan_implementation: passed to `ssm_scan` ("pallas", "xla", "sequential" or None for auto).
    dtype: compute dtype of `b(u)` (the eigenvalues and the scan stay float32); param_dtype: storage.
    input_term: "affine" (`b(u) = W_b u + c_b`) or "none" (`b = 0`).
  """

  d_state: int
  kind: str = "aussm"
  scan_implementation: str | None = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  input_term: str = "affine"

  def setup(self):
    if self.kind not in EIGENVALUE_KINDS:
      raise ValueError(f"DCDLayer.kind must be one of {EIGENVALUE_KINDS}, got {self.kind!r}")
    if self.input_term not in INPUT_TERMS:
      raise ValueError(f"DCDLayer.input_term must be one of {INPUT_TERMS}, got {self.input_term!r}")
    d, param_dtype = self.d_state, self.param_dtype
    # the eigenvalue projections compute in float32 whatever `dtype` (module docstring)
    eigen_dense = functools.partial(nn.Dense, dtype=jnp.float32, param_dtype=param_dtype)
    if self.kind == "s4d":
      self.log_dt = self.param("log_dt", _log_dt_init, (d,), param_dtype)
      self.log_neg_real = self.param(
        "log_neg_real", nn.initializers.constant(math.log(0.5)), (d,), param_dtype
      )
      self.imag = self.param(
        "imag", lambda k, s, dtype: jnp.pi * jnp.arange(s[0], dtype=dtype), (d,), param_dtype
      )
    if self.kind in ("mamba", "neg_mamba", "aussm"):
      bias = _dt_bias_init if self.kind != "aussm" else nn.initializers.constant(UNIT_DELTA_BIAS)
      self.delta = eigen_dense(d, bias_init=bias)
    if self.kind in ("mamba", "neg_mamba"):
      self.log_neg_lambda = self.param("log_neg_lambda", _log_arange_init, (d,), param_dtype)
    if self.kind in ("aussm", "simple_aussm"):
      self.angle = eigen_dense(d)
    if self.input_term == "affine":
      self.b_proj = nn.Dense(
        2 * d, kernel_init=nn.initializers.zeros, dtype=self.dtype, param_dtype=param_dtype
      )
    self.h0 = self.param("h0", _h0_init, (2, d), param_dtype)

  def eigenvalues(self, u: jax.Array) -> jax.Array:
    """`lambda(u_t)`, `[B, T, d_state]` complex64 (the paper's table of variants)."""
    kind = self.kind
    if kind == "s4d":
      rate = jnp.exp(self.log_dt) * (-jnp.exp(self.log_neg_real) + 1j * self.imag)
      return jnp.broadcast_to(jnp.exp(rate), u.shape[:-1] + (self.d_state,)).astype(jnp.complex64)
    if kind in ("mamba", "neg_mamba"):
      decay = jnp.exp(-jax.nn.softplus(self.delta(u)) * jnp.exp(self.log_neg_lambda))
      real = decay if kind == "mamba" else 2.0 * decay - 1.0
      return real.astype(jnp.complex64)
    theta = self.angle(u)
    if kind == "aussm":
      theta = jax.nn.softplus(self.delta(u)) * theta
    return jnp.exp(1j * theta).astype(jnp.complex64)

  def __call__(self, u: jax.Array) -> jax.Array:
    if u.ndim != 3:
      raise ValueError(f"DCDLayer expects u of shape [batch, time, features], got {u.shape}")
    if self.input_term == "affine":
      # the scan accumulates in complex64: b is cast up before it enters the state
      b_re, b_im = jnp.split(self.b_proj(u).astype(jnp.float32), 2, axis=-1)
      b = jax.lax.complex(b_re, b_im)
    else:
      b = jnp.zeros(u.shape[:-1] + (self.d_state,), jnp.complex64)
    h0 = jnp.broadcast_to(jax.lax.complex(self.h0[0], self.h0[1]), (u.shape[0], self.d_state))
    return ssm_scan(self.eigenvalues(u), b, h0, implementation=self.scan_implementation)


class Block(nn.Module):
  """One layer of the stack: a recurrence, then the pointwise decoder `[features of h, u] -> d_model`."""

  d_model: int
  d_state: int
  d_hidden: int
  kind: str = "aussm"
  scan_implementation: str | None = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  input_term: str = "affine"

  @nn.compact
  def __call__(self, u: jax.Array) -> jax.Array:
    precision = {"dtype": self.dtype, "param_dtype": self.param_dtype}
    if self.kind == "gru":
      # the GRU's recurrent state accumulates over time: float32 whatever `dtype`
      cell = nn.GRUCell(2 * self.d_state, param_dtype=self.param_dtype)
      features = nn.RNN(cell, name="recurrence")(u.astype(jnp.float32))
    else:
      recurrence = DCDLayer(
        self.d_state,
        self.kind,
        self.scan_implementation,
        **precision,
        input_term=self.input_term,
        name="recurrence",
      )
      h = recurrence(u)
      features = jnp.concatenate([h.real, h.imag], axis=-1)
    dense = functools.partial(nn.Dense, **precision)
    decoder_input = jnp.concatenate([features.astype(self.dtype), u], -1)
    hidden = nn.relu(dense(self.d_hidden, name="hidden")(decoder_input))
    return dense(self.d_model, name="out")(hidden)


class StateTracker(nn.Module):
  """`tokens [B, T] int -> logits [B, T, num_classes]`: embedding, `num_layers` blocks, readout.

  Every block reads the previous block's output plus a residual copy of the input embedding
  (RMS-normalised first with `block_norm`).
  """

  vocab_size: int
  num_classes: int
  d_model: int = 64
  d_state: int = 32
  d_hidden: int = 128
  num_layers: int = 1
  kind: str = "aussm"
  scan_implementation: str | None = None
  dtype: Any = jnp.float32  # compute dtype (module docstring: what stays float32)
  param_dtype: Any = jnp.float32
  input_term: str = "affine"  # DCD layers' b(u): "affine" | "none"
  block_norm: bool = False  # RMSNorm before every block and the readout (pre-norm stack)

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    if tokens.ndim != 2:
      raise ValueError(f"StateTracker expects tokens of shape [batch, time], got {tokens.shape}")
    if self.kind not in RECURRENCES:
      raise ValueError(f"StateTracker.kind must be one of {RECURRENCES}, got {self.kind!r}")
    precision = {"dtype": self.dtype, "param_dtype": self.param_dtype}
    embedding = nn.Embed(self.vocab_size, self.d_model, **precision, name="embed")(tokens)
    u = embedding
    for index in range(self.num_layers):
      block = Block(
        self.d_model,
        self.d_state,
        self.d_hidden,
        self.kind,
        self.scan_implementation,
        **precision,
        input_term=self.input_term,
        name=f"layer_{index}",
      )
      u = block(self._norm(u, f"norm_{index}")) + embedding
    logits = nn.Dense(self.num_classes, **precision, name="readout")(self._norm(u, "final_norm"))
    return logits.astype(jnp.float32)  # the cross-entropy's log-sum-exp reads float32 logits

  def _norm(self, u: jax.Array, name: str) -> jax.Array:
    """RMSNorm with `block_norm`: bounds the scale a block's eigenvalue maps read, which without it
    grows with training in a stack (AUSSM's angle is quadratic in its input)."""
    if not self.block_norm:
      return u
    return nn.RMSNorm(dtype=self.dtype, param_dtype=self.param_dtype, name=name)(u)
