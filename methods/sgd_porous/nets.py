"""D2 (late-stage SGD on an MLP, with LLC tracking) and D3 (an ensemble of SGD-trained nets on two moons
against the local posterior) of "Almost Bayesian: Dynamics of SGD Through Singular Learning Theory".

D2, as the paper's fully connected nets (Sec. 4): `digits_pretrain` trains one MLP per seed with Adam;
`digits_late` continues each from there with vanilla SGD (or Adam, the paper's contrast) at every
learning rate of `config.digits.learning_rates` (chains = rates x seeds, vmapped), records
`R(t) = ||w_t - w_t0||` every `record_every` steps and the localised-SGLD LLC of each chain every
`llc_every` steps (one loop step). Evaluation fits `log R = s log t + c` per chain (Def. 3.3) and
reports `s`, its r^2, the mean LLC and its relative spread (near-stability, Hyp. 3.1), and the
spectral dimension `d_s = 2 lambda s`, to be compared with the bound `d_s <= lambda` (Lemma 3.4).

D3, the paper's moons experiment (Sec. 4): `moons_train` trains `config.moons.nets` MLPs by SGD in
parallel from one set of initial nets and records each net's displacement after `late_start`;
`moons_sgld` runs SGLD ensembles from the same initial nets at each of `config.moons.sgld_temperatures`
(the paper's SGLD-approximated local posterior, tempered); `moons_posterior` clusters all nets by their
function signature (predicted class on a grid) and compares SGD's cluster masses with each SGLD
ensemble's in KL(posterior || SGD) (the paper's direction; counts smoothed by half a count), JS and W1
(Hamming distance between cluster signatures as the ground cost). It also measures SGD's Mandt
temperature T_M, the porous correction `D_xi = xi^(2 - 1/s)` from the ensemble's exponent s (xi = 0.5
as the paper), and compares SGD's masses with the free-energy masses
`∝ exp(-(n L_k / T + lambda_k log(n / T)))` (per-cluster LLC) at T = 1, T_M, T_M D_xi and the best T.

Choices where the paper is open: all 1797 digits are the training set (the paper's quantities are
training-loss geometry); minibatches are drawn with replacement; a late-stage Adam starts from fresh
moments; the LLC of D2 uses minibatch losses
as devinterp does; a cluster's `n L_k` and `lambda_k` are means over its nets; no multiplicity factor
for symmetric copies (signatures are functions, so permutations are already merged).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from core import slt
from core.data import slt as slt_data
from core.nn.mlp import MLP
from methods.base import Phase, cached_per_config

# ---------------------------------------------------------------------------------------------------
# Shared: per-chain minibatch updates of vmapped nets
# ---------------------------------------------------------------------------------------------------


def _broadcast(per_chain, leaf):
  return jnp.reshape(per_chain, (-1,) + (1,) * (leaf.ndim - 1))


def chain_grads(loss_fn, params, x, y, key, batch_size: int):
  """Each chain's loss and gradient on its own minibatch (drawn with replacement)."""
  chains = jax.tree.leaves(params)[0].shape[0]
  idx = slt.minibatch_indices(key, (chains, batch_size), x.shape[0])
  return jax.vmap(jax.value_and_grad(loss_fn))(params, x[idx], y[idx])


def sgd_update(params, grads, learning_rate):
  return jax.tree.map(lambda p, g: p - _broadcast(learning_rate, p) * g, params, grads)


def adam_update(params, grads, opt_state, learning_rate):
  """Adam with a per-chain learning rate (`optax.scale_by_adam` is shared, the rate is an array)."""
  updates, opt_state = jax.vmap(optax.scale_by_adam().update)(grads, opt_state, params)
  return jax.tree.map(lambda p, u: p - _broadcast(learning_rate, p) * u, params, updates), opt_state


def tile_chains(params, times: int):
  return jax.tree.map(lambda p: jnp.tile(p, (times,) + (1,) * (p.ndim - 1)), params)


