r"""Causal delta embeddings: "Learning Robust Intervention Representations with Delta Embeddings"
(Alimisis & Diou, ICLR 2026, arXiv 2508.04492, OpenReview 5d7prMWHNF).

An action `a` turns an image `x` into `x~`. The paper represents the intervention by the delta of a
shared encoder-plus-projector `p` (Sec. 3):

    delta_a = p(x~) - p(x)                                                   (delta embedding)

which, under a perfect counterfactual, is non-zero only on the intervened causal variables. Its three
properties are independence (subtraction cancels the scene: structural, no loss), sparsity (sparse
mechanism shift) and invariance (`Var_x[delta_a(x)] ~ 0`). The delta is the *only* input of the
action classifier, and training minimises (Sec. 3.3)

    L = L_CE + alpha_c * L_SupCon(delta) + alpha_s * L_sparse(delta),   alpha_c = 2, alpha_s = 1,
    L_sparse = (1/B) sum_i ||delta_i||_1,
    L_SupCon = mean_{i: P(i) != {}} -1/|P(i)| sum_{p in P(i)}
               log[ exp(sim(delta_i, delta_p)/tau) / sum_{j != i} exp(sim(delta_i, delta_j)/tau) ]

with `P(i)` the other batch items of the same action (Khosla et al. 2020, supervised contrastive).

Models (`DeltaPairModel.kind`):
  cde_global  Model A: the global feature (the ViT's CLS token, as the paper's DINO; the mean of the
              CNN's patch grid) -> projector MLP -> delta -> classifier (an MLP, or linear).
  cde_patch   Model B (multi-object scenes): the projector on every patch, per-patch deltas, the
              Top-K patches by ||delta_patch||_2; the classifier sees their mean (`aggregate`) or
              each of them (`per_patch`: CE, SupCon and L1 on every selected patch, and the pair's
              logits are the mean of the patches' logits).
  vanilla     the ResPair baseline of Causal Triplet (`model/respair.py`, "subcon") on the same
              global feature `h`: `p = ReLU(W h)`, `z = MLP([p1, p2 - p1])`, linear classifier
              on `z`. ICM adds an adversary that predicts the object from `z` (see
              `methods/causal_delta/__init__.py`); SMS adds the block-invariance loss below on
              `(p1, p2)`.

SMS baseline (sparse mechanism shift; Causal Triplet `sparsity/block.py` and `main.py`): the
projection `p` is cut into one block of latent variables per action, an antonym pair sharing a block
(`action_blocks`); `l // K` coordinates per block, the last block also taking the `l mod K` left over
(`block_mask`). An action may change only its own block, so the other blocks must not move:

    L_SMS = mean_{i, j} ((p1_ij - p2_ij) * (1 - m[block(a_i)]_j))^2      (mean over the B x l entries)

added to the CE with a weight (Causal Triplet's `--sparse`, swept over 0.001-1). It needs the
block of each action, which the paper's CDE does without.

Also here: the masked-reconstruction warm-up that stands in for a pretrained backbone, and the
probes of the paper's analysis (sparsity, invariance, antonym cosines).

Choices where the paper is open: cosine similarity in SupCon with tau = 0.1; anchors without a
positive are skipped and the loss is averaged over the remaining anchors (the sum over i in the
formula, normalised); the projector is Dense(128) -> GELU -> Dense(64); the classifier on the delta
is Dense(128) -> GELU -> Dense(A) by default (`classifier_hidden = 0`: linear; a linear map of a
difference cannot detect an action without a direction, such as a hue change, whose deltas average
to zero).

Sparsity (`SPARSITY_KINDS`, `sparsity_penalty`): the L1 as written, `(1/B) sum_i ||delta_i||_1` with
alpha_s = 1 (`l1_sum`), collapses a from-scratch encoder's accuracy, and the per-coordinate mean
(`l1_mean`, alpha_s / l) is l times weaker; beside SupCon neither makes the delta sparse *relative
to its own scale* (the probe `sparsity_fraction`), because shrinking every coordinate lowers either
(without SupCon `l1_mean` does concentrate it somewhat; docs/results.md). The other
choices: `l1_schedule` (the summed L1, switched on only once the CE has shaped the delta and ramped to
full weight at the end of training, `methods/causal_delta/phases.py`), `l1_normalised` (the L1 of the
unit-norm delta, `||delta||_1 / (sqrt(l) ||delta||_2)` in `[1/sqrt(l), 1]`, which only concentrating
the delta on few coordinates lowers) and `topk` (a top-k projector: the delta keeps its k largest
coordinates in magnitude, `top_k_coordinates`, plus the per-coordinate L1 on what is kept).
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

KINDS = ("cde_global", "cde_patch", "vanilla")
SPARSITY_KINDS = ("l1_mean", "l1_sum", "l1_schedule", "l1_normalised", "topk")
PATCH_LOSSES = ("aggregate", "per_patch")
_EPS = 1e-8


# ---------------------------------------------------------------------------------------------------
# Delta embeddings and the models
# ---------------------------------------------------------------------------------------------------


def delta_embedding(before: jax.Array, after: jax.Array) -> jax.Array:
  """`delta = p(x~) - p(x)` (Sec. 3): zero exactly when the two projections are equal."""
  return after - before


def top_k_coordinates(delta: jax.Array, k: int) -> jax.Array:
  """The top-k projector: `delta` `[..., l]` with all but its `k` largest coordinates in magnitude set
  to 0 (`k >= l` keeps everything). Odd in `delta`, so swapping a pair still negates the result."""
  if k >= delta.shape[-1]:
    return delta
  threshold = jax.lax.top_k(jnp.abs(delta), k)[0][..., -1:]
  return jnp.where(jnp.abs(delta) >= threshold, delta, 0.0)


def encoder_features(features) -> tuple[jax.Array, jax.Array | None]:
  """`(patch grid [B, h, w, C], global feature [B, C] or None)` of an encoder's output: a plain array
  is a grid whose cell mean serves as the global feature (the CNN); a ViT's `ViTFeatures` carry the
  CLS token, the global feature of the paper's Model A."""
  if hasattr(features, "cls"):
    return features.grid, features.cls
  return features, None


