"""BWCache: "Accelerating Video Diffusion Transformers through Block-Wise Caching" (ICLR 2026).

Claim: the per-block relative L1 change of a video DiT's block outputs between sampling steps is small
in the middle of the trajectory; caching all block outputs when their mean change falls below delta and
reusing them for R steps (with periodic recomputation and a protected tail) speeds sampling up with
little loss of fidelity -- far less than taking fewer steps at the same compute.

Phases:
  train  training of a small video DiT (`core/nn/dit.py`) on moving-shape videos
         (`core/data/videos.py`): rectified flow (velocity target, the spec's default) or DDPM with
         eps prediction (`config.diffusion.kind = "ddpm"`, the Latte setting). With
         `config.model.checkpoint` the phase restores the DiT instead and trains 0 steps: an orbax
         checkpoint of this DiT's parameters, or a Latte state dict in a `.safetensors` file
         (`config.model.checkpoint_format = "latte"`, converted by `core/nn/dit_convert.py`).
  cache  training-free (0 steps): samples fixed noise with the uncached sampler (the reference)
         and with every caching arm of `core/block_cache.py` -- BWCache over `config.cache.deltas` x
         `config.cache.reuse_steps`, uniform step reduction at BWCache's number of computed steps,
         fixed-interval reuse, a TeaCache-style indicator -- and reports fidelity against the reference
         (PSNR/SSIM/MSE), reuse rate, block evaluations, FLOP ratio from XLA's cost analysis, measured
         wall-clock speedup of the jitted samplers, indicator overhead, the ARL1(t) curve and the
         step x block heat-map. The sampler is Euler for rectified flow and deterministic DDIM for
         DDPM (`config.cache.sampler`); the caching code is the same for both.

The headline arm (`config.cache.delta`, `config.cache.reuse`) gives `results.json`'s `speedup_wall`,
`speedup_flops`, `psnr_vs_uncached` and `reuse_rate`. Training is step-budgeted (not wall-time) so that
a resumed run ends where an uninterrupted one does; the default step count fits a few CPU minutes.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import block_cache, diffusion, image_metrics
from core.data import videos
from core.nn import dit_convert
from core.nn.dit import VideoDiT
from methods.base import (
  ConfigError,
  Method,
  Phase,
  Report,
  require,
  require_choice,
  require_positive_int,
)

DATA_RANGE = 2.0  # videos live in [-1, 1]


# ---------------------------------------------------------------------------------------------------
# Model and training (phase "train")
# ---------------------------------------------------------------------------------------------------


def video_shape(config) -> tuple[int, int, int, int]:
  d = config.data
  return (d.frames, d.size, d.size, d.channels)


def dit(config) -> VideoDiT:
  """The DiT; its time input is `t in [0, 1]` for rectified flow and the step `n` for DDPM (as DiT)."""
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
  )


def sample_labels(config, batch: int) -> jax.Array | None:
  """Class labels for sampling (`cache.class_label`; -1 = the unconditional label), None if unconditional."""
  k = config.model.num_classes
  if not k:
    return None
  return jnp.full((batch,), config.cache.class_label if config.cache.class_label >= 0 else k)


def blockwise(config) -> block_cache.BlockwiseModel:
  net = dit(config)
  return block_cache.BlockwiseModel(
    embed=lambda p, x, t: net.apply(
      p, x, t, sample_labels(config, x.shape[0]), method=VideoDiT.embed
    ),
    run_blocks=lambda p, h, c: net.apply(p, h, c, method=VideoDiT.run_blocks),
    head=lambda p, h, c: net.apply(p, h, c, method=VideoDiT.head),
    modulation=lambda p, h, c: net.apply(p, h, c, method=VideoDiT.block_input_modulation),
    depth=config.model.depth,
  )


def optimizer(config) -> optax.GradientTransformation:
  warmup = min(config.optim.warmup_steps, config.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, config.optim.learning_rate, warmup, max(config.steps, 1)
  )
  return optax.chain(optax.clip_by_global_norm(config.optim.grad_clip), optax.adamw(schedule))


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
  if config.diffusion.kind == "ddpm":
    return eps_loss(config, params, videos_batch, rng)
  return flow_loss(config, params, videos_batch, rng)


def eps_loss(config, params, videos_batch, rng):
  """DDPM eps regression with `n ~ U{0..N-1}` (Ho et al. 2020, Eq. 14). With `learn_sigma` the
  variance half is not trained (no variational-bound term): DDIM with eta = 0 does not use it."""
  n_rng, eps_rng = jax.random.split(rng)
  n = diffusion.ddpm_timesteps(n_rng, videos_batch.shape[:1], config.diffusion.train_steps)
  eps = jax.random.normal(eps_rng, videos_batch.shape)
  x_n = diffusion.ddpm_perturb(videos_batch, eps, diffusion.alpha_bar_at(alpha_bars(config), n))
  return jnp.mean(jnp.square(dit(config).apply(params, x_n, n) - eps))


def flow_loss(config, params, videos_batch, rng):
  """Rectified-flow velocity regression, `t ~ logit-normal` (spec Sec. 3)."""
  t_rng, eps_rng = jax.random.split(rng)
  t = diffusion.logit_normal_time(t_rng, videos_batch.shape[:1])
  eps = jax.random.normal(eps_rng, videos_batch.shape)
  x_t = diffusion.rf_interpolate(videos_batch, eps, t)
  v = dit(config).apply(params, x_t, t)
  return jnp.mean(jnp.square(v - diffusion.rf_velocity_target(videos_batch, eps)))


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
  losses = [
    training_loss(config, state["ema_params"], held_out, jax.random.fold_in(rng, i))
    for i in range(4)
  ]
  return {validation_key(config): float(np.mean(losses))}


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


@functools.lru_cache(maxsize=64)
def _jitted_sampler(frozen: str, policy: block_cache.CachePolicy, num_steps: int):
  """`(params, x_init, delta, reuse, threshold) -> (x, trace)`; the numeric knobs are traced."""
  config = ml_collections.ConfigDict(__import__("json").loads(frozen))
  model, steps = blockwise(config), sampler(config, num_steps)

  def sample(params, x_init, delta, reuse, threshold):
    knobs = policy._replace(delta=delta, reuse_steps=reuse, teacache_threshold=threshold)
    return block_cache.cached_sample(model, params, x_init, steps, knobs)

  return jax.jit(sample)


@functools.lru_cache(maxsize=16)
def _jitted_plain_sampler(frozen: str, num_steps: int):
  """The uncached sampler with no indicator at all: the wall-clock and FLOP baseline."""
  config = ml_collections.ConfigDict(__import__("json").loads(frozen))
  net, steps = dit(config), sampler(config, num_steps)

  def sample(params, x):
    labels = sample_labels(config, x.shape[0])
    return diffusion.sample(lambda x, t: net.apply(params, x, t, labels), x, steps)

  return jax.jit(sample)


def _frozen(config) -> str:
  return config.to_json(sort_keys=True)


def _seconds(fn, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def _speedup(reference, reference_args, fn, args, repeats: int) -> float:
  """Median over `repeats` of (reference time / `fn` time), the two timed back to back each round so
  that changes in machine load affect both alike. Both are compiled before timing."""
  jax.block_until_ready(reference(*reference_args))
  jax.block_until_ready(fn(*args))
  return statistics.median(
    _seconds(reference, *reference_args) / _seconds(fn, *args) for _ in range(repeats)
  )


def _flops(fn, *args) -> float:
  analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
  if isinstance(analysis, list | tuple):
    analysis = analysis[0]
  return float(analysis["flops"])


def step_flops(config, params, x) -> dict[str, float]:
  """FLOPs of one computed step, one reused step and the indicator (XLA cost analysis)."""
  model, times = blockwise(config), sampler(config, config.cache.num_steps).times
  t = jnp.full(x.shape[:1], times[config.cache.num_steps // 2])

  def computed(p, x):
    h0, c = model.embed(p, x, t)
    h_n, outputs = model.run_blocks(p, h0, c)
    return x - 0.1 * model.head(p, h_n, c), outputs

  def reused(p, x, cache):
    h0, c = model.embed(p, x, t)
    return x - 0.1 * model.head(p, cache, c)

  _, outputs = jax.eval_shape(computed, params, x)
  cache = jnp.zeros(outputs.shape[1:], outputs.dtype)
  previous = jnp.zeros(outputs.shape, outputs.dtype)
  from kernels.block_cache import reference

  return {
    "computed": _flops(computed, params, x),
    "reused": _flops(reused, params, x, cache),
    "indicator": _flops(reference.relative_l1_update, previous, previous),
  }


def _fidelity(x, reference) -> dict[str, float]:
  return {
    "psnr": float(jnp.mean(image_metrics.psnr(x, reference, DATA_RANGE))),
    "ssim": float(jnp.mean(image_metrics.ssim(x, reference, DATA_RANGE))),
    "mse": float(jnp.mean(image_metrics.mse(x, reference))),
  }


def _first_trigger_limit(computed: np.ndarray) -> int:
  """The protected tail's start implied by the first reused step (first trigger = the step before)."""
  reused = np.flatnonzero(~computed)
  if reused.size == 0:
    return len(computed)
  k = int(reused[0]) - 1
  return k + (len(computed) - k) // 2


