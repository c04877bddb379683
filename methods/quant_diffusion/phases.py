"""QDPM's phase: data, the three models on one backbone, the training step, the bound's evaluation
and the samplers (the maths is in `core/quant_diffusion.py`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import diffusion, optim
from core import quant_diffusion as qd
from core.data import batching, entropy_sources, images
from core.nn import precision
from core.nn.mlp import TimeConditionedMLP
from methods.base import (
  Phase,
  cached_per_config,
)

KINDS = ("qdpm", "vdm", "dequantized")
SOURCES = entropy_sources.NAMES  # `config.data.name` of the generated data of known entropy


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _digits(num_levels: int, split_seed: int):
  return images.digits(num_levels, split_seed)


@cached_per_config(maxsize=4)
def known_source(
  config: ml_collections.ConfigDict,
) -> entropy_sources.KnownEntropySource:
  """The known-entropy source named by `config.data.name` (`core/data/entropy_sources.py`)."""
  data = config.data
  return entropy_sources.make_source(
    data.name, data.num_levels, data.image_size, data.level_std, data.markov_stay
  )


def _known_entropy_splits(config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """Fresh train and test draws of the source, and every test image's exact `-log2 p(x) / D`."""
  source, data = known_source(config), config.data
  train = source.sample(data.num_train, (data.split_seed, 0)).astype(np.float32)
  test = source.sample(data.num_eval_examples, (data.split_seed, 1)).astype(np.float32)
  return {
    "train": train,
    "train_eval": train[: data.num_eval_examples],
    "test": test,
    "test_nll": source.nll_bits_per_dim(test),
  }


