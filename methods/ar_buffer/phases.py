"""The phases of the AR-buffer method: `train` (meta-learning on GP or sawtooth tasks with the
set/buffer training mix, evaluated on joint log-likelihoods) and `benchmark` (joint sampling time and
activation memory of the buffer sampler vs AR re-encoding, padded and unpadded, side by side in one
process).

Maths and network live in `core/neural_process.py`; GP tasks and their exact oracle in
`core/data/gp_tasks.py`, sawtooth tasks and their known-parameter bound in `core/data/sawtooth.py`;
this module wires them to the config, the optimiser and the loop.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from core import neural_process as tnp
from core import optim
from core.data import gp_tasks, sawtooth
from methods.base import Phase, cached_per_config, figure_grid

# ---------------------------------------------------------------------------------------------------
# Model, prior, optimiser
# ---------------------------------------------------------------------------------------------------


def prior_of(config: ml_collections.ConfigDict) -> gp_tasks.GPPrior:
  d = config.data
  return gp_tasks.GPPrior(
    kernels=tuple(d.kernels),
    lengthscale_min=d.lengthscale_min,
    lengthscale_max=d.lengthscale_max,
    noise_std=d.noise_std,
    jitter=d.jitter,
    x_min=d.x_min,
    x_max=d.x_max,
  )


TASKS = ("gp", "sawtooth")


def sawtooth_prior_of(config: ml_collections.ConfigDict) -> sawtooth.SawtoothPrior:
  d = config.data
  return sawtooth.SawtoothPrior(
    frequency_min=d.frequency_min,
    frequency_max=d.frequency_max,
    amplitude_min=d.amplitude_min,
    amplitude_max=d.amplitude_max,
    noise_std=d.noise_std,
    x_min=d.x_min,
    x_max=d.x_max,
  )


def sample_tasks(config, key, num_tasks: int, num_points: int) -> dict[str, jax.Array]:
  """`num_tasks` tasks of `config.data.task`: `x`, `y [T, P]` and the task's hidden parameters."""
  if config.data.task == "sawtooth":
    return sawtooth.sample_tasks(key, num_tasks, num_points, sawtooth_prior_of(config))
  return gp_tasks.sample_tasks(key, num_tasks, num_points, prior_of(config))


def make_model(config: ml_collections.ConfigDict) -> tnp.BufferTNP:
  m = config.model
  return tnp.BufferTNP(
    width=m.width,
    depth=m.depth,
    num_heads=m.num_heads,
    mlp_hidden=m.mlp_hidden,
    max_buffer=m.max_buffer,
    embed_hidden=m.embed_hidden,
    min_std=m.min_std,
    num_components=m.num_components,
    max_std=m.max_std,
    buffer_positions=m.buffer_positions,
    attention_implementation=m.attention or None,
    shared_attention_implementation=m.shared_attention or None,
  )


def optimizer(config) -> optax.GradientTransformation:
  """AdamW (beta2 0.95) on a warmup-cosine schedule, global-norm clipping."""
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip, o.weight_decay, b2=0.95)


# ---------------------------------------------------------------------------------------------------
# Training: one forward per batch of tasks, half set mode, half buffer mode
# ---------------------------------------------------------------------------------------------------


def training_batch(config, rng) -> dict[str, jax.Array]:
  """Tasks split into a context of `N ~ U{min..max}` points (padded to max), a buffer of K points
  in random order (the draw order of i.i.d. inputs) and M targets with their visible prefixes."""
  d, k = config.data, config.model.max_buffer
  k_task, k_size, k_visible = jax.random.split(rng, 3)
  n_max, m = d.max_context, d.num_targets
  tasks = sample_tasks(config, k_task, config.batch_size, n_max + k + m)
  x, y = tasks["x"], tasks["y"]
  sizes = jax.random.randint(k_size, (config.batch_size,), d.min_context, n_max + 1)
  return {
    "x_ctx": x[:, :n_max],
    "y_ctx": y[:, :n_max],
    "ctx_valid": jnp.arange(n_max)[None] < sizes[:, None],
    "x_buf": x[:, n_max : n_max + k],
    "y_buf": y[:, n_max : n_max + k],
    "x_tgt": x[:, n_max + k :],
    "y_tgt": y[:, n_max + k :],
    "visible": tnp.training_visible(k_visible, config.batch_size, m, k),
  }


