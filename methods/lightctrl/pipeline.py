"""The training-free phase: LightCtrl and its baselines on the trained networks (`core/relighting.py`).

Arms (`config.evaluation.arms`):
  source                 the input video (no relighting)
  per_frame              the relighter on every frame, conditioned on the source frame (IC-Light)
  per_frame_sdedit_<s>   the per-frame result re-noised to strength s, denoised by the video prior
  lav_traj               progressive light fusion with trajectory light maps, without LMI and GAR
                         (Light-A-Video's fusion loop; its consistent-light attention is not modelled)
  lightctrl_no_lmi       fusion + GAR
  lightctrl_no_gar       fusion + LMI
  lightctrl              fusion + LMI + GAR (the full pipeline)
  oracle                 the target render
All fusion arms share one jitted sampler; LMI and GAR are traced switches of it. The arms run on
`networks(config, state)`: the three trained networks, or for the `paper` variant SD-1.5 + IC-Light fc
+ AnimateDiff (`paper.py`), through the same code.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import relight_metrics, relighting
from core.data import gif, lambertian
from methods.base import EvaluationChunks, Phase, cached_per_config, figure_grid
from methods.lightctrl import models as P
from methods.lightctrl import paper

FUSION_ARMS = {  # arm: (LMI, GAR)
  "lav_traj": (0.0, 0.0),
  "lightctrl_no_lmi": (0.0, 1.0),
  "lightctrl_no_gar": (1.0, 0.0),
  "lightctrl": (1.0, 1.0),
}
SDEDIT_PREFIX = "per_frame_sdedit_"
METRICS = (
  "psnr",
  "ssim",
  "light_following",
  "psnr_light",
  "source_leakage",
  "flicker",
  "prompt_error",
)


def known_arm(name: str) -> bool:
  if name in ("source", "per_frame", "oracle") or name in FUSION_ARMS:
    return True
  if name.startswith(SDEDIT_PREFIX):
    try:
      return 0 < float(name[len(SDEDIT_PREFIX) :]) <= 1
    except ValueError:
      return False
  return False


# ---------------------------------------------------------------------------------------------------
# The networks as the callables of core.relighting
# ---------------------------------------------------------------------------------------------------


def uses_paper_networks(config) -> bool:
  """The `paper` variant runs the arms on SD-1.5 + IC-Light + AnimateDiff (`paper.py`)."""
  return config.variant == "paper"


def networks(config, state) -> P.Networks:
  """The networks every arm runs: the trained ones, or the paper's for the `paper` variant."""
  if uses_paper_networks(config):
    return paper.networks(config, state)
  return P.trained_networks(config, state)


def _relighter_fns(config, nets: P.Networks) -> relighting.RelighterFns:
  p = config.pipeline
  schedule = relighting.euler_schedule(P.alpha_bars(config), p.relight_steps, p.relight_strength)
  return relighting.RelighterFns(
    eps=nets.relighter_eps, guidance=p.relight_guidance, schedule=schedule
  )


def _video_eps(config, nets: P.Networks, prompt):
  eps = lambda x, t, conditional: nets.video_eps(x, t, prompt, conditional)
  return relighting.guided(eps, config.pipeline.guidance)


def _frames(x: jax.Array) -> jax.Array:
  return x.reshape(-1, *x.shape[2:])


def make_relight(config, nets: P.Networks, clips, gar: jax.Array):
  """`(I, lambda, rng) -> I'`: GAR (if `gar` = 1) and the per-frame relighter from the light maps."""
  p = config.pipeline
  fns = _relighter_fns(config, nets)
  z_normal = nets.encode(clips["normals"])
  z_light = nets.encode(P.grey(clips["light_map"]))
  prompts = jnp.repeat(clips["prompt"], config.data.frames)

  def relight(images, lam, rng):
    z_rgb = nets.encode(images)
    z_gar = relighting.geometry_aware_latent(
      z_normal, z_rgb, lam, p.gar_axes, p.gar_filter, p.gar_order
    )
    condition = gar * z_gar + (1.0 - gar) * z_rgb
    if config.relighter.light_condition == "fbc":
      condition = jnp.concatenate([condition, z_light], axis=-1)
    z = relighting.relight_frames(fns, _frames(z_light), _frames(condition), prompts, rng)
    return nets.decode(z.reshape(z_rgb.shape))

  return relight


def _pipeline_fns(config, nets: P.Networks, clips, gar) -> relighting.PipelineFns:
  return relighting.PipelineFns(
    encode=nets.encode,
    decode=nets.decode,
    video_eps=_video_eps(config, nets, clips["prompt"]),
    relight=make_relight(config, nets, clips, gar),
  )


# ---------------------------------------------------------------------------------------------------
# Jitted arms
# ---------------------------------------------------------------------------------------------------


def schedule_for(config, strength: float) -> relighting.EulerSchedule:
  """`pipeline.num_steps` steps at `strength`: the shape never depends on the strength, so one jitted
  sampler serves every arm."""
  return relighting.euler_schedule(P.video_alpha_bars(config), config.pipeline.num_steps, strength)


