r"""Late-stage SGD as diffusion on porous media, measured with singular learning theory (SLT).

Paper: "Almost Bayesian: Dynamics of SGD Through Singular Learning Theory" (Hennick & De Baerdemacker,
ICLR 2026). Its claim: long-run SGD obeys a fractional Fokker-Planck equation on the porous low-loss
set, whose steady state is `p_s(w) ∝ exp(-gamma L_m(w) / D_xi)` (Sec. 3), i.e. a *tempered* Bayesian
posterior restricted to the region SGD can reach ("accessibility"); the walk is sub-diffusive,
`R(t) ∝ t^(1/d_walk)` with `d_walk = 2 lambda / d_s` (Def. 3.3) and `d_s <= lambda` (Lemma 3.4), where
`lambda` is the local learning coefficient (LLC) and `d_s` the spectral dimension. This module holds
the maths every experiment of the paper's kind needs:

1. Singular toys with known learning coefficients (standard SLT normal crossings, Watanabe 2009):
   `f_w(x) = g(w) . x` on `y = x c + eps`, squared loss, so `n L_n` is the negative log-likelihood up
   to a constant and every minibatch loss is a function of the minibatch's sufficient statistics
   (`statistics_table`): R `g = w` (regular, lambda = 1), A `g = w1 w2` with c = 1 (lambda = 1/2 on the
   hyperbola), A0 the same with c = 0 (lambda = 1/2, multiplicity 2, at the cross's centre), B
   `g = w1 w2^2` with c = 0 (lambda = 1/4 on {w2 = 0}, 1/2 on {w1 = 0}).
2. Exact grid posteriors `p_T(w) ∝ rho(w) exp(-n L_n(w) / T)` for a uniform prior on a box, as masses
   of histogram bins (`posterior_bin_masses`), so SGD histograms are compared with posteriors at any
   temperature without MCMC.
3. Many-chain SGD and SGLD (`langevin_update`, `toy_iteration`): the chain axis is an array axis
   (vmapped gradients, `lax.scan` over steps in the callers), so it shards over devices.
4. Divergences between binned distributions (KL, JS, marginal W1) and temperature fits: the best
   global temperature, per-valley temperatures with SGD's own valley masses, and the posterior
   restricted to the bins SGD reached (the paper's accessibility constraint), `tempering_fits`.
5. The Mandt et al. (2017) temperature `T_M = eta n sigma_g^2 / (2 B)` (isotropic-noise SGD as a
   posterior), the baseline the porous picture refines.
6. The localised-SGLD LLC estimator of Lau et al. (2023) as in devinterp's `SGLD`:
   `lambda_hat = n beta (E_w[L_n(w)] - L_n(w*))`, `beta = 1 / log n`, with the update
   `dw = -(eps / 2) (n beta grad L_batch(w) + gamma (w - w*)) + N(0, eps)` (`estimate_llc`).
7. Displacement-exponent fits `log R(t) = s log t + c` (Def. 3.3: `s = 1 / d_walk = d_s / (2 lambda)`),
   the spectral dimension `d_s = 2 lambda s`, and the coarse-grained diffusion coefficient
   `D_xi = xi^(2 - 2 lambda / d_s) = xi^(2 - 1/s)` (Sec. 3).
8. Function-space clusters of an ensemble and their free-energy masses
   `∝ exp(-(n L_k / T + lambda_k log(n / T)))` (the local posterior's asymptotics at temperature T),
   with the Wasserstein-1 distance between cluster distributions.

Choices where the paper is open: histogram bins are the coarse-graining scale at which SGD and the
posterior are compared; "valleys" are fixed regions of each toy (the branches of A's hyperbola, the
axes of A0 and B split by |w1| vs |w2|); Mandt's `sigma_g^2` is the largest eigenvalue of the
per-sample gradient covariance (the variance of the noise in the direction it acts); minibatches are
drawn with replacement.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

# ---------------------------------------------------------------------------------------------------
# 1. Toy models
# ---------------------------------------------------------------------------------------------------


class Toy(NamedTuple):
  """A two-parameter model `f_w(x) = g(w) . x` of `y = x c + eps` with a known learning coefficient.

  Attributes:
    name: "R", "A", "A0" or "B".
    coefficients: `c` (its length is the input dimension k).
    reference: a point `w*` of the minimum set where the learning coefficient is `llc`.
    llc: the learning coefficient at `reference`.
    valleys: names of the regions `valley_label` returns, in label order.
  """

  name: str
  coefficients: tuple[float, ...]
  reference: tuple[float, float]
  llc: float
  valleys: tuple[str, ...]


TOYS = {
  "R": Toy("R", (1.0, 0.5), (1.0, 0.5), 1.0, ("all",)),
  "A": Toy("A", (1.0,), (1.0, 1.0), 0.5, ("w1w2=1, w>0", "w1w2=1, w<0")),
  "A0": Toy("A0", (0.0,), (0.0, 0.0), 0.5, ("w2=0", "w1=0")),
  "B": Toy("B", (0.0,), (2.0, 0.0), 0.25, ("w2=0 (lambda 1/4)", "w1=0 (lambda 1/2)")),
}


def toy_g(name: str, w: jax.Array) -> jax.Array:
  """`g(w)`: `(..., 2) -> (..., k)`."""
  w1, w2 = w[..., 0], w[..., 1]
  if name == "R":
    return w
  if name in ("A", "A0"):
    return (w1 * w2)[..., None]
  if name == "B":
    return (w1 * w2**2)[..., None]
  raise ValueError(f"unknown toy {name!r}; known: {sorted(TOYS)}")


def valley_label(name: str, w) -> jax.Array:
  """Which valley `w (..., 2)` lies in (int32): A's hyperbola branch by the sign of w1 + w2; the axes
  of A0 and B by |w2| < |w1| ({w2 = 0}, label 0) or not ({w1 = 0}, label 1); R has one."""
  w = jnp.asarray(w)
  if name == "R":
    return jnp.zeros(w.shape[:-1], jnp.int32)
  if name == "A":
    return (w[..., 0] + w[..., 1] < 0).astype(jnp.int32)
  return (jnp.abs(w[..., 1]) >= jnp.abs(w[..., 0])).astype(jnp.int32)


def along_valley(name: str, w: jax.Array) -> jax.Array:
  """Coordinates whose displacement measures the walk along the minimum set, `(..., 2)`: R (no
  valley) `w` itself; A the hyperbola's parameter `u = log|w1/w2| / 2` (`w = (e^u, e^-u)` on it);
  A0 and B `w1 + w2`, the position along whichever axis the chain is on."""
  if name == "R":
    return w
  if name == "A":
    a = jnp.log(jnp.abs(w) + 1e-12)
    u = 0.5 * (a[..., 0] - a[..., 1])
  else:
    u = w[..., 0] + w[..., 1]
  return jnp.stack([u, jnp.zeros_like(u)], -1)


def input_dim(name: str) -> int:
  return len(TOYS[name].coefficients)


def statistics_table(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Per-sample sufficient statistics `[x y, vec(x x^T), y^2]`, `(n, k + k^2 + 1)` (numpy): the mean
  of any subset of rows determines that subset's squared loss for every toy."""
  x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
  n, k = x.shape
  outer = (x[:, :, None] * x[:, None, :]).reshape(n, k * k)
  return np.concatenate([x * y[:, None], outer, (y**2)[:, None]], -1)


