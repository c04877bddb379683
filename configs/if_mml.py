r"""IID: "Supporting Multimodal Intermediate Fusion with Informatic Constraint and Distribution Coherence"
(Li, Song, Zheng, Li; ICLR 2026).

Claim: intermediate fusion (a weighted sum of modality latents under one linear head) beats late fusion
under the paper's informatic constraint, and removing the distribution incoherence between the
modality latents (FFT sparsification + RIP projection + unbalanced Sinkhorn) improves the
generalisation of intermediate fusion, most of all when the modalities are incoherent.

Variants:
  default  two-modality synthetic data (semantic and noise dimensions), incoherence delta in {0, 2},
           3 seeds vmapped; IF, LF and IID (`full`) as three phases, each replicate evaluated at its
           best-validation weights and at its final weights; 1:46 wall on 2 shared CPU cores.
  study    experiments/study.py, 24 arms of 5 deltas {0, .5, 1, 2, 4} x 5 seeds (vmapped in each arm):
           lf, if, concat, if_ic, if_dc, full, with both signs of the informatic constraint's
           unimodal term (`*_neg`), if_ic[_neg] at alpha {.01, .1, 1}, if_dc at beta {.1, 1}, an
           affine-only incoherence check, and lf / if / full with IID-Q and IID-P fusion weights
           (`*_q`, `*_p`); one figure. About 20 CPU-minutes.
  gpu      paper scale on a real two-modality benchmark: tfds `so2sat/all` (Sentinel-1 SAR and
           Sentinel-2 multispectral 32x32 patches, 17 local-climate-zone classes), prepared as
           array_record in --config.data.data_dir (never downloaded; the run stops at validation with
           a one-line error naming config.data.data_dir when it is unset), conv encoders, 3 seeds.

  python experiments/train.py --config=configs/if_mml.py --workdir=runs/if_mml
  python experiments/study.py --config=configs/if_mml.py:study --workdir=runs/if_mml_study
  tfds build so2sat/all --file_format=array_record --data_dir=$DATA   # once, where the data lives
  python experiments/train.py --config=configs/if_mml.py:gpu --config.data.data_dir=$DATA \
    --workdir=runs/if_mml_gpu
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "gpu")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "if_mml"
  config.variant = variant
  config.seed = 0
  # one phase per model: lf | if | concat | if_ic | if_dc | full (IID = IF + L_ic + L_dc)
  config.models = ("if", "lf", "full")

  config.data = ml_collections.ConfigDict()
  config.data.name = "synthetic"  # "synthetic" or a prepared tfds two-modality dataset
  config.data.data_dir = ""  # tfds data_dir (array_record); required for tfds data
  config.data.fields = ("sentinel1", "sentinel2", "label")  # tfds: modality 1, modality 2, label
  config.data.train_split = "train"
  config.data.test_split = "validation"
  config.data.num_train_eval = 256  # tfds: training examples scored for the generalisation gap
  config.data.deltas = (0.0, 2.0)  # incoherence of modality 2 (scale 1 + delta, shift, heavy tails)
  config.data.num_seeds = 3  # independent data sets and initialisations, vmapped
  config.data.first_seed = 0  # data seeds first_seed .. first_seed + num_seeds - 1
  config.data.num_classes = 4
  config.data.semantic_dim = 8  # task-relevant dimensions S
  config.data.view_dim = 5  # semantic dims each modality sees (modality 1: [0, 5), 2: [3, 8))
  config.data.input_dim = 16  # per-modality input (semantic + nuisance, orthogonally mixed)
  config.data.class_scale = 0.8  # class-mean scale; unimodal linear probes ~0.75, fused ~0.83
  config.data.tail_rate = (
    0.25  # P(a nuisance coordinate of modality 2 is Student-t(3)) = rate * delta
  )
  config.data.num_train = 256
  config.data.num_val = 512  # synthetic: a validation split (for choosing alpha and beta; 0: none)
  config.data.num_test = 4096

  config.model = ml_collections.ConfigDict()
  config.model.encoder = "mlp"  # "mlp" (vectors) | "conv" (image-like patches)
  config.model.hidden = (64,)
  config.model.latent_dim = 32  # d, shared by all modalities
  # fusion weights: "static" (IID-L) | "energy" (QMF's, IID-Q) | "pdf" (PDF's co-belief, IID-P)
  config.model.weighting = "static"
  config.model.static_weights = (0.5, 0.5)
  config.model.confidence_weight = 1.0  # pdf: weight of the confidence networks' L1 loss (PDF: 1)

  config.lf = ml_collections.ConfigDict()
  config.lf.unimodal_weight = 1.0  # LF: weight of each head's own cross-entropy

  config.ic = ml_collections.ConfigDict()
  config.ic.alpha = 0.001  # weight of L_ic (paper grid {1, .1, .01, .001}; chosen on validation)
  config.ic.kl_weight = 0.01  # lam inside L_ic
  config.ic.unimodal_sign = 1  # +1: formula as printed (unimodal CE added); -1: prose (subtracted)

  config.dc = ml_collections.ConfigDict()
  config.dc.beta = 0.01  # weight of L_dc, normalised cost (chosen on validation in {.01, .1, 1})
  config.dc.keep = 16  # d1: FFT coefficients kept per latent
  config.dc.projection_dim = 8  # k: rows of the RIP matrix
  config.dc.use_fft = True  # False: the no-FFT ablation (Phi z)
  config.dc.epsilon = 0.05  # Sinkhorn entropic regularisation, relative to the mean cost
  config.dc.marginal_weight = 1.0  # lam1 of the KL marginal penalties
  config.dc.iterations = 50  # Sinkhorn iterations (fixed)

  config.batch_size = 128
  config.steps = 600  # 300 epochs of 256 examples
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 3e-3

  config.eval = ml_collections.ConfigDict()
  config.eval.select_best = True  # synthetic: evaluate each replicate's best-validation weights
  config.eval.select_every = 10  # steps between validation checks
  config.eval.incoherence_points = 512  # test latents per modality for the exact W2
  config.eval.chunk = 4096  # examples per jitted forward pass

  config.loop = common.loop_config(log_every=100, checkpoint_every=600)
  common.add_parallelism(config)

  config.study = ml_collections.ConfigDict()
  config.study.models = ("lf", "if", "concat", "if_ic", "if_dc", "full")
  config.study.ic_signs = (1, -1)  # both signs of L_ic's unimodal term for the models that use it
  config.study.alphas = ()  # if_ic (both signs) at these extra alphas
  config.study.betas = ()  # if_dc at these extra betas
  config.study.affine_arms = ()  # arms rerun with affine-only incoherence (data.tail_rate = 0)
  config.study.weightings = ()  # dynamic fusion weights ("energy" IID-Q, "pdf" IID-P) studied ...
  config.study.weighted_models = ()  # ... for these models (arms `<model>_q`, `<model>_p`)

  if variant == "study":
    config.data.deltas = (0.0, 0.5, 1.0, 2.0, 4.0)
    config.data.num_seeds = 5
    config.study.alphas = (0.01, 0.1, 1.0)
    config.study.betas = (0.1, 1.0)
    config.study.affine_arms = ("if", "if_dc_beta1")
    config.study.weightings = ("energy", "pdf")
    config.study.weighted_models = ("lf", "if", "full")

  if variant == "gpu":
    config.models = ("lf", "if", "if_ic", "if_dc", "full")
    config.data.name = "so2sat/all"
    config.data.deltas = (0.0,)
    config.data.num_classes = 17
    config.data.num_train_eval = 10_000
    config.data.num_test = 24_119  # the validation split
    config.model.encoder = "conv"
    config.model.hidden = (64, 128)
    config.model.latent_dim = 128
    config.dc.keep = 64
    config.dc.projection_dim = 32
    config.batch_size = 256
    config.steps = 20_000
    config.optim.learning_rate = 1e-3
    config.eval.incoherence_points = 1024
    config.eval.chunk = 1024
    config.loop = common.loop_config(log_every=500, checkpoint_every=2000, max_to_keep=3)
  return config
