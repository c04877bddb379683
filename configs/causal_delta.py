r"""Causal Delta Embeddings: "Learning Robust Intervention Representations with Delta Embeddings"
(Alimisis & Diou, ICLR 2026, arXiv 2508.04492; method page docs/methods/causal_delta.md).

Claim: representing an action by the delta of a shared projection, `p(x~) - p(x)`, as the sole input
of the action classifier, trained with CE + 2 SupCon + 1 L1 on the delta, generalises to unseen
(action, object) compositions and unseen objects far better than pair models of the same encoder
(ResPair, ICM): OOD accuracy up by >= 10 points, the IID-OOD gap about halved, antonym actions
anti-parallel; the patch-wise Top-K variant beats the global one on multi-object scenes.

Variants:
  default   ShapeTriplet pairs at 32x32 (10k train, 2k per test split; built once into a tfds folder),
            CDE-global on a small CNN, 1 seed, 390 Adam steps: ~2-3 min on 2 CPU cores.
  study     experiments/study.py: vanilla, ICM, SMS, the CDE loss ablations and CDE on single-object
            scenes, global / patch-wise on multi-object scenes; 3 seeds per arm as one array axis;
            ~15 min on 2 idle CPU cores. `--config.study.digit_arms='("vanilla", "sms", "cde")'`
            adds those arms on the data with digit objects (about 1.5 CPU-min each).
  gpu       paper scale on one accelerator: the 64x64 preset (100k train pairs, 10k per test split)
            prepared ahead in --config.data.data_dir, the paper's DINO ViT-S/16 backbone read from
            --config.model.encoder_checkpoint (an .npz of its state dict, docs/paper_scale.md) and
            fine-tuned on images upsampled to 128x128, 30 epochs, 3 seeds vmapped.

  python experiments/train.py --config=configs/causal_delta.py --workdir=runs/causal_delta
  python experiments/study.py --config=configs/causal_delta.py:study --workdir=runs/causal_delta_study
  python -m core.data.shape_triplets --config=single64 --data_dir=DIR   # once, for :gpu
  python experiments/train.py --config=configs/causal_delta.py:gpu --config.data.data_dir=DIR \
    --config.model.encoder_checkpoint=dino_vits16.npz
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "gpu")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "causal_delta"
  config.variant = variant
  config.seed = 0
  config.num_seeds = 1  # independent models trained side by side (an array axis of the state)
  config.seed_batching = "auto"  # "auto" (unroll on CPU, vmap elsewhere) | "vmap" | "unroll"

  config.data = ml_collections.ConfigDict()
  config.data.image_size = 32  # H = W; object sizes scale with it
  config.data.num_train = 10_000  # training pairs
  config.data.num_eval = 2_000  # pairs per test split (iid, comp, syst, scene)
  config.data.scene = "single"  # "single" (target + 0-2 distractors) | "multi" (3-4 objects)
  config.data.noise_sigma = 0.02  # per-image pixel noise of the counterfactual
  config.data.max_shift = 1  # per-image global shift (pixels)
  config.data.split_seed = 0  # which classes / (action, object) pairs are held out
  config.data.seed = 0  # which pairs are drawn
  config.data.comp_fraction = 0.3  # share of valid training pairs held out for OOD-comp
  config.data.num_syst_objects = 3  # classes held out for OOD-syst
  config.data.objects = "shapes"  # "shapes" (8 classes) | "shapes_digits" (+ 10 sklearn digits)
  config.data.data_dir = ""  # tfds data_dir ("" = tfds's default folder)
  config.data.generate = True  # build the dataset there when missing (False: must be prepared)

  config.model = ml_collections.ConfigDict()
  config.model.kind = "cde_global"  # "cde_global" | "cde_patch" | "vanilla" | "icm" | "sms"
  config.model.encoder = "cnn"  # "cnn" | "vit" (core/nn/vit.py: CLS token + patch grid)
  config.model.channels = (16, 32, 64)  # CNN widths
  config.model.strides = (2, 2, 1)  # CNN strides: 32x32 -> an 8x8 patch grid
  config.model.group_norm = False
  config.model.vit_patch = 4  # ViT patch size (pixels)
  config.model.vit_width = 64
  config.model.vit_depth = 4
  config.model.vit_heads = 4
  config.model.vit_mlp_ratio = 4
  config.model.vit_image_size = 0  # images resized to this before the ViT (0 = data.image_size)
  # a DINO ViT state dict saved as .npz (core/nn/vit_convert.py); "" = the encoder starts at random
  config.model.encoder_checkpoint = ""
  config.model.embed_dim = 64  # l: projector output (the delta's dimension)
  config.model.hidden = 128  # projector hidden width
  config.model.classifier_hidden = 128  # CDE classifier on the delta: MLP width (0 = linear)
  config.model.top_k = 4  # cde_patch: patches kept by ||delta_patch||
  config.model.patch_loss = "aggregate"  # cde_patch: "aggregate" (mean of Top-K) | "per_patch"

  config.loss = ml_collections.ConfigDict()
  config.loss.ce = 1.0
  config.loss.supcon = 2.0  # alpha_c (paper: 2.0); 0 for the baselines
  config.loss.sparsity = 1.0  # alpha_s (paper: 1.0); 0 for the baselines
  # how L_sparse makes the delta sparse (core/causal_delta.py SPARSITY_KINDS): "l1_mean" (L1 per
  # coordinate) | "l1_sum" ((1/B) sum_i ||delta_i||_1, as written) | "l1_schedule" (the sum, off for
  # the first ramp_fraction of steps, then ramped to full weight) | "l1_normalised" (L1 of the
  # unit-norm delta) | "topk" (a top-k projector on the delta, plus the per-coordinate L1)
  config.loss.sparsity_kind = "l1_mean"
  config.loss.sparsity_top_k = 8  # "topk": delta coordinates the projector keeps (of embed_dim)
  config.loss.temperature = 0.1  # SupCon tau
  config.loss.adversary = 0.1  # icm: lambda of the object adversary
  config.loss.sms = 1.0  # sms: weight of the block-invariance MSE (Causal Triplet's --sparse)
  config.loss.ramp_fraction = 0.5  # SupCon and L1 ramp up over this share of steps (0 = none)

  config.batch_size = 128
  config.steps = 390  # 5 epochs of 10k pairs
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 3e-3
  config.optim.grad_clip = 1.0  # global-norm clipping (0 = none)

  config.warmup = ml_collections.ConfigDict()
  config.warmup.steps = 0  # masked-reconstruction warm-up of the encoder (0 = none)
  config.warmup.batch_size = 128
  config.warmup.learning_rate = 1e-3
  config.warmup.mask_ratio = 0.5  # share of grid cells masked

  config.eval = ml_collections.ConfigDict()
  config.eval.chunk = 500  # pairs per jitted forward
  config.eval.num_train = 2_000  # training pairs scored for train_accuracy
  config.eval.num_projection = 400  # IID embeddings in the 2-D projection
  config.eval.num_examples = 8  # example pairs in the figure

  config.loop = common.loop_config(log_every=50, checkpoint_every=200)
  common.add_parallelism(config)

  config.study = ml_collections.ConfigDict()
  config.study.single_arms = (
    "vanilla",
    "icm",
    "sms",
    "cde_ce",
    "cde_ce_supcon",
    "cde_ce_l1",
    "cde",
    "cde_l1_sum",
    "cde_l1_schedule",
    "cde_l1_normalised",
    "cde_topk",
  )  # single-object arms (methods/causal_delta/study.py: ARM_FIELDS)
  config.study.multi_arms = ("cde_global", "cde_patch", "cde_patch_per_patch")  # multi-object
  config.study.digit_arms = ()  # arms on data.objects="shapes_digits" (e.g. "vanilla", "sms", "cde")
  config.study.digit_num_syst_objects = 6  # of the 18 classes, held out for OOD-syst in those arms

  if variant == "study":
    config.num_seeds = 3

  if variant == "gpu":
    config.num_seeds = 3
    config.data.image_size = 64
    config.data.num_train = 100_000
    config.data.num_eval = 10_000
    config.data.generate = False
    # the paper's backbone: DINO ViT-S/16, fine-tuned end to end (--config.model.encoder_checkpoint)
    config.model.encoder = "vit"
    config.model.vit_patch = 16
    config.model.vit_width = 384
    config.model.vit_depth = 12
    config.model.vit_heads = 6
    config.model.vit_image_size = 128  # 64x64 images upsampled: an 8x8 grid of DINO's 16-px patches
    config.model.hidden = 256
    config.batch_size = 256
    config.steps = 30 * 100_000 // 256  # 30 epochs (Causal Triplet's default)
    config.optim.learning_rate = 1e-4  # fine-tuning a pretrained backbone
    config.warmup.batch_size = 256
    config.eval.chunk = 1_000
    config.eval.num_train = 10_000
    config.loop = common.loop_config(log_every=200, checkpoint_every=2_000, max_to_keep=3)
  return config
