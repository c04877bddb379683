"""The DGN method's phases: data, seed-stacked training, evaluation under perturbations, the variance check.

Seeds are a vmapped axis: the state holds `config.num_seeds` independent networks (their own init and
their own data order), trained by one jitted step; evaluation runs the seeds as one vmap too.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import optim
from core import spiking_stability as stability
from core.data import batching
from core.data import spikes as spike_data
from core.nn import spiking
from methods.base import Phase, cached_per_config, with_changes

SYNTHETIC = ("temporal_digits", "mnist1d")
EVENT_DATA = tuple(spike_data.EVENT_FILES)
DATASETS = SYNTHETIC + EVENT_DATA
BASELINE_SUFFIX = "_lif"


# ---------------------------------------------------------------------------------------------------
# Configuration -> network
# ---------------------------------------------------------------------------------------------------


def network_config(config: ml_collections.ConfigDict) -> spiking.NetworkConfig:
  m = config.model
  neuron = spiking.NeuronConfig(
    dt=m.dt,
    tau_s=m.tau_s,
    g_l=m.g_l,
    threshold=m.threshold,
    phi=m.phi,
    surrogate=m.surrogate,
    surrogate_width=m.surrogate_width,
    detach_reset=m.detach_reset,
  )
  return spiking.NetworkConfig(
    kind=m.kind,
    n_in=config.data.channels,
    hidden_sizes=tuple(m.hidden_sizes),
    n_out=config.data.num_classes,
    recurrent=m.recurrent,
    neuron=neuron,
    w_scale=m.w_scale,
    readout_scale=m.readout_scale,
    c_scale=m.c_scale,
    reversal_init=m.reversal_init,
    scan_implementation=m.scan_implementation,
  )


def baseline_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The LIF network of the same size, trained beside the main model when `config.compare_lif`."""
  return with_changes(config, model__kind="lif")


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=4)
def load_splits(data: ml_collections.ConfigDict) -> dict:
  """`{"train": {"x", "y"} arrays or an EventDataset, "test": {"x", "y"} arrays}`."""
  if data.name == "temporal_digits":
    make = functools.partial(
      spike_data.temporal_order_digits,
      num_classes=data.num_classes,
      num_steps=data.num_steps,
      channels=data.channels,
      prototype_seed=data.prototype_seed,
      background_rate=data.background_rate,
    )
    train = make(2 * data.seed, data.train_per_class)
    test = make(2 * data.seed + 1, data.test_per_class)
  elif data.name == "mnist1d":
    num_train = data.train_per_class * data.num_classes
    num_test = data.test_per_class * data.num_classes
    both = spike_data.mnist1d_spikes(data.seed, num_train + num_test, data.channels, data.num_steps)
    train = {k: v[:num_train] for k, v in both.items()}
    test = {k: v[num_train:] for k, v in both.items()}
  else:
    event = functools.partial(
      spike_data.EventDataset,
      num_steps=data.num_steps,
      max_time=data.max_time,
      num_units=data.channels,
    )
    train = event(spike_data.event_file(data.data_dir, data.name, "train"))
    test_set = event(spike_data.event_file(data.data_dir, data.name, "test"))
    test = test_set[np.arange(min(len(test_set), data.max_test_examples))]
  return {"train": train, "test": test}


@dataclasses.dataclass
class SeedStackedBatches:
  """One shuffled batch per seed, stacked on axis 1: `x [B, S, T, C]`, `y [B, S]` (the batch axis
  stays first, so the loop shards it over devices)."""

  sources: list
  global_batch_size: int

  def batch(self, step: int, process_index: int = 0, process_count: int = 1):
    parts = [s.batch(step, process_index, process_count) for s in self.sources]
    return {name: np.stack([p[name] for p in parts], axis=1) for name in parts[0]}