class _Arms:
  """Runs caching arms against one reference on fixed noise and collects their metrics."""

  def __init__(self, config, params, rng):
    self.config, self.params, self.frozen = config, params, _frozen(config)
    self.num_steps = config.cache.num_steps
    shape = (config.cache.num_videos, *video_shape(config))
    self.x_init = jax.random.normal(rng, shape)
    self.plain = _jitted_plain_sampler(self.frozen, self.num_steps)
    self.reference = self.plain(params, self.x_init)
    self.flops = step_flops(config, params, self.x_init)

  def run(
    self,
    policy: block_cache.CachePolicy,
    num_steps: int | None = None,
    delta=0.0,
    reuse=0,
    threshold=0.0,
  ):
    steps = num_steps or self.num_steps
    fn = _jitted_sampler(self.frozen, policy, steps)
    args = (self.params, self.x_init, jnp.float32(delta), jnp.int32(reuse), jnp.float32(threshold))
    x, trace = fn(*args)
    speedup = _speedup(
      self.plain, (self.params, self.x_init), fn, args, self.config.cache.timing_repeats
    )
    computed = np.asarray(trace["computed"])
    n_computed, n_reused = int(computed.sum()), int((~computed).sum())
    f = self.flops
    cost = n_computed * (f["computed"] + f["indicator"]) + n_reused * f["reused"]
    metrics = {
      **_fidelity(x, self.reference),
      "reuse_rate": n_reused / steps,
      "computed_steps": n_computed,
      "block_evaluations": n_computed * self.config.model.depth,
      "speedup_flops": self.num_steps * f["computed"] / cost,
      "speedup_wall": speedup,
    }
    return metrics, trace