def lightctrl_video(config, state, clips, start, rng, lmi, gar, fuse_above, schedule):
  """SDEdit of `start` (pixels) along `schedule`, LMI on its noised latent (`lmi` in {0, 1}), the
  fusion loop (never when `fuse_above >= 1`), decoded. Sec. 3.2-3.4."""
  p = config.pipeline
  noise_key, inject_key, loop_key = jax.random.split(rng, 3)
  nets = networks(config, state)
  fns = _pipeline_fns(config, nets, clips, gar)
  z0 = fns.encode(start)
  sigma = schedule.sigmas[0]
  z = relighting.noise_to(z0, sigma, jax.random.normal(noise_key, z0.shape))
  scale = nets.factor
  masks = relighting.lmi_masks(
    clips["light_path"] / scale, z.shape[-2], config.data.light_radius / scale, p.mask_threshold
  )
  fresh = jax.random.normal(inject_key, z.shape)
  if p.lmi_noise_scale == "sigma":
    fresh = fresh * sigma
  z = relighting.inject_light_map(z, lmi * masks, fresh, p.omega)
  z = relighting.lightctrl_sample(fns, schedule, z, clips["source"], loop_key, fuse_above, p.detail)
  return jnp.clip(fns.decode(z), 0.0, 1.0)


@cached_per_config(maxsize=4)
def jitted_fusion(config):
  """`(state, clips, start, rng, lmi, gar, fuse_above, schedule) -> video`, all traced."""
  return jax.jit(functools.partial(lightctrl_video, config))


@cached_per_config(maxsize=4)
def jitted_per_frame(config):
  def run(state, clips, rng):
    relight = make_relight(config, networks(config, state), clips, jnp.float32(0.0))
    return jnp.clip(relight(clips["source"], jnp.float32(0.0), rng), 0.0, 1.0)

  return jax.jit(run)


@cached_per_config(maxsize=4)
def jitted_metrics(config):
  def metrics(video, clips, colours):
    return relight_metrics.all_metrics(video, clips, colours, lambertian.AMBIENT)

  return jax.jit(metrics)


class _ArmRunner:
  """Runs the arms of `config.evaluation.arms` one at a time on the evaluation clips, with the
  per-frame relighting (the input of `per_frame` and the SDEdit arms) computed once, when first
  needed. `pipeline.clips_per_call` clips go through the networks at once (0: all)."""

  def __init__(self, config, state, rng):
    self.config, self.state, self.rng = config, state, rng
    self.clips = P.evaluation_clips(config)
    self.chunks = _chunks(config, self.clips)
    self.arms = tuple(config.evaluation.arms)
    self._per_frame = None

  def per_frame(self) -> list:
    if self._per_frame is None:
      key = jax.random.fold_in(self.rng, 0)
      self._per_frame = [
        jitted_per_frame(self.config)(self.state, clips, _chunk_key(key, c, self.chunks))
        for c, clips in enumerate(self.chunks)
      ]
    return self._per_frame

  def video(self, arm: str) -> np.ndarray:
    needs_per_frame = arm == "per_frame" or arm.startswith(SDEDIT_PREFIX)
    per_frame = self.per_frame() if needs_per_frame else [None] * len(self.chunks)
    key = jax.random.fold_in(self.rng, self.arms.index(arm) + 1)
    outs = [
      _arm(self.config, self.state, arm, clips, per_frame[c], _chunk_key(key, c, self.chunks))
      for c, clips in enumerate(self.chunks)
    ]
    return np.concatenate([np.asarray(out) for out in outs])


def run_arms(config, state, rng) -> tuple[dict[str, np.ndarray], dict]:
  """Every arm of `config.evaluation.arms` on the evaluation clips: their videos and the clips."""
  runner = _ArmRunner(config, state, rng)
  return {arm: runner.video(arm) for arm in runner.arms}, runner.clips


def _chunks(config, clips_np) -> list[dict[str, jax.Array]]:
  total = len(clips_np["source"])
  size = config.pipeline.clips_per_call or total
  return [
    {k: jnp.asarray(v[start : start + size]) for k, v in clips_np.items()}
    for start in range(0, total, size)
  ]


def _chunk_key(key, index: int, chunks) -> jax.Array:
  """The arm's key itself when all clips go at once (so results do not depend on chunking
  being available), else one key per chunk."""
  return key if len(chunks) == 1 else jax.random.fold_in(key, index)


def _arm(config, state, arm: str, clips, per_frame, key) -> jax.Array:
  if arm == "source":
    return clips["source"]
  if arm == "oracle":
    return clips["target"]
  if arm == "per_frame":
    return per_frame
  if arm.startswith(SDEDIT_PREFIX):
    schedule = schedule_for(config, float(arm[len(SDEDIT_PREFIX) :]))
    return jitted_fusion(config)(state, clips, per_frame, key, 0.0, 0.0, 2.0, schedule)
  lmi, gar = FUSION_ARMS[arm]
  schedule = schedule_for(config, config.pipeline.strength)
  return jitted_fusion(config)(
    state, clips, clips["source"], key, lmi, gar, config.pipeline.fuse_above, schedule
  )