def load_splits(config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """Flattened float32 images on the integer grid: train (all) and test/train_eval (eval subsets);
  known-entropy sources add `test_nll`, the exact code length of each test image in bits/dim."""
  data = config.data
  if data.name in SOURCES:
    return _known_entropy_splits(config)
  if data.name == "digits":
    splits = _digits(data.num_levels, data.split_seed)
    train = splits["train"]["image"].reshape(len(splits["train"]["image"]), -1).astype(np.float32)
    test = splits["test"]["image"].reshape(len(splits["test"]["image"]), -1).astype(np.float32)
  else:
    record = functools.partial(images.tfds_image_record, num_levels=data.num_levels)
    source = images.tfds_image_source(data.name, "train", data.data_dir or None)
    test_source = images.tfds_image_source(data.name, "test", data.data_dir or None)
    count = min(data.num_eval_examples, len(test_source))
    test = np.stack([record(test_source[i])["image"].reshape(-1) for i in range(count)]).astype(
      np.float32
    )
    train = _LazyFlatImages(source, record)
  return {
    "train": train,
    "train_eval": np.asarray(train[np.arange(min(data.num_eval_examples, len(train)))], np.float32),
    "test": test[: data.num_eval_examples],
  }


class _LazyFlatImages:
  """Random access to flattened float32 images of a tfds source, for batches and eval subsets."""

  def __init__(self, source, record):
    self.source, self.record = source, record

  def __len__(self):
    return len(self.source)

  def __getitem__(self, indices):
    return np.stack(
      [self.record(self.source[int(i)])["image"].reshape(-1) for i in np.atleast_1d(indices)]
    ).astype(np.float32)


def train_batches(config: ml_collections.ConfigDict, train) -> batching.IndexedBatches:
  if isinstance(train, np.ndarray):
    return batching.from_arrays({"x": train}, config.batch_size, config.seed)
  return batching.IndexedBatches(
    lambda idx: {"x": train[idx]}, len(train), config.batch_size, config.seed
  )


def grid_of(config: ml_collections.ConfigDict) -> qd.Grid:
  return qd.Grid(num_levels=config.data.num_levels, spacing=1.0, offset=0.0)


# ---------------------------------------------------------------------------------------------------
# Model: one backbone, three parameterisations
# ---------------------------------------------------------------------------------------------------


def backbone(config: ml_collections.ConfigDict) -> TimeConditionedMLP:
  """The MLP at `config.model.dtype` (float32 parameters; its output is float32, so the bound and the
  loss of `core/quant_diffusion.py` are computed in float32 whatever the compute dtype)."""
  m = config.model
  return TimeConditionedMLP(
    m.width, m.depth, m.time_features, dtype=precision.compute_dtype(m.dtype)
  )


def _center(grid: qd.Grid) -> float:
  return grid.offset + grid.spacing * (grid.num_levels - 1) / 2


def qdpm_delta_fn(config, params):
  """`delta_hat(x_t, t, u)`: the network sees `x_t / sqrt(sigma_d^2 + t^2)` and `u` (QDPM's conditioning)."""
  net, grid, sigma = backbone(config), grid_of(config), config.model.sigma_data

  def delta_fn(x_t, t, u):
    return sigma * net.apply(params, diffusion.network_input(x_t, t, sigma, _center(grid)), u)

  return delta_fn


def baseline_x_hat_fn(config, params):
  """`x_hat(x_t, t)` with EDM preconditioning around the grid's centre; time feature = normalised log t."""
  net, grid, sigma = backbone(config), grid_of(config), config.model.sigma_data
  log_t_min, log_t_max = math.log(config.model.t_min), math.log(config.model.t_max)

  def x_hat_fn(x_t, t):
    t = jnp.broadcast_to(t, x_t.shape[:1])
    c = _center(grid)
    c_skip = sigma**2 / (sigma**2 + t**2)
    c_out = t * sigma / jnp.sqrt(sigma**2 + t**2)
    time = jnp.clip((jnp.log(t) - log_t_min) / (log_t_max - log_t_min), 0.0, 1.0)
    out = net.apply(params, diffusion.network_input(x_t, t, sigma, c), time)
    return c + c_skip[:, None] * (x_t - c) + c_out[:, None] * out

  return x_hat_fn


def per_example_nats(config, params, x0, rng):
  """The training objective per image, in nats (QDPM: the C-free form of the bound)."""
  grid, kind = grid_of(config), config.model.kind
  if kind == "qdpm":
    return qd.qdpm_train_loss(qdpm_delta_fn(config, params), x0, rng, grid)
  if kind == "vdm":
    return qd.vdm_discrete_loss(
      baseline_x_hat_fn(config, params),
      x0,
      rng,
      grid,
      config.model.t_min,
      config.model.t_max,
    )
  return qd.dequantized_loss(
    baseline_x_hat_fn(config, params),
    x0,
    rng,
    grid,
    config.model.t_min,
    config.model.t_max,
  )


# ---------------------------------------------------------------------------------------------------
# The phase
# ---------------------------------------------------------------------------------------------------


def optimizer(config) -> optax.GradientTransformation:
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip, o.weight_decay)


def init_state(config, dim: int, rng, inputs=None):
  del inputs
  params = backbone(config).init(rng, jnp.zeros((1, dim)), jnp.zeros((1,)))
  return {
    "params": params,
    "ema_params": params,
    "opt_state": optimizer(config).init(params),
  }


def train_step(config, state, batch, rng):
  """One AdamW step on the batch mean of the per-image objective, in bits per dimension."""
  x0 = batch["x"]
  scale = 1.0 / (x0.shape[-1] * math.log(2.0))

  def loss_fn(params):
    return scale * jnp.mean(per_example_nats(config, params, x0, rng))

  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  decay = config.optim.ema_decay
  ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, state["ema_params"], params)
  metrics = {"loss": loss, "grad_norm": optax.global_norm(grads)}
  return {"params": params, "ema_params": ema, "opt_state": opt_state}, metrics


