"""Graph neural network modules (flax linen) over `core.graph` edge lists: baselines and FGL parts.

Every module takes node features [n, d] and edge arrays and returns logits [n, C]; `deterministic`
turns dropout off. Edge lists are directed (both directions of each edge), see `core.graph`.
Equations are those of "Forest-Based Graph Learning for Semi-Supervised Node Classification"
(FGL, ICLR 2026).

* `MLP`, `GCN` (Kipf and Welling, A-hat propagation), `GAT` (Velickovic et al., multi-head):
  baselines; FGL's non-attention auxiliary model (NAAM, its pre-processing step) is an `MLP` or a
  `GCN`. `baseline` builds one of the three by name.
* `AttentionEstimator` (FGL's homophily estimator, Eq. 3): one head of local Q/K/V attention over
  the augmented graph; logits come from the attended neighbours only, so classifying a node forces
  the attention onto neighbours of its class. Returns the per-edge attention alongside.
* `LocalModule` (Eq. 9): K^L steps of the blend beta_a A_alpha + beta_g A-hat + beta_i I.
* `TreeFuser` (Eq. 7-8 and the tree fuser): per tree the W_A^dist aggregation of H through the
  kernel, RowNorm, mean over the N_T trees.
* `FGLStudent` (Eq. 10-11): H = ReLU(X W_B); RowNorm(local) + gamma * global; logits = W_H(.).
* `NodeClassifier`: any of these modules with its calling convention on the full graph (which edge
  arrays it reads, whether it also returns attention), the one interface a training phase needs.

Precision (`dtype`, `param_dtype`; float32 by default): with `dtype = bfloat16` the dense
projections run in bfloat16; everything that sums over the graph stays float32 (the propagation's
neighbour sums, attention logits and the segment softmax, the tree aggregation, RowNorm), and so do
the returned logits and attention.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core import graph


def _dense(module: nn.Module, features: int, **kwargs) -> nn.Dense:
  """A Dense layer at `module`'s compute and parameter dtypes."""
  return nn.Dense(features, dtype=module.dtype, param_dtype=module.param_dtype, **kwargs)


class MLP(nn.Module):
  """`num_layers` dense layers with ReLU and dropout."""

  hidden: int
  num_classes: int
  num_layers: int = 2
  dropout: float = 0.5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    for _ in range(self.num_layers - 1):
      x = nn.Dropout(self.dropout, deterministic=deterministic)(x)
      x = nn.relu(_dense(self, self.hidden)(x))
    x = nn.Dropout(self.dropout, deterministic=deterministic)(x)
    return _dense(self, self.num_classes)(x).astype(jnp.float32)


class GCN(nn.Module):
  """`num_layers` GCN layers H <- A-hat H W (self loops, symmetric normalisation)."""

  hidden: int
  num_classes: int
  num_layers: int = 2
  dropout: float = 0.5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, senders, receivers, deterministic: bool = True):
    n = x.shape[0]
    loop_senders, loop_receivers, weights = graph.gcn_norm_edges(senders, receivers, n)
    for layer in range(self.num_layers):
      width = self.num_classes if layer == self.num_layers - 1 else self.hidden
      x = nn.Dropout(self.dropout, deterministic=deterministic)(x)
      projected = _dense(self, width)(x).astype(jnp.float32)  # neighbour sums in float32
      x = graph.propagate(projected, loop_senders, loop_receivers, weights, n)
      if layer < self.num_layers - 1:
        x = nn.relu(x)
    return x


class GATLayer(nn.Module):
  """One multi-head graph attention layer (self loops included); heads concatenated or averaged."""

  features: int
  heads: int
  concat: bool = True
  dropout: float = 0.5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, senders, receivers, deterministic: bool = True):
    n = x.shape[0]
    loops = jnp.arange(n, dtype=senders.dtype)
    senders, receivers = jnp.concatenate([senders, loops]), jnp.concatenate([receivers, loops])
    z = _dense(self, self.heads * self.features, use_bias=False)(x)
    # attention logits, the segment softmax and the neighbour sum in float32
    z = z.astype(jnp.float32).reshape(n, self.heads, -1)
    shape, init = (self.heads, self.features), nn.initializers.glorot_uniform()
    source = self.param("attention_source", init, shape, self.param_dtype)
    target = self.param("attention_target", init, shape, self.param_dtype)
    logits = nn.leaky_relu(
      (z * source).sum(-1)[senders] + (z * target).sum(-1)[receivers], negative_slope=0.2
    )
    attention = graph.segment_softmax(logits, receivers, n)
    attention = nn.Dropout(self.dropout, deterministic=deterministic)(attention)
    out = jax.ops.segment_sum(attention[..., None] * z[senders], receivers, num_segments=n)
    out = out.reshape(n, -1) if self.concat else out.mean(axis=1)
    return out + self.param("bias", nn.initializers.zeros, (out.shape[-1],), self.param_dtype)