def loss_fn(model, params, batch):
  """Mean negative log-likelihood per target; also its set-mode and buffer-mode halves."""
  log_p = tnp.target_log_density(
    model,
    params,
    batch["x_ctx"],
    batch["y_ctx"],
    batch["x_buf"],
    batch["y_buf"],
    batch["x_tgt"],
    batch["y_tgt"],
    batch["visible"],
    batch["ctx_valid"],
  )
  set_mode = batch["visible"] == 0
  nll_set = -jnp.sum(jnp.where(set_mode, log_p, 0.0)) / jnp.maximum(jnp.sum(set_mode), 1)
  nll_buffer = -jnp.sum(jnp.where(set_mode, 0.0, log_p)) / jnp.maximum(jnp.sum(~set_mode), 1)
  return -jnp.mean(log_p), {"nll_set_mode": nll_set, "nll_buffer_mode": nll_buffer}


def init_state(config, rng, inputs=None):
  del inputs
  model = make_model(config)
  batch = training_batch(config, jax.random.key(0))
  x, y, role, slot = tnp.layout(
    batch["x_ctx"][:1],
    batch["y_ctx"][:1],
    batch["x_buf"][:1],
    batch["y_buf"][:1],
    batch["x_tgt"][:1],
  )
  params = model.init(rng, x, y, role, slot, None)
  return {"params": params, "opt_state": optimizer(config).init(params)}


def train_step(config, state, batch, rng):
  """Draws a batch of GP tasks from `rng` (the step makes its own data) and takes one AdamW step."""
  del batch
  model = make_model(config)
  batch = training_batch(config, rng)
  (loss, aux), grads = jax.value_and_grad(lambda p: loss_fn(model, p, batch), has_aux=True)(
    state["params"]
  )
  updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  metrics = {"loss": loss, "grad_norm": optax.global_norm(grads), **aux}
  return {"params": params, "opt_state": opt_state}, metrics


# ---------------------------------------------------------------------------------------------------
# Evaluation: joint log-likelihoods on held-out tasks (the same tasks for every seed)
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=4)
def eval_tasks(config) -> dict[str, np.ndarray]:
  """`num_tasks` tasks of N context + M targets and `num_orders` random target orders per task."""
  e = config.eval
  key = jax.random.key(e.seed)
  tasks = sample_tasks(config, key, e.num_tasks, e.num_context + e.num_targets)
  keys = jax.random.split(jax.random.fold_in(key, 1), e.num_tasks * e.num_orders)
  orders = jax.vmap(lambda k: jax.random.permutation(k, e.num_targets))(keys)
  out = {name: np.asarray(value) for name, value in tasks.items()}
  out["orders"] = np.asarray(orders).reshape(e.num_tasks, e.num_orders, e.num_targets)
  return out


def _split(config, x, y):
  n = config.eval.num_context
  return x[:, :n], y[:, :n], x[:, n:], y[:, n:]


