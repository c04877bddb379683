r"""LightCtrl: "LightCtrl: Training-free Controllable Video Relighting" (Peng, Chen, Zhang, Cun; ICLR 2026;
official code GVCLab/LightCtrl).

Claim: fusing a light-map-steered image relighter into the denoising loop of a video diffusion prior,
with Light Map Injection (re-randomising the latent where the light will be) and Geometry-Aware
Relighting (the relighter's condition takes its low frequencies from the normal video), relights a video
along a given light trajectory: the light follows the path better than Light-A-Video-style fusion, with
less source-light leakage and far less flicker than per-frame relighting.

Small-scale setting: three networks trained here on rendered Lambertian scenes with exact normals
(core/data/lambertian.py): a latent autoencoder (32x32x3 <-> 8x8x4), an image relighter (IC-Light-fc
analogue: noisy latent || condition latent, a 3-way lighting prompt with classifier-free guidance) and
a video prior (AnimateDiff analogue: a video DiT with temporal attention, core/nn/dit.py); then the
training-free pipeline (core/relighting.py) on clips along the paper's six trajectories, against
ground-truth renders.

Variants:
  default  the three models at CPU size and the pipeline arms (per-frame relighter, LAV-Traj, LightCtrl
           with and without LMI / GAR) on 6 clips with shortened samplers: about 4 CPU-minutes per
           seed (`study.seeds`, 3 by default, when run by experiments/study.py).
  study    longer training, longer samplers (20 video steps at strength 0.5, 8 relighter steps at
           0.9; the paper: 25 and 15), all arms (+ SDEdit 0.2 / 0.6, oracle) on 12 clips: about 14
           CPU-minutes per seed (3 seeds: 45 minutes wall on a shared 2-core machine).
  gpu      the same pipeline at a larger synthetic scale on one accelerator (64x64 renders, 16 frames,
           wider networks, 48 clips); no weights needed.
  paper    the arms on the paper's networks (no training phase): SD-1.5 (Realistic Vision 5.1) VAE,
           CLIP text encoder and UNet, IC-Light fc (the UNet + offsets, 8 input channels) as the
           relighter and the UNet + AnimateDiff's motion adapter v1-5-3 as the video prior
           (methods/lightctrl/paper.py, core/nn/sd_unet.py), named in `paper.*` fields (empty by
           default; validation stops naming the first missing one).

  python experiments/train.py --config=configs/lightctrl.py --workdir=runs/lightctrl
  python experiments/study.py --config=configs/lightctrl.py:study --workdir=runs/lightctrl_study
  python experiments/train.py --config=configs/lightctrl.py:paper --workdir=runs/lightctrl_paper \
    --config.paper.vae_checkpoint=... (every paper.* file; docs/methods/lightctrl.md)
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "gpu", "paper")
ARMS = (
  "source",  # the input video, unchanged
  "per_frame",  # the image relighter on every frame independently (IC-Light per frame)
  "per_frame_sdedit_0.2",  # per-frame output re-noised to strength 0.2 and denoised by the video prior
  "per_frame_sdedit_0.6",
  "lav_traj",  # progressive light fusion with trajectory light maps, no LMI, no GAR (Light-A-Video)
  "lightctrl_no_lmi",
  "lightctrl_no_gar",
  "lightctrl",  # the full pipeline
  "oracle",  # the target render
)


def _training(steps: int, batch_size: int, learning_rate: float) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    {
      "steps": steps,
      "batch_size": batch_size,
      "learning_rate": learning_rate,
      "warmup_steps": 50,
      "grad_clip": 1.0,
      "ema_decay": 0.99,  # EMA of the diffusion models' weights, used for sampling
    }
  )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "lightctrl"
  config.variant = variant
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.frames = 8  # frames per clip (the paper: 16 with AnimateDiff)
  config.data.size = 32  # render side in pixels (the paper: 512)
  # light-map and spot radius in pixels: the paper's 75 px at 512 is 4.7 px at 32; 6 keeps the LMI
  # mask (threshold 0.2 at sigma = R / f) at least 3 latent cells wide
  config.data.light_radius = 6.0
  config.data.light_height = 16.0  # target light height above the ground plane, pixels
  config.data.max_objects = 3
  config.data.normal_noise = 0.0  # std of noise on the normal video (a normal estimator's error)

  config.autoencoder = _training(steps=250, batch_size=32, learning_rate=2e-3)
  config.autoencoder.latent_channels = 4
  config.autoencoder.widths = (16, 32)  # one stride-2 level per width: f = 4
  config.autoencoder.latent_penalty = 1e-4  # weight of mean(z^2), keeps the latent scale bounded

  config.relighter = _training(steps=300, batch_size=48, learning_rate=2e-3)
  config.relighter.width = 32
  # how the light map reaches the relighter: "init" (IC-Light fc: only as the img2img initial latent)
  # | "fbc" (also concatenated as a condition latent, IC-Light's background-conditioned variant)
  config.relighter.light_condition = "init"
  config.relighter.prompt_dropout = 0.1  # null-prompt rate in training (classifier-free guidance)
  # fraction of training conditions replaced by the GAR mix (normal-latent low band + source-latent
  # high band, cutoff ~ U(pipeline.fuse_above, 1)); 0 = trained on source latents only, as IC-Light
  config.relighter.gar_rate = 0.0

  config.video_prior = _training(steps=300, batch_size=16, learning_rate=1e-3)
  config.video_prior.hidden = 64
  config.video_prior.depth = 4
  config.video_prior.heads = 4
  config.video_prior.mlp_ratio = 4
  config.video_prior.patch = (1, 2, 2)  # (frames, height, width) of a latent token
  config.video_prior.attention = (
    "alternating"  # spatial / temporal blocks (AnimateDiff's motion modules)
  )
  config.video_prior.prompt_dropout = 0.1

  config.diffusion = ml_collections.ConfigDict()
  config.diffusion.train_steps = 1000
  config.diffusion.beta_start = 0.00085  # SD-1.5's scaled-linear betas (both networks)
  config.diffusion.beta_end = 0.012
  # the video prior's sampler betas: "scaled_linear" (as trained here) | "linear" (the official
  # relight.py reloads AnimateDiff's Euler-ancestral scheduler with beta_schedule="linear")
  config.diffusion.video_beta_schedule = "scaled_linear"

  config.pipeline = ml_collections.ConfigDict()
  config.pipeline.num_steps = 8  # video-prior steps that run (paper: 25 of round(25/0.5) = 50)
  config.pipeline.strength = 0.5  # SDEdit strength of the source video
  config.pipeline.guidance = 2.0  # classifier-free guidance of the video prior on the prompt
  config.pipeline.relight_steps = 4  # relighter steps that run (paper: 15 of round(15/0.9) = 17)
  config.pipeline.relight_strength = 0.9  # img2img strength from the light-map latent
  config.pipeline.relight_guidance = 2.0
  config.pipeline.omega = 0.8  # LMI: weight of fresh noise inside the mask
  config.pipeline.mask_threshold = 0.2  # LMI: mask = Gaussian(sigma = R / f) > threshold
  config.pipeline.lmi_noise_scale = (
    "unit"  # "unit" (official code) | "sigma" (noise at the latent's level)
  )
  config.pipeline.fuse_above = 0.15  # fusion while lambda_i = 1 - i/(N-1) exceeds this
  config.pipeline.detail = (
    True  # add lambda_i (V_s - D(x0_hat at step 0)) to the consistency target
  )
  config.pipeline.gar_axes = (
    "chw"  # "chw" (official code: per frame) | "hw" | "fhw" (paper wording)
  )
  config.pipeline.gar_filter = "butterworth"  # "butterworth" | "gaussian" | "ideal"
  config.pipeline.gar_order = 4  # Butterworth order
  config.pipeline.clips_per_call = 0  # clips through the networks at once (0: every clip)

  config.evaluation = ml_collections.ConfigDict()
  # clips along the paper's six trajectories, prompts assigned round-robin
  # (core/data/lambertian.py paper_assignment): >= 6 covers every trajectory and every prompt
  config.evaluation.num_clips = 6
  config.evaluation.arms = (
    "source",
    "per_frame",
    "lav_traj",
    "lightctrl_no_lmi",
    "lightctrl_no_gar",
    "lightctrl",
    "oracle",
  )
  config.evaluation.headline = (
    "lightctrl"  # the arm whose metrics are results.json's top-level keys
  )
  config.evaluation.figure_clip = 0  # the clip drawn frame by frame in the figure

  # The paper's networks (variant "paper"), each a diffusers / transformers folder's weights with the
  # folder's config.json beside it. The UNet must be in diffusers' layout (the unet/ folder of a
  # diffusers pipeline), not the original LDM single file (model.diffusion_model.*) of Realistic
  # Vision / SD-1.5 downloads: convert one with diffusers' from_single_file + save_pretrained.
  config.paper = ml_collections.ConfigDict()
  config.paper.vae_checkpoint = ""  # vae/diffusion_pytorch_model.safetensors (SD-1.5's VAE)
  config.paper.unet_checkpoint = ""  # unet/diffusion_pytorch_model.safetensors (RV 5.1)
  config.paper.iclight_checkpoint = ""  # iclight_sd15_fc.safetensors (offsets, 8-channel conv_in)
  config.paper.motion_checkpoint = ""  # motion adapter v1-5-3: diffusion_pytorch_model.safetensors
  config.paper.text_encoder_checkpoint = ""  # text_encoder/model.safetensors (CLIP ViT-L/14)
  config.paper.tokenizer_vocab = ""  # tokenizer/vocab.json
  config.paper.tokenizer_merges = ""  # tokenizer/merges.txt
  # one text per lighting prompt (white / warm / cool light, core/data/lambertian.py PROMPTS), the
  # video prior's prompt and, with `relight_suffix`, the relighter's (LightCtrl's Relighter appends
  # ", best quality"); both networks' guidance uses `negative_prompt` (the official configs set
  # "bad quality, worse quality" for the video prior and IC-Light's "lowres, bad anatomy, ..." for
  # the relighter)
  config.paper.prompts = (
    "a scene on a table lit by a white point light",
    "a scene on a table lit by a warm orange point light",
    "a scene on a table lit by a cool blue point light",
  )
  config.paper.relight_suffix = ", best quality"
  config.paper.negative_prompt = ""

  config.study = ml_collections.ConfigDict()
  # one full run (training and evaluation) per seed; the study reports intervals over them
  config.study.seeds = (0, 1, 2)

  config.loop = common.loop_config(log_every=100, checkpoint_every=500)
  common.add_parallelism(config)

  if variant == "study":
    config.autoencoder.steps = 600
    config.relighter.steps = 1500
    config.video_prior.steps = 1200
    # shorter than the paper's 25 video / 15 relighter steps, to fit the CPU budget (the relighter
    # runs at every fused step on every frame): 20 of round(20 / 0.5) = 40 and 8 of round(8 / 0.9)
    config.pipeline.num_steps = 20
    config.pipeline.relight_steps = 8
    config.evaluation.num_clips = 12
    config.evaluation.arms = ARMS
  if variant == "gpu":
    config.data.update(frames=16, size=64, light_radius=12.0, light_height=32.0, max_objects=4)
    config.autoencoder.update(steps=20_000, batch_size=256, widths=(64, 128, 128))
    config.relighter.update(steps=50_000, batch_size=256, width=128, ema_decay=0.999)
    config.video_prior.update(steps=50_000, batch_size=64, hidden=256, depth=8, heads=8)
    config.video_prior.ema_decay = 0.999
    config.pipeline.num_steps = 25
    config.pipeline.relight_steps = 15
    config.evaluation.num_clips = 48
    config.evaluation.arms = ARMS
    config.loop = common.loop_config(log_every=500, checkpoint_every=5000)
  if variant == "paper":
    config.data.update(frames=16, size=512, light_radius=75.0, light_height=256.0)
    config.pipeline.num_steps = 25
    config.pipeline.relight_steps = 15
    config.evaluation.arms = ARMS
    config.diffusion.video_beta_schedule = "linear"
    # one 16-frame 512 px clip at a time: full-softmax attention over 64x64 latents holds
    # 16 x 8 x 4096^2 float32 logits (8.6 GB) per call
    config.pipeline.clips_per_call = 1
    config.study.seeds = (0,)  # released networks: a seed changes only the clips and the noise
  return config