class GAT(nn.Module):
  """GAT: hidden layers of `heads` x (hidden // heads) concatenated heads with ELU, one-head output."""

  hidden: int
  num_classes: int
  num_layers: int = 2
  heads: int = 8
  dropout: float = 0.5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, senders, receivers, deterministic: bool = True):
    precision = {"dtype": self.dtype, "param_dtype": self.param_dtype}
    for _ in range(self.num_layers - 1):
      x = nn.Dropout(self.dropout, deterministic=deterministic)(x)
      layer = GATLayer(self.hidden // self.heads, self.heads, dropout=self.dropout, **precision)
      x = nn.elu(layer(x, senders, receivers, deterministic))
    x = nn.Dropout(self.dropout, deterministic=deterministic)(x)
    out = GATLayer(self.num_classes, 1, concat=False, dropout=self.dropout, **precision)
    return out(x, senders, receivers, deterministic)


class AttentionEstimator(nn.Module):
  """Local Q/K/V attention over the augmented graph (Eq. 3); returns (logits, attention [E]).

  attention[e] = softmax over the receiver's incoming edges of <q_receiver, k_sender> / sqrt(d),
  i.e. alpha_{receiver -> sender} in the paper's notation; logits = W_o sum_e attention[e] v_sender.
  """

  hidden: int
  num_classes: int
  dropout: float = 0.5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, senders, receivers, deterministic: bool = True):
    n = x.shape[0]
    x = nn.Dropout(self.dropout, deterministic=deterministic)(x)
    h = nn.relu(_dense(self, self.hidden)(x))
    # the projections in `dtype`; the logits' dot products, the softmax and the sum in float32
    q, k, v = (
      _dense(self, self.hidden, name=name)(h).astype(jnp.float32)
      for name in ("query", "key", "value")
    )
    logits = (q[receivers] * k[senders]).sum(-1) / np.sqrt(self.hidden)
    attention = graph.segment_softmax(logits, receivers, n)
    z = graph.propagate(v, senders, receivers, attention, n)
    z = nn.Dropout(self.dropout, deterministic=deterministic)(nn.relu(z))
    return _dense(self, self.num_classes)(z).astype(jnp.float32), attention


class LocalModule(nn.Module):
  """Eq. 9: `steps` applications of beta_a A_alpha + beta_g A-hat + beta_i I (betas: softmax)."""

  steps: int
  beta_init: tuple[float, float, float]  # (attention, normalised adjacency, identity)

  @nn.compact
  def __call__(self, h, senders, receivers, attention):
    n = h.shape[0]
    init = lambda *_: jnp.log(jnp.asarray(self.beta_init, jnp.float32))
    beta = jax.nn.softmax(self.param("beta_logits", init, (3,)))
    gcn_senders, gcn_receivers, gcn_weights = graph.gcn_norm_edges(senders, receivers, n)
    for _ in range(self.steps):
      h = (
        beta[0] * graph.propagate(h, senders, receivers, attention, n)
        + beta[1] * graph.propagate(h, gcn_senders, gcn_receivers, gcn_weights, n)
        + beta[2] * h
      )
    return h


