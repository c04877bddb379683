"""Spiking neurons and networks: LIF, the Dynamic Gated Neuron (DGN) and its shared-reversal s-DGN.

Paper: "A Brain-Inspired Gating Mechanism Unlocks Robust Computation in Spiking Neural Networks"
(Bai, Wang, Yu; ICLR 2026, arXiv 2509.03281), Eq. 3-8. A DGN receives every input `i` through two
synaptic pathways: a current weight `W_i` and a conductance weight `C_i`, so that presynaptic activity
also raises the membrane's leak (an activity-dependent "forget gate").

Continuous model (Eq. 3-4), input spike times `t_i^k`:

    tau_s dD_i/dt = -D_i + sum_k delta(t - t_i^k)
    dV/dt = -(g_l + sum_i C_i D_i) V + sum_i W_i D_i

Discrete update (forward Euler with step `dt`, Eq. 5-8), input spikes `z_i^t`:

    D_i^t = exp(-dt / tau_s) D_i^{t-1} + z_i^t                           (5)
    rho^t = phi(1 - g_l dt - dt sum_i C_i D_i^t)                         (6)
    V^t   = rho^t V^{t-1} + dt sum_i W_i D_i^t - theta z^{t-1}            (7)
    z^t   = Heaviside(V^t - theta)                                       (8)

The discrete trace jumps by 1 per spike where Eq. 3's jumps by `1 / tau_s`, so discrete weights are the
continuous ones divided by `tau_s`; step `t` covers `[t dt, (t + 1) dt)` and `V^t` approximates
`V((t + 1) dt)` (`continuous_neuron` is the reference the tests converge to).

Neuron kinds (`KINDS`), per layer of `n_in -> n` neurons:
  "lif"   `W` only; `rho = phi(1 - g_l dt)` is constant (the DGN with `C = 0`).
  "dgn"   `W` and `C`, both `[n_in, n]`: twice LIF's synapses.
  "sdgn"  one reversal potential `E` per neuron shared by all its synapses, `W_i = E C_i` (the paper's s-DGN):
          LIF's parameter count plus one per neuron.

Networks: feed-forward (or recurrent, `recurrent=True`: the layer's own spikes feed a trace with its own
`W_rec`, `C_rec`) spiking layers and a non-spiking leaky-integrator readout (the same membrane without
threshold and reset); logits are the readout potential averaged over time. Every linear recurrence of
the network goes through `kernels.ssm_scan` (Pallas on GPU/TPU): the synaptic traces (Eq. 5: constant
decay) and the readout (Eq. 6-7 without reset: input-dependent decay `rho^t`, but linear in `V`). The
spiking membrane is not linear in `V` (the reset `z^{t-1} = Heaviside(V^{t-1} - theta)`), so it runs as
a `lax.scan` over time with the surrogate-gradient spike function.

Choices where the paper is open:
* `phi` is "a truncation function such as a sigmoid": default `"clip"` to [0, 1], so that `C = 0`
  reproduces LIF with decay `1 - g_l dt` exactly and `rho` is a valid decay; `"sigmoid"` is offered as
  the ablation (it changes the `C = 0` baseline).
* LIF's decay is `1 - g_l dt` (not `exp(-g_l dt)`) so that it is exactly the DGN with `C = 0`.
* Surrogate gradient (the paper trains with BPTT and a surrogate, shape not given): rectangular
  `1[|x| < a/2] / a` by default, ATan and fast-sigmoid offered; each integrates to 1 with peak `1/a`.
  The forward pass is the exact Heaviside (`x >= 0` spikes).
* Signs are unconstrained; `C` starts at `|N(0, (c_scale / sqrt(n_in))^2)|` (a physical, small
  non-negative conductance), `W` at `N(0, (w_scale / sqrt(n_in))^2)`; s-DGN starts with
  `C ~ N(0, (w_scale / (E_0 sqrt(n_in)))^2)` and `E = E_0`, so its initial `W = E C` matches LIF's.
* The readout carries the layer's kind (C on the readout too: the paper's parameter counts for
  LIF / DGN / s-DGN imply it).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kernels.ssm_scan import ssm_scan

KINDS = ("lif", "dgn", "sdgn")
PHIS = ("clip", "sigmoid")
SURROGATES = ("rectangle", "atan", "fast_sigmoid")
SCAN_IMPLEMENTATIONS = ("auto", "pallas", "xla", "sequential")


@dataclasses.dataclass(frozen=True)
class NeuronConfig:
  """Constants of Eq. 5-8 and the surrogate gradient (hashable: closed over by jitted code)."""

  dt: float = 1.0
  tau_s: float = 5.0  # synaptic time constant: trace decay exp(-dt / tau_s)
  g_l: float = 0.1  # leak conductance: LIF decay 1 - g_l dt
  threshold: float = 1.0  # theta
  phi: str = "clip"  # "clip" to [0, 1] | "sigmoid"
  surrogate: str = "rectangle"  # "rectangle" | "atan" | "fast_sigmoid"
  surrogate_width: float = 1.0  # a: each surrogate has peak 1/a and unit integral
  detach_reset: bool = False  # stop the gradient through the reset term theta z^{t-1}

  @property
  def trace_decay(self) -> float:
    return math.exp(-self.dt / self.tau_s)


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
  """A spiking classifier: `n_in -> hidden_sizes -> n_out`, every layer of neuron kind `kind`."""

  kind: str = "dgn"
  n_in: int = 64
  hidden_sizes: tuple[int, ...] = (128,)
  n_out: int = 10
  recurrent: bool = False
  neuron: NeuronConfig = NeuronConfig()
  w_scale: float = 2.0  # W ~ N(0, (w_scale / sqrt(n_in))^2) in the spiking layers
  readout_scale: float = 0.2  # the readout's w_scale: initial logits of order 1
  c_scale: float = 0.1  # C ~ |N(0, (c_scale / sqrt(n_in))^2)|
  reversal_init: float = 2.0  # s-DGN: E_0
  scan_implementation: str = "auto"  # kernels.ssm_scan implementation for traces and the readout


class Forward(NamedTuple):
  logits: jax.Array  # [B, n_out]: readout potential averaged over time
  hidden_spikes: tuple[jax.Array, ...]  # per layer [B, T, n]
  readout_potential: jax.Array  # [B, T, n_out]


# ---------------------------------------------------------------------------------------------------
# Spike function (Eq. 8) with a surrogate gradient
# ---------------------------------------------------------------------------------------------------


def surrogate_derivative(x: jax.Array, surrogate: str, width: float) -> jax.Array:
  """The pseudo-derivative of Heaviside(x): peak `1 / width`, integral 1."""
  if surrogate == "rectangle":
    return (jnp.abs(x) < width / 2).astype(x.dtype) / width
  if surrogate == "atan":  # d/dx [arctan(pi x / a) / pi]
    return (1.0 / width) / (1.0 + (math.pi * x / width) ** 2)
  if surrogate == "fast_sigmoid":  # SuperSpike
    return (1.0 / width) / (1.0 + 2.0 * jnp.abs(x) / width) ** 2
  raise ValueError(f"surrogate must be one of {SURROGATES}, got {surrogate!r}")


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def spike(x: jax.Array, surrogate: str = "rectangle", width: float = 1.0) -> jax.Array:
  """Heaviside(x) (1 where `x >= 0`) forward; `surrogate_derivative` as its derivative."""
  return (x >= 0).astype(x.dtype)


@spike.defjvp
def _spike_jvp(surrogate, width, primals, tangents):
  (x,), (dx,) = primals, tangents
  return spike(x, surrogate, width), surrogate_derivative(x, surrogate, width) * dx


# ---------------------------------------------------------------------------------------------------
# Neuron dynamics
# ---------------------------------------------------------------------------------------------------


def phi(x: jax.Array, kind: str) -> jax.Array:
  """The truncation of Eq. 6."""
  if kind == "clip":
    return jnp.clip(x, 0.0, 1.0)
  if kind == "sigmoid":
    return jax.nn.sigmoid(x)
  raise ValueError(f"phi must be one of {PHIS}, got {kind!r}")


def decay_factor(conductance: jax.Array | float, neuron: NeuronConfig) -> jax.Array:
  """`rho = phi(1 - g_l dt - G)` with `G = dt sum_i C_i D_i` (Eq. 6); `G = 0` is LIF."""
  return phi(1.0 - neuron.g_l * neuron.dt - jnp.asarray(conductance), neuron.phi)


def _implementation(name: str) -> str | None:
  return None if name == "auto" else name


def synaptic_trace(
  spikes: jax.Array, neuron: NeuronConfig, implementation: str = "auto"
) -> jax.Array:
  """`D^t = exp(-dt / tau_s) D^{t-1} + z^t` (Eq. 5) for spikes `[B, T, n]`, by `kernels.ssm_scan`."""
  spikes = spikes.astype(jnp.float32)
  decay = jnp.full_like(spikes, neuron.trace_decay)
  return ssm_scan(decay, spikes, implementation=_implementation(implementation))


def synaptic_drive(params: dict, trace: jax.Array, kind: str, dt: float, suffix: str = ""):
  """`(dt sum_i W_i D_i, dt sum_i C_i D_i)` of a layer's pathways; the conductance is None for LIF."""
  if kind == "lif":
    return dt * trace @ params["w" + suffix], None
  conductance = dt * trace @ params["c" + suffix]
  if kind == "sdgn":
    return params["e"] * conductance, conductance
  return dt * trace @ params["w" + suffix], conductance