@cached_per_config(maxsize=4)
def _evaluator(config):
  """Jitted `(params, tasks) -> {name: per-task (or per task x order) log-likelihoods, nats}`."""
  model = make_model(config)
  e, buffer_size = config.eval, config.model.max_buffer

  def by_order(params, x_ctx, y_ctx, x_tgt, y_tgt, orders, sizes):
    """Joint LLs `[T, O]` of the targets decoded in each order, for each buffer size."""
    t, o = orders.shape[:2]
    rows = lambda a: jnp.repeat(a, o, axis=0)  # noqa: E731
    perm = orders.reshape(t * o, -1)
    xt = jnp.take_along_axis(rows(x_tgt), perm, axis=1)
    yt = jnp.take_along_axis(rows(y_tgt), perm, axis=1)
    xc, yc = rows(x_ctx), rows(y_ctx)
    out = {"reencode": tnp.reencode_log_density(model, params, xc, yc, xt, yt).reshape(t, o)}
    for k in sizes:
      joint = tnp.joint_log_density(model, params, xc, yc, xt, yt, k)
      out[f"buffer_k{k}"] = joint.reshape(t, o)
    return out

  def evaluate(params, tasks):
    x_ctx, y_ctx, x_tgt, y_tgt = _split(config, tasks["x"], tasks["y"])
    sizes = sorted({buffer_size, *e.buffer_sizes} - {1})
    out = by_order(params, x_ctx, y_ctx, x_tgt, y_tgt, tasks["orders"], sizes)
    by_x = jnp.argsort(x_tgt, axis=1)[:, None, :]
    sorted_order = by_order(params, x_ctx, y_ctx, x_tgt, y_tgt, by_x, [buffer_size])
    out["buffer_sorted"] = sorted_order[f"buffer_k{buffer_size}"][:, 0]
    out["reencode_sorted"] = sorted_order["reencode"][:, 0]
    out["marginal"] = tnp.marginal_log_density(model, params, x_ctx, y_ctx, x_tgt, y_tgt)
    out.update(_oracles(config, x_ctx, y_ctx, x_tgt, y_tgt, tasks))
    return out

  return jax.jit(evaluate)


def _oracles(config, x_ctx, y_ctx, x_tgt, y_tgt, tasks) -> dict[str, jax.Array]:
  """GP: the exact joint `oracle` and the exact marginals `oracle_marginal`. Sawtooth (no closed
  form posterior): `oracle_known_parameters`, the noise-only density with the true function known,
  an upper bound of both."""
  if config.data.task == "sawtooth":
    bound = functools.partial(sawtooth.known_parameter_log_density, prior=sawtooth_prior_of(config))
    params = [tasks[k] for k in ("frequency", "direction", "phase", "amplitude")]
    return {"oracle_known_parameters": jax.vmap(bound)(x_tgt, y_tgt, *params)}
  prior = prior_of(config)
  args = (x_ctx, y_ctx, x_tgt, y_tgt, tasks["lengthscale"], tasks["kernel"])
  return {
    "oracle": jax.vmap(functools.partial(gp_tasks.conditional_log_density, prior=prior))(*args),
    "oracle_marginal": jax.vmap(functools.partial(gp_tasks.marginal_log_density, prior=prior))(
      *args
    ),
  }


def _mean_and_stderr(per_task: np.ndarray) -> tuple[float, float]:
  return float(per_task.mean()), float(per_task.std(ddof=1) / np.sqrt(len(per_task)))


def evaluate(config, params) -> dict[str, float | np.ndarray]:
  """Per-target joint log-likelihoods (nats; mean over tasks and orders) of independent marginals,
  AR re-encoding (K = 1), the one-pass buffer (K = max_buffer and the ablation sizes), the same with
  targets decoded in sorted-x order, and the oracles (`_oracles`); GP: by lengthscale bin as
  arrays."""
  tasks = eval_tasks(config)
  raw = jax.device_get(_evaluator(config)(params, {k: jnp.asarray(v) for k, v in tasks.items()}))
  m, k = config.eval.num_targets, config.model.max_buffer
  per_task = {name: np.asarray(v).reshape(len(v), -1).mean(1) / m for name, v in raw.items()}
  per_task["buffer"] = per_task.pop(f"buffer_k{k}")
  results = {}
  for name, values in per_task.items():
    results[f"ll_{name}"], results[f"ll_{name}_stderr"] = _mean_and_stderr(values)
  paired = per_task["reencode"] - per_task["buffer"]
  results["gap_reencode_minus_buffer"], results["gap_reencode_minus_buffer_stderr"] = (
    _mean_and_stderr(paired)
  )
  results["gain_buffer_over_marginal"] = results["ll_buffer"] - results["ll_marginal"]
  results["ll_reencode_k1"] = results["ll_reencode"]
  if config.data.task == "gp":
    results["gap_oracle_minus_buffer"] = results["ll_oracle"] - results["ll_buffer"]
    results.update(_by_lengthscale(config, tasks["lengthscale"], per_task))
  return results