@cached_per_config(maxsize=32)
def _bound_fn(config: ml_collections.ConfigDict, null: bool):
  """Jitted `(params, x0 chunk, rng) -> per-image bits/dim`."""
  grid, kind, samples = grid_of(config), config.model.kind, config.eval.num_u_samples

  def chunk_bpd(params, x0, rng):
    if kind == "qdpm" or null:
      delta_fn = (lambda x_t, t, u: jnp.zeros_like(x_t)) if null else qdpm_delta_fn(config, params)
      return qd.qdpm_bound_bits_per_dim(delta_fn, x0, rng, grid, samples)[0]
    rngs = jax.random.split(rng, samples)
    nats = jax.vmap(lambda r: per_example_nats(config, params, x0, r))(rngs).mean(0)
    return qd.bits_per_dim(nats, x0.shape[-1])

  return jax.jit(chunk_bpd)


def bound_bits_per_dim(config, params, x: np.ndarray, rng, null: bool = False) -> np.ndarray:
  """Per-image bound in bits/dim over `x` (QDPM: full bound with analytic C; baselines: their bound).

  Images go through in chunks of `config.eval.chunk` (the last one padded), one compilation in all.
  """
  return _over_chunks(_bound_fn(config, null), config.eval.chunk, params, x, rng)


def _over_chunks(chunk_fn, size: int, params, x: np.ndarray, rng):
  """`chunk_fn(params, chunk, rng_i)` over chunks of `size` rows of `x` (the last padded), outputs
  (arrays or dicts of per-row arrays) concatenated."""
  out = []
  for i, start in enumerate(range(0, len(x), size)):
    chunk = x[start : start + size]
    padded = np.concatenate([chunk, np.repeat(chunk[-1:], size - len(chunk), axis=0)])
    out.append(chunk_fn(params, jnp.asarray(padded), jax.random.fold_in(rng, i)))
  return jax.tree.map(lambda *parts: np.concatenate(parts)[: len(x)], *out)


@cached_per_config(maxsize=32)
def _sampler_fn(config: ml_collections.ConfigDict, dim: int, order: int):
  """Jitted `(params, rng) -> samples`: QDPM-Solver-`order`, or the baselines' ancestral sampler."""
  grid, shape, steps = (
    grid_of(config),
    (config.eval.num_samples, dim),
    config.eval.sampler_steps,
  )
  if config.model.kind == "qdpm":
    sample = functools.partial(qd.qdpm_sample, shape=shape, grid=grid, num_steps=steps, order=order)
    return jax.jit(lambda p, r: sample(qdpm_delta_fn(config, p), r, snap_to_grid=False))
  t_min, t_max = config.model.t_min, config.model.t_max
  return jax.jit(
    lambda p, r: qd.baseline_sample(
      baseline_x_hat_fn(config, p), r, shape, grid, steps, t_min, t_max
    )
  )


def draw_samples(config, params, rng, dim: int, order: int = 1, at_t0: bool = True) -> np.ndarray:
  """Samples of the model. QDPM's last solver step returns `x_hat(x_s, s)` at the last positive time
  `s` of its u-grid; `at_t0` then applies the model's own `x_hat(., 0) = round` (u(0) = 0, Prop. 2).
  The baselines' samples are their `x_hat` at `t_min`, never rounded."""
  samples = np.asarray(_sampler_fn(config, dim, order)(params, rng))
  if config.model.kind == "qdpm" and at_t0:
    return np.asarray(qd.nearest_level(jnp.asarray(samples), grid_of(config)))
  return samples


