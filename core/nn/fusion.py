"""Modality encoders and fusion heads of "Supporting Multimodal Intermediate Fusion with Informatic
Constraint and Distribution Coherence" (ICLR 2026), Sec. 3.1.

`FusionClassifier` holds one encoder h_m per modality (all with the same latent width d) and a linear
target mapping:
  intermediate  g(sum_m w_m z^m): ONE head shared by the fused and the unimodal latents (the informatic
                constraint scores q(y | z^m) with the same head);
  late          sum_m w_m g_m(z^m): one head per modality;
  concat        g([z^1; ...; z^M]): the concatenation foil (no unimodal predictions of its own).
Weights (`core.fusion.fusion_weights`) are static (`static_weights`, IID-L), QMF-style energy
weights (`weighting = "energy"`, IID-Q) or PDF weights (`weighting = "pdf"`, IID-P): then each
modality has a `ConfidenceNet` that predicts its true-class probability from its latent (held
fixed, so the confidence networks do not shape the encoders), and `__call__(..., train=True)` uses
PDF's training weights (no relative calibration), `train=False` the calibrated evaluation weights.
With linear heads and sum_m w_m = 1, IF equals LF with tied heads (theta_m = theta).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from core import fusion as fusion_lib

FUSIONS = ("intermediate", "late", "concat")
WEIGHTINGS = fusion_lib.WEIGHTINGS
ENCODERS = ("mlp", "conv")


class MLPEncoder(nn.Module):
  """x (B, D) -> z (B, latent_dim): GELU layers of widths `hidden`, then a linear map."""

  hidden: tuple[int, ...] = (64,)
  latent_dim: int = 32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape(x.shape[0], -1)
    for width in self.hidden:
      x = nn.gelu(nn.Dense(width)(x))
    return nn.Dense(self.latent_dim)(x)


class ConvEncoder(nn.Module):
  """x (B, H, W, C) -> z (B, latent_dim): 3x3 conv + GELU + 2x2 average pool per width in `hidden`,
  global average pool, a linear map (for image-like modalities such as SAR or multispectral patches)."""

  hidden: tuple[int, ...] = (32, 64)
  latent_dim: int = 128

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for width in self.hidden:
      x = nn.gelu(nn.Conv(width, (3, 3))(x))
      x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    return nn.Dense(self.latent_dim)(jnp.mean(x, axis=(1, 2)))


def make_encoder(kind: str, hidden: Sequence[int], latent_dim: int) -> nn.Module:
  if kind not in ENCODERS:
    raise ValueError(f"encoder kind must be one of {ENCODERS}, got {kind!r}")
  cls = MLPEncoder if kind == "mlp" else ConvEncoder
  return cls(hidden=tuple(hidden), latent_dim=latent_dim)


class ConfidenceNet(nn.Module):
  """z (B, d) -> predicted true-class probability (B,): the official PDF code's ConfidNet, linear
  maps d -> 2d -> d -> 1 (no activations between them) and a sigmoid."""

  @nn.compact
  def __call__(self, z: jax.Array) -> jax.Array:
    dim = z.shape[-1]
    for width in (2 * dim, dim, 1):
      z = nn.Dense(width)(z)
    return jax.nn.sigmoid(z[..., 0])


class FusionOutput(NamedTuple):
  """What a forward pass gives the losses (arrays; `fused` is zeros for late and concat fusion)."""

  latents: jax.Array  # (M, B, d) z^m
  fused: jax.Array  # (B, d) sum_m w_m z^m
  logits: jax.Array  # (B, C) the fused prediction
  unimodal_logits: jax.Array  # (M, B, C) g(z^m) (IF: shared head; LF: g_m; concat: zeros)
  weights: jax.Array  # (M, B) fusion weights
  confidence: jax.Array  # (M, B) predicted true-class probabilities (pdf weighting; else zeros)


class FusionClassifier(nn.Module):
  """Encoders h_m and the fusion head; `__call__(inputs)` with `inputs` a tuple of M arrays."""

  fusion: str
  num_classes: int
  encoder_kind: str = "mlp"
  encoder_hidden: tuple[int, ...] = (64,)
  latent_dim: int = 32
  num_modalities: int = 2
  weighting: str = "static"
  static_weights: tuple[float, ...] = (0.5, 0.5)

  def setup(self):
    if self.fusion not in FUSIONS:
      raise ValueError(f"fusion must be one of {FUSIONS}, got {self.fusion!r}")
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
    self.encoders = [
      make_encoder(self.encoder_kind, self.encoder_hidden, self.latent_dim)
      for _ in range(self.num_modalities)
    ]
    num_heads = self.num_modalities if self.fusion == "late" else 1
    self.heads = [nn.Dense(self.num_classes) for _ in range(num_heads)]
    if self.weighting == "pdf":
      self.confidence_nets = [ConfidenceNet() for _ in range(self.num_modalities)]

  def encode(self, inputs: Sequence[jax.Array]) -> jax.Array:
    if len(inputs) != self.num_modalities:
      raise ValueError(f"expected {self.num_modalities} modalities, got {len(inputs)}")
    return jnp.stack([encoder(x) for encoder, x in zip(self.encoders, inputs, strict=True)])

  def _confidence(self, latents: jax.Array) -> jax.Array:
    """(M, B) predicted true-class probabilities from the latents, held fixed."""
    if self.weighting != "pdf":
      return jnp.zeros(latents.shape[:2], latents.dtype)
    fixed = jax.lax.stop_gradient(latents)
    return jnp.stack([net(z) for net, z in zip(self.confidence_nets, fixed, strict=True)])

  def _weights(self, unimodal_logits, confidence, train: bool) -> jax.Array:
    return fusion_lib.fusion_weights(
      self.weighting, unimodal_logits, self.static_weights, confidence, calibrate=not train
    )

  def __call__(self, inputs: Sequence[jax.Array], train: bool = False) -> FusionOutput:
    latents = self.encode(inputs)
    batch = latents.shape[1]
    confidence = self._confidence(latents)
    if self.fusion == "concat":
      logits = self.heads[0](jnp.concatenate(list(latents), axis=-1))
      zeros = jnp.zeros((self.num_modalities, batch, self.num_classes), logits.dtype)
      weights = jnp.full((self.num_modalities, batch), 1.0 / self.num_modalities)
      return FusionOutput(latents, jnp.zeros_like(latents[0]), logits, zeros, weights, confidence)
    if self.fusion == "late":
      unimodal = jnp.stack([head(z) for head, z in zip(self.heads, latents, strict=True)])
      weights = self._weights(unimodal, confidence, train)
      logits = fusion_lib.late_fusion(unimodal, weights)
      return FusionOutput(
        latents, jnp.zeros_like(latents[0]), logits, unimodal, weights, confidence
      )
    unimodal = self.heads[0](latents)
    weights = self._weights(unimodal, confidence, train)
    fused = fusion_lib.intermediate_fusion(latents, weights)
    return FusionOutput(latents, fused, self.heads[0](fused), unimodal, weights, confidence)