def cache_evaluation(config, params, rng) -> tuple[dict[str, float], dict]:
  """Every arm of the spec's Sec. 3 on the same noise; returns flat results and the traces for figures."""
  c = config.cache
  arms = _Arms(config, params, rng)
  results, traces = {}, {}
  blocks = tuple(c.indicator_blocks)
  bw = block_cache.CachePolicy(
    kind="bwcache",
    protect_tail=c.protect_tail,
    reevaluate=c.reevaluate,
    indicator_blocks=blocks,
    reuse_mode=c.reuse_mode,
  )
  headline, traces["bwcache"] = arms.run(bw, delta=c.delta, reuse=c.reuse)
  results.update(
    psnr_vs_uncached=headline["psnr"],
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
  tail = _first_trigger_limit(computed)
  results["reuse_in_protected_tail"] = int((~computed[tail:]).sum()) if c.protect_tail else -1

  residual_metrics, _ = arms.run(bw._replace(reuse_mode="residual"), delta=c.delta, reuse=c.reuse)
  results.update(
    residual_mode_psnr=residual_metrics["psnr"],
    residual_mode_reuse_rate=residual_metrics["reuse_rate"],
  )

  reference_policy = block_cache.CachePolicy(kind="none", indicator_blocks=())
  with_indicator, traces["uncached"] = arms.run(reference_policy)
  results["indicator_overhead"] = 1.0 / with_indicator["speedup_wall"] - 1.0

  fewer, _ = arms.run(reference_policy, num_steps=max(headline["computed_steps"], 1))
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
  for delta in c.deltas:
    for reuse in c.reuse_steps:
      grid, _ = arms.run(bw, delta=delta, reuse=reuse)
      for name in ("psnr", "ssim", "reuse_rate", "speedup_wall", "speedup_flops", "computed_steps"):
        results[f"grid/delta_{delta:g}/R_{reuse}/{name}"] = grid[name]
  return results, traces


def cache_figures(config, traces) -> dict:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  change = np.asarray(traces["uncached"]["block_change"])  # (T, N), NaN at step 0
  arl1 = np.nansum(change, axis=1)
  arl1[0] = np.nan
  fig_curve, ax = plt.subplots(figsize=(5, 3.2))
  ax.plot(np.arange(len(arl1)), arl1, marker="o", ms=3)
  computed = np.asarray(traces["bwcache"]["computed"])
  for j in np.flatnonzero(~computed):
    ax.axvspan(j - 0.5, j + 0.5, color="C1", alpha=0.25, lw=0)
  ax.set_xlabel("sampling step (0 = noise)")
  ax.set_ylabel("ARL1 = sum_i L1_rel(h_i)")
  ax.set_title("ARL1(t); shaded: steps BWCache reused")
  fig_heat, ax = plt.subplots(figsize=(5, 3.2))
  image = ax.imshow(change.T, aspect="auto", cmap="viridis", origin="lower")
  ax.set_xlabel("sampling step")
  ax.set_ylabel("block")
  ax.set_title("L1_rel per block (uncached run)")
  fig_heat.colorbar(image)
  return {"arl1_curve": fig_curve, "block_change_heatmap": fig_heat}


# ---------------------------------------------------------------------------------------------------
# Phases, validation, study
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


def validate(config: ml_collections.ConfigDict) -> None:
  for field in (
    "data.frames",
    "data.size",
    "data.channels",
    "model.hidden",
    "model.depth",
    "model.heads",
  ):
    require_positive_int(config, field)
  require_choice(config, "model.attention", ("full", "alternating"))
  require_choice(config, "cache.reuse_mode", ("output", "residual"))
  f, s = config.data.frames, config.data.size
  pt, ph, pw = config.model.patch
  require(
    f % pt == 0 and s % ph == 0 and s % pw == 0,
    "model.patch",
    f"{tuple(config.model.patch)} must divide (F, H, W) = ({f}, {s}, {s})",
  )
  require(config.model.hidden % config.model.heads == 0, "model.heads", "must divide model.hidden")
  require(s >= 7, "data.size", "frames must be at least 7x7 (SSIM window)")
  for field in ("cache.num_steps", "cache.num_videos", "cache.timing_repeats"):
    require_positive_int(config, field)
  require(
    isinstance(config.cache.reuse, int) and config.cache.reuse >= 0,
    "cache.reuse",
    "must be an int >= 0",
  )
  require(
    all(0 <= b < config.model.depth for b in config.cache.indicator_blocks),
    "cache.indicator_blocks",
    f"must index the {config.model.depth} blocks",
  )
  require(config.cache.delta >= 0, "cache.delta", "must be >= 0")
  _validate_diffusion(config)
  _validate_checkpoint(config)


def _validate_diffusion(config) -> None:
  """The training target and the sampler must agree: Euler for rectified flow, DDIM for DDPM."""
  require_choice(config, "diffusion.kind", ("rectified_flow", "ddpm"))
  require_choice(config, "cache.sampler", ("euler", "ddim"))
  require_choice(config, "cache.ddim_spacing", diffusion.DDIM_SPACINGS)
  if config.diffusion.kind == "rectified_flow":
    require(
      config.cache.sampler == "euler",
      "cache.sampler",
      "'ddim' needs diffusion.kind='ddpm'; for rectified flow deterministic DDIM is the Euler step",
    )
    return
  require(
    config.cache.sampler == "ddim", "cache.sampler", "'euler' needs rectified flow; use 'ddim'"
  )
  require_positive_int(config, "diffusion.train_steps")
  require(
    config.cache.num_steps <= config.diffusion.train_steps,
    "cache.num_steps",
    f"DDIM takes at most diffusion.train_steps = {config.diffusion.train_steps} steps",
  )
  d = config.diffusion
  require(
    0 < d.beta_start < d.beta_end < 1, "diffusion.beta_end", "need 0 < beta_start < beta_end < 1"
  )


def _validate_checkpoint(config) -> None:
  """Model options a Latte checkpoint needs, and the class label used for sampling."""
  m = config.model
  require_choice(config, "model.positions", ("sincos3d", "latte"))
  require_choice(config, "model.checkpoint_format", ("orbax", "latte"))
  require(isinstance(m.learn_sigma, bool), "model.learn_sigma", "must be a bool")
  require(
    isinstance(m.time_frequencies, int) and m.time_frequencies >= 0 and m.time_frequencies % 2 == 0,
    "model.time_frequencies",
    "must be an even int >= 0 (0 = model.hidden)",
  )
  if m.positions == "latte":
    require(
      m.attention == "alternating", "model.attention", "positions='latte' needs 'alternating'"
    )
    require(m.hidden % 4 == 0, "model.hidden", "positions='latte' needs a multiple of 4")
  if m.checkpoint_format == "latte":
    require(bool(m.checkpoint), "model.checkpoint", "checkpoint_format='latte' needs a file")
    require(m.positions == "latte", "model.positions", "a Latte checkpoint needs 'latte'")
    require(m.patch[0] == 1, "model.patch", "Latte patchifies each frame: patch[0] must be 1")
  require(
    isinstance(m.num_classes, int) and m.num_classes >= 0,
    "model.num_classes",
    "must be an int >= 0",
  )
  require(
    -1 <= config.cache.class_label < m.num_classes,
    "cache.class_label",
    f"must be -1 (unconditional) or a class in [0, {m.num_classes})",
  )


def study_arms(config):
  return [("bwcache", config)]


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  r = results["bwcache"]
  rows = []
  for delta in config.cache.deltas:
    for reuse in config.cache.reuse_steps:
      key = f"grid/delta_{delta:g}/R_{reuse}"
      rows.append(
        {
          "arm": "BWCache",
          "delta": delta,
          "R": reuse,
          "psnr_db": r[f"{key}/psnr"],
          "ssim": r[f"{key}/ssim"],
          "reuse_rate": r[f"{key}/reuse_rate"],
          "computed_steps": r[f"{key}/computed_steps"],
          "speedup_flops": r[f"{key}/speedup_flops"],
          "speedup_wall": r[f"{key}/speedup_wall"],
        }
      )
  rows.append(
    {
      "arm": f"step reduction ({r['step_reduction_steps']:.0f} steps)",
      "psnr_db": r["step_reduction_psnr"],
      "ssim": r["step_reduction_ssim"],
      "computed_steps": r["step_reduction_steps"],
    }
  )
  rows.append(
    {
      "arm": "fixed-interval reuse",
      "psnr_db": r["fixed_interval_psnr"],
      "reuse_rate": r["fixed_interval_reuse_rate"],
    }
  )
  rows.append(
    {
      "arm": "TeaCache-style",
      "psnr_db": r["teacache_psnr"],
      "reuse_rate": r["teacache_reuse_rate"],
      "speedup_wall": r["teacache_speedup_wall"],
    }
  )
  columns = (
    "arm",
    "delta",
    "R",
    "psnr_db",
    "ssim",
    "reuse_rate",
    "computed_steps",
    "speedup_flops",
    "speedup_wall",
  )
  rows = [{k: row.get(k) for k in columns} for row in rows]
  summary = {
    k: r[k]
    for k in (
      "psnr_vs_uncached",
      "reuse_rate",
      "speedup_wall",
      "speedup_flops",
      "step_reduction_psnr",
      "reuse_in_protected_tail",
      "indicator_overhead",
      validation_key(config),
    )
  }
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  for reuse in config.cache.reuse_steps:
    keys = [f"grid/delta_{d:g}/R_{reuse}" for d in config.cache.deltas]
    axes[0].plot(
      config.cache.deltas, [r[f"{k}/psnr"] for k in keys], marker="o", label=f"R={reuse}"
    )
    axes[1].plot(
      config.cache.deltas, [r[f"{k}/reuse_rate"] for k in keys], marker="o", label=f"R={reuse}"
    )
  axes[0].axhline(r["step_reduction_psnr"], color="gray", ls="--", label="step reduction")
  axes[0].set_xlabel("delta")
  axes[0].set_ylabel("PSNR vs uncached (dB)")
  axes[1].set_xlabel("delta")
  axes[1].set_ylabel("reuse rate")
  axes[0].legend()
  axes[1].legend()
  fig.tight_layout()
  return Report(rows=rows, summary=summary, figures={"psnr_and_reuse_vs_delta": fig})


METHOD = Method(
  name="bwcache", phases=phases, validate=validate, study_arms=study_arms, report=report
)