def train_batches(config: ml_collections.ConfigDict) -> SeedStackedBatches:
  train, size = load_splits(config.data)["train"], config.batch_size
  seeds = [config.seed * 1000 + s for s in range(config.num_seeds)]
  if isinstance(train, dict):
    sources = [batching.from_arrays(train, size, seed) for seed in seeds]
  else:
    sources = [batching.IndexedBatches(train.__getitem__, len(train), size, s) for s in seeds]
  return SeedStackedBatches(sources, size)


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


def optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam on a warmup-cosine schedule with global-norm clipping (BPTT through Eq. 7)."""
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip)


def init_state(config: ml_collections.ConfigDict, rng, inputs=None) -> dict:
  del inputs
  net, opt = network_config(config), optimizer(config)
  keys = jax.vmap(lambda s: jax.random.fold_in(rng, s))(jnp.arange(config.num_seeds))
  params = jax.vmap(lambda key: spiking.init_network(key, net))(keys)
  return {"params": params, "opt_state": jax.vmap(opt.init)(params)}


def loss_and_metrics(net: spiking.NetworkConfig, params, x, y):
  """Cross-entropy of the time-averaged readout potential; accuracy and hidden firing rate."""
  forward = spiking.apply_network(params, x.astype(jnp.float32), net)
  loss = optax.softmax_cross_entropy_with_integer_labels(forward.logits, y).mean()
  accuracy = jnp.mean(jnp.argmax(forward.logits, -1) == y)
  rate = jnp.mean(jnp.stack([s.mean() for s in forward.hidden_spikes]))
  return loss, (accuracy, rate)


def train_step(config: ml_collections.ConfigDict, state, batch, rng):
  del rng
  net, opt = network_config(config), optimizer(config)

  def one_seed(params, opt_state, x, y):
    (loss, (accuracy, rate)), grads = jax.value_and_grad(
      lambda p: loss_and_metrics(net, p, x, y), has_aux=True
    )(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    metrics = (loss, accuracy, rate, optax.tree.norm(grads))
    return optax.apply_updates(params, updates), opt_state, metrics

  x, y = jnp.swapaxes(batch["x"], 0, 1), jnp.swapaxes(batch["y"], 0, 1)
  params, opt_state, metrics = jax.vmap(one_seed)(state["params"], state["opt_state"], x, y)
  loss, accuracy, rate, grad_norm = (m.mean() for m in metrics)
  step_metrics = {"loss": loss, "accuracy": accuracy, "firing_rate": rate, "grad_norm": grad_norm}
  return {"params": params, "opt_state": opt_state}, step_metrics


# ---------------------------------------------------------------------------------------------------
# Evaluation: clean, perturbed, attacked; spike counts
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=16)
def _evaluator(config: ml_collections.ConfigDict):
  """Jitted `(stacked params, x, y, valid) -> per seed (correct, hidden spikes, synaptic ops)`, summed
  over the chunk's valid rows; `x` is `[S, B, T, C]` (each seed sees its own perturbation draw)."""
  net = network_config(config)

  def one_seed(params, x, y, valid):
    x = x.astype(jnp.float32)
    forward = spiking.apply_network(params, x, net)
    correct = (jnp.argmax(forward.logits, -1) == y) & valid
    hidden = sum(s.sum(axis=(1, 2)) for s in forward.hidden_spikes)
    synops = spiking.synaptic_operations(x, forward, net)
    return correct.sum(), jnp.sum(hidden * valid), jnp.sum(synops * valid)

  return jax.jit(jax.vmap(one_seed, in_axes=(0, 0, None, None)))


@functools.cache
def _perturber(family: str, num_seeds: int):
  """Jitted `(x, key, strength) -> [S, B, T, C]`: one perturbation draw per seed; "clean" repeats."""

  def run(x, key, strength):
    if family == "clean":
      return jnp.broadcast_to(x, (num_seeds, *x.shape))
    keys = jax.random.split(key, num_seeds)
    return jax.vmap(lambda k: spike_data.perturb(k, x, family, strength))(keys)

  return jax.jit(run)


