"""BWCache's phases: `train` (a small video DiT on moving-shape videos, or a restored checkpoint) and
`cache` (every caching arm against the uncached sampler on fixed noise). The paper and what the phases
report are in `methods/bwcache/__init__.py`; the caching rule and its measurement in
`core/block_cache.py`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import block_cache, diffusion, image_metrics, optim
from core.data import videos
from core.nn import dit_convert, precision
from core.nn.dit import VideoDiT
from core.nn.dit import blockwise as dit_blockwise
from methods.base import ConfigError, Phase, cached_per_config, figure_grid

DATA_RANGE = 2.0  # videos live in [-1, 1]


# ---------------------------------------------------------------------------------------------------
# Model and training (phase "train")
# ---------------------------------------------------------------------------------------------------


def video_shape(config) -> tuple[int, int, int, int]:
  d = config.data
  return (d.frames, d.size, d.size, d.channels)


def dit(config) -> VideoDiT:
  """The DiT; its time input is `t in [0, 1]` for rectified flow and the step `n` for DDPM (as DiT).
  `config.model.dtype` is its compute dtype (float32 parameters; `core/nn/dit.py` says what stays
  float32)."""
  m = config.model
  return VideoDiT(
    video_shape(config),
    tuple(m.patch),
    m.hidden,
    m.depth,
    m.heads,
    m.mlp_ratio,
    m.attention,
    positions=m.positions,
    learn_sigma=m.learn_sigma,
    num_classes=m.num_classes,
    time_frequencies=m.time_frequencies,
    time_scale=1.0 if config.diffusion.kind == "ddpm" else 1000.0,
    dtype=precision.compute_dtype(m.dtype),
  )


def sample_label(config) -> int | None:
  """The class sampled (`cache.class_label`; -1 = the unconditional label), None if unconditional."""
  k = config.model.num_classes
  if not k:
    return None
  return config.cache.class_label if config.cache.class_label >= 0 else k


def sample_labels(config, batch: int) -> jax.Array | None:
  """`sample_label` for each of `batch` samples, None if unconditional."""
  label = sample_label(config)
  return None if label is None else jnp.full((batch,), label)


def blockwise(config) -> block_cache.BlockwiseModel:
  return dit_blockwise(dit(config), sample_label(config))


def optimizer(config) -> optax.GradientTransformation:
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip, weight_decay=1e-4)  # optax.adamw's default


def init_train_state(config, rng, inputs=None):
  del inputs
  x = jnp.zeros((1, *video_shape(config)))
  params = dit(config).init(rng, x, jnp.zeros((1,)))
  if config.model.checkpoint:
    params = load_pretrained(config, params)
  return {"params": params, "ema_params": params, "opt_state": optimizer(config).init(params)}


def load_pretrained(config, like):
  """Reads `config.model.checkpoint` in `config.model.checkpoint_format`.

  "orbax": DiT parameters saved by this codebase (an orbax checkpoint of the `params` tree).
  "latte": a Latte state dict in a `.safetensors` file, read with `safetensors.numpy` and converted by
  `dit_convert.latte_to_flax` (errors name any missing, unexpected or misshapen key). Latte releases
  torch pickles (`.pt`); convert one once, offline, in an environment with torch:
  `sd = torch.load(path, map_location="cpu")`, take its EMA weights (`sd["ema"]` where present), and
  `safetensors.torch.save_file({k: v.float().contiguous() for k, v in sd.items()}, "latte.safetensors")`.
  """
  path = config.model.checkpoint
  if config.model.checkpoint_format == "latte":
    from safetensors.numpy import load_file

    try:
      return dit_convert.latte_to_flax(load_file(path), dit(config))
    except dit_convert.CheckpointError as error:
      raise ConfigError(f"config.model.checkpoint: {error}") from None
  import orbax.checkpoint as ocp

  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
  return ocp.StandardCheckpointer().restore(path, abstract)


def alpha_bars(config) -> jax.Array:
  d = config.diffusion
  return diffusion.linear_alpha_bars(d.train_steps, d.beta_start, d.beta_end)


def training_loss(config, params, videos_batch, rng):
  """DDPM eps regression or rectified-flow velocity regression (`config.diffusion.kind`) of the DiT;
  rectified flow samples `t` logit-normally, the objective of the video DiTs the paper accelerates
  (Open-Sora 1.2, Wan 2.1, HunyuanVideo). With `learn_sigma` the variance half is not trained:
  DDIM with eta = 0 does not use it."""
  model_fn = functools.partial(dit(config).apply, params)
  if config.diffusion.kind == "ddpm":
    return diffusion.ddpm_eps_loss(model_fn, videos_batch, rng, alpha_bars(config))
  return diffusion.rectified_flow_loss(model_fn, videos_batch, rng)


def train_step(config, state, batch, rng):
  loss, grads = jax.value_and_grad(lambda p: training_loss(config, p, batch["video"], rng))(
    state["params"]
  )
  updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  decay = config.optim.ema_decay
  ema = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, state["ema_params"], params)
  return {"params": params, "ema_params": ema, "opt_state": opt_state}, {"loss": loss}


def validation_loss(config, state, rng) -> dict[str, float]:
  held_out = jnp.asarray(
    videos.video_batch(config.seed + 1, 0, config.cache.num_videos, **_video_kwargs(config))
  )
  loss_fn = jitted_training_loss(config)
  losses = [loss_fn(state["ema_params"], held_out, jax.random.fold_in(rng, i)) for i in range(4)]
  return {validation_key(config): float(np.mean(losses))}


@cached_per_config(maxsize=4)
def jitted_training_loss(config):
  """`(params, videos, rng) -> loss`, compiled once for every evaluation of a run."""
  return jax.jit(functools.partial(training_loss, config))


def validation_key(config) -> str:
  return "validation_eps_loss" if config.diffusion.kind == "ddpm" else "validation_flow_loss"


def _video_kwargs(config) -> dict:
  d = config.data
  return dict(frames=d.frames, size=d.size, channels=d.channels, max_shapes=d.max_shapes)


# ---------------------------------------------------------------------------------------------------
# Samplers (phase "cache")
# ---------------------------------------------------------------------------------------------------


def sampler(config, num_steps: int) -> diffusion.Sampler:
  """Euler over the rectified-flow grid, or deterministic DDIM over `num_steps` training steps."""
  if config.cache.sampler == "ddim":
    ts = diffusion.ddim_time_grid(
      num_steps, config.diffusion.train_steps, config.cache.ddim_spacing
    )
    clip = DATA_RANGE / 2 if config.cache.clip_denoised else None  # videos live in [-1, 1]
    return diffusion.ddim_sampler(ts, alpha_bars(config), clip)
  return diffusion.euler_sampler(diffusion.rf_time_grid(num_steps, config.cache.time_shift))


@cached_per_config(maxsize=64)
def jitted_sampler(config, policy: block_cache.CachePolicy, num_steps: int):
  """`(params, x_init, delta, reuse, threshold) -> (x, trace)`; the numeric knobs are traced."""
  model, steps = blockwise(config), sampler(config, num_steps)

  def sample(params, x_init, delta, reuse, threshold):
    knobs = policy._replace(delta=delta, reuse_steps=reuse, teacache_threshold=threshold)
    return block_cache.cached_sample(model, params, x_init, steps, knobs)

  return jax.jit(sample)


@cached_per_config(maxsize=16)
def jitted_plain_sampler(config, num_steps: int):
  """The uncached sampler with no indicator at all: the wall-clock and FLOP baseline."""
  net, steps = dit(config), sampler(config, num_steps)

  def sample(params, x):
    labels = sample_labels(config, x.shape[0])
    return diffusion.sample(lambda x, t: net.apply(params, x, t, labels), x, steps)

  return jax.jit(sample)


def step_flops(config, params, x) -> dict[str, float]:
  """FLOPs of one computed step, one reused step and the indicator, in the middle of the grid."""
  times = sampler(config, config.cache.num_steps).times
  t = jnp.full(x.shape[:1], times[config.cache.num_steps // 2])
  return block_cache.step_flops(blockwise(config), params, x, t)


def seed_interval(values) -> tuple[float, float, float]:
  """Mean and 95% Student-t interval over noise seeds (the caching decision is one per batch, so a
  seed's batch is the unit); one seed gives a zero-width interval."""
  values = np.asarray(values, np.float64)
  mean = float(values.mean())
  if values.size < 2:
    return mean, mean, mean
  import scipy.stats

  half = float(
    scipy.stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
  )
  return mean, mean - half, mean + half


class _Arms:
  """Runs caching arms against one reference per noise seed and collects their metrics.

  Seed 0 is the phase's noise (the numbers of a one-seed run); seed s > 0 folds s into it. Every arm
  samples every seed's batch with the same compiled sampler; wall time is measured on seed 0 only,
  back to back with the uncached sampler (`block_cache.wall_speedup`)."""

  def __init__(self, config, params, rng):
    self.config, self.params = config, params
    self.num_steps = config.cache.num_steps
    shape = (config.cache.num_videos, *video_shape(config))
    keys = [rng] + [jax.random.fold_in(rng, s) for s in range(1, config.cache.seeds)]
    self.x_init = [jax.random.normal(key, shape) for key in keys]
    self.x_init0 = self.x_init[0]
    self.plain = jitted_plain_sampler(config, self.num_steps)
    self.references = [self.plain(params, x) for x in self.x_init]
    self.reference = self.references[0]
    self.flops = step_flops(config, params, self.x_init0)

  def run(
    self,
    policy: block_cache.CachePolicy,
    num_steps: int | None = None,
    delta=0.0,
    reuse=0,
    threshold=0.0,
  ):
    """Mean metrics over seeds, `<name>_lo` / `<name>_hi` 95% intervals for PSNR, SSIM, computed steps
    and reuse rate, the wall speedup and wall-time ratio, and seed 0's trace."""
    steps = num_steps or self.num_steps
    fn = jitted_sampler(self.config, policy, steps)
    args = (self.params, None, jnp.float32(delta), jnp.int32(reuse), jnp.float32(threshold))
    return self._measure(fn, args, steps, lambda out: out)

  def run_uniform(self, num_steps: int):
    """Uniform step reduction: the plain sampler (no indicator) over `num_steps` steps."""
    fn = jitted_plain_sampler(self.config, num_steps)
    trace = {"computed": np.ones(num_steps, bool)}
    metrics, _ = self._measure(fn, (self.params, None), num_steps, lambda x: (x, trace))
    metrics["speedup_flops"] = self.num_steps / num_steps  # no indicator to pay
    return metrics

  def _measure(self, fn, args, steps: int, unpack):
    """`args[1]` is the noise slot, filled per seed."""
    per_seed, traces = [], []
    for x_init, reference in zip(self.x_init, self.references, strict=True):
      x, trace = unpack(fn(args[0], x_init, *args[2:]))
      computed = np.asarray(trace["computed"])
      per_seed.append(
        {
          **image_metrics.fidelity(x, reference, DATA_RANGE),
          "computed_steps": float(computed.sum()),
          "reuse_rate": float((~computed).sum()) / steps,
          "speedup_flops": block_cache.flop_speedup(self.flops, computed, self.num_steps),
        }
      )
      traces.append(trace)
    timed_args = (args[0], self.x_init0, *args[2:])
    speedup = block_cache.wall_speedup(
      self.plain, (self.params, self.x_init0), fn, timed_args, self.config.cache.timing_repeats
    )
    metrics = {"speedup_wall": speedup, "wall_ratio": 1.0 / speedup}
    for name in per_seed[0]:
      mean, lo, hi = seed_interval([m[name] for m in per_seed])
      metrics[name] = mean
      if name in ("psnr", "ssim", "computed_steps", "reuse_rate"):
        metrics[f"{name}_lo"], metrics[f"{name}_hi"] = lo, hi
    metrics["block_evaluations"] = metrics["computed_steps"] * self.config.model.depth
    return metrics, traces[0]


FRONTIER_METRICS = (
  "psnr",
  "psnr_lo",
  "psnr_hi",
  "ssim",
  "ssim_lo",
  "ssim_hi",
  "computed_steps",
  "computed_steps_lo",
  "computed_steps_hi",
  "reuse_rate",
  "speedup_flops",
  "speedup_wall",
  "wall_ratio",
)

# Readings of the rule the paper leaves open, compared at the paper's most aggressive ablation point
# (delta 0.25, R 10% of the steps), where the paper reports 59.0% reuse on Open-Sora: name ->
# `CachePolicy` fields changed from the configured rule.
READINGS = {
  "configured": {},
  "warmup_3": {"warmup": 3},
  "warmup_6": {"warmup": 6},
  "tail_all_half": {"tail_of": "all", "tail_fraction": 0.5},
  "tail_all_quarter": {"tail_of": "all", "tail_fraction": 0.25},
  "tail_remaining_quarter": {"tail_of": "remaining", "tail_fraction": 0.25},
  "tail_each_trigger": {"tail_of": "each_trigger"},
  "no_tail": {"protect_tail": False},
  "adjacent": {"indicator_reference": "adjacent"},
  "adjacent_each_trigger": {"indicator_reference": "adjacent", "tail_of": "each_trigger"},
}


def bwcache_policy(config) -> block_cache.CachePolicy:
  """The configured BWCache rule (`config.cache`); delta and R are passed to the sampler traced."""
  c = config.cache
  return block_cache.CachePolicy(
    kind="bwcache",
    protect_tail=c.protect_tail,
    tail_of=c.tail_of,
    tail_fraction=c.tail_fraction,
    warmup=c.warmup,
    indicator_reference=c.indicator_reference,
    reevaluate=c.reevaluate,
    indicator_blocks=tuple(c.indicator_blocks),
    reuse_mode=c.reuse_mode,
  )


def _store(results: dict, prefix: str, metrics: dict, names=FRONTIER_METRICS) -> None:
  for name in names:
    results[f"{prefix}/{name}"] = metrics[name]


def cache_evaluation(config, params, rng) -> tuple[dict[str, float], dict]:
  """Every arm on the same noise seeds: BWCache at the headline (delta, R) and over the grid of
  delta x R x warm-up, its residual reuse mode, the uncached sampler with the indicator, uniform step
  reduction (at the headline's computed steps and at every `cache.frontier_steps`), fixed-interval
  reuse, a TeaCache-style indicator and, with `cache.compare_readings`, the `READINGS` of the rule.
  Returns flat results and seed 0's traces for the figures."""
  c = config.cache
  arms = _Arms(config, params, rng)
  results, traces = {}, {}
  bw = bwcache_policy(config)
  headline, traces["bwcache"] = arms.run(bw, delta=c.delta, reuse=c.reuse)
  results.update(
    psnr_vs_uncached=headline["psnr"],
    psnr_vs_uncached_lo=headline["psnr_lo"],
    psnr_vs_uncached_hi=headline["psnr_hi"],
    ssim_vs_uncached=headline["ssim"],
    mse_vs_uncached=headline["mse"],
    reuse_rate=headline["reuse_rate"],
    computed_steps=headline["computed_steps"],
    block_evaluations=headline["block_evaluations"],
    block_evaluations_uncached=c.num_steps * config.model.depth,
    speedup_flops=headline["speedup_flops"],
    speedup_wall=headline["speedup_wall"],
  )
  computed = np.asarray(traces["bwcache"]["computed"])
  tail = block_cache.protected_tail_start(computed, bw)
  results["reuse_in_protected_tail"] = int((~computed[tail:]).sum()) if c.protect_tail else -1

  residual_metrics, _ = arms.run(bw._replace(reuse_mode="residual"), delta=c.delta, reuse=c.reuse)
  results.update(
    residual_mode_psnr=residual_metrics["psnr"],
    residual_mode_reuse_rate=residual_metrics["reuse_rate"],
  )

  reference_policy = block_cache.CachePolicy(kind="none", indicator_blocks=())
  with_indicator, traces["uncached"] = arms.run(reference_policy)
  results["indicator_overhead"] = 1.0 / with_indicator["speedup_wall"] - 1.0

  fewer = arms.run_uniform(max(round(headline["computed_steps"]), 1))
  results.update(
    step_reduction_psnr=fewer["psnr"],
    step_reduction_ssim=fewer["ssim"],
    step_reduction_steps=fewer["computed_steps"],
  )
  fixed = block_cache.CachePolicy(
    kind="schedule", schedule=block_cache.fixed_interval_schedule(c.num_steps)
  )
  fixed_metrics, _ = arms.run(fixed)
  results.update(
    fixed_interval_psnr=fixed_metrics["psnr"], fixed_interval_reuse_rate=fixed_metrics["reuse_rate"]
  )
  tea = block_cache.CachePolicy(kind="teacache")
  tea_metrics, traces["teacache"] = arms.run(tea, threshold=c.teacache_threshold)
  results.update(
    teacache_psnr=tea_metrics["psnr"],
    teacache_reuse_rate=tea_metrics["reuse_rate"],
    teacache_speedup_wall=tea_metrics["speedup_wall"],
  )
  for steps in c.frontier_steps:
    uniform = arms.run_uniform(steps)
    _store(results, f"uniform/steps_{steps}", uniform)
  for warmup in c.warmups:
    for delta in c.deltas:
      for reuse in c.reuse_steps:
        grid, _ = arms.run(bw._replace(warmup=warmup), delta=delta, reuse=reuse)
        _store(results, grid_key(delta, reuse, warmup), grid)
  if c.compare_readings:
    results.update(reading_evaluation(config, arms, bw))
  return results, traces


def grid_key(delta: float, reuse: int, warmup: int) -> str:
  return f"grid/delta_{delta:g}/R_{reuse}/W_{warmup}"


def reading_evaluation(config, arms: _Arms, bw: block_cache.CachePolicy) -> dict[str, float]:
  """Each of `READINGS` at `cache.reading_delta` and R = `cache.reading_reuse`: fidelity, reuse rate
  (reused / all steps, the definition used everywhere here) and, for the other definition a reader
  might take, reused steps over the steps before the protected tail of seed 0's trace."""
  c = config.cache
  results = {}
  for name, fields in READINGS.items():
    policy = bw._replace(**fields)
    metrics, trace = arms.run(policy, delta=c.reading_delta, reuse=c.reading_reuse)
    _store(results, f"reading/{name}", metrics)
    computed = np.asarray(trace["computed"])
    tail = (
      block_cache.protected_tail_start(computed, policy) if policy.protect_tail else c.num_steps
    )
    results[f"reading/{name}/reuse_rate_before_tail"] = float((~computed[:tail]).sum()) / tail
  return results


def cache_figures(config, traces) -> dict:
  """ARL1(t) = sum_i L1_rel(h_i) of the uncached run (U-shaped over the trajectory for the paper's
  video DiTs) with the steps BWCache reused shaded, and the step x block heat-map of L1_rel (Eq. 6)."""
  change = np.asarray(traces["uncached"]["block_change"])  # (T, N), NaN at step 0
  arl1 = np.nansum(change, axis=1)
  arl1[0] = np.nan
  fig_curve, ((ax,),) = figure_grid(panel_size=(5, 3.2))
  ax.plot(np.arange(len(arl1)), arl1, marker="o", ms=3)
  computed = np.asarray(traces["bwcache"]["computed"])
  for j in np.flatnonzero(~computed):
    ax.axvspan(j - 0.5, j + 0.5, color="C1", alpha=0.25, lw=0)
  ax.set_xlabel("sampling step (0 = noise)")
  ax.set_ylabel("ARL1 = sum_i L1_rel(h_i)")
  ax.set_title("ARL1(t); shaded: steps BWCache reused")
  fig_heat, ((ax,),) = figure_grid(panel_size=(5, 3.2))
  image = ax.imshow(change.T, aspect="auto", cmap="viridis", origin="lower")
  ax.set_xlabel("sampling step")
  ax.set_ylabel("block")
  ax.set_title("L1_rel per block (uncached run)")
  fig_heat.colorbar(image)
  return {"arl1_curve": fig_curve, "block_change_heatmap": fig_heat}


# ---------------------------------------------------------------------------------------------------
# The phases
# ---------------------------------------------------------------------------------------------------


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  train = Phase(
    name="train",
    num_steps=0 if config.model.checkpoint else config.steps,
    init=functools.partial(init_train_state, config),
    step=functools.partial(train_step, config),
    data=lambda inputs: videos.video_stream(
      config.seed, config.batch_size, **_video_kwargs(config)
    ),
    evaluate=lambda state, rng, inputs: validation_loss(config, state, rng),
    outputs=lambda state, inputs: state["ema_params"],
  )
  evaluation: dict = {}

  def evaluate(state, rng, inputs):
    results, evaluation["traces"] = cache_evaluation(config, state["params"], rng)
    return results

  def artifacts(state, rng, inputs):
    if "traces" not in evaluation:
      _, evaluation["traces"] = cache_evaluation(config, state["params"], rng)
    return cache_figures(config, evaluation["traces"])

  cache = Phase(
    name="cache",
    num_steps=0,
    init=lambda rng, inputs: {"params": inputs["train"]},
    evaluate=evaluate,
    artifacts=artifacts,
  )
  return [train, cache]