def top_k_patches(patch_deltas: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The `k` patches of largest `||delta_patch||_2` (Model B): `([B, k, l] deltas, [B, k] indices)`."""
  _, index = jax.lax.top_k(jnp.sum(patch_deltas**2, axis=-1), k)
  return jnp.take_along_axis(patch_deltas, index[..., None], axis=1), index


class Projector(nn.Module):
  """The shared "causal projector": Dense(hidden) -> GELU -> Dense(features), on the last axis."""

  hidden: int
  features: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    return nn.Dense(self.features)(nn.gelu(nn.Dense(self.hidden)(x)))


class PairOutput(NamedTuple):
  """What a pair model returns for `[B]` pairs.

  logits `[B, A]`; embedding `[B, l]`: the classifier's input (CDE: delta, or the mean of the Top-K
  patch deltas; vanilla: `z`); patch_embedding `[B, K, l]`, patch_logits `[B, K, A]` and patch_index
  `[B, K]` for `cde_patch` (else None); before / after `[B, l]`: the projections of the two images
  (the mean over patches for `cde_patch`).
  """

  logits: jax.Array
  embedding: jax.Array
  before: jax.Array
  after: jax.Array
  patch_embedding: jax.Array | None = None
  patch_logits: jax.Array | None = None
  patch_index: jax.Array | None = None


class DeltaPairModel(nn.Module):
  """Encoder (shared by both images) + the kind's head; see the module docstring."""

  encoder: nn.Module
  kind: str
  num_actions: int
  embed_dim: int = 64
  hidden: int = 128
  top_k: int = 4
  classifier_hidden: int = 128
  per_patch: bool = False
  delta_top_k: int = 0  # > 0: the top-k projector on the delta(s) the classifier sees

  @nn.compact
  def __call__(self, before: jax.Array, after: jax.Array) -> PairOutput:
    if self.kind not in KINDS:
      raise ValueError(f"DeltaPairModel: kind must be one of {KINDS}, got {self.kind!r}")
    grid, global_feature = encoder_features(self.encoder(jnp.concatenate([before, after])))
    cells = grid.reshape(grid.shape[0], -1, grid.shape[-1])  # [2B, P, C]
    pooled = cells.mean(axis=1) if global_feature is None else global_feature
    if self.kind == "vanilla":
      return self._respair(pooled)
    if self.classifier_hidden:
      classifier = Projector(self.classifier_hidden, self.num_actions, name="classifier")
    else:
      classifier = nn.Dense(self.num_actions, name="classifier")
    if self.kind == "cde_patch":
      projected = Projector(self.hidden, self.embed_dim, name="projector")(cells)
      p1, p2 = jnp.split(projected, 2)
      selected, index = top_k_patches(delta_embedding(p1, p2), self.top_k)
      if self.per_patch:  # the projector on what each classifier call sees
        selected = self._sparse(selected)
        embedding = selected.mean(axis=1)
      else:
        embedding = self._sparse(selected.mean(axis=1))
      patch_logits = classifier(selected)
      return PairOutput(
        patch_logits.mean(axis=1) if self.per_patch else classifier(embedding),
        embedding,
        p1.mean(1),
        p2.mean(1),
        patch_embedding=selected,
        patch_logits=patch_logits,
        patch_index=index,
      )
    p1, p2 = jnp.split(Projector(self.hidden, self.embed_dim, name="projector")(pooled), 2)
    embedding = self._sparse(delta_embedding(p1, p2))
    return PairOutput(classifier(embedding), embedding, p1, p2)

  def _sparse(self, delta: jax.Array) -> jax.Array:
    return top_k_coordinates(delta, self.delta_top_k) if self.delta_top_k > 0 else delta

  def _respair(self, pooled: jax.Array) -> PairOutput:
    """ResPair ("subcon"): `p = ReLU(W h)`, `z = MLP([p1, p2 - p1])`, a linear classifier on z."""
    p1, p2 = jnp.split(nn.relu(nn.Dense(self.embed_dim, name="projector")(pooled)), 2)
    z = jnp.concatenate([p1, p2 - p1], axis=-1)
    for layer in range(2):
      z = nn.relu(nn.Dense(self.embed_dim, name=f"pairwise_{layer}")(z))
    return PairOutput(nn.Dense(self.num_actions, name="classifier")(z), z, p1, p2)