def _perturbed_sums(config, params, split, key, family: str, strength) -> list[np.ndarray]:
  evaluator, perturber = _evaluator(config), _perturber(family, config.num_seeds)
  totals = None
  for i, (x, y, valid) in enumerate(_chunks(split, config.eval.chunk)):
    x = perturber(x, jax.random.fold_in(key, i), jnp.asarray(strength, jnp.float32))
    out = [np.asarray(v, np.float64) for v in evaluator(params, x, y, valid)]
    totals = out if totals is None else [t + o for t, o in zip(totals, out, strict=True)]
  return totals


@cached_per_config(maxsize=8)
def _attacker(config: ml_collections.ConfigDict):
  """Jitted PGD (L-inf, random start) on inputs relaxed to [0, 1]: per seed the correct count."""
  net, steps = network_config(config), config.eval.pgd_steps

  def one_seed(params, x, y, valid, key, eps):
    x = x.astype(jnp.float32)
    step_size = config.eval.pgd_step_scale * eps / steps

    def loss(xa):
      logits = spiking.apply_network(params, xa, net).logits
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()

    def ascend(_, xa):
      xa = xa + step_size * jnp.sign(jax.grad(loss)(xa))
      return jnp.clip(jnp.clip(xa, x - eps, x + eps), 0.0, 1.0)

    start = jnp.clip(x + jax.random.uniform(key, x.shape, minval=-eps, maxval=eps), 0.0, 1.0)
    adversarial = jax.lax.fori_loop(0, steps, ascend, start)
    logits = spiking.apply_network(params, adversarial, net).logits
    return jnp.sum((jnp.argmax(logits, -1) == y) & valid)

  def run(params, x, y, valid, key, eps):
    keys = jax.random.split(key, config.num_seeds)
    return jax.vmap(one_seed, in_axes=(0, None, None, None, 0, None))(
      params, x, y, valid, keys, eps
    )

  return jax.jit(run)


def _chunks(split: dict, size: int):
  """`(x, y, valid)` chunks of `size` rows, the last padded by repeating its final row."""
  x, y = split["x"], split["y"]
  for start in range(0, len(y), size):
    xs, ys = x[start : start + size], y[start : start + size]
    pad = size - len(ys)
    valid = np.arange(size) < len(ys)
    if pad:
      xs = np.concatenate([xs, np.repeat(xs[-1:], pad, axis=0)])
      ys = np.concatenate([ys, np.repeat(ys[-1:], pad, axis=0)])
    yield jnp.asarray(xs), jnp.asarray(ys), jnp.asarray(valid)


def _attacked_correct(config, params, split, key, eps) -> np.ndarray:
  attack, total = _attacker(config), 0.0
  size = min(config.eval.chunk, len(split["y"]))
  for i, (x, y, valid) in enumerate(_chunks(split, size)):
    total = total + np.asarray(attack(params, x, y, valid, jax.random.fold_in(key, i), eps))
  return total


def _first_examples(split, count: int) -> dict:
  """The first `count` examples of arrays or of an EventDataset, as arrays."""
  if isinstance(split, dict):
    return {name: value[:count] for name, value in split.items()}
  return split[np.arange(min(count, len(split)))]


@cached_per_config(maxsize=16)
def _gate_fn(config: ml_collections.ConfigDict):
  """Jitted `(stacked params, x [S, B, T, C]) -> per seed the mean decay rho^t of the first hidden
  layer over neurons, steps and examples (its feed-forward conductance; Eq. 6)."""
  net = network_config(config)

  def one_seed(params, x):
    trace = spiking.synaptic_trace(x.astype(jnp.float32), net.neuron, net.scan_implementation)
    _, conductance = spiking.synaptic_drive(params["hidden"][0], trace, net.kind, net.neuron.dt)
    return spiking.decay_factor(0.0 if conductance is None else conductance, net.neuron).mean()

  return jax.jit(jax.vmap(one_seed))