def evaluate(config, splits, state, rng) -> dict[str, float]:
  """Test/train bpd with standard errors, the null model, on-grid fraction of samples; on data of
  known entropy also every estimate's gap to the entropy (`entropy_gaps`)."""
  params, grid = state["ema_params"], grid_of(config)
  rngs = jax.random.split(rng, 6)
  test = bound_bits_per_dim(config, params, splits["test"], rngs[0])
  train = bound_bits_per_dim(config, params, splits["train_eval"], rngs[1])
  null = bound_bits_per_dim(config, params, splits["test"], rngs[2], null=True)
  dim = splits["test"].shape[-1]
  last_step = draw_samples(config, params, rngs[3], dim, at_t0=False)
  samples = draw_samples(config, params, rngs[3], dim)
  results = {
    "test_bpd": float(test.mean()),
    "test_bpd_stderr": float(test.std(ddof=1) / math.sqrt(len(test))),
    "train_bpd": float(train.mean()),
    "train_bpd_stderr": float(train.std(ddof=1) / math.sqrt(len(train))),
    "null_bpd": float(null.mean()),
    "log2_num_levels": math.log2(grid.num_levels),
    "memorization_floor_bpd": math.log2(len(splits["train"])) / splits["test"].shape[-1],
    "on_grid_fraction": float(qd.on_grid_fraction(samples, grid)),
    "on_grid_fraction_before_t0": float(qd.on_grid_fraction(last_step, grid)),
  }
  if config.model.kind == "qdpm":
    results["on_grid_fraction_solver2"] = float(
      qd.on_grid_fraction(draw_samples(config, params, rngs[4], dim, order=2), grid)
    )
    mc_c = np.asarray(
      qd.monte_carlo_C_bits_per_dim(
        jnp.asarray(splits["test"]), rngs[5], grid, config.eval.mc_c_samples
      )
    )
    results["test_bpd_monte_carlo_C"] = float(
      test.mean() - math.log2(grid.num_levels) + mc_c.mean()
    )
  if config.data.name in SOURCES:
    per_image = {"test_bpd": test, "null_bpd": null}
    if config.model.kind == "qdpm":
      estimates, repeats = _qdpm_known_entropy_estimates(config, splits, params, test, mc_c, rng)
      per_image.update(estimates)
      results.update(repeats)
    results.update(entropy_gaps(config, splits["test_nll"], per_image))
  return results


def oracle_shift_fn(config) -> qd.ShiftFn:
  """`u delta*(x_t, t)` of the known source's Bayes denoiser (`E[x_0 | x_t]` in closed form): the
  model whose bound has expectation exactly the entropy (I-MMSE: `int t^-3 mmse(t) dt = H` nats)."""
  source, grid = known_source(config), grid_of(config)
  log_initial = jnp.log(jnp.asarray(source.initial, jnp.float32))
  log_transition = jnp.log(jnp.asarray(source.transition, jnp.float32))
  if source.name == "iid_levels":
    return lambda x_t, t: qd.iid_prior_shift(x_t, t, log_initial, grid)
  return lambda x_t, t: qd.markov_prior_shift(x_t, t, log_initial, log_transition, grid)


@cached_per_config(maxsize=8)
def _log_t_fn(config: ml_collections.ConfigDict):
  """Jitted `(params, x0 chunk, rng) -> {"model"|"oracle": qd.log_t_estimates(...)}`: the trained
  QDPM's and the closed-form denoiser's bound sampled in `ln t` (finite variance for both)."""
  grid, samples, oracle = (
    grid_of(config),
    config.eval.log_t_samples,
    oracle_shift_fn(config),
  )

  def chunk_fn(params, x0, rng):
    delta_fn = qdpm_delta_fn(config, params)

    def model_shift(x_t, t):
      u = qd.u_from_t(t)
      return diffusion.broadcast_time(u, x_t) * delta_fn(x_t, t, u)

    key_model, key_oracle = jax.random.split(rng)
    return {
      "model": qd.log_t_estimates(model_shift, x0, key_model, grid, samples),
      "oracle": qd.log_t_estimates(oracle, x0, key_oracle, grid, samples),
    }

  return jax.jit(chunk_fn)


@cached_per_config(maxsize=8)
def _monte_carlo_C_fn(config: ml_collections.ConfigDict):
  grid, samples = grid_of(config), config.eval.mc_c_samples
  return jax.jit(lambda x0, rng: qd.monte_carlo_C_bits_per_dim(x0, rng, grid, samples))