class Adversary(nn.Module):
  """ICM baseline's critic (Causal Triplet `model/adversary.py`): Dense(l) -> ReLU -> Dense(classes)."""

  hidden: int
  num_classes: int

  @nn.compact
  def __call__(self, z: jax.Array) -> jax.Array:
    return nn.Dense(self.num_classes)(nn.relu(nn.Dense(self.hidden)(z)))


# ---------------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------------


def _unit(x: jax.Array) -> jax.Array:
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), _EPS**2))


def supcon_loss(embeddings: jax.Array, labels: jax.Array, temperature: float = 0.1) -> jax.Array:
  """Supervised contrastive loss (module docstring) on `[N, l]` embeddings with cosine similarity;
  anchors with no positive are skipped; 0 when no anchor has one."""
  z = _unit(embeddings)
  n = z.shape[0]
  others = ~jnp.eye(n, dtype=bool)
  logits = jnp.where(others, z @ z.T / temperature, -jnp.inf)
  log_prob = logits - jax.nn.logsumexp(logits, axis=1, keepdims=True)
  positives = (labels[:, None] == labels[None, :]) & others
  count = positives.sum(axis=1)
  per_anchor = -jnp.sum(jnp.where(positives, log_prob, 0.0), axis=1) / jnp.maximum(count, 1)
  has_positive = count > 0
  return jnp.sum(jnp.where(has_positive, per_anchor, 0.0)) / jnp.maximum(has_positive.sum(), 1)


def sparsity_penalty(deltas: jax.Array, kind: str = "l1_sum") -> jax.Array:
  """`L_sparse` of one of `SPARSITY_KINDS` over the leading axis: `(1/B) sum_i ||delta_i||_1` as written
  (`l1_sum`, `l1_schedule`); the same over `l` (`l1_mean`, `topk`); `(1/B) sum_i ||delta_i||_1 /
  (sqrt(l) ||delta_i||_2)` (`l1_normalised`, 0 for a zero delta)."""
  if kind not in SPARSITY_KINDS:
    raise ValueError(f"sparsity kind must be one of {SPARSITY_KINDS}, got {kind!r}")
  l1 = jnp.sum(jnp.abs(deltas), axis=-1)
  if kind in ("l1_mean", "topk"):
    return jnp.mean(l1 / deltas.shape[-1])
  if kind == "l1_normalised":
    norm = jnp.sqrt(jnp.sum(deltas * deltas, axis=-1) + _EPS**2)
    return jnp.mean(l1 / (np.sqrt(deltas.shape[-1]) * norm))
  return jnp.mean(l1)