def gate_diagnostics(config: ml_collections.ConfigDict, params, test: dict, rng) -> dict:
  """The gate at work: mean decay of the first hidden layer on clean inputs and with spikes inserted
  at the largest `eval.additive_probs` (LIF: the constant 1 - g_l dt), and the fraction of its
  conductance weights that are positive (`C`, or s-DGN's `C` signed like `E`)."""
  x = jnp.asarray(test["x"][: config.eval.chunk])
  p = max(config.eval.additive_probs, default=0.0)
  gate = _gate_fn(config)
  out = {
    "mean_decay_clean": np.asarray(
      gate(params, _perturber("clean", config.num_seeds)(x, rng, 0.0))
    ),
    "mean_decay_inserted": np.asarray(
      gate(params, _perturber("additive", config.num_seeds)(x, rng, jnp.float32(p)))
    ),
  }
  layer = params["hidden"][0]
  if "c" in layer:
    sign = jnp.sign(layer["e"])[:, None, :] if "e" in layer else 1.0
    out["positive_conductance_fraction"] = np.asarray(jnp.mean(sign * layer["c"] > 0, axis=(1, 2)))
  return {k: float(np.mean(v)) for k, v in out.items()}


def perturbation_grid(config: ml_collections.ConfigDict) -> dict[str, list]:
  """The perturbed test conditions: `{family: [strength, ...]}` (never seen in training)."""
  e = config.eval
  return {
    "additive": [float(p) for p in e.additive_probs],
    "subtractive": [float(p) for p in e.subtractive_probs],
    "mixed": [tuple(float(v) for v in pair) for pair in e.mixed_probs],
    "jitter": [float(s) for s in e.jitter_sigmas],
  }


def evaluate(config: ml_collections.ConfigDict, params, rng) -> dict:
  """Clean and perturbed test accuracy per seed; `robust_accuracy` is the mean accuracy over every
  perturbed condition of `perturbation_grid` (the paper's "overall robustness"); spike counts per
  inference (hidden layers) and synaptic operations (the SNN energy proxy), on clean test data."""
  splits = load_splits(config.data)
  test = splits["test"]
  n = len(test["y"])
  correct, hidden, synops = _perturbed_sums(config, params, test, rng, "clean", 0.0)
  net = network_config(config)
  results = {
    "clean_accuracy": float(correct.mean() / n),
    "clean_accuracy_per_seed": correct / n,
    "spikes_per_inference": float(hidden.mean() / n),
    "firing_rate": float(hidden.mean() / n / (config.data.num_steps * sum(net.hidden_sizes))),
    "synaptic_ops_per_inference": float(synops.mean() / n),
    "num_params": float(spiking.num_params(jax.tree.map(lambda p: p[0], params))),
  }
  train_subset = _first_examples(splits["train"], config.eval.num_train_examples)
  train_correct = _perturbed_sums(config, params, train_subset, rng, "clean", 0.0)[0]
  results["train_accuracy"] = float(train_correct.mean() / len(train_subset["y"]))
  perturbed = []
  for index, (family, strengths) in enumerate(perturbation_grid(config).items()):
    key = jax.random.fold_in(rng, index + 1)
    curve = np.stack(
      [
        _perturbed_sums(config, params, test, jax.random.fold_in(key, j), family, s)[0] / n
        for j, s in enumerate(strengths)
      ],
      axis=1,
    )  # [S, strengths]
    results[f"accuracy_{family}"] = curve
    perturbed.append(curve)
  robust = np.concatenate(perturbed, axis=1).mean(axis=1)
  results.update(gate_diagnostics(config, params, test, jax.random.fold_in(rng, 99)))
  results["robust_accuracy"] = float(robust.mean())
  results["robust_accuracy_per_seed"] = robust
  if config.eval.pgd_epsilons:
    key = jax.random.fold_in(rng, 100)
    attacked = _first_examples(test, config.eval.pgd_examples)
    m = len(attacked["y"])
    curve = np.stack(
      [
        _attacked_correct(config, params, attacked, jax.random.fold_in(key, j), eps) / m
        for j, eps in enumerate(config.eval.pgd_epsilons)
      ],
      axis=1,
    )
    results["accuracy_pgd"] = curve
    results["pgd_accuracy"] = float(curve.mean())
  return results


