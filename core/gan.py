"""Adversarial losses of Flow2GAN's GAN stage ("Flow2GAN", ICLR 2026, Sec. 3.3; official code
k2-fsa/Flow2GAN `flow2gan/models/gan.py`), over lists of per-sub-discriminator scores and feature maps
(`core/nn/audio_discriminators.py`).

- `hinge_discriminator_loss`: `sum_k mean(relu(1 - D_k(real))) + mean(relu(1 + D_k(fake)))`.
- `hinge_generator_loss`: `sum_k mean(relu(1 - D_k(fake)))`.
- `feature_matching_loss`: `sum over sub-discriminators and layers of mean |f(real) - f(fake)|`, the
  real features held fixed.
The mel reconstruction loss is `core.audio.multi_scale_mel_l1`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp


def hinge_discriminator_loss(
  real_scores: Sequence[jax.Array], fake_scores: Sequence[jax.Array]
) -> jax.Array:
  return sum(
    jnp.mean(jax.nn.relu(1.0 - r)) + jnp.mean(jax.nn.relu(1.0 + f))
    for r, f in zip(real_scores, fake_scores, strict=True)
  )


def hinge_generator_loss(fake_scores: Sequence[jax.Array]) -> jax.Array:
  return sum(jnp.mean(jax.nn.relu(1.0 - f)) for f in fake_scores)


def feature_matching_loss(
  real_fmaps: Sequence[Sequence[jax.Array]], fake_fmaps: Sequence[Sequence[jax.Array]]
) -> jax.Array:
  return sum(
    jnp.mean(jnp.abs(jax.lax.stop_gradient(r) - f))
    for real, fake in zip(real_fmaps, fake_fmaps, strict=True)
    for r, f in zip(real, fake, strict=True)
  )
