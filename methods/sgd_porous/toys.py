"""D1: SGD and SGLD chains on the singular toys against their exact tempered posteriors, and the LLC
estimator on the toys (Sec. 3 of "Almost Bayesian: Dynamics of SGD Through Singular Learning Theory").

Phases, for each toy in `config.toys.models`:
  toys_<model>_b<B>  one phase per batch size B: every chain group with that B (SGD at each learning
                     rate, SGLD at each initialisation) as one flat chain axis (`(groups * chains, 2)`,
                     sharded over the mesh's data axis by `config.sharding = "fsdp"`). A loop step is
                     `records_per_call` records of `thin` iterations (`lax.scan`); after `burn_in`
                     iterations each record adds the chains to their group's histogram, and the mean
                     squared along-valley displacement from the burn-in position is kept at
                     geometric lags. Evaluation: per group, KL/JS/W1 to the Bayes posterior (T = 1)
                     and to the best tempered one, per-valley temperatures, the accessible-posterior
                     KL, valley masses, Mandt's temperature, the displacement exponent (all lags and
                     the last decade), and `kl_floor`, the KL of as many independent exact draws as
                     chains (the noise level of chains that do not move along their valley).
  toys_summary       the headline numbers (`kl_regular`, `kl_singular`, ...) for the first SGD
                     group, and a figure of chain histograms against posteriors.
  toys_llc           the localised-SGLD LLC at each toy's reference point against the known value.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from core import slt
from core.data import slt as slt_data
from methods.base import Phase, cached_per_config, figure_grid


class Group(NamedTuple):
  """Chains sharing a sampler: SGD (`temperature = 0`) or SGLD at `temperature`, from `init`."""

  name: str
  learning_rate: float
  temperature: float
  init: str  # "prior" (uniform on the box) or "posterior" (exact draws from p_T)


def sgd_group_name(learning_rate: float, batch_size: int) -> str:
  return f"sgd_lr{learning_rate:g}_b{batch_size}"


def groups_for(config, batch_size: int) -> list[Group]:
  t = config.toys
  groups = []
  if batch_size in t.batch_sizes:
    groups += [Group(sgd_group_name(lr, batch_size), lr, 0.0, "prior") for lr in t.learning_rates]
  if batch_size == t.sgld_batch_size:
    groups += [
      Group(
        f"sgld_T{t.sgld_temperature:g}_{init}_b{batch_size}",
        t.sgld_learning_rate,
        t.sgld_temperature,
        init,
      )
      for init in t.sgld_inits
    ]
  return groups


def batch_sizes(config) -> list[int]:
  t = config.toys
  return sorted(set(t.batch_sizes) | ({t.sgld_batch_size} if t.sgld_inits else set()))


def phase_name(model: str, batch_size: int) -> str:
  return f"toys_{model}_b{batch_size}"


def headline_group(config) -> str:
  return sgd_group_name(config.toys.learning_rates[0], config.toys.batch_sizes[0])


# ---------------------------------------------------------------------------------------------------
# Data, windows, exact posteriors (built once per config and toy)
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=16)
def toy_data(config, model: str) -> dict[str, np.ndarray]:
  toy = slt.TOYS[model]
  data = slt_data.toy_regression(
    toy.coefficients,
    config.toys.n,
    config.toys.data_seed + list(slt.TOYS).index(model),
    config.toys.orthogonal_noise,
    config.toys.noise_std,
  )
  table = slt.statistics_table(data["x"], data["y"])
  return {**data, "table": table, "stats": table.mean(0)}


def window_of(config, model: str) -> slt.Window:
  """The full prior box for the singular toys; a square around c for the regular one, whose
  posterior is a narrow Gaussian."""
  t = config.toys
  if model == "R":
    c, h = np.asarray(slt.TOYS["R"].coefficients), t.regular_half_width
    return slt.Window(tuple(c - h), tuple(c + h), t.bins)
  return slt.Window((-t.box, -t.box), (t.box, t.box), t.bins)


def temperature_grid(config) -> np.ndarray:
  """Log-spaced and symmetric around T = 1 (an odd count contains 1 exactly)."""
  lo, hi, count = config.toys.temperatures
  return np.geomspace(lo, hi, count)


@cached_per_config(maxsize=16)
def posterior_masses(config, model: str) -> np.ndarray:
  """`(temperatures, cells)` bin masses of the exact tempered posteriors of `model` on the grid."""
  return masses_at(config, model, temperature_grid(config))


@cached_per_config(maxsize=16)
def valley_of_cells(config, model: str) -> np.ndarray:
  window = window_of(config, model)
  labels = np.asarray(slt.valley_label(model, jnp.asarray(slt.bin_centers(window))))
  return np.concatenate([labels, [0]])  # the outside cell (R only) belongs to R's one valley


def lags(config) -> np.ndarray:
  """Displacement lags in iterations: geometric multiples of `thin` after burn-in."""
  t = config.toys
  return t.thin * slt.geometric_lags((t.steps - t.burn_in) // t.thin, t.num_lags)


# ---------------------------------------------------------------------------------------------------
# The chain phase
# ---------------------------------------------------------------------------------------------------


def _per_chain(groups, chains: int, field: str) -> jnp.ndarray:
  return jnp.repeat(jnp.asarray([getattr(g, field) for g in groups], jnp.float32), chains)


@cached_per_config(maxsize=16)
def posterior_draws(config, model: str, temperature: float, index: int) -> np.ndarray:
  """Exact draws from `p_T` that start the "posterior" SGLD groups, computed eagerly once (seeded by
  `config.seed`, the toy and the group), so the chain phase's init stays small to compile."""
  t = config.toys
  key = jax.random.fold_in(jax.random.key(config.seed), 1000 * list(slt.TOYS).index(model) + index)
  with jax.ensure_compile_time_eval():
    draws = slt.sample_grid_posterior(
      model,
      jnp.asarray(toy_data(config, model)["stats"]),
      t.n,
      temperature,
      t.box,
      t.init_resolution,
      key,
      t.chains,
    )
  return np.asarray(draws, np.float32)


