"""L-inf gradient attacks on inputs in a box: FGSM, BIM and PGD.

The three attacks of robustness tables such as the one of "A Brain-Inspired Gating Mechanism Unlocks
Robust Computation in Spiking Neural Networks" (Bai, Wang, Yu; ICLR 2026):

  FGSM (Goodfellow et al. 2015)  one step `x + eps sign(grad)`.
  BIM  (Kurakin et al. 2017)     `steps` steps of `step_size sign(grad)` from `x`, each projected onto
                                 the eps-ball around `x` and the box.
  PGD  (Madry et al. 2018)       BIM from a uniform random start in the eps-ball.

`loss_fn(x_adv) -> scalar` is maximised; inputs are clipped to `[lo, hi]` (spike trains relaxed to
[0, 1]: the gradient flows through the network's surrogate spike derivative). Every attack is pure and
jittable; `attack` dispatches on the name.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

ATTACKS = ("fgsm", "bim", "pgd")


def _project(x_adv, x, eps, lo: float, hi: float):
  return jnp.clip(jnp.clip(x_adv, x - eps, x + eps), lo, hi)


def _ascend(loss_fn: Callable, x, start, eps, steps: int, step_size, lo: float, hi: float):
  """`steps` signed-gradient ascent steps from `start`, projected after each."""

  def body(_, x_adv):
    return _project(x_adv + step_size * jnp.sign(jax.grad(loss_fn)(x_adv)), x, eps, lo, hi)

  return jax.lax.fori_loop(0, steps, body, start)


def fgsm(loss_fn: Callable, x, eps, lo: float = 0.0, hi: float = 1.0):
  """One signed-gradient step of size eps."""
  return _ascend(loss_fn, x, x, eps, 1, eps, lo, hi)


def bim(loss_fn: Callable, x, eps, steps: int, step_size, lo: float = 0.0, hi: float = 1.0):
  """Basic iterative method: projected signed-gradient steps from the clean input."""
  return _ascend(loss_fn, x, x, eps, steps, step_size, lo, hi)


def pgd(loss_fn: Callable, x, eps, steps: int, step_size, key, lo: float = 0.0, hi: float = 1.0):
  """Projected gradient descent (ascent on the loss) from a uniform random start in the eps-ball."""
  start = _project(x + jax.random.uniform(key, x.shape, x.dtype, -eps, eps), x, eps, lo, hi)
  return _ascend(loss_fn, x, start, eps, steps, step_size, lo, hi)


def attack(
  name: str,
  loss_fn: Callable,
  x,
  eps,
  steps: int,
  step_size,
  key,
  lo: float = 0.0,
  hi: float = 1.0,
):
  """The adversarial input of attack `name` (one of `ATTACKS`; FGSM ignores steps and step_size)."""
  if name == "fgsm":
    return fgsm(loss_fn, x, eps, lo, hi)
  if name == "bim":
    return bim(loss_fn, x, eps, steps, step_size, lo, hi)
  if name == "pgd":
    return pgd(loss_fn, x, eps, steps, step_size, key, lo, hi)
  raise ValueError(f"attack must be one of {ATTACKS}, got {name!r}")