def toy_loss(name: str, w: jax.Array, stats: jax.Array) -> jax.Array:
  """`L(w) = mean_i (y_i - g(w) . x_i)^2 / 2` from the mean statistics `stats`, for `w (..., 2)`."""
  k = input_dim(name)
  g = toy_g(name, w)
  sxy, sxx, syy = stats[..., :k], stats[..., k : k + k * k], stats[..., -1]
  quadratic = jnp.einsum("...i,...ij,...j->...", g, sxx.reshape(*sxx.shape[:-1], k, k), g)
  return 0.5 * (syy - 2.0 * jnp.sum(g * sxy, -1) + quadratic)


def toy_per_sample_gradients(name: str, w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
  """`grad_w (y_i - g(w) . x_i)^2 / 2` for every sample, `(n, 2)`."""
  loss = lambda w, xi, yi: 0.5 * (yi - jnp.dot(toy_g(name, w), xi)) ** 2
  return jax.vmap(jax.grad(loss), (None, 0, 0))(w, x, y)


# ---------------------------------------------------------------------------------------------------
# 2. Exact grid posteriors, binned
# ---------------------------------------------------------------------------------------------------


class Window(NamedTuple):
  """A square of `bins x bins` histogram bins inside the prior box; one more bin holds the rest."""

  lo: tuple[float, float]
  hi: tuple[float, float]
  bins: int

  @property
  def num_cells(self) -> int:
    return self.bins * self.bins + 1

  @property
  def width(self) -> np.ndarray:
    return (np.asarray(self.hi) - np.asarray(self.lo)) / self.bins


def bin_index(w: jax.Array, window: Window) -> jax.Array:
  """Flat bin `i1 * bins + i2` of `w (..., 2)` in `window`; `bins^2` for points outside it."""
  lo, hi = jnp.asarray(window.lo), jnp.asarray(window.hi)
  cell = jnp.floor((w - lo) / (hi - lo) * window.bins).astype(jnp.int32)
  inside = jnp.all((cell >= 0) & (cell < window.bins), -1)
  return jnp.where(inside, cell[..., 0] * window.bins + cell[..., 1], window.bins**2)


def bin_centers(window: Window) -> np.ndarray:
  """`(bins^2, 2)` centres in the order of `bin_index`."""
  axes = [window.lo[d] + (np.arange(window.bins) + 0.5) * window.width[d] for d in range(2)]
  return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2)


