"""Causal Delta Embeddings: "Learning Robust Intervention Representations with Delta Embeddings"
(Alimisis & Diou, ICLR 2026, arXiv 2508.04492, OpenReview 5d7prMWHNF; no official code found; the
benchmark and baselines follow Causal Triplet, github.com/CausalTriplet/causaltriplet).

Claim: an action classifier that sees only the delta `p(x~) - p(x)` of a shared projection, trained
with `L_CE + 2 L_SupCon + 1 L_sparse` on the delta, generalises to unseen (action, object)
compositions (OOD-comp) and unseen objects (OOD-syst) far better than pair models (ResPair, ICM,
SMS): the IID-OOD gap drops from ~0.5 to ~0.2; antonym actions come out anti-parallel; the patch-wise
Top-K model beats the global one on multi-object scenes.

Map to the paper:
  `core/data/shape_triplets.py`  procedural before/after pairs (8 objects, 8 actions with
                                 preconditions and 3 antonym pairs, shared scenes, counterfactual
                                 noise), Causal Triplet's comp / noun splits plus scene and
                                 multi-object variants, optionally 10 handwritten-digit classes
                                 (scikit-learn's bundled digits), as a tfds builder.
  `core/nn/cnn.py`               the small CNN encoder (default): a patch grid, its mean global.
  `core/nn/vit.py`               the ViT encoder in DINO's layout (CLS token = Model A's global
                                 feature, patch tokens = Model B's grid); `model.encoder = "vit"`.
  `core/nn/vit_convert.py`       DINO's released ViT state dict (saved as .npz) -> its parameters,
                                 with DINO's bicubic resize of the position table (gpu: ViT-S/16).
  `core/causal_delta.py`         delta embeddings (Model A global, Model B Top-K patches), the loss
                                 (CE, SupCon, L1), the ResPair head, the ICM adversary and the SMS
                                 block-invariance loss (Causal Triplet's), the masked-
                                 reconstruction warm-up, the probes (sparsity, invariance, cosines).
  `phases.py`                    `warmup` (optional) and `train` phases, seeds as an array axis,
                                 evaluation on the IID / comp / syst / scene splits.
  `study.py`                     the study's arms (baselines, loss ablations, global vs patch on
                                 multi-object scenes), table, summary and figure.

Results (`results.json`): `iid_accuracy`, `ood_comp_accuracy`, `ood_syst_accuracy`,
`ood_scene_accuracy`, `ood_accuracy` (mean of comp and syst), `gap` (= IID - OOD), `train_accuracy`,
the probes on the IID split (`delta_sparsity`, `invariance_ratio`, `object_dependence_ratio`,
`cos_<antonym pair>`, `antonym_cosine`, `projector_antonym_cosine`), `topk_in_target_*` for the
patch model; every one also `_per_seed`; plus seed 0's `projection_2d`, `cosine_matrix` and
example predictions for the figures.

Choices where the paper is open: the CPU variants have no pretrained DINO, so the encoder is trained
end to end from scratch for every model (optionally after a masked-reconstruction warm-up); the `gpu`
variant fine-tunes DINO ViT-S/16 from `model.encoder_checkpoint`, as the paper does; the baselines
use the same encoder and budget; "ICM" uses the action adversary only (Causal Triplet's state critic is
off); "SMS" is Causal Triplet's block-sparsity regulariser on ResPair's projections, its blocks
taken from the action labels as there (antonyms share one; here they coincide with the attribute
families), weight `loss.sms = 1` (the top of Causal Triplet's 0.001-1 sweep); Adam at 3e-3 with
clipping for every model (at 3e-4 or 1e-3 none fits in 5 CPU epochs); SupCon and L1 ramp up over the
first half of training (`loss.ramp_fraction`: at full weight from step 0 they drown the CE of an
untrained encoder) and L1 is averaged over the delta's coordinates by default (`loss.sparsity_kind`:
the sum collapses the delta; the other choices, a schedule, the L1 of the unit-norm delta and a
top-k projector, are in `core/causal_delta.py`); the rest is listed in `core/causal_delta.py` and
`core/data/shape_triplets.py`.
"""

from __future__ import annotations

import ml_collections

from core import causal_delta as cde
from core.data import shape_triplets as triplets
from methods.base import Method, require, require_choice, require_file, require_positive_int
from methods.causal_delta import phases as phases_lib
from methods.causal_delta import study as study_lib
from methods.causal_delta.phases import phases


def _validate_data(config: ml_collections.ConfigDict) -> None:
  data = config.data
  for field in ("data.image_size", "data.num_train", "data.num_eval", "data.num_syst_objects"):
    require_positive_int(config, field)
  require_choice(config, "data.scene", triplets.SCENES)
  require_choice(config, "data.objects", tuple(triplets.OBJECT_SETS))
  require(
    data.image_size % 8 == 0, "data.image_size", f"must be a multiple of 8, got {data.image_size}"
  )
  require(0.0 < data.comp_fraction < 1.0, "data.comp_fraction", "must lie in (0, 1)")
  require(data.noise_sigma >= 0.0, "data.noise_sigma", "must be >= 0")
  require(
    isinstance(data.max_shift, int) and data.max_shift >= 0, "data.max_shift", "must be an int >= 0"
  )
  num_objects = len(triplets.OBJECT_SETS[data.objects])
  require(
    data.num_syst_objects < num_objects,
    "data.num_syst_objects",
    f"must be below the {num_objects} classes of data.objects={data.objects!r}",
  )
  try:
    triplets.held_out_objects(data.split_seed, data.num_syst_objects, num_objects=num_objects)
  except ValueError as error:
    require(False, "data.num_syst_objects", str(error))
  require(
    config.batch_size <= data.num_train, "batch_size", f"exceeds data.num_train={data.num_train}"
  )
  if not data.generate:
    settings = phases_lib.settings_of(data)
    name = triplets.config_name(settings)
    problem = "not set" if not data.data_dir else None
    if problem is None and not triplets.is_prepared(settings, data.data_dir):
      problem = f"no prepared tfds dataset 'shape_triplets/{name}' in {data.data_dir!r}"
    preset = name if name in triplets.PRESETS else "<preset>"
    require(
      problem is None,
      "data.data_dir",
      f"{problem}; this variant reads a prepared ShapeTriplets dataset: run `python -m "
      f"core.data.shape_triplets --config={preset} --data_dir=DIR` once and pass "
      "--config.data.data_dir=DIR (or set --config.data.generate=True) (docs/paper_scale.md)",
    )