def _by_lengthscale(config, lengthscale, per_task) -> dict[str, np.ndarray]:
  """Means per equal-width lengthscale bin: the buffer's gain over marginals grows with l (longer
  lengthscales correlate the targets more)."""
  d, bins = config.data, config.eval.lengthscale_bins
  edges = np.linspace(d.lengthscale_min, d.lengthscale_max, bins + 1)
  which = np.clip(np.digitize(lengthscale, edges) - 1, 0, bins - 1)
  out = {"lengthscale_bin_centers": 0.5 * (edges[1:] + edges[:-1])}
  for name in ("marginal", "reencode", "buffer", "oracle", "oracle_marginal"):
    out[f"ll_{name}_by_lengthscale"] = np.asarray(
      [per_task[name][which == b].mean() if np.any(which == b) else np.nan for b in range(bins)]
    )
  return out


def samples_figure(config, params, rng):
  """A held-out task (GP: the longest lengthscale) with `eval.plot_context` context points: the
  exact GP posterior band or the true sawtooth, joint buffer draws (correlated) against independent
  marginal draws (white noise around the mean)."""
  tasks = eval_tasks(config)
  gp = config.data.task == "gp"
  i = int(np.argmax(tasks["lengthscale"])) if gp else 0
  n, draws = min(config.eval.plot_context, config.eval.num_context), config.eval.num_plot_samples
  x_ctx, y_ctx = tasks["x"][i, :n], tasks["y"][i, :n]
  grid = np.linspace(config.data.x_min, config.data.x_max, config.model.max_buffer)
  order = np.asarray(jax.random.permutation(jax.random.fold_in(rng, 1), len(grid)))
  model = make_model(config)
  noise = tnp.sampling_noise(rng, draws, len(grid), config.model.num_components)
  joint, _ = jax.jit(
    lambda p: tnp.sample_joint(model, p, x_ctx, y_ctx, grid[order], noise, config.model.max_buffer)
  )(params)
  joint = np.asarray(joint)[:, np.argsort(order)]
  predictive = jax.jit(lambda p: model.apply(p, *_marginal_inputs(x_ctx, y_ctx, grid)))(params)
  predictive = tnp.Predictive(
    *(jnp.broadcast_to(a[0, n:], (draws,) + a[0, n:].shape) for a in predictive)
  )
  marginal = np.asarray(predictive.sample(*noise))
  fig, axes = figure_grid(1, 2, figsize=(9, 3.2), sharey=True)
  for ax, title, ys in (
    (axes[0, 0], "buffer: joint draws", joint),
    (axes[0, 1], "independent marginals", marginal),
  ):
    _truth(ax, config, tasks, i, x_ctx, y_ctx, grid)
    ax.plot(grid, np.asarray(ys).T, lw=1, alpha=0.8)
    ax.scatter(x_ctx, y_ctx, c="k", s=12, zorder=3, label="context")
    label = f"l = {tasks['lengthscale'][i]:.2f}" if gp else f"frequency {tasks['frequency'][i]:.2f}"
    ax.set_title(f"{title} ({label})")
    ax.set_xlabel("x")
  axes[0, 0].legend(loc="lower left", fontsize=7)
  fig.tight_layout()
  return {"joint_samples": fig}


def _truth(ax, config, tasks, i, x_ctx, y_ctx, grid):
  """GP: the exact posterior band (±2 sd); sawtooth: the true function."""
  if config.data.task == "sawtooth":
    fine = np.linspace(config.data.x_min, config.data.x_max, 400)
    params = [tasks[k][i] for k in ("frequency", "direction", "phase", "amplitude")]
    ax.plot(fine, np.asarray(sawtooth.sawtooth(fine, *params)), "k", lw=0.8, label="true f")
    return
  mean, cov = gp_tasks.posterior(
    x_ctx, y_ctx, grid, tasks["lengthscale"][i], tasks["kernel"][i], prior_of(config)
  )
  sd = np.sqrt(np.diag(np.asarray(cov)))
  mean = np.asarray(mean)
  ax.fill_between(grid, mean - 2 * sd, mean + 2 * sd, color="0.85", label="GP oracle ±2σ")