def _cell_centres(lo, hi, count: int) -> np.ndarray:
  axes = [
    np.linspace(lo[d], hi[d], count + 1)[:-1] + (hi[d] - lo[d]) / (2 * count) for d in range(2)
  ]
  return np.stack(np.meshgrid(*axes, indexing="ij"), -1)


def posterior_bin_masses(
  name: str,
  stats: jax.Array,
  n: int,
  temperatures,
  window: Window,
  box: float,
  subdivisions: int = 8,
  coarse: int = 401,
) -> jax.Array:
  """Masses of `p_T(w) ∝ 1[w in box] exp(-n L_n(w) / T)` in the bins of `window` (and the rest),
  `(len(temperatures), bins^2 + 1)`, each row summing to 1.

  Inside the window each bin is integrated by the midpoint rule on `subdivisions^2` points; the rest
  of the box `[-box, box]^2` by a `coarse x coarse` grid (its cells centred outside the window). The
  full-data loss comes from the mean statistics `stats` (`statistics_table(x, y).mean(0)`).
  """
  sub = window.bins * subdivisions
  fine = jnp.asarray(_cell_centres(window.lo, window.hi, sub), jnp.float32)
  rest = _cell_centres((-box, -box), (box, box), coarse).reshape(-1, 2)
  lo, hi = np.asarray(window.lo), np.asarray(window.hi)
  rest = jnp.asarray(rest[~np.all((rest >= lo) & (rest < hi), -1)], jnp.float32)
  area_fine = float(np.prod(window.width)) / subdivisions**2
  area_rest = (2 * box / coarse) ** 2
  return _binned_masses(
    name,
    stats,
    n,
    jnp.asarray(temperatures, jnp.float32),
    fine,
    rest,
    window.bins,
    subdivisions,
    area_fine,
    area_rest,
  )


@functools.partial(jax.jit, static_argnums=(0, 2, 6, 7, 8, 9))
def _binned_masses(
  name, stats, n, temperatures, fine, rest, bins, subdivisions, area_fine, area_rest
):
  """The grids are arguments, not closed-over constants, so XLA does not fold them at compile time."""
  loss_fine = toy_loss(name, fine, stats)
  loss_rest = toy_loss(name, rest, stats)
  floor = jnp.minimum(loss_fine.min(), loss_rest.min() if rest.shape[0] else jnp.inf)

  def masses(temperature):
    inside = jnp.exp(-n * (loss_fine - floor) / temperature) * area_fine
    inside = inside.reshape(bins, subdivisions, bins, subdivisions).sum((1, 3))
    outside = jnp.sum(jnp.exp(-n * (loss_rest - floor) / temperature)) * area_rest
    cells = jnp.concatenate([inside.reshape(-1), outside[None]])
    return cells / cells.sum()

  return jax.lax.map(masses, temperatures)