def membrane_scan(
  current: jax.Array,
  conductance: jax.Array | None,
  neuron: NeuronConfig,
  recurrent: tuple[dict, str] | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Eq. 6-8 over time: `(spikes z, potentials V)`, each `[B, T, n]`, from `[B, T, n]` drives.

  `recurrent = (params, kind)` adds the drive of the layer's own spike trace
  `D_rec^t = exp(-dt / tau_s) D_rec^{t-1} + z^{t-1}` through `params["w_rec"]`, `params["c_rec"]`.
  """
  batch, _, width = current.shape
  zeros = jnp.zeros((batch, width), current.dtype)

  def step(carry, drive):
    v, z_prev, d_rec = carry
    i_t, g_t = drive
    if recurrent is not None:
      params, kind = recurrent
      d_rec = neuron.trace_decay * d_rec + z_prev
      i_rec, g_rec = synaptic_drive(params, d_rec, kind, neuron.dt, suffix="_rec")
      i_t = i_t + i_rec
      g_t = g_t if g_rec is None else g_t + g_rec
    reset = jax.lax.stop_gradient(z_prev) if neuron.detach_reset else z_prev
    v = decay_factor(g_t, neuron) * v + i_t - neuron.threshold * reset
    z = spike(v - neuron.threshold, neuron.surrogate, neuron.surrogate_width)
    return (v, z, d_rec), (z, v)

  g = jnp.zeros_like(current) if conductance is None else conductance
  drives = (jnp.swapaxes(current, 0, 1), jnp.swapaxes(g, 0, 1))
  _, (z, v) = jax.lax.scan(step, (zeros, zeros, zeros), drives)
  return jnp.swapaxes(z, 0, 1), jnp.swapaxes(v, 0, 1)


def leaky_readout(
  current: jax.Array,
  conductance: jax.Array | None,
  neuron: NeuronConfig,
  implementation: str = "auto",
) -> jax.Array:
  """`V^t = rho^t V^{t-1} + I^t` (Eq. 6-7 without threshold or reset), linear in V: `ssm_scan`."""
  rho = decay_factor(jnp.zeros_like(current) if conductance is None else conductance, neuron)
  return ssm_scan(rho, current, implementation=_implementation(implementation))


# ---------------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------------


def init_pathways(
  key, n_in: int, n: int, config: NetworkConfig, w_scale: float, suffix: str = ""
) -> dict:
  """One layer's synapses from `n_in` inputs (see the module docstring for the initialisation)."""
  key_w, key_c = jax.random.split(key)
  std = w_scale / math.sqrt(n_in)
  if config.kind == "lif":
    return {"w" + suffix: std * jax.random.normal(key_w, (n_in, n))}
  if config.kind == "sdgn":
    c_std = std / config.reversal_init
    return {"c" + suffix: c_std * jax.random.normal(key_c, (n_in, n))}
  c_std = config.c_scale / math.sqrt(n_in)
  return {
    "w" + suffix: std * jax.random.normal(key_w, (n_in, n)),
    "c" + suffix: c_std * jnp.abs(jax.random.normal(key_c, (n_in, n))),
  }


def init_layer(
  key, n_in: int, n: int, config: NetworkConfig, recurrent: bool, w_scale: float
) -> dict:
  key_in, key_rec = jax.random.split(key)
  params = init_pathways(key_in, n_in, n, config, w_scale)
  if recurrent:
    params |= init_pathways(key_rec, n, n, config, w_scale, suffix="_rec")
  if config.kind == "sdgn":
    params["e"] = jnp.full((n,), config.reversal_init)
  return params


def init_network(key, config: NetworkConfig) -> dict:
  """`{"hidden": [layer params], "readout": params}`."""
  sizes = (config.n_in, *config.hidden_sizes)
  keys = jax.random.split(key, len(sizes))
  hidden = [
    init_layer(k, n_in, n, config, config.recurrent, config.w_scale)
    for k, n_in, n in zip(keys[:-1], sizes[:-1], sizes[1:], strict=True)
  ]
  readout = init_layer(keys[-1], sizes[-1], config.n_out, config, False, config.readout_scale)
  return {"hidden": hidden, "readout": readout}


def num_params(params) -> int:
  return sum(int(leaf.size) for leaf in jax.tree.leaves(params))


# ---------------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------------


def spiking_layer(params: dict, trace: jax.Array, config: NetworkConfig):
  """A layer's `(spikes, potentials)` from the trace `[B, T, n_in]` of its inputs."""
  current, conductance = synaptic_drive(params, trace, config.kind, config.neuron.dt)
  recurrent = (params, config.kind) if config.recurrent else None
  return membrane_scan(current, conductance, config.neuron, recurrent)


def apply_network(params: dict, spikes: jax.Array, config: NetworkConfig) -> Forward:
  """Input spikes `[B, T, n_in]` (binary, or relaxed to [0, 1]) -> logits and every layer's spikes."""
  neuron, implementation = config.neuron, config.scan_implementation
  hidden = []
  layer_input = spikes
  for layer in params["hidden"]:
    layer_input, _ = spiking_layer(
      layer, synaptic_trace(layer_input, neuron, implementation), config
    )
    hidden.append(layer_input)
  trace = synaptic_trace(layer_input, neuron, implementation)
  current, conductance = synaptic_drive(params["readout"], trace, config.kind, neuron.dt)
  potential = leaky_readout(current, conductance, neuron, implementation)
  return Forward(potential.mean(axis=1), tuple(hidden), potential)


def synaptic_operations(spikes: jax.Array, forward: Forward, config: NetworkConfig) -> jax.Array:
  """Per example: presynaptic spikes times fan-out times pathways (DGN: W and C; else one), summed
  over the spiking inputs and hidden layers: the accumulate-operation count SNN energy estimates use."""
  pathways = 2 if config.kind == "dgn" else 1
  fan_outs = (*config.hidden_sizes, config.n_out)
  sources = (spikes, *forward.hidden_spikes)
  total = 0.0
  for source, fan_out in zip(sources, fan_outs, strict=True):
    total = total + source.sum(axis=(1, 2)) * fan_out * pathways
  if config.recurrent:
    for layer_spikes, width in zip(forward.hidden_spikes, config.hidden_sizes, strict=True):
      total = total + layer_spikes.sum(axis=(1, 2)) * width * pathways
  return total


# ---------------------------------------------------------------------------------------------------
# Continuous model (Eq. 3-4): the reference for the discrete update
# ---------------------------------------------------------------------------------------------------


def continuous_neuron(
  input_spikes: jax.Array,
  w: jax.Array,
  c: jax.Array,
  g_l: float,
  tau_s: float,
  step: float,
  threshold: float | None = None,
) -> jax.Array:
  """`V` of Eq. 3-4 on a fine grid of `step`, for input spikes `[T_fine, n_in]` on that grid.

  Between grid points the traces decay exactly (`D(s) = D(t) exp(-(s - t) / tau_s)`) and `V` takes one
  classical Runge-Kutta step; a spike at grid time `t` raises its trace by `1 / tau_s` at `t`. With a
  `threshold`, `V` is reset by subtraction when it reaches it. Returns `V` at the end of each step.
  """

  def dv(v, d):
    return -(g_l + d @ c) * v + d @ w

  def advance(carry, z):
    v, d = carry
    d = d + z / tau_s
    half, full = d * math.exp(-step / (2 * tau_s)), d * math.exp(-step / tau_s)
    k1 = dv(v, d)
    k2 = dv(v + step / 2 * k1, half)
    k3 = dv(v + step / 2 * k2, half)
    k4 = dv(v + step * k3, full)
    v = v + step / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    if threshold is not None:
      v = v - threshold * (v >= threshold)
    return (v, full), v

  d0 = jnp.zeros(input_spikes.shape[1], jnp.float32)
  _, v = jax.lax.scan(advance, (jnp.float32(0.0), d0), input_spikes.astype(jnp.float32))
  return v


def discrete_neuron(
  input_spikes: jax.Array, w: jax.Array, c: jax.Array, neuron: NeuronConfig
) -> tuple[jax.Array, jax.Array]:
  """One DGN (`c = 0`: LIF) by Eq. 5-8 for input spikes `[T, n_in]`: `(spikes, V)`, each `[T]`."""
  trace = synaptic_trace(input_spikes[None], neuron, "sequential")
  current, conductance = neuron.dt * trace @ w[:, None], neuron.dt * trace @ c[:, None]
  z, v = membrane_scan(current, conductance, neuron)
  return z[0, :, 0], v[0, :, 0]
