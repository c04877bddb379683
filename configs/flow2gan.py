r"""Flow2GAN: "Flow2GAN: Hybrid Flow Matching and GAN with Multi-Resolution Network for Few-step Audio
Generation" (Yao et al., ICLR 2026; official code k2-fsa/Flow2GAN).

Claim: flow matching with an endpoint (data) target and spectral-energy loss scaling trains a
multi-branch Fourier-coefficient vocoder that is good at few Euler steps, and GAN fine-tuning of its
1- or 2-step unrolled sampler then matches or beats many-step flow matching at a fraction of the cost.

Variants:
  default  procedural speech-like audio at 8 kHz (0.512 s segments), the paper's networks scaled down
           (3 branches, 2 ConvNeXt blocks each), 600 flow-matching steps, then 80 GAN steps of the
           1-step generator and the side-by-side benchmark: a few minutes on 2 CPU cores.
  study    experiments/study.py runs the arms of methods/flow2gan/study.py (endpoint vs velocity,
           with and without spectral scaling, 3 branches vs 1 at equal parameters, GAN from either
           flow-matching init, FM at 1/2/4/8 steps vs GAN at 1/2 steps), each arm at the default's
           sizes; ~15 minutes on an idle 2-core machine.
  tokens   experiments/study.py runs the token arms of methods/flow2gan/study.py: the generator
           conditioned on tokens of a codec trained here (its own `codec` phase first) at 8 and 2
           codebooks (4 and 1 kbps, the paper's 6 and 1.5 kbps EnCodec settings scaled to 8 kHz)
           against the mel arm, FM at 1/2/4 steps and the 1-step GAN each.
  gpu      paper scale on one accelerator: 24 kHz LibriTTS from a prepared tfds folder
           (`--config.data.data_dir`, never downloaded), the paper's 3-branch generator (n_fft
           512/256/128, 768/512/384 channels, 8 blocks), 100-bin mels, batch 64, GAN of 1/2-step
           generators with the full-size discriminators. `--config.model.pretrained_checkpoint=G.npz`
           starts from the official released generator instead (converted, flow matching skipped).
  gpu_tokens  the gpu variant conditioned on EnCodec 24 kHz tokens at 6 kbps (8 of 32 codebooks of
           1024, 75 frames/s; `--config.codec.quantizers=2` for 1.5 kbps): the codec in EnCodec's real
           layout, converted from `--config.model.codec_checkpoint=E.npz` (facebook/encodec_24khz,
           core/nn/encodec_convert.py) or trained here when that is empty; branch hops 320/160/80
           (n_fft 640/320/160) so that the 320-sample codec hop is a multiple of each.

  python experiments/train.py --config=configs/flow2gan.py --workdir=runs/flow2gan
  python experiments/study.py --config=configs/flow2gan.py:study --workdir=runs/flow2gan_study
  python experiments/study.py --config=configs/flow2gan.py:tokens --workdir=runs/flow2gan_tokens
  python experiments/train.py --config=configs/flow2gan.py:gpu --config.data.data_dir=DIR
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "tokens", "gpu", "gpu_tokens")


def data_config() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.source = "procedural"  # "procedural" (core/data/speech_like.py) or "libritts" (tfds)
  d.data_dir = ""  # prepared tfds folder holding libritts (source "libritts"; never downloaded)
  d.train_split = "train_clean100+train_clean360+train_other500"  # libritts training splits
  d.test_split = "test_clean"  # libritts evaluation split
  d.sample_rate = 8000  # Hz
  d.segment_length = 4096  # samples per segment (a multiple of every hop)
  d.num_train = 1024  # procedural training segments
  d.num_test = 64  # evaluation segments
  d.min_events = 3  # events per procedural segment
  d.max_events = 6
  d.seed = 0  # procedural data seed (the test set takes the indices after the training set)
  return d


def mel_config() -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.n_fft = 256  # conditioning log-mel (the reference's 1024 at 24 kHz, / 4)
  m.hop = 64
  m.n_mels = 32
  return m


def model_config() -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.n_ffts = (128, 64, 32)  # one STFT resolution per branch (reference: 512, 256, 128)
  m.hops = (64, 32, 16)  # n_fft / 2, divides the mel hop
  m.channels = (48, 32, 24)  # ConvNeXt width per branch (reference: 768, 512, 384)
  m.num_blocks = (2, 2, 2)  # ConvNeXt blocks per branch (reference: 8)
  m.hidden_factor = 3  # pointwise expansion
  m.kernel_size = 7  # depthwise kernel
  m.time_dim = 32  # sinusoidal time embedding (reference: 512)
  m.cond_channels = 32  # mel encoder width (reference: 512)
  m.cond_blocks = 1  # mel encoder blocks (reference: 4)
  m.branch_dropout = 0.05  # per-example probability of dropping one branch in training
  # the official released generator (k2-fsa/Flow2GAN, e.g. libritts-mel-1-step.pt) exported to an
  # .npz of its state dict (core/nn/audio_convnext_convert.py; the gpu variant's layout); "" trains
  # from scratch, a path skips flow matching (0 steps) and benchmarks, or GAN-fine-tunes, those weights
  m.pretrained_checkpoint = ""
  # the condition: "mel" (log-mel, config.mel) or "tokens" (summed codewords of the codec's tokens,
  # config.codec; the codec hop, prod(codec.ratios), must be a multiple of every model.hops entry)
  m.condition = "mel"
  # EnCodec 24 kHz's encoder and quantizer (transformers' EncodecModel state dict as an .npz,
  # core/nn/encodec_convert.py) as the token codec; "" trains the codec here (the `codec` phase)
  m.codec_checkpoint = ""
  return m


def codec_config() -> ml_collections.ConfigDict:
  """The token codec (core/nn/codec.py, EnCodec's layout); EnCodec 24 kHz in brackets."""
  c = ml_collections.ConfigDict()
  c.num_filters = 8  # SEANet base width (32)
  c.ratios = (4, 4, 4, 2)  # decoder upsampling ratios, hop = their product: 128 (8, 5, 4, 2: 320)
  c.dimension = 32  # latent and codeword size (128)
  c.num_residual_layers = 1  # residual blocks per stride (1)
  c.lstm_layers = 0  # skip-LSTM layers after the strided convs (2)
  c.codebook_size = 256  # codewords per codebook (1024)
  c.num_quantizers = 8  # codebooks trained (32)
  # codebooks used for the tokens, the bitrate: quantizers * log2(codebook_size) * frame rate;
  # 8 and 2 here are 4 and 1 kbps at 62.5 frames/s (EnCodec: 8 and 2 of 10 bits at 75/s = 6 / 1.5)
  c.quantizers = 8
  c.quantizer_dropout = True  # train with a random count 1..num_quantizers per batch (EnCodec)
  c.steps = 500  # optimiser steps of the codec phase
  c.batch_size = 16
  c.learning_rate = 1e-3  # Adam, b1 0.5, b2 0.9 (EnCodec: 3e-4)
  c.warmup_steps = 50  # linear warm-up of the rate
  c.l1_weight = 0.1  # waveform L1 (EnCodec's lambda_t)
  c.spectral_weight = 1.0  # multi-scale log-mel L1 at gan.mel_n_ffts (EnCodec's lambda_f)
  c.commitment_weight = 1.0
  c.ema_decay = 0.99  # codebook moving averages
  c.ema_eps = 1e-5  # Laplace smoothing of the cluster sizes
  c.kmeans_iters = 10  # k-means rounds initialising each codebook on the first batch (50)
  c.dead_code_threshold = 0.25  # codewords with a smaller average cluster size are reset (2)
  return c


def flow_config() -> ml_collections.ConfigDict:
  f = ml_collections.ConfigDict()
  f.prediction = "data"  # "data": endpoint estimation (the paper's); "velocity": standard FM
  f.spectral_scaling = True  # energy-scaled spectral loss; False: mean squared waveform error
  f.noise_scale = 0.1  # x0 = noise_scale * N(0, I) (the reference's init_noise_scale)
  f.time_sampling = "uniform"  # t ~ U(0, 1), as the reference
  f.loss_n_fft = 256  # STFT of the loss scaling (reference: 1024 at 24 kHz)
  f.loss_hop = 64
  f.loss_filters = 64  # linear triangular filters (reference: 256)
  f.loss_power = 0.5  # scale = (S(x1) + eps)^-power
  f.loss_eps = 1e-7
  f.loss_scale_min = 1e-2  # clamp of the scale
  f.loss_scale_max = 1e2
  f.steps = 600  # optimiser steps
  f.batch_size = 16
  f.learning_rate = 2e-3  # AdamW peak (ScaledAdam's 0.035 does not transfer)
  f.warmup_steps = 50
  f.grad_clip = 1.0
  f.ema_decay = 0.99  # parameter average handed to the GAN stage (the reference averages epochs)
  return f


def gan_config() -> ml_collections.ConfigDict:
  g = ml_collections.ConfigDict()
  g.generator_steps = (1,)  # one GAN phase per entry: the N of the unrolled N-step generator
  g.steps = 80  # steps per GAN phase (each: one D update, then one G update)
  g.disc_only_steps = 20  # D-only warm-up steps (reference: 1000 batches)
  g.batch_size = 8
  g.gen_learning_rate = 2e-4  # AdamW
  g.disc_learning_rate = 2e-4
  g.b1 = 0.8
  g.b2 = 0.99
  g.grad_clip = 10.0
  g.periods = (2, 3, 5, 7, 11)  # MPD
  g.period_channels = (4, 8, 16, 32, 32)  # reference: 32, 128, 512, 1024, 1024
  g.windows = (512, 256, 128)  # MRD STFT windows (reference: 2048, 1024, 512)
  g.resolution_channels = 4  # MRD per-band width (reference: 32)
  g.weights = (1.0, 0.1, 1.0, 0.1, 45.0)  # adv MPD, adv MRD, feature-matching MPD, MRD, mel
  g.disc_weights = (1.0, 0.1)  # hinge MPD, MRD
  g.mel_n_ffts = (32, 64, 128, 256, 512)  # mel reconstruction scales, hop n_fft / 4
  g.mel_n_mels = (5, 10, 20, 40, 80)
  return g


def eval_config() -> ml_collections.ConfigDict:
  e = ml_collections.ConfigDict()
  e.fm_steps = (1, 2, 4, 8)  # flow-matching sampler steps benchmarked
  e.headline_fm_steps = 4  # the headline generator when there is no GAN phase
  e.batch_size = 32  # evaluation batch
  e.mel_n_ffts = (32, 64, 128, 256, 512)  # mel distance scales (hop n_fft / 4)
  e.mel_n_mels = (5, 10, 20, 40, 80)
  e.stft_n_ffts = (64, 128, 256, 512)  # multi-resolution STFT distance
  e.lsd_n_fft = 256  # quiet-bin LSD STFT (hop n_fft / 4)
  e.quiet_threshold_db = -40.0  # quiet bins: below this, re. the segment's loudest bin
  e.floor_db = -80.0  # both spectra floored here (re. that maximum)
  e.timing_batch = 8  # segments per timed call
  e.timing_repeats = 3  # best of this many timed calls
  return e


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "flow2gan"
  config.variant = variant
  config.seed = 0
  config.data = data_config()
  config.mel = mel_config()
  config.model = model_config()
  config.codec = codec_config()
  config.flow = flow_config()
  config.gan = gan_config()
  config.eval = eval_config()
  config.study = ml_collections.ConfigDict()
  config.study.single_branch_channels = 80  # 1-branch arm width: parameters within 5% of 3 branches
  config.study.second_gan_steps = 2  # the headline arm also fine-tunes this many-step generator
  config.loop = common.loop_config(log_every=50, checkpoint_every=200)
  common.add_parallelism(config)

  if variant == "tokens":
    config.model.condition = "tokens"
    config.eval.update(fm_steps=(1, 2, 4), headline_fm_steps=4)
  if variant in ("gpu", "gpu_tokens"):
    config.data.update(source="libritts", sample_rate=24_000, segment_length=35_840, num_test=256)
    config.mel.update(n_fft=1024, hop=256, n_mels=100)
    config.model.update(
      n_ffts=(512, 256, 128),
      hops=(256, 128, 64),
      channels=(768, 512, 384),
      num_blocks=(8, 8, 8),
      time_dim=512,
      cond_channels=512,
      cond_blocks=4,
    )
    config.flow.update(
      loss_n_fft=1024, loss_hop=256, loss_filters=256, steps=400_000, batch_size=64
    )
    config.flow.update(learning_rate=5e-4, warmup_steps=5000, ema_decay=0.9999)
    config.gan.update(
      generator_steps=(1, 2),
      steps=60_000,
      disc_only_steps=1000,
      batch_size=64,
      period_channels=(32, 128, 512, 1024, 1024),
      windows=(2048, 1024, 512),
      resolution_channels=32,
      mel_n_ffts=(32, 64, 128, 256, 512, 1024, 2048),
      mel_n_mels=(5, 10, 20, 40, 80, 160, 320),
    )
    config.eval.update(
      mel_n_ffts=(32, 64, 128, 256, 512, 1024, 2048),
      mel_n_mels=(5, 10, 20, 40, 80, 160, 320),
      stft_n_ffts=(256, 512, 1024, 2048),
      lsd_n_fft=1024,
      batch_size=16,
      timing_batch=16,
    )
    config.loop = common.loop_config(log_every=100, checkpoint_every=5000)
  if variant == "gpu_tokens":
    config.model.update(
      condition="tokens", n_ffts=(640, 320, 160), hops=(320, 160, 80), pretrained_checkpoint=""
    )
    config.codec.update(
      num_filters=32,
      ratios=(8, 5, 4, 2),
      dimension=128,
      lstm_layers=2,
      codebook_size=1024,
      num_quantizers=32,
      quantizers=8,
      steps=300_000,
      batch_size=64,
      learning_rate=3e-4,
      kmeans_iters=50,
      dead_code_threshold=2.0,
    )
  return config