def action_blocks(num_actions: int, antonym: dict[int, int]) -> np.ndarray:
  """`[A]` latent block of each action: antonyms share one, every other action has its own, numbered
  in order of first appearance (Causal Triplet `main.py`, `verb_block`)."""
  block = np.full(num_actions, -1, np.int32)
  count = 0
  for action in range(num_actions):
    if action in antonym and antonym[action] < action:
      block[action] = block[antonym[action]]
    else:
      block[action] = count
      count += 1
  return block


def block_mask(num_blocks: int, dim: int) -> np.ndarray:
  """`[K, l]` 0/1 membership of the `l` coordinates in the `K` blocks: `l // K` consecutive
  coordinates each, the last block also owning the `l mod K` trailing ones (`sparsity/block.py`)."""
  if not 0 < num_blocks <= dim:
    raise ValueError(f"block_mask: need 0 < num_blocks <= dim, got {num_blocks} blocks of {dim}")
  owner = np.minimum(np.arange(dim) // (dim // num_blocks), num_blocks - 1)
  return (owner[None, :] == np.arange(num_blocks)[:, None]).astype(np.float32)


def block_invariance_loss(
  before: jax.Array, after: jax.Array, blocks: jax.Array, num_blocks: int
) -> jax.Array:
  """The SMS loss (module docstring): the MSE between the projections `[B, l]` of the two images on
  the coordinates outside each pair's intervened block `blocks` `[B]`, averaged over all B x l."""
  invariant = 1.0 - jnp.asarray(block_mask(num_blocks, before.shape[-1]))[blocks]
  return jnp.mean(((before - after) * invariant) ** 2)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


class LossWeights(NamedTuple):
  """`L = ce * L_CE + supcon * L_SupCon + sparsity * L_sparse` (paper: 1, 2, 1; tau 0.1);
  `sparsity_kind` as in `sparsity_penalty`."""

  ce: float = 1.0
  supcon: float = 2.0
  sparsity: float = 1.0
  temperature: float = 0.1
  sparsity_kind: str = "l1_sum"


def is_zero_weight(weight) -> bool:
  """A weight known to be zero at trace time (its term is then not computed)."""
  return isinstance(weight, int | float) and weight == 0


def cde_loss(
  output: PairOutput, labels: jax.Array, weights: LossWeights, per_patch: bool = False
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The paper's objective on the classifier's input (or, `per_patch`, on every selected patch
  delta, each labelled with its pair's action). Returns the total and its parts."""
  if per_patch:
    deltas = output.patch_embedding.reshape(-1, output.patch_embedding.shape[-1])
    logits = output.patch_logits.reshape(-1, output.patch_logits.shape[-1])
    labels = jnp.repeat(labels, output.patch_embedding.shape[1])
  else:
    deltas, logits = output.embedding, output.logits
  parts = {
    "ce": cross_entropy(logits, labels),
    "supcon": jnp.zeros(())
    if is_zero_weight(weights.supcon)
    else supcon_loss(deltas, labels, weights.temperature),
    "sparsity": jnp.zeros(())
    if is_zero_weight(weights.sparsity)
    else sparsity_penalty(deltas, weights.sparsity_kind),
  }
  total = (
    weights.ce * parts["ce"]
    + weights.supcon * parts["supcon"]
    + weights.sparsity * parts["sparsity"]
  )
  return total, parts


# ---------------------------------------------------------------------------------------------------
# Self-supervised warm-up: masked reconstruction of single images
# ---------------------------------------------------------------------------------------------------


class MaskedReconstruction(nn.Module):
  """The encoder sees the image with masked grid cells set to grey; a linear decoder predicts each
  cell's pixels from its feature (a stand-in for the paper's pretrained DINO backbone)."""

  encoder: nn.Module

  @nn.compact
  def __call__(self, images: jax.Array, cell_mask: jax.Array) -> jax.Array:
    batch, height, width, channels = images.shape
    grid_h, grid_w = cell_mask.shape[1:]
    ph, pw = height // grid_h, width // grid_w
    pixel_mask = jnp.repeat(jnp.repeat(cell_mask, ph, axis=1), pw, axis=2)[..., None]
    features, _ = encoder_features(self.encoder(jnp.where(pixel_mask, 0.5, images)))
    cells = nn.Dense(ph * pw * channels, name="decoder")(features)
    cells = cells.reshape(batch, grid_h, grid_w, ph, pw, channels).transpose(0, 1, 3, 2, 4, 5)
    return cells.reshape(batch, height, width, channels)


def masked_reconstruction_loss(
  reconstruction: jax.Array, images: jax.Array, cell_mask: jax.Array
) -> jax.Array:
  """Mean squared error over the masked cells' pixels."""
  grid_h, grid_w = cell_mask.shape[1:]
  ph, pw = images.shape[1] // grid_h, images.shape[2] // grid_w
  pixel_mask = jnp.repeat(jnp.repeat(cell_mask, ph, axis=1), pw, axis=2)[..., None]
  error = jnp.where(pixel_mask, (reconstruction - images) ** 2, 0.0)
  return jnp.sum(error) / jnp.maximum(jnp.sum(pixel_mask) * images.shape[-1], 1)


# ---------------------------------------------------------------------------------------------------
# Probes of the representation (numpy, on evaluation sets)
# ---------------------------------------------------------------------------------------------------


def sparsity_fraction(embeddings: np.ndarray, relative: float = 1e-2) -> float:
  """Mean fraction of coordinates with `|e_j| <= relative * max_j |e_j|` (per vector)."""
  magnitude = np.abs(embeddings)
  return float(np.mean(magnitude <= relative * magnitude.max(axis=-1, keepdims=True)))


def _normalised(embeddings: np.ndarray) -> np.ndarray:
  norm = np.linalg.norm(embeddings, axis=-1, keepdims=True)
  return embeddings / np.maximum(norm, _EPS)


def invariance_ratio(embeddings: np.ndarray, actions: np.ndarray) -> float:
  """Within-action variance of the normalised embeddings / their total variance (0: each action has
  one direction whatever the object and scene; 1: the action explains nothing)."""
  unit = _normalised(embeddings)
  total = np.sum(np.var(unit, axis=0))
  within = sum(
    np.mean(actions == a) * np.sum(np.var(unit[actions == a], axis=0)) for a in np.unique(actions)
  )
  return float(within / max(total, _EPS))


def object_dependence_ratio(
  embeddings: np.ndarray, actions: np.ndarray, objects: np.ndarray
) -> float:
  """Variance across object classes of the per-(action, object) mean of the normalised embeddings,
  averaged over actions, / the total variance: how much an action's representation depends on the
  object it acts on (`Var_x[delta_a(x)]` of the paper, the part explained by the object)."""
  unit = _normalised(embeddings)
  total = np.sum(np.var(unit, axis=0))
  spreads = []
  for a in np.unique(actions):
    rows = actions == a
    means = np.stack([unit[rows & (objects == o)].mean(0) for o in np.unique(objects[rows])])
    spreads.append(np.sum(np.var(means, axis=0)))
  return float(np.mean(spreads) / max(total, _EPS))


def action_means(embeddings: np.ndarray, actions: np.ndarray, num_actions: int) -> np.ndarray:
  """`[A, l]` mean embedding per action (zeros for an absent action)."""
  means = np.zeros((num_actions, embeddings.shape[-1]))
  for a in range(num_actions):
    if np.any(actions == a):
      means[a] = embeddings[actions == a].mean(0)
  return means


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
  unit = _normalised(vectors)
  return unit @ unit.T


def pca_2d(embeddings: np.ndarray) -> np.ndarray:
  """The first two principal components' scores (`[N, 2]`)."""
  centred = embeddings - embeddings.mean(0)
  _, _, vt = np.linalg.svd(centred, full_matrices=False)
  return centred @ vt[:2].T