# ---------------------------------------------------------------------------------------------------
# The variance check of Eq. 13-14
# ---------------------------------------------------------------------------------------------------


def variance_check(config: ml_collections.ConfigDict, rng) -> dict:
  """One neuron with shared white-noise inputs, its conductances scaled by each of
  `stability.conductance_scales`: Eq. 13 (linearised), the exact Ito variance and Euler-Maruyama."""
  s = config.stability
  w, mu, sigma = (jnp.asarray(v, jnp.float32) for v in (s.weights, s.means, s.stds))
  simulate = jax.jit(
    functools.partial(
      stability.simulate_variance,
      g_l=s.g_l,
      dt=s.dt,
      num_steps=s.num_steps,
      num_chains=s.num_chains,
      burn_in=s.burn_in,
    )
  )
  formula, exact, simulated = [], [], []
  for i, scale in enumerate(s.conductance_scales):
    c = scale * jnp.asarray(s.conductances, jnp.float32)
    formula.append(float(stability.dgn_variance(w, c, mu, sigma, s.g_l)))
    exact.append(float(stability.ito_variance(w, c, mu, sigma, s.g_l)))
    simulated.append(float(simulate(jax.random.fold_in(rng, i), w, c, mu, sigma)))
  lif = float(stability.lif_variance(w, sigma, s.g_l))
  zero = jnp.zeros_like(w)
  lif_simulated = float(
    simulate(jax.random.fold_in(rng, len(s.conductance_scales)), w, zero, mu, sigma)
  )
  formula, exact, simulated = (np.asarray(v) for v in (formula, exact, simulated))
  return {
    "variance_conductance_scales": np.asarray(s.conductance_scales, np.float64),
    "variance_dgn_formula": formula,
    "variance_dgn_ito": exact,
    "variance_dgn_simulated": simulated,
    "variance_lif_formula": lif,
    "variance_lif_simulated": lif_simulated,
    "variance_formula_max_relative_error": float(np.max(np.abs(simulated / formula - 1))),
    "variance_ito_max_relative_error": float(np.max(np.abs(simulated / exact - 1))),
  }


# ---------------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------------


def _training_phase(config: ml_collections.ConfigDict, name: str, suffix: str) -> Phase:
  def evaluate_phase(state, rng, inputs):
    return {k + suffix: v for k, v in evaluate(config, state["params"], rng).items()}

  return Phase(
    name=name,
    num_steps=config.steps,
    init=functools.partial(init_state, config),
    step=functools.partial(train_step, config),
    data=lambda inputs: train_batches(config),
    evaluate=evaluate_phase,
    outputs=lambda state, inputs: {"params": state["params"]},
  )


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  """`train` (the configured neuron), `train_lif` (the same network with LIF neurons, when
  `compare_lif`: its results carry the suffix `_lif`), `stability` (the Eq. 13-14 check, when
  `stability.enabled`)."""
  out = [_training_phase(config, "train", "")]
  if config.compare_lif and config.model.kind != "lif":
    out.append(_training_phase(baseline_config(config), "train_lif", BASELINE_SUFFIX))
  if config.stability.enabled:
    out.append(
      Phase(
        name="stability",
        num_steps=0,
        init=lambda rng, inputs: {"scales": jnp.asarray(config.stability.conductance_scales)},
        evaluate=lambda state, rng, inputs: variance_check(config, rng),
      )
    )
  return out