def single_arm_metrics(config, arm: str, video, clips) -> dict[str, float | list]:
  """`<arm>/<metric>`: the mean over clips, and `<arm>/<metric>_per_clip`."""
  colours = jnp.asarray(lambertian.LIGHT_COLOURS[clips["prompt"]])
  jclips = {k: jnp.asarray(v) for k, v in clips.items()}
  values = jitted_metrics(config)(jnp.asarray(video), jclips, colours)
  results: dict = {}
  for name in METRICS:
    per_clip = np.asarray(values[name], np.float64)
    results[f"{arm}/{name}"] = float(per_clip.mean())
    results[f"{arm}/{name}_per_clip"] = per_clip
  return results


def with_headline(config, results: dict) -> dict:
  """The arms' metrics and the headline arm's means on top (`<metric>`)."""
  headline = config.evaluation.headline
  return {**results, **{name: results[f"{headline}/{name}"] for name in METRICS}}


def arm_metrics(config, videos, clips) -> dict[str, float | list]:
  """`<arm>/<metric>` means over clips and per-clip lists, and the headline arm's means on top."""
  results: dict = {}
  for arm, video in videos.items():
    results |= single_arm_metrics(config, arm, video, clips)
  return with_headline(config, results)


def arm_chunks(config, state, rng, evaluation: dict) -> EvaluationChunks:
  """The evaluation as one chunk per arm (saved and resumed by the loop one arm at a time); the
  videos of the arms run in this process are kept in `evaluation` for the artifacts. Equal to
  `arm_metrics` of `run_arms`."""
  runner = _ArmRunner(config, state, rng)
  evaluation["videos"], evaluation["clips"] = {}, runner.clips

  def run(arm):
    evaluation["videos"][arm] = runner.video(arm)
    return single_arm_metrics(config, arm, evaluation["videos"][arm], runner.clips)

  def combine(done):
    if len(evaluation["videos"]) < len(runner.arms):  # resumed: some arms ran before
      del evaluation["videos"]
    return with_headline(config, {k: v for arm in runner.arms for k, v in done[arm].items()})

  return EvaluationChunks(names=runner.arms, run=run, combine=combine)


def frames_figure(config, videos, clips):
  """One row per arm, one column per frame of `evaluation.figure_clip`, the light path marked."""
  clip = config.evaluation.figure_clip
  arms = list(videos)
  frames = config.data.frames
  fig, axes = figure_grid(len(arms), frames, panel_size=(1.3, 1.3))
  path = clips["light_path"][clip]
  for row, arm in enumerate(arms):
    for f in range(frames):
      ax = axes[row, f]
      ax.imshow(np.clip(videos[arm][clip, f], 0, 1), interpolation="nearest")
      ax.plot(path[f, 0], path[f, 1], "+", color="red", ms=6)
      ax.set_xticks([])
      ax.set_yticks([])
      if f == 0:
        ax.set_ylabel(arm, fontsize=7)
  trajectory = lambertian.TRAJECTORIES[clip % len(lambertian.TRAJECTORIES)]
  fig.suptitle(
    f"clip {clip}: {trajectory}, prompt {lambertian.PROMPTS[int(clips['prompt'][clip])]}"
  )
  fig.tight_layout()
  return fig


def clip_gifs(config, videos) -> gif.VideoClips:
  """Clip `evaluation.figure_clip` of every arm as a looping GIF (`relit_clips/<arm>.gif`): flicker and
  light following are claims about motion, which a row of frames shows less well."""
  clip = config.evaluation.figure_clip
  scale = max(1, 128 // config.data.size)  # small renders enlarged to ~128 px
  return gif.VideoClips(
    {arm: np.clip(v[clip], 0, 1) for arm, v in videos.items()}, fps=4.0, scale=scale
  )


def relight_phase(config) -> Phase:
  """The arms on the trained networks (the outputs of the training phases, the phase's state), or
  for the `paper` variant on the paper's checkpoints: the state is the prompts' text embeddings,
  the networks are read and converted when the phase evaluates (`paper.load_networks`, cached), so
  that gigabytes of released weights are neither traced as constants nor checkpointed again."""
  evaluation: dict = {}
  if uses_paper_networks(config):
    init = lambda rng, inputs: {"text": paper.prompt_embeddings(config)}
    weights = lambda state: {**paper.load_networks(config), "text": state["text"]}
  else:
    init = lambda rng, inputs: {
      "ae": inputs["autoencoder"],
      "relighter": inputs["relighter"],
      "vdm": inputs["video_prior"],
    }
    weights = lambda state: state

  def evaluate(state, rng, inputs):
    return arm_chunks(config, weights(state), rng, evaluation)

  def artifacts(state, rng, inputs):
    if "videos" not in evaluation:
      evaluation["videos"], evaluation["clips"] = run_arms(
        config, weights(state), jax.random.fold_in(rng, -1)
      )
    videos, clips = evaluation["videos"], evaluation["clips"]
    return {
      "relit_frames": frames_figure(config, videos, clips),
      "relit_clips": clip_gifs(config, videos),
    }

  return Phase(name="relight", num_steps=0, init=init, evaluate=evaluate, artifacts=artifacts)