def sample_grid_posterior(
  name: str, stats: jax.Array, n: int, temperature: float, box: float, resolution: int, key, count
) -> jax.Array:
  """`count` exact draws from `p_T` on the box: a cell of a `resolution^2` grid by inverse CDF, then a
  uniform point in it."""
  axis = -box + (jnp.arange(resolution) + 0.5) * (2 * box / resolution)
  centres = jnp.stack(jnp.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)
  log_p = -n * toy_loss(name, centres, stats) / temperature
  cdf = jnp.cumsum(jnp.exp(log_p - log_p.max()))
  pick_key, jitter_key = jax.random.split(key)
  u = jax.random.uniform(pick_key, (count,)) * cdf[-1]
  cells = jnp.minimum(jnp.searchsorted(cdf, u), centres.shape[0] - 1)
  half = box / resolution
  return centres[cells] + jax.random.uniform(jitter_key, (count, 2), minval=-half, maxval=half)


# ---------------------------------------------------------------------------------------------------
# 3. Many-chain SGD and SGLD
# ---------------------------------------------------------------------------------------------------


def minibatch_indices(key, shape, n: int) -> jax.Array:
  """Indices uniform on [0, n), drawn with replacement as `floor(u n)` of float32 uniforms (bias below
  n 2^-23); 2-3x faster than `jax.random.randint`, which draws twice the bits for exactness."""
  return jnp.minimum((jax.random.uniform(key, shape) * n).astype(jnp.int32), n - 1)


def sgld_noise_std(learning_rate, n: int, temperature):
  """SGLD's noise scale `sqrt(2 eta T / n)`: `w <- w - eta grad L + N(0, 2 eta T / n)` samples
  `exp(-n L / T)` as eta -> 0 (Welling & Teh 2011); T = 0 is plain SGD."""
  return jnp.sqrt(2.0 * jnp.asarray(learning_rate) * jnp.asarray(temperature) / n)


def langevin_update(w: jax.Array, grad: jax.Array, learning_rate, noise_std, key) -> jax.Array:
  """One SGD (noise_std = 0) or SGLD step for a chain axis: `learning_rate`, `noise_std` are `(C,)`."""
  lr = jnp.reshape(learning_rate, (-1,) + (1,) * (w.ndim - 1))
  std = jnp.reshape(noise_std, (-1,) + (1,) * (w.ndim - 1))
  return w - lr * grad + std * jax.random.normal(key, w.shape, w.dtype)


def toy_iteration(
  name: str, table: jax.Array, w: jax.Array, key, learning_rate, noise_std, batch_size: int, box
) -> jax.Array:
  """One minibatch step of every chain `w (C, 2)` (each its own minibatch), clipped to the box."""
  batch_key, noise_key = jax.random.split(key)
  idx = minibatch_indices(batch_key, (w.shape[0], batch_size), table.shape[0])
  stats = table[idx].mean(1)
  grads = jax.vmap(jax.grad(functools.partial(toy_loss, name)))(w, stats)
  return jnp.clip(langevin_update(w, grads, learning_rate, noise_std, noise_key), -box, box)


def histogram(bins_of_chains: jax.Array, groups: jax.Array, num_groups: int, num_cells: int):
  """Counts `(num_groups, num_cells)` of flat bin indices, one row per chain group."""
  flat = groups * num_cells + bins_of_chains
  counts = jnp.zeros(num_groups * num_cells, jnp.int32).at[flat].add(1)
  return counts.reshape(num_groups, num_cells)


# ---------------------------------------------------------------------------------------------------
# 4. Divergences and temperature fits (numpy: evaluation only)
# ---------------------------------------------------------------------------------------------------


def kl_noise_floor(q, count: int, seed: int = 0, repeats: int = 4) -> float:
  """Mean `KL(h || q)` of histograms `h` of `count` independent exact draws from the cell masses `q`:
  the value a perfect sampler with `count` independent points reaches (the finite-sample floor)."""
  rng = np.random.default_rng(seed)
  q = np.asarray(q, np.float64) / np.sum(q)
  return float(
    np.mean([kl_divergence(rng.multinomial(count, q) / count, q) for _ in range(repeats)])
  )