def _validate_vit(config: ml_collections.ConfigDict) -> None:
  m = config.model
  for field in ("model.vit_patch", "model.vit_width", "model.vit_depth", "model.vit_heads"):
    require_positive_int(config, field)
  require_positive_int(config, "model.vit_mlp_ratio")
  require(
    isinstance(m.vit_image_size, int) and m.vit_image_size >= 0,
    "model.vit_image_size",
    f"must be an int >= 0 (0 = data.image_size), got {m.vit_image_size!r}",
  )
  size = m.vit_image_size or config.data.image_size
  require(size % m.vit_patch == 0, "model.vit_patch", f"must divide the ViT's image size {size}")
  require(m.vit_width % m.vit_heads == 0, "model.vit_heads", "must divide model.vit_width")


def validate(config: ml_collections.ConfigDict) -> None:
  _validate_data(config)
  m = config.model
  require_choice(config, "model.kind", phases_lib.MODEL_KINDS)
  require_choice(config, "model.encoder", ("cnn", "vit"))
  require_choice(config, "model.patch_loss", ("aggregate", "per_patch"))
  require_choice(config, "seed_batching", ("auto", "vmap", "unroll"))
  for field in ("num_seeds", "model.embed_dim", "model.hidden", "model.top_k", "eval.chunk"):
    require_positive_int(config, field)
  for field in ("eval.num_train", "eval.num_projection", "eval.num_examples"):
    require_positive_int(config, field)
  require(
    config.eval.num_examples <= config.data.num_eval,
    "eval.num_examples",
    f"exceeds data.num_eval={config.data.num_eval}",
  )
  if m.encoder == "cnn":
    require(
      len(m.channels) == len(m.strides) > 0,
      "model.strides",
      f"needs one stride per channel width, got {len(m.strides)} for {len(m.channels)}",
    )
  else:
    _validate_vit(config)
  if config.variant == "gpu" or m.encoder_checkpoint:
    require(m.encoder == "vit", "model.encoder", "a DINO checkpoint needs 'vit'")
    require_file(
      config,
      "model.encoder_checkpoint",
      "DINO ViT-S/16's state dict (torch names) saved as .npz",
      "download dino_deitsmall16_pretrain.pth (github.com/facebookresearch/dino) and save it once "
      "with torch: np.savez('dino_vits16.npz', **{k: v.float().numpy() for k, v in "
      "torch.load(path, map_location='cpu').items()})",
    )
  grid = phases_lib.grid_shape(config)
  require(
    m.top_k <= grid[0] * grid[1],
    "model.top_k",
    f"exceeds the encoder's {grid[0]}x{grid[1]} patches",
  )
  if m.kind in phases_lib.BASELINES:
    require(
      config.loss.supcon == 0 and config.loss.sparsity == 0,
      "loss.supcon",
      f"the {m.kind} baseline trains on CE only (Causal Triplet); pass --config.loss.supcon=0 "
      "--config.loss.sparsity=0",
    )
  require(config.loss.temperature > 0, "loss.temperature", "must be positive")
  require_choice(config, "loss.sparsity_kind", cde.SPARSITY_KINDS)
  if config.loss.sparsity_kind == "topk":
    require_positive_int(config, "loss.sparsity_top_k")
    require(
      config.loss.sparsity_top_k <= m.embed_dim,
      "loss.sparsity_top_k",
      f"exceeds the delta's model.embed_dim={m.embed_dim}",
    )
    require(m.kind in ("cde_global", "cde_patch"), "loss.sparsity_kind", "topk needs a CDE model")
  for field in ("ce", "supcon", "sparsity", "adversary", "sms"):
    require(config.loss[field] >= 0, f"loss.{field}", "must be >= 0")
  if m.kind == "sms":
    require(
      config.loss.sms > 0,
      "loss.sms",
      "must be > 0 for model.kind='sms' (0 is the vanilla baseline)",
    )
    require(
      m.embed_dim >= phases_lib.NUM_BLOCKS,
      "model.embed_dim",
      f"must be >= the {phases_lib.NUM_BLOCKS} latent blocks of the SMS baseline",
    )
  require(config.optim.learning_rate > 0, "optim.learning_rate", "must be positive")
  require(0.0 < config.warmup.mask_ratio < 1.0, "warmup.mask_ratio", "must lie in (0, 1)")
  if config.warmup.steps:
    require_positive_int(config, "warmup.batch_size")


METHOD = Method(
  name="causal_delta",
  phases=phases,
  validate=validate,
  study_arms=study_lib.study_arms,
  report=study_lib.report,
)
