"""Exact DCD SSM weights for group state tracking: the constructions of Thm 1 and Thm 2.

"The Expressive Limits of Diagonal SSMs for State-Tracking" (ICLR 2026, arXiv 2603.01959). The cascade
below is our derivation of the sufficiency direction of Thm 2; it agrees with the paper's S3 example.

**Cascade** (Thm 2, sufficiency). Given a subnormal series `{e} = G_0 < G_1 < ... < G_k = G` with
Abelian factors, layer `l` (1-based) tracks the factor `Q_l = G_{k-l+1} / G_{k-l}`. With a section
`s_l: Q_l -> G_{k-l+1}` (least coset element, so `s_l(e) = e`) write `n^0_t = p_t` and
`n^{l-1}_t = n^l_t s_l(q^l_t)`. Then

    q^l_t = q^l_{t-1} * image(tau^l_t)                      (an Abelian scan: layer l)
    tau^1_t = x_t,  tau^{l+1}_t = s_l(q^l_{t-1}) tau^l_t s_l(q^l_t)^-1  in G_{k-l},

and since `q^l_{t-1} = q^l_t image(tau^l_t)^-1`, `tau^{l+1}_t` is a pointwise function of
`(q^l_t, tau^l_t)`: layer `l + 1` needs no memory of its own beyond its scan. The final label is
`p_t = s_k(q^k_t) ... s_1(q^1_t)`. For k = 1 this is Thm 1's construction for Abelian G.

**Scan weights.** `Q_l` is decomposed into cyclic factors `Z_{n_1} x ... x Z_{n_r}`
(`groups.cyclic_decomposition`); state coordinate `j` is the character `chi_j(q) = exp(2 pi i c_j(q) /
n_j)`: `lambda_j(tau) = chi_j(image(tau))`, `b = 0`, `h0 = 1`. AUSSM realises the angle with
`Delta = 1`; Simple AUSSM directly; Negative Mamba only angles 0 and pi (`Delta = +-BIG`), i.e. factors
Z2 (use `groups.elementary_abelian_series`).

**Decoders as lookup tables.** Layer `l` reads a one-hot *key* `kappa^l_t = (q^1_t, ..., q^{l-1}_t,
tau^l_t)` from its input (layer 1: the token's embedding). Its decoder has one ReLU unit per
(state `q`, key class) pair: pre-activation `(2 / delta) (score_q(h) - r) + 1 + B (sum of the class's
key indicators - 1)`, where `score_q(h) = sum_j Re(h_j conj(chi_j(q)))` equals `r` exactly at state `q`
and is at most `r - delta` elsewhere (`delta = min_j 1 - cos(2 pi / n_j)`), so the unit is 1 at its pair
and <= -1 elsewhere, with a margin `delta / 2` against float32 drift. Keys sharing all their outputs
form one class. The unit writes the one-hot of the next key `kappa^{l+1}_t` (for the last layer: `p_t`)
into the key block of the next layer's input; the readout maps that block to logits.

Model layout (`core.nn.ssm.StateTracker`): `u = [embedding block (|G|) | key block (|G|) | unused]`,
so `d_model >= 2 |G|`; `d_state >= r`; `d_hidden >=` the units of the widest layer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from core.data import groups as groups_lib
from core.nn import ssm

CONSTRUCTION_KINDS = ("aussm", "simple_aussm", "neg_mamba")
INDICATOR_WEIGHT = 2.0  # B: a unit whose key is absent is pushed to <= -1
NEG_MAMBA_GATE = 100.0  # softplus(+-100) makes 2 exp(-Delta) - 1 exactly -1 or +1 in float32


@dataclasses.dataclass(frozen=True)
class CascadeLayer:
  """What one layer of the cascade computes.

  Attributes:
    orders: orders `n_j` of the cyclic factors of this layer's quotient `Q`.
    state_exponents: `[|Q|, r]`, `c_j(q)`: the state after prefix `q` is `exp(2 pi i c_j(q) / n_j)`.
    key_angles: `[num_keys, r]`, angle of `lambda_j` for each input key.
    units: `(q, key_ids, next_key)` per decoder unit: fires on state `q` and any key in `key_ids`,
      and writes the one-hot of `next_key` (the next layer's key, or the label for the last layer).
    num_keys: width of this layer's key one-hot.
  """

  orders: tuple[int, ...]
  state_exponents: np.ndarray
  key_angles: np.ndarray
  units: tuple[tuple[int, tuple[int, ...], int], ...]
  num_keys: int

  @property
  def margin(self) -> float:
    """`delta`: the least gap in `score_q(h)` between the state `q` and any other state."""
    return min(1.0 - math.cos(2 * math.pi / n) for n in self.orders)


@dataclasses.dataclass(frozen=True)
class Cascade:
  """A k-layer exact construction for `group` along `series` (bottom-up, as in `groups`)."""

  group: groups_lib.FiniteGroup
  series: tuple[frozenset, ...]
  layers: tuple[CascadeLayer, ...]

  @property
  def num_layers(self) -> int:
    return len(self.layers)

  def required_sizes(self) -> dict[str, int]:
    """The smallest `d_model`, `d_state`, `d_hidden` of a `StateTracker` that holds the weights."""
    return {
      "d_model": 2 * self.group.order,
      "d_state": max(len(layer.orders) for layer in self.layers),
      "d_hidden": max(len(layer.units) for layer in self.layers),
    }


# ---------------------------------------------------------------------------------------------------
# The cascade, computed exactly on the Cayley table
# ---------------------------------------------------------------------------------------------------


def _quotients(group, series) -> list[groups_lib.Quotient]:
  """`Q_l = G_{k-l+1} / G_{k-l}` for l = 1..k (`depth` below)."""
  k = len(series) - 1
  return [
    groups_lib.quotient(group, series[k - depth + 1], series[k - depth], f"Q{depth}")
    for depth in range(1, k + 1)
  ]


def _states(group, quotients, p: int) -> list[int]:
  """`(q^1, ..., q^k)` of the prefix product `p`: peel off `s_l(q^l)` layer by layer."""
  states, n = [], p
  for quo in quotients:
    q = quo.coset_of[n]
    states.append(q)
    n = group.multiply(n, int(group.inverse[quo.representative[q]]))
  if n != 0:
    raise AssertionError("the series does not end at the trivial group")
  return states


def _step_records(group, quotients):
  """For every (previous prefix, token): per layer `(q_prev, q, key)`, and the new prefix product."""
  records = []
  for p_prev in range(group.order):
    before = _states(group, quotients, p_prev)
    for x in range(group.order):
      p = group.multiply(p_prev, x)
      after = _states(group, quotients, p)
      tau, per_layer = x, []
      for depth, quo in enumerate(quotients):
        key = (tuple(after[:depth]), tau)
        per_layer.append((before[depth], after[depth], key))
        s_prev, s_now = quo.representative[before[depth]], quo.representative[after[depth]]
        tau = group.multiply(s_prev, tau, int(group.inverse[s_now]))
      records.append((per_layer, p))
  return records


def build_cascade(
  group: groups_lib.FiniteGroup, series: Sequence[frozenset] | None = None
) -> Cascade:
  """The exact cascade of Thm 2 along `series` (default: the derived series, i.e. fewest layers).

  Raises:
    ValueError: `group` is not solvable (no series), or `series` is not a subnormal series with
      Abelian factors (the message names the position).
  """
  if series is None:
    if not groups_lib.is_solvable(group):
      raise ValueError(
        f"{group.name} is not solvable: no DCD SSM of any depth tracks it (Thm 2), no construction"
      )
    series = groups_lib.derived_series(group)
  series = tuple(frozenset(s) for s in series)
  groups_lib.check_series(group, series)
  quotients = _quotients(group, series)
  records = _step_records(group, quotients)
  k = len(quotients)
  key_ids: list[dict] = [dict() for _ in range(k)]
  for per_layer, _ in records:
    for depth, (_, _, key) in enumerate(per_layer):
      key_ids[depth].setdefault(key, len(key_ids[depth]))
  if k:
    key_ids[0] = {((), x): x for x in range(group.order)}  # layer 1 reads the token's embedding
  layers = [_layer(group, quotients[depth], records, key_ids, depth) for depth in range(k)]
  return Cascade(group, series, tuple(layers))


def _layer(group, quo, records, key_ids, depth) -> CascadeLayer:
  orders, exponents = groups_lib.cyclic_decomposition(quo.group)
  ids = key_ids[depth]
  angles = np.zeros((len(ids), len(orders)))
  outputs: dict[tuple[int, int], int] = {}
  for per_layer, p in records:
    q_prev, q, key = per_layer[depth]
    step = quo.group.multiply(int(quo.group.inverse[q_prev]), q)  # image of tau in Q
    angles[ids[key]] = 2 * np.pi * exponents[step] / np.asarray(orders)
    nxt = key_ids[depth + 1][per_layer[depth + 1][2]] if depth + 1 < len(key_ids) else p
    if outputs.setdefault((q, ids[key]), nxt) != nxt:
      raise AssertionError("the next key is not a function of (state, key)")
  # keys with the same output for every state share decoder units
  num_states = quo.group.order
  signature = {kid: tuple(outputs.get((q, kid)) for q in range(num_states)) for kid in ids.values()}
  classes: dict[tuple, list[int]] = {}
  for kid in sorted(signature):
    classes.setdefault(signature[kid], []).append(kid)
  units = []
  for sig, members in classes.items():
    units += [(q, tuple(members), nxt) for q, nxt in enumerate(sig) if nxt is not None]
  return CascadeLayer(
    tuple(orders), exponents.astype(np.int64), angles, tuple(units), num_keys=len(ids)
  )


def abelian_construction(group: groups_lib.FiniteGroup) -> Cascade:
  """Thm 1: one layer, one complex coordinate per cyclic factor of an Abelian group."""
  if not group.is_abelian():
    raise ValueError(f"{group.name} is not Abelian: a 1-layer DCD SSM cannot track it (Thm 1)")
  return build_cascade(group, (frozenset({0}), group.elements))


def s3_cascade() -> Cascade:
  """S3 with A3 = Z3 normal, S3 / A3 = Z2: layer 1 tracks parity, layer 2 the rotation (paper's example)."""
  group = groups_lib.by_name("S3")
  rotations = frozenset(g for g in group.elements if group.element_order(g) in (1, 3))
  return build_cascade(group, (frozenset({0}), rotations, group.elements))


def a4_cascade() -> Cascade:
  """A4 with V4 = Z2 x Z2 normal, A4 / V4 = Z3: layer 1 tracks Z3, layer 2 V4."""
  group = groups_lib.by_name("A4")
  klein = frozenset(g for g in group.elements if group.element_order(g) in (1, 2))
  return build_cascade(group, (frozenset({0}), klein, group.elements))


def construction_for(group_name: str, kind: str, num_layers: int) -> Cascade:
  """The construction a config asks for: Abelian -> Thm 1, S3/A4 -> the named cascades, other solvable
  groups -> the derived series; Negative Mamba -> the series with Z2 factors."""
  group = groups_lib.by_name(group_name)
  if kind == "neg_mamba":
    cascade = build_cascade(group, groups_lib.elementary_abelian_series(group, 2))
  elif group_name == "S3":
    cascade = s3_cascade()
  elif group_name == "A4":
    cascade = a4_cascade()
  else:
    cascade = build_cascade(group)
  if cascade.num_layers != num_layers:
    raise ValueError(
      f"the construction for {group_name} with {kind} has {cascade.num_layers} layers, "
      f"the model {num_layers}"
    )
  return cascade


# ---------------------------------------------------------------------------------------------------
# Writing the construction into StateTracker parameters
# ---------------------------------------------------------------------------------------------------


def _check_sizes(cascade: Cascade, model: ssm.StateTracker) -> None:
  if model.kind not in CONSTRUCTION_KINDS:
    raise ValueError(f"no construction for kind {model.kind!r}; kinds: {CONSTRUCTION_KINDS}")
  if model.num_layers != cascade.num_layers:
    raise ValueError(f"model has {model.num_layers} layers, construction {cascade.num_layers}")
  if model.vocab_size != cascade.group.order or model.num_classes != cascade.group.order:
    raise ValueError(
      f"model vocab/classes must equal |{cascade.group.name}| = {cascade.group.order}"
    )
  for field, need in cascade.required_sizes().items():
    if getattr(model, field) < need:
      raise ValueError(
        f"{field} = {getattr(model, field)} is too small for the construction, need {need}"
      )
  if model.kind == "neg_mamba":
    orders = {n for layer in cascade.layers for n in layer.orders}
    if orders != {2}:
      raise ValueError(
        f"Negative Mamba realises only Z2 factors (eigenvalues +-1), got orders {orders}"
      )


def _zeros(x) -> np.ndarray:
  return np.zeros(np.shape(x), np.float32)


def _recurrence_params(layer: CascadeLayer, params: dict, kind: str, key_rows: np.ndarray) -> dict:
  """`lambda(key) = exp(i angle(key))`, `b = 0`, `h0 = 1` on the used coordinates."""
  params = {name: _zeros(value) for name, value in _flat(params).items()}
  r = len(layer.orders)
  if kind in ("aussm", "simple_aussm"):
    params["angle/kernel"][key_rows, :r] = layer.key_angles
  if kind == "aussm":
    params["delta/bias"][:] = ssm.UNIT_DELTA_BIAS
  if kind == "neg_mamba":
    flips = np.isclose(layer.key_angles, np.pi)
    params["delta/kernel"][:] = 0.0
    params["delta/kernel"][key_rows, :r] = np.where(flips, NEG_MAMBA_GATE, -NEG_MAMBA_GATE)
    params["delta/kernel"][key_rows, r:] = -NEG_MAMBA_GATE  # unused coordinates keep lambda = 1
    params["log_neg_lambda"][:] = 0.0  # Lambda = -1
  params["h0"][0, :r] = 1.0
  return _nested(params)


def _decoder_params(
  layer: CascadeLayer, d_state: int, key_rows: np.ndarray, next_rows: np.ndarray, template
):
  """The lookup-table decoder (module docstring): one ReLU unit per (state, key class)."""
  hidden_kernel = _zeros(template["hidden"]["kernel"])
  hidden_bias = _zeros(template["hidden"]["bias"])
  out_kernel = _zeros(template["out"]["kernel"])
  r, scale = len(layer.orders), 2.0 / layer.margin
  for unit, (q, keys, nxt) in enumerate(layer.units):
    phase = 2 * np.pi * layer.state_exponents[q] / np.asarray(layer.orders)
    hidden_kernel[:r, unit] = scale * np.cos(phase)  # Re h
    hidden_kernel[d_state : d_state + r, unit] = scale * np.sin(phase)  # Im h
    hidden_kernel[2 * d_state + key_rows[list(keys)], unit] = INDICATOR_WEIGHT
    hidden_bias[unit] = 1.0 - scale * r - INDICATOR_WEIGHT
    out_kernel[unit, next_rows[nxt]] = 1.0
  return {
    "hidden": {"kernel": hidden_kernel, "bias": hidden_bias},
    "out": {"kernel": out_kernel, "bias": _zeros(template["out"]["bias"])},
  }


def construction_params(
  cascade: Cascade, model: ssm.StateTracker, template: dict, logit_scale: float = 20.0
) -> dict:
  """`StateTracker` parameters realising `cascade` exactly, as float32 NumPy arrays.

  `template` is an init of `model` (`{"params": ...}`, arrays or `jax.eval_shape` structs) and fixes
  the tree structure. Every weight not named by the construction is 0.
  """
  _check_sizes(cascade, model)
  order = cascade.group.order
  params = jax.tree.map(_zeros, template["params"])
  params["embed"]["embedding"][np.arange(order), np.arange(order)] = 1.0
  key_block = order + np.arange(order)
  for depth, layer in enumerate(cascade.layers):
    name = f"layer_{depth}"
    key_rows = np.arange(order) if depth == 0 else key_block[: layer.num_keys]
    recurrence = _recurrence_params(
      layer, template["params"][name]["recurrence"], model.kind, key_rows
    )
    decoder = _decoder_params(layer, model.d_state, key_rows, key_block, template["params"][name])
    params[name] = {"recurrence": recurrence, **decoder}
  params["readout"]["kernel"][key_block, np.arange(order)] = logit_scale
  return {"params": jax.tree.map(lambda x: np.asarray(x, np.float32), params)}


def perturb(params: dict, reference: dict, sigma: float, rng: jax.Array) -> dict:
  """`params + sigma * rms * N(0, 1)` per leaf (the study's E3), `rms` the leaf's root mean square, or, for an
  all-zero leaf of the construction, that of the same leaf of `reference` (a random init). Traceable."""
  leaves, treedef = jax.tree.flatten(params)
  ref_leaves = jax.tree.leaves(reference)
  keys = jax.random.split(rng, len(leaves))
  out = []
  for leaf, ref, key in zip(leaves, ref_leaves, keys, strict=True):
    rms = float(np.sqrt(np.mean(np.square(leaf))))
    scale = rms if rms > 0 else jnp.sqrt(jnp.mean(jnp.square(ref)))
    out.append(leaf + sigma * scale * jax.random.normal(key, np.shape(leaf), jnp.float32))
  return jax.tree.unflatten(treedef, out)


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for name, value in tree.items():
    path = f"{prefix}{name}"
    if isinstance(value, dict):
      out.update(_flat(value, path + "/"))
    else:
      out[path] = value
  return out


def _nested(flat: dict) -> dict:
  out: dict = {}
  for path, value in flat.items():
    node = out
    *parents, leaf = path.split("/")
    for parent in parents:
      node = node.setdefault(parent, {})
    node[leaf] = value
  return out