def init_chains(config, model: str, groups, rng, inputs=None):
  del inputs
  t, data = config.toys, toy_data(config, model)
  starts = []
  for i, group in enumerate(groups):
    key = jax.random.fold_in(rng, i)
    if group.init == "prior":
      starts.append(jax.random.uniform(key, (t.chains, 2), minval=-t.box, maxval=t.box))
    else:
      starts.append(
        slt.sample_grid_posterior(
          model,
          jnp.asarray(data["stats"]),
          t.n,
          group.temperature,
          t.box,
          t.init_resolution,
          key,
          t.chains,
        )
      )
  w = jnp.concatenate(starts).astype(jnp.float32)
  window = window_of(config, model)
  return {
    "w": w,
    "w_ref": w,
    "t": jnp.zeros((), jnp.int32),
    "hist": jnp.zeros((len(groups), t.blocks, window.num_cells), jnp.int32),
    "msd": jnp.zeros((len(groups), t.blocks, len(lags(config))), jnp.float32),
  }


def chain_step(config, model: str, batch_size: int, groups, state, batch, rng):
  """`records_per_call x thin` iterations of every chain; histogram and displacement records."""
  del batch
  t, data = config.toys, toy_data(config, model)
  table, stats = jnp.asarray(data["table"]), jnp.asarray(data["stats"])
  window, lag_steps = window_of(config, model), jnp.asarray(lags(config), jnp.int32)
  num_groups, chains = len(groups), t.chains
  lr = _per_chain(groups, chains, "learning_rate")
  noise = slt.sgld_noise_std(lr, t.n, _per_chain(groups, chains, "temperature"))
  rows = num_groups * t.blocks  # each group's chains split into `blocks` equal blocks
  block_of_chain = jnp.repeat(jnp.arange(rows), chains // t.blocks)

  def iteration(w, key):
    return slt.toy_iteration(model, table, w, key, lr, noise, batch_size, t.box), None

  def record(state, key):
    w = jax.lax.scan(iteration, state["w"], jax.random.split(key, t.thin))[0]
    step = state["t"] + t.thin
    counts = slt.histogram(slt.bin_index(w, window), block_of_chain, rows, window.num_cells)
    w_ref = jnp.where(step == t.burn_in, w, state["w_ref"])
    moved = slt.along_valley(model, w) - slt.along_valley(model, w_ref)
    msd = jnp.sum(moved**2, -1).reshape(num_groups, t.blocks, -1).mean(-1)
    hit = (step - t.burn_in) == lag_steps
    return {
      "w": w,
      "w_ref": w_ref,
      "t": step,
      "hist": state["hist"] + (step > t.burn_in) * counts.reshape(num_groups, t.blocks, -1),
      "msd": jnp.where(hit[None, None, :], msd[..., None], state["msd"]),
    }, None

  state = jax.lax.scan(record, state, jax.random.split(rng, t.records_per_call))[0]
  loss = slt.toy_loss(model, state["w"], stats).reshape(num_groups, chains).mean(1)
  metrics = {"loss": loss.mean()}
  metrics.update({f"loss_{g.name}": loss[i] for i, g in enumerate(groups)})
  return state, metrics


# ---------------------------------------------------------------------------------------------------
# Evaluation of a chain phase
# ---------------------------------------------------------------------------------------------------


def mandt_temperatures(config, model: str, lr: float, batch_size: int, w_final) -> dict[str, float]:
  """`T_M` with `sigma_g^2` at the toy's reference minimum, and per valley averaged over the chains'
  final positions there (the noise of the singular toys varies along their valleys)."""
  t, data = config.toys, toy_data(config, model)
  x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
  sigma2 = jax.jit(
    jax.vmap(lambda w: slt.gradient_noise_variance(slt.toy_per_sample_gradients(model, w, x, y)))
  )
  reference = jnp.asarray(slt.TOYS[model].reference, jnp.float32)[None]
  out = {"t_mandt": float(slt.mandt_temperature(lr, t.n, batch_size, sigma2(reference)[0]))}
  labels = np.asarray(slt.valley_label(model, w_final))
  values = np.asarray(sigma2(w_final))
  for v in range(len(slt.TOYS[model].valleys)):
    chosen = values[labels == v]
    mean = float(chosen.mean()) if chosen.size else float("nan")
    out[f"t_mandt_valley{v}"] = float(slt.mandt_temperature(lr, t.n, batch_size, mean))
  return out


def masses_at(config, model: str, temperatures) -> np.ndarray:
  """Exact posterior cell masses of `model` at any temperatures `(len, cells)`."""
  t = config.toys
  return np.asarray(
    slt.posterior_bin_masses(
      model,
      jnp.asarray(toy_data(config, model)["stats"]),
      t.n,
      np.asarray(temperatures, np.float64),
      window_of(config, model),
      t.box,
      t.subdivisions,
      t.coarse,
    ),
    np.float64,
  )


def _normalised(counts) -> np.ndarray:
  counts = np.asarray(counts, np.float64)
  return counts / max(counts.sum(), 1.0)


def _interval(out: dict, name: str, values) -> None:
  """`name_mean` and `name_half` (95% Student-t half-width) over the chain blocks."""
  out[f"{name}_mean"], out[f"{name}_half"] = slt.block_interval(values)


def late_exponent(config, msd) -> tuple[float, float]:
  """`(s, r^2)` of `RMS displacement ∝ lag^s` over the last decade of lags (the late stage)."""
  lag_steps = lags(config)
  late = lag_steps >= lag_steps[-1] / 10
  slope2, _, r2 = slt.power_law_fit(lag_steps[late], np.asarray(msd)[late])
  return 0.5 * slope2, r2


def refined_temperatures(config, model: str, hists, t_grid: float) -> list[tuple]:
  """`refine_temperature` of each histogram on `toys.refine_points` geometric points spanning two
  steps of the coarse grid on either side of `t_grid` (one set of masses for all)."""
  lo, hi, count = config.toys.temperatures
  step = (hi / lo) ** (1.0 / (count - 1))
  fine = np.geomspace(t_grid / step**2, t_grid * step**2, config.toys.refine_points)
  masses = masses_at(config, model, fine)
  return [slt.refine_temperature(h, fine, masses) for h in hists]


def porous_tempering(config, model: str, group: Group, hists, exponents, t_star, t_mandt):
  """The paper's tempering of SGD's own distribution (Sec. 3): `KL(h^T / Z || p_1)` for the
  temperatures T of the fitted posterior (T*), Mandt's (T_M), the porous one from the walk's
  exponent (`T_xi = n D_xi / eta`, `D_xi = xi^(2 - 1/s)`) and Mandt's rescaled by D_xi (`T_M D_xi`,
  the reading in which D_xi corrects the microscopic diffusion coefficient). One value per entry of
  `hists`, with its own exponent and T*."""
  t, temperatures = config.toys, temperature_grid(config)
  bayes = posterior_masses(config, model)[int(np.argmin(np.abs(np.log(temperatures))))]
  out = {name: [] for name in ("star", "mandt", "xi", "mandt_xi")}
  for h, s, ts in zip(hists, exponents, t_star, strict=True):
    d_xi = float(slt.porous_diffusion_coefficient(t.xi, s))
    chosen = {
      "star": ts,
      "mandt": t_mandt,
      "xi": float(slt.porous_temperature(t.xi, s, t.n, group.learning_rate)),
      "mandt_xi": t_mandt * d_xi,
    }
    for name, temperature in chosen.items():
      ok = np.isfinite(temperature) and temperature > 0
      kl = slt.kl_divergence(slt.tempered_histogram(h, temperature), bayes) if ok else np.nan
      out[name].append((temperature, kl))
  return out


def tempered_floor(config, star, bayes, temperature: float, count: int, repeats: int = 4) -> float:
  """`KL(h^T / Z || p_1)` for histograms `h` of `count` independent exact draws from `p_T*` (as many
  as the SGD histogram's entries: a lower bound on its noise, since records of a chain correlate).
  Tempering by T < 1 raises sparse bins, so sampling noise alone leaves this much."""
  rng = np.random.default_rng(config.seed)
  return float(
    np.mean(
      [
        slt.kl_divergence(
          slt.tempered_histogram(rng.multinomial(count, star / star.sum()) / count, temperature),
          bayes,
        )
        for _ in range(repeats)
      ]
    )
  )


def group_metrics(config, model: str, group: Group, batch_size: int, hist, msd, w) -> dict:
  """Every number of one chain group (keys without the model/group prefix). `hist` and `msd` are
  per chain block `(blocks, ...)`; intervals are over the blocks (`*_mean`, `*_half`)."""
  window, temperatures = window_of(config, model), temperature_grid(config)
  masses, valleys = posterior_masses(config, model), valley_of_cells(config, model)
  num_valleys = len(slt.TOYS[model].valleys)
  block_h = [_normalised(b) for b in np.asarray(hist)]
  h = _normalised(np.asarray(hist).sum(0))
  msd_all = np.asarray(msd).mean(0)  # equal blocks: the mean over every chain
  bayes = masses[int(np.argmin(np.abs(np.log(temperatures))))]
  fits = slt.tempering_fits(h, masses, temperatures, valleys, num_valleys)
  star = masses[int(np.argmin(np.abs(temperatures - fits["t_star"])))]
  out = dict(fits)
  out["kl_floor"] = slt.kl_noise_floor(star, config.toys.chains, config.seed)
  out.update(
    kl_bayes=slt.kl_divergence(h, bayes),
    js_bayes=slt.js_divergence(h, bayes),
    w1_bayes=slt.marginal_w1(h, bayes, window),
    js_star=slt.js_divergence(h, star),
    w1_star=slt.marginal_w1(h, star, window),
  )
  for name, dist in (("sgd", h), ("bayes", bayes), ("star", star)):
    m = slt.valley_masses(dist, valleys, num_valleys)
    if num_valleys == 2:
      out[f"occupancy_ratio_{name}"] = float(m[0] / max(m[1], 1e-300))
  alpha2, _, r2 = slt.power_law_fit(lags(config), msd_all)
  late_alpha, late_r2 = late_exponent(config, msd_all)
  out.update(alpha=0.5 * alpha2, alpha_r2=r2, alpha_late=late_alpha, alpha_late_r2=late_r2)
  block_alpha = [late_exponent(config, m)[0] for m in np.asarray(msd)]
  _interval(out, "alpha_late", block_alpha)
  refined = refined_temperatures(config, model, [h, *block_h], fits["t_star"])
  out["t_star_refined"], out["kl_star_refined"], (out["t_star_lo"], out["t_star_hi"]) = refined[0]
  _interval(out, "t_star_blocks", [r[0] for r in refined[1:]])
  if group.temperature == 0.0:
    out.update(mandt_temperatures(config, model, group.learning_rate, batch_size, jnp.asarray(w)))
    tempered = porous_tempering(
      config,
      model,
      group,
      [h, *block_h],
      [late_alpha, *block_alpha],
      [r[0] for r in refined],
      out["t_mandt"],
    )
    out["d_xi"] = float(slt.porous_diffusion_coefficient(config.toys.xi, late_alpha))
    entries = int(np.asarray(hist).sum())
    out["kl_tempered_floor"] = tempered_floor(config, star, bayes, out["t_star_refined"], entries)
    for name, rows in tempered.items():
      out[f"t_{name}_tempering"], out[f"kl_tempered_{name}"] = rows[0]
      _interval(out, f"kl_tempered_{name}", [kl for _, kl in rows[1:]])
  return out


def group_arrays(config, model: str, index: int, chains: int, state) -> tuple:
  """A group's `(hist (blocks, cells), msd (blocks, lags), final positions (chains, 2))`."""
  rows = slice(index * chains, (index + 1) * chains)
  return (
    np.asarray(state["hist"][index]),
    np.asarray(state["msd"][index]),
    np.asarray(state["w"][rows]),
  )


def evaluate_chains(config, model: str, batch_size: int, groups, state) -> dict:
  results = {}
  for i, group in enumerate(groups):
    hist, msd, w = group_arrays(config, model, i, config.toys.chains, state)
    metrics = group_metrics(config, model, group, batch_size, hist, msd, w)
    results.update({f"{model}_{group.name}_{k}": v for k, v in metrics.items()})
    results[f"{model}_{group.name}_msd"] = np.asarray(msd).mean(0)
  return results


def chain_phases(config) -> list[Phase]:
  t = config.toys
  phases = []
  for model in t.models:
    for b in batch_sizes(config):
      groups = groups_for(config, b)
      phases.append(
        Phase(
          name=phase_name(model, b),
          num_steps=t.steps // (t.records_per_call * t.thin),
          init=functools.partial(init_chains, config, model, groups),
          step=functools.partial(chain_step, config, model, b, groups),
          evaluate=functools.partial(_evaluate_phase, config, model, b, groups),
        )
      )
  return phases


def _evaluate_phase(config, model, batch_size, groups, state, rng, inputs):
  del rng, inputs
  return evaluate_chains(config, model, batch_size, groups, state)


# ---------------------------------------------------------------------------------------------------
# Summary: headline numbers and the histogram figure
# ---------------------------------------------------------------------------------------------------


def _headline_state(config, model: str, inputs):
  """The headline group's arrays from its chain phase's final state."""
  b = config.toys.batch_sizes[0]
  groups = groups_for(config, b)
  index = [g.name for g in groups].index(headline_group(config))
  return (
    groups[index],
    b,
    group_arrays(config, model, index, config.toys.chains, inputs[phase_name(model, b)]),
  )


def summarise(config, inputs) -> dict:
  """`kl_regular` (R) and `kl_singular` (mean over the singular toys run) of the headline SGD group,
  at the best global temperature, with the per-valley and accessible refinements, and each toy's
  histogram and best tempered posterior (arrays, for figures)."""
  out, singular = {}, {"kl_star": [], "kl_valley": [], "kl_access": [], "kl_bayes": []}
  for model in config.toys.models:
    group, b, (hist, msd, w) = _headline_state(config, model, inputs)
    metrics = group_metrics(config, model, group, b, hist, msd, w)
    if model == "R":
      out.update(
        kl_regular=metrics["kl_star"],
        kl_regular_bayes=metrics["kl_bayes"],
        t_star_regular=metrics["t_star_refined"],
        t_star_regular_bracket=np.asarray([metrics["t_star_lo"], metrics["t_star_hi"]]),
        t_mandt_regular=metrics["t_mandt"],
      )
    else:
      for key in singular:
        singular[key].append(metrics[key])
    out[f"{model}_hist"] = _image(config, model, _normalised(np.asarray(hist).sum(0)))
    temperatures = temperature_grid(config)
    star = posterior_masses(config, model)[int(np.argmin(np.abs(temperatures - metrics["t_star"])))]
    out[f"{model}_posterior_star"] = _image(config, model, star)
  if singular["kl_star"]:
    out.update(
      kl_singular=float(np.mean(singular["kl_star"])),
      kl_singular_valley=float(np.mean(singular["kl_valley"])),
      kl_singular_access=float(np.mean(singular["kl_access"])),
      kl_singular_bayes=float(np.mean(singular["kl_bayes"])),
    )
  return out


def _image(config, model: str, cells) -> np.ndarray:
  bins = window_of(config, model).bins
  return np.asarray(cells, np.float64)[:-1].reshape(bins, bins)


def plot_log_density(ax, density, extent) -> None:
  """A (w1, w2) histogram or posterior on the grid's extent, log10 scale from 1e-6."""
  ax.imshow(
    np.log10(np.asarray(density) + 1e-7),
    origin="lower",
    extent=extent,
    vmin=-6,
    cmap="magma",
    interpolation="nearest",
    aspect="auto",
  )


def histogram_figure(config, results: dict, title: str = ""):
  """Per toy: the headline SGD group's histogram above its best tempered posterior (log scale)."""
  models = [m for m in config.toys.models if f"{m}_hist" in results]
  fig, axes = figure_grid(2, len(models), panel_size=(2.6, 2.5))
  for col, model in enumerate(models):
    window = window_of(config, model)
    extent = (window.lo[1], window.hi[1], window.lo[0], window.hi[0])
    for row, key in enumerate((f"{model}_hist", f"{model}_posterior_star")):
      plot_log_density(axes[row, col], results[key], extent)
      axes[row, col].set_xlabel("w2")
      axes[row, col].set_ylabel("w1")
    axes[0, col].set_title(f"{model}: SGD")
    axes[1, col].set_title(f"{model}: posterior at T*")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  return fig


def summary_phase(config) -> Phase:
  chains = [phase_name(m, b) for m in config.toys.models for b in batch_sizes(config)]

  def evaluate(state, rng, inputs):
    return summarise(config, {name: inputs[name] for name in chains})

  def artifacts(state, rng, inputs):
    results = summarise(config, {name: inputs[name] for name in chains})
    return {"toys_histograms": histogram_figure(config, results, headline_group(config))}

  return Phase(
    name="toys_summary",
    num_steps=0,
    init=lambda rng, inputs: {"done": jnp.zeros((), jnp.int32)},
    evaluate=evaluate,
    artifacts=artifacts,
  )


# ---------------------------------------------------------------------------------------------------
# LLC on the toys
# ---------------------------------------------------------------------------------------------------

KNOWN = ("R", "A", "B")  # multiplicity-1 reference points: the LLC estimator's asymptotics hold


def llc_settings(config) -> slt.LLCSettings:
  c = config.llc
  return slt.LLCSettings(c.step_size, c.localization, c.chains, c.steps, c.burn_in)


def toy_llc(config, model: str, key) -> dict[str, float]:
  """`lambda_hat` at the toy's reference point: minibatch gradients, exact `L_n` of the draws."""
  data = toy_data(config, model)
  table, stats = jnp.asarray(data["table"]), jnp.asarray(data["stats"])
  n, b = config.toys.n, config.llc.batch_size
  reference = jnp.asarray(slt.TOYS[model].reference, jnp.float32)

  @jax.jit
  def run(key):
    return slt.estimate_llc(
      lambda w, idx: slt.toy_loss(model, w, table[idx].mean(0)),
      reference,
      lambda k: slt.minibatch_indices(k, (b,), n),
      n,
      key,
      llc_settings(config),
      reference_loss=slt.toy_loss(model, reference, stats),
      full_loss_fn=lambda w: slt.toy_loss(model, w, stats),
    )

  out = run(key)
  chains = np.asarray(out["llc_chains"])
  return {
    "llc": float(chains.mean()),
    "llc_stderr": float(chains.std(ddof=1) / np.sqrt(len(chains))),
  }


def evaluate_llc(config, rng) -> dict:
  results, errors = {}, []
  for i, model in enumerate(config.llc.models):
    estimate = toy_llc(config, model, jax.random.fold_in(rng, i))
    known = slt.TOYS[model].llc
    results[f"llc_{model}"] = estimate["llc"]
    results[f"llc_{model}_stderr"] = estimate["llc_stderr"]
    results[f"llc_{model}_known"] = known
    results[f"llc_error_{model}"] = abs(estimate["llc"] - known) / known
    if model in KNOWN:
      errors.append(results[f"llc_error_{model}"])
  results["llc_errors"] = np.asarray(errors)
  return results


def llc_phase(config) -> Phase:
  return Phase(
    name="toys_llc",
    num_steps=0,
    init=lambda rng, inputs: {"done": jnp.zeros((), jnp.int32)},
    evaluate=lambda state, rng, inputs: evaluate_llc(config, rng),
  )


def validate(config, require, require_positive_int) -> None:
  t = config.toys
  for model in t.models:
    require(model in slt.TOYS, "toys.models", f"unknown toy {model!r}; known: {sorted(slt.TOYS)}")
  for model in config.llc.models:
    require(model in slt.TOYS, "llc.models", f"unknown toy {model!r}; known: {sorted(slt.TOYS)}")
  for field in (
    "n",
    "chains",
    "steps",
    "thin",
    "records_per_call",
    "bins",
    "subdivisions",
    "coarse",
    "num_lags",
    "init_resolution",
    "blocks",
    "refine_points",
  ):
    require_positive_int(config, f"toys.{field}")
  require(
    t.blocks >= 2 and t.chains % t.blocks == 0,
    "toys.blocks",
    f"need at least 2 blocks dividing toys.chains = {t.chains}, got {t.blocks}",
  )
  require(t.xi > 0, "toys.xi", "must be positive")
  require(t.noise_std > 0, "toys.noise_std", "must be positive")
  require(
    len(t.learning_rates) > 0 and all(lr > 0 for lr in t.learning_rates),
    "toys.learning_rates",
    "need at least one positive learning rate",
  )
  require(
    len(t.batch_sizes) > 0 and all(0 < b <= t.n for b in t.batch_sizes),
    "toys.batch_sizes",
    f"need batch sizes in 1..n = {t.n}",
  )
  call = t.records_per_call * t.thin
  require(
    t.steps % call == 0,
    "toys.steps",
    f"{t.steps} is not a multiple of records_per_call * thin = {call}",
  )
  require(
    0 <= t.burn_in < t.steps and t.burn_in % t.thin == 0,
    "toys.burn_in",
    f"must be a multiple of thin = {t.thin} in [0, steps), got {t.burn_in}",
  )
  require(t.box > 0, "toys.box", "must be positive")
  lo, hi, count = t.temperatures
  require(
    0 < lo < 1 < hi and count % 2 == 1 and abs(lo * hi - 1) < 1e-9,
    "toys.temperatures",
    "need (lo, hi, odd count) with lo * hi = 1, so that the grid contains T = 1",
  )
  unknown = set(t.sgld_inits) - {"prior", "posterior"}
  require(not unknown, "toys.sgld_inits", f"unknown {sorted(unknown)}; choose prior or posterior")
  require(t.sgld_temperature > 0, "toys.sgld_temperature", "must be positive")
  require(0 < t.sgld_batch_size <= t.n, "toys.sgld_batch_size", f"must lie in 1..n = {t.n}")
  require(t.sgld_learning_rate > 0, "toys.sgld_learning_rate", "must be positive")
  for field in ("chains", "steps", "batch_size"):
    require_positive_int(config, f"llc.{field}")
  require(0 <= config.llc.burn_in < config.llc.steps, "llc.burn_in", "must lie in [0, steps)")
  require(config.llc.step_size > 0, "llc.step_size", "must be positive")


def phases(config: ml_collections.ConfigDict, experiments) -> list[Phase]:
  out = []
  if "toys" in experiments:
    out += chain_phases(config) + [summary_phase(config)]
  if "llc" in experiments:
    out.append(llc_phase(config))
  return out