def chain_distance(params, reference) -> jax.Array:
  """`||w - w_ref||` per chain over all parameters."""
  squares = jax.tree.map(
    lambda p, r: jnp.sum((p - r).reshape(p.shape[0], -1) ** 2, 1), params, reference
  )
  return jnp.sqrt(sum(jax.tree.leaves(squares)))


# ---------------------------------------------------------------------------------------------------
# D2: late-stage diffusion of an MLP
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=4)
def digits_data(config) -> dict[str, np.ndarray]:
  d = config.digits
  if d.dataset == "digits":
    return slt_data.digits()
  return slt_data.tfds_classification(d.dataset, d.data_dir)


def digits_model(config) -> MLP:
  return MLP(hidden=tuple(config.digits.hidden), num_outputs=config.digits.num_classes)


def classification_loss(model, params, x, y):
  logits = model.apply(params, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def init_pretrain(config, rng, inputs=None):
  del inputs
  x = jnp.asarray(digits_data(config)["x"])
  keys = jax.random.split(rng, config.digits.seeds)
  params = jax.vmap(lambda k: digits_model(config).init(k, x[:1]))(keys)
  return {"params": params, "opt_state": jax.vmap(optax.scale_by_adam().init)(params)}


def pretrain_step(config, state, batch, rng):
  """`pretrain_steps_per_call` Adam steps of every seed's net, each on its own minibatch."""
  del batch
  d, data = config.digits, digits_data(config)
  x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
  loss_fn = functools.partial(classification_loss, digits_model(config))
  lr = jnp.full((d.seeds,), d.pretrain_learning_rate)

  def iteration(carry, key):
    params, opt_state = carry
    loss, grads = chain_grads(loss_fn, params, x, y, key, d.batch_size)
    params, opt_state = adam_update(params, grads, opt_state, lr)
    return (params, opt_state), loss.mean()

  keys = jax.random.split(rng, d.pretrain_steps_per_call)
  (params, opt_state), losses = jax.lax.scan(iteration, (state["params"], state["opt_state"]), keys)
  return {"params": params, "opt_state": opt_state}, {"loss": losses.mean()}


def train_accuracy(config, params) -> np.ndarray:
  """Per-chain accuracy on the whole training set."""
  data, model = digits_data(config), digits_model(config)
  x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
  logits = jax.jit(jax.vmap(lambda p: model.apply(p, x)))(params)
  return np.asarray(jnp.mean(jnp.argmax(logits, -1) == y[None], -1))


def evaluate_pretrain(config, state) -> dict:
  accuracy = train_accuracy(config, state["params"])
  return {"digits_pretrain_accuracy": float(accuracy.min())}


def late_shape(config) -> tuple[int, int, int]:
  """(chains, records, LLC measurements) of the late-stage phase."""
  d = config.digits
  return len(d.learning_rates) * d.seeds, d.steps // d.record_every, d.steps // d.llc_every


def init_late(config, rng, inputs):
  del rng
  d = config.digits
  chains, records, calls = late_shape(config)
  params = tile_chains(inputs["digits_pretrain"]["params"], len(d.learning_rates))
  opt_state = jax.vmap(optax.scale_by_adam().init)(params) if d.optimizer == "adam" else {}
  return {
    "params": params,
    "reference": params,
    "opt_state": opt_state,
    "t": jnp.zeros((), jnp.int32),
    "radius": jnp.zeros((chains, records), jnp.float32),
    "llc": jnp.zeros((chains, calls), jnp.float32),
  }


def digits_llc_settings(config) -> slt.LLCSettings:
  c = config.digits.llc
  return slt.LLCSettings(c.step_size, c.localization, c.chains, c.steps, c.burn_in)


def net_llc(loss_fn, x, y, params, key, settings, batch_size: int):
  """Localised-SGLD LLC of one net with minibatch losses (devinterp's estimator)."""
  n = x.shape[0]

  def sample(k):
    idx = slt.minibatch_indices(k, (batch_size,), n)
    return x[idx], y[idx]

  return slt.estimate_llc(lambda p, b: loss_fn(p, *b), params, sample, n, key, settings)["llc"]


def late_step(config, state, batch, rng):
  """`llc_every` optimiser steps of every chain (R(t) every `record_every`), then each chain's LLC."""
  del batch
  d, data = config.digits, digits_data(config)
  x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
  loss_fn = functools.partial(classification_loss, digits_model(config))
  lr = jnp.repeat(jnp.asarray(d.learning_rates, jnp.float32), d.seeds)

  def iteration(carry, key):
    params, opt_state = carry
    loss, grads = chain_grads(loss_fn, params, x, y, key, d.batch_size)
    if d.optimizer == "adam":
      params, opt_state = adam_update(params, grads, opt_state, lr)
    else:
      params = sgd_update(params, grads, lr)
    return (params, opt_state), loss.mean()

  def record(carry, key):
    (params, opt_state), t, radius = carry
    (params, opt_state), losses = jax.lax.scan(
      iteration, (params, opt_state), jax.random.split(key, d.record_every)
    )
    t = t + d.record_every
    column = chain_distance(params, state["reference"])[:, None]
    radius = jax.lax.dynamic_update_slice(radius, column, (0, t // d.record_every - 1))
    return ((params, opt_state), t, radius), losses.mean()

  train_key, llc_key = jax.random.split(rng)
  carry = ((state["params"], state["opt_state"]), state["t"], state["radius"])
  keys = jax.random.split(train_key, d.llc_every // d.record_every)
  ((params, opt_state), t, radius), losses = jax.lax.scan(record, carry, keys)
  chains = late_shape(config)[0]
  llc = jax.vmap(
    lambda p, k: net_llc(loss_fn, x, y, p, k, digits_llc_settings(config), d.llc.batch_size)
  )(params, jax.random.split(llc_key, chains))
  llc_table = jax.lax.dynamic_update_slice(state["llc"], llc[:, None], (0, t // d.llc_every - 1))
  new_state = dict(state, params=params, opt_state=opt_state, t=t, radius=radius, llc=llc_table)
  return new_state, {"loss": losses.mean(), "llc": llc.mean()}


def evaluate_late(config, state) -> dict:
  """Per learning rate (means over seeds): exponent s, r^2, mean LLC and its spread, d_s."""
  d = config.digits
  radius, llc = np.asarray(state["radius"], np.float64), np.asarray(state["llc"], np.float64)
  steps = d.record_every * np.arange(1, radius.shape[1] + 1)
  fits = np.array([slt.power_law_fit(steps, r) for r in radius])
  slopes, r2 = fits[:, 0], fits[:, 2]
  half = radius.shape[1] // 2
  late = np.array([slt.power_law_fit(steps[half:], r[half:])[0] for r in radius])
  llc_mean = llc.mean(1)
  llc_spread = llc.std(1) / np.maximum(np.abs(llc_mean), 1e-12)
  spectral = slt.spectral_dimension(llc_mean, slopes)
  accuracy = train_accuracy(config, state["params"])
  per_lr = lambda v: np.asarray(v).reshape(len(d.learning_rates), d.seeds).mean(1)
  out = {
    "diffusion_exponent": float(per_lr(slopes)[0]),
    "diffusion_exponent_r2": float(per_lr(r2)[0]),
    "digits_exponents": per_lr(slopes),
    "digits_exponent_r2": per_lr(r2),
    "digits_exponents_second_half": per_lr(late),
    "digits_llc": per_lr(llc_mean),
    "digits_llc_spread": per_lr(llc_spread),
    "digits_spectral_dims": per_lr(spectral),
    "digits_ds_below_llc_fraction": float(np.mean(spectral <= llc_mean)),
    "digits_final_accuracy": per_lr(accuracy),
    "digits_radius": radius.reshape(len(d.learning_rates), d.seeds, -1).mean(1),
    "digits_llc_trace": llc.reshape(len(d.learning_rates), d.seeds, -1).mean(1),
    "digits_record_steps": steps.astype(np.float64),
    "digits_learning_rates": np.asarray(d.learning_rates, np.float64),
  }
  for i, lr in enumerate(d.learning_rates):
    prefix = f"digits_{d.optimizer}_lr{lr:g}"
    out[f"{prefix}_exponent"] = float(out["digits_exponents"][i])
    out[f"{prefix}_llc"] = float(out["digits_llc"][i])
    out[f"{prefix}_spectral_dim"] = float(out["digits_spectral_dims"][i])
  return out


def digits_phases(config) -> list[Phase]:
  d = config.digits
  return [
    Phase(
      name="digits_pretrain",
      num_steps=d.pretrain_steps // d.pretrain_steps_per_call,
      init=functools.partial(init_pretrain, config),
      step=functools.partial(pretrain_step, config),
      evaluate=lambda state, rng, inputs: evaluate_pretrain(config, state),
      outputs=lambda state, inputs: {"params": state["params"]},
    ),
    Phase(
      name="digits_late",
      num_steps=d.steps // d.llc_every,
      init=functools.partial(init_late, config),
      step=functools.partial(late_step, config),
      evaluate=lambda state, rng, inputs: evaluate_late(config, state),
    ),
  ]


# ---------------------------------------------------------------------------------------------------
# D3: an SGD ensemble on two moons against the local posterior
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=4)
def moons_data(config) -> dict[str, np.ndarray]:
  m = config.moons
  data = slt_data.moons(m.n, m.noise, m.data_seed)
  return {**data, "grid": slt_data.moons_grid(data["x"], m.grid)}


def moons_model(config) -> MLP:
  return MLP(hidden=tuple(config.moons.hidden), num_outputs=1)


def logistic_loss(model, params, x, y):
  logits = model.apply(params, x)[:, 0]
  return optax.sigmoid_binary_cross_entropy(logits, y.astype(logits.dtype)).mean()


def moons_unravel(config):
  """Nets are flat vectors in the state (one noise draw per SGLD step); this maps one back."""
  template = moons_model(config).init(jax.random.key(0), jnp.zeros((1, 2), jnp.float32))
  return ravel_pytree(template)[1]


def moons_flat_loss(config):
  model, unravel = moons_model(config), moons_unravel(config)
  return lambda flat, x, y: logistic_loss(model, unravel(flat), x, y)


def moons_records(config) -> int:
  m = config.moons
  return (m.steps - m.late_start) // m.record_every


def init_moons(config, temperatures, rng, inputs=None):
  """Every ensemble starts from the same nets (drawn from `config.seed`, not the phase's rng), so SGD
  and the SGLD ensembles differ only in their noise."""
  del rng, inputs
  m = config.moons
  x = jnp.asarray(moons_data(config)["x"])
  keys = jax.random.split(jax.random.fold_in(jax.random.key(config.seed), 7), m.nets)
  flat = jax.vmap(lambda k: ravel_pytree(moons_model(config).init(k, x[:1]))[0])(keys)
  flat = jnp.tile(flat, (len(temperatures), 1))
  return {
    "params": flat,
    "reference": flat,
    "t": jnp.zeros((), jnp.int32),
    "radius": jnp.zeros((flat.shape[0], moons_records(config)), jnp.float32),
  }


def moons_step(config, temperatures, state, batch, rng):
  """`steps_per_call` SGD (T = 0) or SGLD steps of every net; displacement from `late_start` every
  `record_every`."""
  del batch
  m, data = config.moons, moons_data(config)
  x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
  loss_fn = moons_flat_loss(config)
  lr = jnp.full((state["params"].shape[0],), m.learning_rate)
  noise = slt.sgld_noise_std(lr, m.n, jnp.repeat(jnp.asarray(temperatures, jnp.float32), m.nets))

  def iteration(params, key):
    batch_key, noise_key = jax.random.split(key)
    loss, grads = chain_grads(loss_fn, params, x, y, batch_key, m.batch_size)
    return slt.langevin_update(params, grads, lr, noise, noise_key), loss.mean()

  def record(carry, key):
    params, reference, t, radius = carry
    params, losses = jax.lax.scan(iteration, params, jax.random.split(key, m.record_every))
    t = t + m.record_every
    reference = jnp.where(t == m.late_start, params, reference)
    index = jnp.clip((t - m.late_start) // m.record_every - 1, 0, radius.shape[1] - 1)
    distance = jnp.linalg.norm(params - reference, axis=-1)
    column = jnp.where(t > m.late_start, distance, radius[:, index])
    radius = jax.lax.dynamic_update_slice(radius, column[:, None], (0, index))
    return (params, reference, t, radius), losses.mean()

  carry = (state["params"], state["reference"], state["t"], state["radius"])
  keys = jax.random.split(rng, m.steps_per_call // m.record_every)
  (params, reference, t, radius), losses = jax.lax.scan(record, carry, keys)
  return {"params": params, "reference": reference, "t": t, "radius": radius}, {
    "loss": losses.mean()
  }


def moons_llc_settings(config) -> slt.LLCSettings:
  c = config.moons.llc
  return slt.LLCSettings(c.step_size, c.localization, c.chains, c.steps, c.burn_in)


def signatures(config, flat_params) -> np.ndarray:
  """Each net's predicted class on the grid, `(nets, grid^2)` bool: its function signature."""
  grid = jnp.asarray(moons_data(config)["grid"])
  model, unravel = moons_model(config), moons_unravel(config)
  apply = jax.jit(jax.vmap(lambda f: model.apply(unravel(f), grid)[:, 0] > 0))
  return np.asarray(apply(flat_params))


def per_net_statistics(config, flat_params, key) -> dict[str, np.ndarray]:
  """Each SGD net's full-data loss, accuracy, LLC and Mandt noise sigma_g^2."""
  m, data = config.moons, moons_data(config)
  x, y = jnp.asarray(data["x"]), jnp.asarray(data["y"])
  loss_fn = moons_flat_loss(config)
  model, unravel = moons_model(config), moons_unravel(config)

  def one(f, k):
    per_sample = jax.vmap(lambda xi, yi: jax.grad(loss_fn)(f, xi[None], yi[None]))(x, y)
    return {
      "loss": loss_fn(f, x, y),
      "accuracy": jnp.mean((model.apply(unravel(f), x)[:, 0] > 0) == (y == 1)),
      "llc": net_llc(loss_fn, x, y, f, k, moons_llc_settings(config), m.llc.batch_size),
      "sigma2": slt.gradient_noise_variance(per_sample),
    }

  keys = jax.random.split(key, flat_params.shape[0])
  return jax.tree.map(np.asarray, jax.jit(jax.vmap(one))(flat_params, keys))


def _smoothed(counts) -> np.ndarray:
  """Cluster masses from counts with half a count added to every cluster (so KL stays finite)."""
  counts = np.asarray(counts, np.float64) + 0.5
  return counts / counts.sum()


def ensemble_comparison(config, sgd_labels, sgld_labels, cost) -> dict:
  """SGD's cluster masses against each SGLD ensemble's (the local posterior at temperature T)."""
  m = config.moons
  k = cost.shape[0]
  sgd = np.bincount(sgd_labels, minlength=k)
  out = {"moons_sgd_masses": sgd / sgd.sum()}
  js = []
  for i, t in enumerate(m.sgld_temperatures):
    sgld = np.bincount(sgld_labels[i], minlength=k)
    out[f"moons_sgld_T{t:g}_masses"] = sgld / sgld.sum()
    out[f"moons_kl_sgld_T{t:g}"] = slt.kl_divergence(_smoothed(sgld), _smoothed(sgd))
    out[f"moons_js_sgld_T{t:g}"] = slt.js_divergence(sgld / sgld.sum(), sgd / sgd.sum())
    out[f"moons_w1_sgld_T{t:g}"] = slt.discrete_w1(sgld, sgd, cost)
    js.append(out[f"moons_js_sgld_T{t:g}"])
  out["moons_t_best_sgld"] = float(m.sgld_temperatures[int(np.argmin(js))])
  return out


def free_energy_comparison(config, labels, stats, t_mandt: float, t_xi: float) -> dict:
  """SGD's masses on its own clusters against `∝ exp(-(n L_k / T + lambda_k log(n / T)))`."""
  m = config.moons
  k = labels.max() + 1
  sgd = np.bincount(labels, minlength=k) / len(labels)
  n_loss = np.array([m.n * stats["loss"][labels == c].mean() for c in range(k)])
  llc = np.array([stats["llc"][labels == c].mean() for c in range(k)])
  temperatures = np.geomspace(1e-3, 1e3, 121)
  kls = [slt.kl_divergence(slt.free_energy_masses(n_loss, llc, m.n, t), sgd) for t in temperatures]
  out = {"moons_cluster_llc": llc, "moons_cluster_n_loss": n_loss}
  chosen = {"1": 1.0, "mandt": t_mandt, "xi": t_xi, "best": float(temperatures[np.argmin(kls)])}
  out["moons_t_best_free_energy"] = chosen["best"]
  for name, t in chosen.items():
    ok = np.isfinite(t) and t > 0
    out[f"moons_kl_free_energy_{name}"] = (
      slt.kl_divergence(slt.free_energy_masses(n_loss, llc, m.n, t), sgd) if ok else float("nan")
    )
  return out


def evaluate_moons(config, rng, inputs) -> dict:
  m = config.moons
  sgd_state, sgld_state = inputs["moons_train"], inputs["moons_sgld"]
  sgd_sig = signatures(config, sgd_state["params"])
  sgld_sig = signatures(config, sgld_state["params"])
  labels = slt.leader_clusters(np.concatenate([sgd_sig, sgld_sig]), m.cluster_radius)
  sgd_labels, sgld_labels = labels[: m.nets], labels[m.nets :].reshape(-1, m.nets)
  k = labels.max() + 1
  centre = np.array(
    [np.concatenate([sgd_sig, sgld_sig])[labels == c].mean(0) > 0.5 for c in range(k)]
  )
  cost = (centre[:, None, :] != centre[None, :, :]).mean(-1)
  stats = per_net_statistics(config, sgd_state["params"], rng)
  radius = np.asarray(sgd_state["radius"], np.float64)
  steps = m.record_every * np.arange(1, radius.shape[1] + 1)
  slope = float(np.nanmean([slt.power_law_fit(steps, r)[0] for r in radius]))
  t_mandt = float(slt.mandt_temperature(m.learning_rate, m.n, m.batch_size, stats["sigma2"].mean()))
  d_xi = float(slt.porous_diffusion_coefficient(m.xi, slope)) if slope > 0 else float("nan")
  out = {
    "moons_num_clusters": float(k),
    "moons_sgd_clusters": float(len(np.unique(sgd_labels))),
    "moons_exponent": slope,
    "moons_d_xi": d_xi,
    "moons_t_mandt": t_mandt,
    "moons_t_xi": t_mandt * d_xi,
    "moons_llc_mean": float(stats["llc"].mean()),
    "moons_accuracy_mean": float(stats["accuracy"].mean()),
    "moons_sgld_temperatures": np.asarray(m.sgld_temperatures, np.float64),
  }
  out.update(ensemble_comparison(config, sgd_labels, sgld_labels, cost))
  relabelled = np.unique(sgd_labels, return_inverse=True)[1].reshape(-1)
  out.update(free_energy_comparison(config, relabelled, stats, t_mandt, t_mandt * d_xi))
  return out


def moons_phases(config) -> list[Phase]:
  m = config.moons
  sgd, sgld = (0.0,), tuple(m.sgld_temperatures)
  return [
    Phase(
      name="moons_train",
      num_steps=m.steps // m.steps_per_call,
      init=functools.partial(init_moons, config, sgd),
      step=functools.partial(moons_step, config, sgd),
    ),
    Phase(
      name="moons_sgld",
      num_steps=m.steps // m.steps_per_call,
      init=functools.partial(init_moons, config, sgld),
      step=functools.partial(moons_step, config, sgld),
    ),
    Phase(
      name="moons_posterior",
      num_steps=0,
      init=lambda rng, inputs: {"done": jnp.zeros((), jnp.int32)},
      evaluate=lambda state, rng, inputs: evaluate_moons(config, rng, inputs),
    ),
  ]


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


def validate(config, require, require_positive_int, require_choice) -> None:
  d, m = config.digits, config.moons
  if "digits" in config.experiments:
    require_choice(config, "digits.optimizer", ("sgd", "adam"))
    if d.dataset != "digits":
      require(
        bool(d.data_dir),
        "digits.data_dir",
        f"dataset {d.dataset!r} is read from a prepared tfds data_dir (never downloaded); set it",
      )
    for field in (
      "seeds",
      "batch_size",
      "pretrain_steps",
      "pretrain_steps_per_call",
      "steps",
      "record_every",
      "llc_every",
      "num_classes",
      "llc.chains",
      "llc.steps",
      "llc.batch_size",
    ):
      require_positive_int(config, f"digits.{field}")
    require(
      d.pretrain_steps % d.pretrain_steps_per_call == 0,
      "digits.pretrain_steps",
      "must be a multiple of pretrain_steps_per_call",
    )
    require(
      d.llc_every % d.record_every == 0, "digits.llc_every", "must be a multiple of record_every"
    )
    require(d.steps % d.llc_every == 0, "digits.steps", "must be a multiple of llc_every")
    require(
      len(d.learning_rates) > 0 and all(lr > 0 for lr in d.learning_rates),
      "digits.learning_rates",
      "need at least one positive learning rate",
    )
    require(0 <= d.llc.burn_in < d.llc.steps, "digits.llc.burn_in", "must lie in [0, steps)")
  if "moons" in config.experiments:
    for field in (
      "n",
      "nets",
      "batch_size",
      "steps",
      "steps_per_call",
      "record_every",
      "grid",
      "llc.chains",
      "llc.steps",
      "llc.batch_size",
    ):
      require_positive_int(config, f"moons.{field}")
    require(
      m.steps % m.steps_per_call == 0 and m.steps_per_call % m.record_every == 0,
      "moons.steps_per_call",
      "steps must be a multiple of it, and it of record_every",
    )
    require(
      0 <= m.late_start < m.steps and m.late_start % m.record_every == 0,
      "moons.late_start",
      "must be a multiple of record_every in [0, steps)",
    )
    require(
      (m.steps - m.late_start) // m.record_every >= 3,
      "moons.late_start",
      "leaves fewer than 3 displacement records",
    )
    require(0 < m.xi, "moons.xi", "must be positive")
    require(
      len(m.sgld_temperatures) > 0 and all(t > 0 for t in m.sgld_temperatures),
      "moons.sgld_temperatures",
      "need at least one positive temperature",
    )
    require(0 <= m.llc.burn_in < m.llc.steps, "moons.llc.burn_in", "must lie in [0, steps)")


def phases(config: ml_collections.ConfigDict, experiments) -> list[Phase]:
  out = []
  if "digits" in experiments:
    out += digits_phases(config)
  if "moons" in experiments:
    out += moons_phases(config)
  return out