def kl_divergence(p, q, floor: float = 1e-300) -> float:
  """`KL(p || q) = sum p log(p / q)` over the cells where p > 0 (q floored)."""
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  on = p > 0
  return float(np.sum(p[on] * (np.log(p[on]) - np.log(np.maximum(q[on], floor)))))


def js_divergence(p, q) -> float:
  """Jensen-Shannon divergence in nats (bounded by log 2)."""
  m = 0.5 * (np.asarray(p, np.float64) + np.asarray(q, np.float64))
  return 0.5 * kl_divergence(p, m) + 0.5 * kl_divergence(q, m)


def marginal_w1(p, q, window: Window) -> float:
  """Sum over the two coordinates of the Wasserstein-1 distance between the marginals of `p` and `q`
  inside the window (each renormalised there), in units of w."""
  total = 0.0
  for axis in (0, 1):
    cdfs = []
    for dist in (p, q):
      inside = np.asarray(dist, np.float64)[:-1].reshape(window.bins, window.bins)
      marginal = inside.sum(1 - axis)
      cdfs.append(np.cumsum(marginal / max(marginal.sum(), 1e-300)))
    total += float(np.sum(np.abs(cdfs[0] - cdfs[1])) * window.width[axis])
  return total


def _restricted(dist, mask):
  """`dist` restricted to `mask` and renormalised (rows of a 2-D array each); NaN where no mass."""
  kept = np.asarray(dist, np.float64) * mask
  total = kept.sum(-1, keepdims=True)
  return np.where(total > 0, kept / np.where(total > 0, total, 1.0), np.nan)


def best_temperature(h, masses, temperatures, mask=None) -> tuple[float, float, int]:
  """`(T*, KL(h || p_T*), index)`: the grid temperature whose posterior (restricted to `mask` and
  renormalised, with `h`) is closest to the histogram `h` in KL."""
  mask = np.ones_like(h, bool) if mask is None else mask
  h_in = _restricted(h, mask)
  q = _restricted(masses, mask)
  kls = np.array([kl_divergence(h_in, row) if np.all(np.isfinite(row)) else np.inf for row in q])
  index = int(np.argmin(kls))
  return float(temperatures[index]), float(kls[index]), index


def tempering_fits(h, masses, temperatures, valley_of_cell, num_valleys: int) -> dict[str, float]:
  """How well tempered posteriors explain a chain histogram `h` (cells of a `Window`).

  Returns the best global temperature `t_star` and `kl_star`; per valley `v` the best temperature
  `t_valley_v` of the posterior conditioned on the valley, and `kl_valley = sum_v h(v) KL(h(.|v) ||
  p_{T_v}(.|v))`, the KL to the mixture of per-valley tempered posteriors weighted by SGD's own valley
  masses; `kl_access`, the same with each posterior also restricted to the cells the chains reached
  (the paper's accessibility constraint), and `accessible_mass`, the Bayes posterior's (T = 1 when
  in the grid, else the closest) mass on those cells. `kl_valley` and `kl_access` can only be <=
  `kl_star`, and `kl_access <= kl_valley`: each has more freedom than the one before, by
  construction, so they are diagnostics of where the misfit sits, never evidence for the paper's
  accessibility claim.
  """
  h = np.asarray(h, np.float64)
  t_star, kl_star, _ = best_temperature(h, masses, temperatures)
  reached = h > 0
  out = {"t_star": t_star, "kl_star": kl_star, "kl_valley": 0.0, "kl_access": 0.0}
  for v in range(num_valleys):
    in_valley = valley_of_cell == v
    weight = h[in_valley].sum()
    out[f"sgd_mass_valley{v}"] = float(weight)
    if weight == 0:
      out[f"t_valley{v}"] = float("nan")
      continue
    t_v, kl_v, _ = best_temperature(h, masses, temperatures, in_valley)
    _, kl_acc, _ = best_temperature(h, masses, temperatures, in_valley & reached)
    out[f"t_valley{v}"] = t_v
    out["kl_valley"] += weight * kl_v
    out["kl_access"] += weight * kl_acc
  bayes = masses[int(np.argmin(np.abs(np.log(temperatures))))]
  out["accessible_mass"] = float(np.sum(bayes[reached]))
  return out