def _qdpm_known_entropy_estimates(config, splits, params, test, mc_c, rng) -> tuple[dict, dict]:
  """Per-test-image bpd of every way of evaluating the bound, for the trained QDPM and the
  closed-form denoiser ("oracle"): analytic C, plain Monte-Carlo C, C importance-sampled in `ln t`;
  and the gaps to the entropy of `eval.mc_c_repeats` independent plain Monte-Carlo evaluations
  (the first one uses `mc_c`), as arrays."""
  log2_k = math.log2(config.data.num_levels)
  est = _over_chunks(
    _log_t_fn(config),
    config.eval.chunk,
    params,
    splits["test"],
    jax.random.fold_in(rng, 1001),
  )
  model, oracle = est["model"], est["oracle"]
  out = {
    "test_bpd_log_t": model["bound"],
    "test_bpd_importance_C": test - log2_k + model["C"],
    "importance_sampled_C": model["C"],
    "oracle_bpd": oracle["bound"],
    "oracle_bpd_importance_C": oracle["bound"] - log2_k + oracle["C"],
  }
  repeats = {}
  test_x, nll = jnp.asarray(splits["test"]), splits["test_nll"]
  for r in range(config.eval.mc_c_repeats):
    key = jax.random.fold_in(rng, 2000 + r)
    mc = mc_c if r == 0 else np.asarray(_monte_carlo_C_fn(config)(test_x, key))
    for name, theta in (
      ("test_bpd", test - log2_k),
      ("oracle_bpd", oracle["bound"] - log2_k),
    ):
      if r == 0:
        out[f"{name}_monte_carlo_C"] = theta + mc
      gap = theta + mc - nll
      repeats.setdefault(f"{name}_monte_carlo_C_repeats_gap", []).append(gap.mean())
      repeats.setdefault(f"{name}_monte_carlo_C_repeats_gap_stderr", []).append(
        gap.std(ddof=1) / math.sqrt(len(gap))
      )
  return out, {name: np.asarray(values) for name, values in repeats.items()}


def entropy_gaps(config, nll: np.ndarray, per_image: Mapping[str, np.ndarray]) -> dict:
  """For each per-image estimate `b_i`: its mean and standard error, and the signed gap to the
  entropy `mean(b_i - nll_i)` with its paired standard error (`nll_i = -log2 p(x_i) / D` exactly,
  so `E[b - nll] = E[b] - H`: a valid bound has a gap >= 0 up to noise)."""
  n = len(nll)
  out = {
    "entropy_bpd": known_source(config).entropy_bits_per_dim,
    "test_true_nll_bpd": float(nll.mean()),
    "test_true_nll_bpd_stderr": float(nll.std(ddof=1) / math.sqrt(n)),
  }
  for name, values in per_image.items():
    gap = values - nll
    out[f"{name}_mean"] = float(values.mean())
    out[f"{name}_stderr"] = float(values.std(ddof=1) / math.sqrt(n))
    out[f"{name}_gap"] = float(gap.mean())
    out[f"{name}_gap_stderr"] = float(gap.std(ddof=1) / math.sqrt(n))
  return out


def sample_grid(config, state, rng, dim: int) -> dict[str, np.ndarray]:
  """A tiled image of samples (digits and the known-entropy sources) for the workdir."""
  samples = draw_samples(config, state["ema_params"], rng, dim)
  if config.data.name == "digits":
    side = 8
  elif config.data.name in SOURCES:
    side = config.data.image_size
    samples = entropy_sources.chain_to_images(samples, side)
  else:
    return {}
  n = int(math.sqrt(len(samples)))
  tiles = np.pad(samples[: n * n].reshape(n, n, side, side), ((0, 0), (0, 0), (1, 1), (1, 1)))
  size = side + 2
  mosaic = tiles.transpose(0, 2, 1, 3).reshape(n * size, n * size) / (config.data.num_levels - 1)
  return {"samples": np.kron(mosaic, np.ones((4, 4)))}


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  splits = load_splits(config)
  dim = splits["test"].shape[-1]
  return [
    Phase(
      name="train",
      num_steps=config.steps,
      init=functools.partial(init_state, config, dim),
      step=functools.partial(train_step, config),
      data=lambda inputs: train_batches(config, splits["train"]),
      evaluate=lambda state, rng, inputs: evaluate(config, splits, state, rng),
      artifacts=lambda state, rng, inputs: sample_grid(config, state, rng, dim),
    )
  ]
