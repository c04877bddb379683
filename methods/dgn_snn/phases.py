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

from core import attacks, optim
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
def _attacker(config: ml_collections.ConfigDict, name: str):
  """Jitted L-inf attack `name` (`core.attacks`: FGSM, BIM, PGD) on inputs relaxed to [0, 1], through
  the surrogate gradients: per seed the count of attacked examples still classified correctly."""
  net, e = network_config(config), config.eval

  def one_seed(params, x, y, valid, key, eps):
    x = x.astype(jnp.float32)

    def loss(xa):
      logits = spiking.apply_network(params, xa, net).logits
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()

    step_size = e.attack_step_scale * eps / e.attack_steps
    adversarial = attacks.attack(name, loss, x, eps, e.attack_steps, step_size, key)
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


def _attacked_correct(config, params, split, key, name: str, eps) -> np.ndarray:
  attack, total = _attacker(config, name), 0.0
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


RANDOM_FAMILIES = ("additive", "subtractive", "mixed")  # averaged into robust_accuracy


def evaluate(config: ml_collections.ConfigDict, params, rng) -> dict:
  """Clean and perturbed test accuracy per seed, and spike counts on clean test data.

  `robust_accuracy` is the mean accuracy over the random spike perturbations (insertion, deletion,
  mixed: the paper's "overall robustness"); `jitter_accuracy` is reported apart (on these data every
  model keeps its clean accuracy under jitter, so averaging it in would dilute the comparison);
  `adversarial_accuracy` is the mean over every gradient attack of `eval.attacks` (FGSM, BIM, PGD) and
  epsilon, each also as `accuracy_<attack>` `[seed, eps]` and `<attack>_accuracy`. Spikes per
  inference (hidden layers) and synaptic operations are the SNN energy proxy."""
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
  for index, (family, strengths) in enumerate(perturbation_grid(config).items()):
    key = jax.random.fold_in(rng, index + 1)
    curve = [
      _perturbed_sums(config, params, test, jax.random.fold_in(key, j), family, s)[0] / n
      for j, s in enumerate(strengths)
    ]
    results[f"accuracy_{family}"] = (
      np.stack(curve, axis=1) if curve else np.zeros((len(correct), 0))
    )
  random = np.concatenate([results[f"accuracy_{f}"] for f in RANDOM_FAMILIES], axis=1)
  results["robust_accuracy_per_seed"] = random.mean(axis=1)
  results["robust_accuracy"] = float(random.mean())
  if np.size(results["accuracy_jitter"]):
    results["jitter_accuracy_per_seed"] = results["accuracy_jitter"].mean(axis=1)
    results["jitter_accuracy"] = float(results["accuracy_jitter"].mean())
  results.update(gate_diagnostics(config, params, test, jax.random.fold_in(rng, 99)))
  if config.eval.attacks and config.eval.attack_epsilons:
    results.update(attack_accuracies(config, params, test, jax.random.fold_in(rng, 100)))
  return results


def attack_accuracies(config: ml_collections.ConfigDict, params, test, key) -> dict:
  """Per attack of `eval.attacks`, accuracy `[seed, eps]` on the first `eval.attack_examples` test
  examples; `adversarial_accuracy` is the mean over attacks and epsilons."""
  attacked = _first_examples(test, config.eval.attack_examples)
  m, out, curves = len(attacked["y"]), {}, []
  for i, name in enumerate(config.eval.attacks):
    attack_key = jax.random.fold_in(key, i)
    curve = np.stack(
      [
        _attacked_correct(config, params, attacked, jax.random.fold_in(attack_key, j), name, eps)
        / m
        for j, eps in enumerate(config.eval.attack_epsilons)
      ],
      axis=1,
    )
    out[f"accuracy_{name}"], out[f"{name}_accuracy"] = curve, float(curve.mean())
    curves.append(curve)
  adversarial = np.concatenate(curves, axis=1)
  out["adversarial_accuracy_per_seed"] = adversarial.mean(axis=1)
  out["adversarial_accuracy"] = float(adversarial.mean())
  return out


# ---------------------------------------------------------------------------------------------------
# The variance check of Eq. 13-14
# ---------------------------------------------------------------------------------------------------


def variance_check(config: ml_collections.ConfigDict, rng) -> dict:
  """One neuron of the network (`membrane_scan`, the configured `phi`) with three noisy inputs, its
  conductances scaled by each of `stability.conductance_scales`, at each step `stability.dts`:
  measured mean and variance of `V` against `V_ss`, Eq. 13 (Eq. 14 at scale 0), the exact Ito
  variance and the exact variance of the unclipped discrete update; `clipped_fraction` says where the
  clip of `phi` takes the neuron away from the SDE. Arrays are `[dt, scale]`."""
  s = config.stability
  w, mu, sigma = (jnp.asarray(v, jnp.float32) for v in (s.weights, s.means, s.stds))
  scales = np.asarray(s.conductance_scales, np.float64)
  cs = [scale * jnp.asarray(s.conductances, jnp.float32) for scale in scales]
  out = {
    "variance_dts": np.asarray(s.dts, np.float64),
    "variance_conductance_scales": scales,
    "variance_dgn_formula": np.array(
      [float(stability.dgn_variance(w, c, mu, sigma, s.g_l)) for c in cs]
    ),
    "variance_dgn_ito": np.array(
      [float(stability.ito_variance(w, c, mu, sigma, s.g_l)) for c in cs]
    ),
    "variance_steady_state": np.array([float(stability.steady_state(w, c, mu, s.g_l)) for c in cs]),
    "variance_lif_formula": float(stability.lif_variance(w, sigma, s.g_l)),
  }
  measured = {"mean": [], "variance": [], "clipped_fraction": [], "discrete": []}
  for i, dt in enumerate(s.dts):
    moments = jax.jit(
      functools.partial(
        stability.neuron_moments,
        g_l=s.g_l,
        dt=dt,
        num_steps=s.num_steps,
        num_chains=s.num_chains,
        burn_in=s.burn_in,
        phi=config.model.phi,
      )
    )
    rows = [
      moments(jax.random.fold_in(rng, 100 * i + j), w, c, mu, sigma) for j, c in enumerate(cs)
    ]
    for key in ("mean", "variance", "clipped_fraction"):
      measured[key].append([float(r[key]) for r in rows])
    measured["discrete"].append(
      [float(stability.discrete_variance(w, c, mu, sigma, s.g_l, dt)) for c in cs]
    )
  variance, discrete = np.asarray(measured["variance"]), np.asarray(measured["discrete"])
  clipped = np.asarray(measured["clipped_fraction"])
  out.update(
    variance_neuron_mean=np.asarray(measured["mean"]),
    variance_neuron=variance,
    variance_clipped_fraction=clipped,
    variance_discrete=discrete,
  )
  free = clipped <= s.unclipped_tolerance
  errors = lambda ref: np.abs(variance / ref - 1)[free]
  out["variance_unclipped_cells"] = float(free.sum())
  if free.any():
    out["variance_discrete_max_relative_error"] = float(errors(discrete).max())
    out["variance_formula_max_relative_error"] = float(
      errors(np.broadcast_to(out["variance_dgn_formula"], variance.shape)).max()
    )
  return out


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