def refine_temperature(h, temperatures, masses) -> tuple[float, float, tuple[float, float]]:
  """`(T*, KL(h || p_T*), (lo, hi))` on a fine grid `temperatures` (increasing) with posterior cell
  masses `masses` `(len(temperatures), cells)`, e.g. geometric points around a coarse grid's T*; the
  bracket `(lo, hi)` is the fine grid's neighbours of T*, which hold the minimum of a unimodal KL
  curve (T* itself is known to within that bracket, no better)."""
  kls = np.array([kl_divergence(h, row) for row in np.asarray(masses, np.float64)])
  i, last = int(np.argmin(kls)), len(temperatures) - 1
  lo, hi = temperatures[max(i - 1, 0)], temperatures[min(i + 1, last)]
  return float(temperatures[i]), float(kls[i]), (float(lo), float(hi))


def block_interval(values, level: float = 0.95) -> tuple[float, float]:
  """`(mean, half-width)` of a Student-t interval over independent blocks (chain blocks or seeds);
  NaN values are dropped, and the half-width is NaN with fewer than two left."""
  from scipy import stats

  values = np.asarray(values, np.float64)
  values = values[np.isfinite(values)]
  if values.size < 2:
    return (float(values.mean()) if values.size else float("nan")), float("nan")
  half = stats.t.ppf(0.5 + level / 2, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
  return float(values.mean()), float(half)


def tempered_histogram(h, exponent: float) -> np.ndarray:
  """SGD's own distribution tempered by `exponent`, `h^exponent / Z` (cells where h = 0 stay 0).

  The paper's local posterior `p(w | X_m) = rho(w) p_s(w)^(m D_xi) / Z` (Sec. 3) with a uniform prior:
  if `h ∝ exp(-n L / T)`, then `h^T` is the Bayes posterior `exp(-n L)`, so the exponent that makes
  SGD Bayesian is SGD's temperature."""
  h = np.asarray(h, np.float64)
  on = h > 0
  log_h = np.where(on, np.log(np.where(on, h, 1.0)), -np.inf) * exponent
  out = np.where(on, np.exp(log_h - log_h[on].max()), 0.0)
  return out / out.sum()


def valley_masses(dist, valley_of_cell, num_valleys: int) -> np.ndarray:
  return np.array([np.sum(np.asarray(dist)[valley_of_cell == v]) for v in range(num_valleys)])


# ---------------------------------------------------------------------------------------------------
# 5. Mandt et al.'s temperature
# ---------------------------------------------------------------------------------------------------


def gradient_noise_variance(per_sample_grads: jax.Array) -> jax.Array:
  """`sigma_g^2`: the largest eigenvalue of the covariance of per-sample gradients `(n, d)` (through the
  `(n, n)` Gram matrix when n < d)."""
  centred = per_sample_grads - per_sample_grads.mean(0)
  n, d = centred.shape
  gram = centred @ centred.T if n < d else centred.T @ centred
  return jnp.linalg.eigvalsh(gram / n)[-1]


def mandt_temperature(learning_rate, n: int, batch_size: int, sigma2):
  """`T_M = eta n sigma_g^2 / (2 B)`: constant-rate SGD with isotropic noise of variance sigma_g^2 is
  stationary at `exp(-2 B L / (eta sigma_g^2)) = exp(-n L / T_M)` (Mandt et al. 2017)."""
  return learning_rate * n * sigma2 / (2.0 * batch_size)


# ---------------------------------------------------------------------------------------------------
# 6. The local learning coefficient: localised SGLD (Lau et al. 2023)
# ---------------------------------------------------------------------------------------------------


class LLCSettings(NamedTuple):
  """Localised SGLD: step `step_size` (eps), pull `localization` (gamma) towards w*, `num_chains`
  chains of `num_steps` steps, the first `burn_in` discarded; `beta` defaults to 1 / log n."""

  step_size: float
  localization: float
  num_chains: int
  num_steps: int
  burn_in: int
  beta: float | None = None


def estimate_llc(
  loss_fn: Callable,
  params,
  sample_batch: Callable,
  n: int,
  key,
  settings: LLCSettings,
  reference_loss=None,
  reference_batches: int = 16,
  full_loss_fn: Callable | None = None,
) -> dict[str, jax.Array]:
  """`lambda_hat(w*) = n beta (E_{w ~ p_{beta,gamma}}[L_n(w)] - L_n(w*))` (Lau et al. 2023).

  `loss_fn(params, batch)` is the mean loss of a minibatch, `sample_batch(key)` draws one. Each chain
  runs `w <- w - (eps/2) (n beta grad L_batch(w) + gamma (w - w*)) + N(0, eps)` from w* (devinterp's
  `SGLD` with `temperature = 1/beta`); `E[L_n]` is the mean minibatch loss after burn-in.
  `L_n(w*)` is `reference_loss` when given (full data), else the mean over `reference_batches`
  minibatches (a single-batch value is a known source of bias). With `full_loss_fn(params) = L_n`
  (cheap for the toys), `E[L_n]` averages the exact full-data loss of the draws instead of their
  minibatch losses: the same expectation without the minibatch noise. Returns `llc`, `llc_chains`
  and the chains' mean loss per step `loss_trace`.
  """
  beta = settings.beta if settings.beta is not None else 1.0 / math.log(n)
  nbeta, eps, gamma = n * beta, settings.step_size, settings.localization
  ref_key, chain_key = jax.random.split(key)
  if reference_loss is None:
    keys = jax.random.split(ref_key, reference_batches)
    reference_loss = jnp.mean(jax.vmap(lambda k: loss_fn(params, sample_batch(k)))(keys))
  # One flat vector: one noise draw per step instead of one per leaf (much faster to compile).
  centre, unravel = ravel_pytree(params)
  flat_loss = lambda w, batch: loss_fn(unravel(w), batch)

  def step(w, step_key):
    batch_key, noise_key = jax.random.split(step_key)
    loss, grad = jax.value_and_grad(flat_loss)(w, sample_batch(batch_key))
    if full_loss_fn is not None:
      loss = full_loss_fn(unravel(w))
    noise = jax.random.normal(noise_key, w.shape, w.dtype)
    w = w - 0.5 * eps * (nbeta * grad + gamma * (w - centre)) + math.sqrt(eps) * noise
    return w, loss

  def chain(key):
    return jax.lax.scan(step, centre, jax.random.split(key, settings.num_steps))[1]

  losses = jax.vmap(chain)(jax.random.split(chain_key, settings.num_chains))
  llc_chains = nbeta * (losses[:, settings.burn_in :].mean(1) - reference_loss)
  return {"llc": llc_chains.mean(), "llc_chains": llc_chains, "loss_trace": losses.mean(0)}


# ---------------------------------------------------------------------------------------------------
# 7. Displacement exponents, spectral dimension, D_xi
# ---------------------------------------------------------------------------------------------------


def geometric_lags(max_lag: int, count: int) -> np.ndarray:
  """Distinct integers from 1 to `max_lag`, about geometrically spaced (at most `count`)."""
  return np.unique(np.round(np.geomspace(1, max_lag, count)).astype(np.int64))


def power_law_fit(t, r) -> tuple[float, float, float]:
  """`(slope, intercept, r^2)` of the least-squares line `log r = slope log t + intercept` over the
  points with `t, r > 0` (NaNs when fewer than 3)."""
  t, r = np.asarray(t, np.float64), np.asarray(r, np.float64)
  ok = (t > 0) & (r > 0) & np.isfinite(r)
  if ok.sum() < 3:
    return float("nan"), float("nan"), float("nan")
  x, y = np.log(t[ok]), np.log(r[ok])
  slope, intercept = np.polyfit(x, y, 1)
  residual = y - (slope * x + intercept)
  total = np.sum((y - y.mean()) ** 2)
  return float(slope), float(intercept), float(1.0 - residual @ residual / max(total, 1e-300))


def spectral_dimension(llc, slope):
  """`d_s = 2 lambda s` from `log R = (d_s / (2 lambda)) log t + c` (Def. 3.3)."""
  return 2.0 * np.asarray(llc) * np.asarray(slope)


def porous_diffusion_coefficient(xi: float, slope):
  """`D_xi = xi^(2 - 2 lambda / d_s) = xi^(2 - 1/s)`: the diffusion coefficient of a walk with
  `R ∝ t^s` coarse-grained at scale xi (Sec. 3; `d_walk = 1/s`): `xi^2 / t_xi` for the time
  `t_xi = xi^(1/s)` at which a walk with `R(t) = t^s` reaches `R = xi`. NaN for `s <= 0`."""
  slope = np.asarray(slope, np.float64)
  positive = slope > 0
  return np.where(positive, np.power(xi, 2.0 - 1.0 / np.where(positive, slope, 1.0)), np.nan)


def porous_temperature(xi: float, slope, n: int, drift: float):
  """The temperature the paper's steady state `p_s ∝ exp(-gamma L_m / D_xi)` (Sec. 3) puts on
  `exp(-n L_n / T)`: `T_xi = n D_xi / gamma`, with `gamma` the drift per unit time (for SGD counted
  in steps, `gamma = eta`; the paper's `gamma = 1` reading is `drift = 1`). `D_xi` is in the walk's
  own units (`R(t) = t^s` with t in steps)."""
  return n * porous_diffusion_coefficient(xi, slope) / drift


# ---------------------------------------------------------------------------------------------------
# 8. Function-space clusters of an ensemble and their free-energy masses
# ---------------------------------------------------------------------------------------------------


def leader_clusters(signatures: np.ndarray, radius: int) -> np.ndarray:
  """Cluster labels of binary function signatures `(N, P)`: the most common signatures become leaders
  first; a net joins the first leader within Hamming distance `radius`, else leads a new cluster.
  Labels are ordered by cluster size (0 = largest)."""
  signatures = np.asarray(signatures, bool)
  unique, inverse, counts = np.unique(signatures, axis=0, return_inverse=True, return_counts=True)
  leaders: list[int] = []
  label_of_unique = np.empty(len(unique), np.int64)
  for u in np.argsort(-counts, kind="stable"):
    distances = [np.count_nonzero(unique[u] != unique[leader]) for leader in leaders]
    near = [i for i, d in enumerate(distances) if d <= radius]
    if near:
      label_of_unique[u] = near[0]
    else:
      label_of_unique[u] = len(leaders)
      leaders.append(u)
  labels = label_of_unique[np.asarray(inverse).reshape(-1)]
  sizes = np.bincount(labels)
  rank = np.empty_like(sizes)
  rank[np.argsort(-sizes, kind="stable")] = np.arange(len(sizes))
  return rank[labels]


def free_energy_masses(n_loss, llc, n: int, temperature: float) -> np.ndarray:
  """Local-posterior masses `∝ exp(-(n L_k / T + lambda_k log(n / T)))` of basins k at temperature T
  (Watanabe's free-energy asymptotics of the tempered posterior `exp(-n L / T)`)."""
  log_mass = -(np.asarray(n_loss) / temperature + np.asarray(llc) * math.log(n / temperature))
  log_mass -= log_mass.max()
  mass = np.exp(log_mass)
  return mass / mass.sum()


def discrete_w1(p, q, cost) -> float:
  """Wasserstein-1 distance between distributions `p`, `q` on K points with ground cost `(K, K)`
  (exact, by linear programming over the points either distribution charges; sparse constraints)."""
  from scipy import sparse
  from scipy.optimize import linprog

  p, q = np.asarray(p, float) / np.sum(p), np.asarray(q, float) / np.sum(q)
  keep = (p > 0) | (q > 0)
  p, q, cost = p[keep], q[keep], np.asarray(cost, float)[np.ix_(keep, keep)]
  k = len(p)
  identity, ones = sparse.identity(k, format="csr"), sparse.csr_matrix(np.ones((1, k)))
  constraints = sparse.vstack([sparse.kron(identity, ones), sparse.kron(ones, identity)])
  solved = linprog(
    cost.reshape(-1),
    A_eq=constraints.tocsr(),
    b_eq=np.concatenate([p, q]),
    bounds=(0, None),
    method="highs",
  )
  return float(solved.fun)