class TreeFuser(nn.Module):
  """Global part: mean over trees of RowNorm(W_A^dist aggregation of H) (Eq. 7-8, the tree fuser).

  `w_a = "diagonal"`: W_A = diag(tanh theta), one decay per channel (W_A^dist is then a per-channel
  scalar power, applied inside the kernel's passes); `"symmetric"`: W_A = U diag(tanh theta) U^T
  with U orthogonal by the Cayley map. Both keep ||W_A||_2 < 1.
  """

  eigenvalue_init: float = 0.9
  w_a: str = "diagonal"
  implementation: str | None = None

  @nn.compact
  def __call__(self, h, parents, weight_up, weight_down):
    d = h.shape[1]
    theta = self.param(
      "w_a_theta", nn.initializers.constant(np.arctanh(self.eigenvalue_init)), (d,)
    )
    basis = None
    if self.w_a == "symmetric":
      basis = graph.orthogonal_from_skew(self.param("w_a_skew", nn.initializers.zeros, (d, d)))

    def one_tree(parent, up, down):
      out = graph.tree_aggregate_matrix(
        h, parent, up, down, jnp.tanh(theta), basis, implementation=self.implementation
      )
      return graph.row_norm(out)

    return jax.vmap(one_tree)(parents, weight_up, weight_down).mean(axis=0)


class FGLStudent(nn.Module):
  """FGL: H = ReLU(X W_B); logits = W_H(RowNorm(local(H)) + gamma * TreeFuser(H)) (Eq. 7-11)."""

  hidden: int
  num_classes: int
  local_steps: int = 2
  beta_init: tuple[float, float, float] = (0.4, 0.4, 0.2)
  fusion_init: float = 1.0
  eigenvalue_init: float = 0.9
  w_a: str = "diagonal"
  dropout: float = 0.5
  use_global: bool = True
  implementation: str | None = None
  dtype: Any = jnp.float32  # W_B and W_H; the local and tree aggregations stay float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, senders, receivers, attention, trees, deterministic: bool = True):
    x = nn.Dropout(self.dropout, deterministic=deterministic)(x)
    h = nn.relu(_dense(self, self.hidden, name="w_b")(x)).astype(jnp.float32)
    h = nn.Dropout(self.dropout, deterministic=deterministic)(h)
    fused = graph.row_norm(
      LocalModule(self.local_steps, self.beta_init)(h, senders, receivers, attention)
    )
    if self.use_global:
      fuser = TreeFuser(self.eigenvalue_init, self.w_a, self.implementation)
      gamma = self.param("gamma", nn.initializers.constant(self.fusion_init), ())
      fused = fused + gamma * fuser(h, trees["parent"], trees["weight_up"], trees["weight_down"])
    fused = nn.Dropout(self.dropout, deterministic=deterministic)(fused)
    return _dense(self, self.num_classes, name="w_h")(fused).astype(jnp.float32)


def baseline(
  kind: str,
  hidden: int,
  num_classes: int,
  num_layers: int,
  heads: int,
  dropout: float,
  dtype: Any = jnp.float32,
  param_dtype: Any = jnp.float32,
) -> nn.Module:
  """The local baseline `kind` ("mlp" | "gcn" | "gat"); `heads` is read by GAT only."""
  precision = {"dtype": dtype, "param_dtype": param_dtype}
  if kind == "mlp":
    return MLP(hidden, num_classes, num_layers, dropout, **precision)
  if kind == "gcn":
    return GCN(hidden, num_classes, num_layers, dropout, **precision)
  return GAT(hidden, num_classes, num_layers, heads, dropout, **precision)


@dataclasses.dataclass(frozen=True)
class NodeClassifier:
  """A module of this file and how to call it on the full graph.

  `fixed` holds a run's edge arrays (`senders`, `receivers`, and for the FGL student the per-edge
  `attention`); `batch` holds the student's trees (`parent`, `weight_up`, `weight_down`) or None.
  """

  kind: str  # "mlp" | "gcn" | "gat" | "estimator" | "fgl"
  module: nn.Module
  features: jax.Array

  def arguments(self, fixed, batch) -> tuple:
    if self.kind == "mlp":
      return (self.features,)
    if self.kind == "fgl":
      edges = (fixed["senders"], fixed["receivers"], fixed["attention"])
      return (self.features, *edges, batch)
    return (self.features, fixed["senders"], fixed["receivers"])

  def init(self, rng, fixed, batch):
    return self.module.init(rng, *self.arguments(fixed, batch), deterministic=True)

  def logits(self, params, fixed, batch, deterministic: bool, rng=None):
    rngs = None if deterministic else {"dropout": rng}
    out = self.module.apply(
      params, *self.arguments(fixed, batch), deterministic=deterministic, rngs=rngs
    )
    return out[0] if self.kind == "estimator" else out

  def attention(self, params, fixed):
    """The estimator's per-edge attention (deterministic)."""
    return self.module.apply(params, *self.arguments(fixed, None), deterministic=True)[1]