def _marginal_inputs(x_ctx, y_ctx, grid):
  m = len(grid)
  x, y, role, slot = tnp.layout(
    x_ctx[None], y_ctx[None], np.zeros((1, 0)), np.zeros((1, 0)), grid[None]
  )
  mask = tnp.structured_mask(jnp.ones((1, len(x_ctx)), bool), 0, jnp.zeros((1, m), jnp.int32))
  return x, y, role, slot, mask


# ---------------------------------------------------------------------------------------------------
# Benchmark: joint sampling, buffer vs AR re-encoding, compiled and timed side by side
# ---------------------------------------------------------------------------------------------------


def _compiled(fn, *args):
  """`(compiled fn, seconds to compile, temp bytes)`: XLA's buffer assignment gives the peak of the
  program's intermediate buffers (activations, KV caches), parameters and inputs excluded."""
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  seconds = time.perf_counter() - start
  analysis = compiled.memory_analysis()
  temp = None if analysis is None else int(analysis.temp_size_in_bytes)
  return compiled, seconds, temp


def _timed(compiled, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  return time.perf_counter() - start


def _sampling_task(config, num_context: int):
  b = config.benchmark
  task = sample_tasks(config, jax.random.key(b.seed), 1, num_context + b.num_targets)
  x, y = task["x"][0], task["y"][0]
  return x[:num_context], y[:num_context], x[num_context:]


def _samplers(config, num_context: int, buffer_sizes, unpadded: bool = False):
  """`{name: fn(params, noise)}`: the buffer sampler at each K, the re-encoding baseline (every step
  padded to N + M tokens, one scanned step) and, with `unpadded`, re-encoding at each step's true
  length N + k (`reencode_unpadded`, one compiled pass per length)."""
  model = make_model(config)
  x_ctx, y_ctx, x_tgt = _sampling_task(config, num_context)
  fns = {
    f"buffer_k{k}": functools.partial(
      lambda p, e, k: tnp.sample_joint(model, p, x_ctx, y_ctx, x_tgt, e, k), k=k
    )
    for k in buffer_sizes
  }
  fns["reencode"] = lambda p, e: tnp.sample_reencode(model, p, x_ctx, y_ctx, x_tgt, e)
  if unpadded:
    fns["reencode_unpadded"] = lambda p, e: tnp.sample_reencode_unpadded(
      model, p, x_ctx, y_ctx, x_tgt, e
    )
  return fns


def measure_sampling(
  config, params, num_context: int, buffer_sizes, unpadded: bool = False
) -> dict[str, dict]:
  """Compile time, peak temp bytes and median wall time of each sampler at one context size; every
  sampler runs `benchmark.repeats` times, in alternation so that machine load hits them alike."""
  b = config.benchmark
  noise = tnp.sampling_noise(
    jax.random.key(b.seed + 1), b.num_samples, b.num_targets, config.model.num_components
  )
  out, compiled = {}, {}
  for name, fn in _samplers(config, num_context, buffer_sizes, unpadded).items():
    compiled[name], seconds, temp = _compiled(fn, params, noise)
    out[name] = {"compile_s": seconds, "temp_bytes": temp, "times": []}
  for _ in range(b.repeats):
    for name, fn in compiled.items():
      out[name]["times"].append(_timed(fn, params, noise))
  for name, entry in out.items():
    entry["time_s"] = float(np.median(entry.pop("times")))
    logging.info(
      "[benchmark] N=%d %s: %.4f s, temp %s bytes",
      num_context,
      name,
      entry["time_s"],
      entry["temp_bytes"],
    )
  return out


def reencode_tokens_per_stream(num_context: int, num_targets: int) -> dict[str, int]:
  """Tokens one stream pushes through the network over the M re-encoding steps: padded, every step
  N + M (`sample_reencode`); unpadded, step k (1-based) N + k (`sample_reencode_unpadded`)."""
  n, m = num_context, num_targets
  return {"padded": m * (n + m), "unpadded": m * n + m * (m + 1) // 2}


def benchmark(config, params) -> dict[str, float | np.ndarray]:
  """Joint sampling of `num_samples` streams x `num_targets` targets per context size: the buffer
  (K = max_buffer) against AR re-encoding padded (every step N + M tokens) and unpadded (step k:
  N + k tokens), their time and activation-memory ratios, the linear memory model
  `B (N + K) / (N + B K)`; then time and K at `ablation_context`."""
  b, k = config.benchmark, config.model.max_buffer
  rows = [measure_sampling(config, params, n, [k], unpadded=True) for n in b.context_sizes]
  column = lambda name, field: np.asarray([r[name][field] for r in rows], np.float64)  # noqa: E731
  buffer_s, padded_s = column(f"buffer_k{k}", "time_s"), column("reencode", "time_s")
  unpadded_s = column("reencode_unpadded", "time_s")
  buffer_b, padded_b = column(f"buffer_k{k}", "temp_bytes"), column("reencode", "temp_bytes")
  unpadded_b = column("reencode_unpadded", "temp_bytes")
  sizes = np.asarray(b.context_sizes, np.float64)
  formula = b.num_samples * (sizes + k) / (sizes + b.num_samples * k)
  tokens = [reencode_tokens_per_stream(n, b.num_targets) for n in b.context_sizes]
  results = {
    "context_sizes": sizes,
    "benchmark_repeats": b.repeats,
    "sampling_time_buffer_s": buffer_s,
    "sampling_time_reencode_s": padded_s,
    "sampling_time_reencode_unpadded_s": unpadded_s,
    "sampling_speedup_by_context": padded_s / buffer_s,
    "sampling_speedup": float(padded_s[-1] / buffer_s[-1]),
    "sampling_speedup_unpadded_by_context": unpadded_s / buffer_s,
    "sampling_speedup_unpadded": float(unpadded_s[-1] / buffer_s[-1]),
    "padded_over_unpadded_time_by_context": padded_s / unpadded_s,
    "reencode_tokens_padded": np.asarray([t["padded"] for t in tokens], np.float64),
    "reencode_tokens_unpadded": np.asarray([t["unpadded"] for t in tokens], np.float64),
    "peak_bytes_buffer": buffer_b,
    "peak_bytes_reencode": padded_b,
    "peak_bytes_reencode_unpadded": unpadded_b,
    "memory_ratio_by_context": padded_b / buffer_b,
    "memory_ratio": float(padded_b[-1] / buffer_b[-1]),
    "memory_ratio_unpadded_by_context": unpadded_b / buffer_b,
    "memory_ratio_linear_model": formula,
    "compile_s_buffer": column(f"buffer_k{k}", "compile_s"),
    "compile_s_reencode": column("reencode", "compile_s"),
    "compile_s_reencode_unpadded": column("reencode_unpadded", "compile_s"),
  }
  if b.buffer_sizes:
    sizes_k = sorted(set(b.buffer_sizes) - {1})
    timed = measure_sampling(config, params, b.ablation_context, sizes_k)
    results["ablation_buffer_sizes"] = np.asarray([1, *sizes_k], np.float64)
    results["sampling_time_by_buffer_size_s"] = np.asarray(
      [timed["reencode"]["time_s"]] + [timed[f"buffer_k{s}"]["time_s"] for s in sizes_k]
    )
  return results


# ---------------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------------


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  out = [
    Phase(
      name="train",
      num_steps=config.steps,
      init=functools.partial(init_state, config),
      step=functools.partial(train_step, config),
      evaluate=lambda state, rng, inputs: evaluate(config, state["params"]),
      artifacts=lambda state, rng, inputs: samples_figure(config, state["params"], rng),
      outputs=lambda state, inputs: state["params"],
      sized_by=("batch_size", "data.max_context", "data.num_targets", "model.width", "model.depth"),
    )
  ]
  if config.benchmark.context_sizes:
    out.append(
      Phase(
        name="benchmark",
        num_steps=0,
        init=lambda rng, inputs: {"params": inputs["train"]},
        evaluate=lambda state, rng, inputs: benchmark(config, inputs["train"]),
      )
    )
  return out
