"""The causal-delta phases: data, the optional warm-up, seed-stacked training, evaluation and probes.

Seeds are an array axis: the state holds `config.num_seeds` independent models (their own init and
their own data order), updated by one jitted step and evaluated by one jitted forward. On CPU the
seeds are unrolled inside the step (`seed_batching = "auto"`): `vmap` over convolution weights
becomes a grouped convolution that XLA:CPU runs several times slower than the separate ones; on
accelerators the step is a `vmap`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import causal_delta as cde
from core.data import batching
from core.data import shape_triplets as triplets
from core.nn import vit_convert
from core.nn.cnn import ConvEncoder
from core.nn.vit import ViT
from methods.base import ConfigError, Phase, cached_per_config

MODEL_KINDS = ("cde_global", "cde_patch", "vanilla", "icm", "sms")
BASELINES = ("vanilla", "icm", "sms")  # the ResPair pair model, with CE (+ the baseline's term)
# Causal Triplet's latent blocks: one per action, antonyms sharing one (here: one per FAMILIES entry)
ACTION_BLOCKS = cde.action_blocks(len(triplets.ACTIONS), triplets.ANTONYM)
NUM_BLOCKS = int(ACTION_BLOCKS.max()) + 1
EVAL_SPLITS = ("iid", "comp", "syst", "scene")
RESULT_NAMES = {"iid": "iid", "comp": "ood_comp", "syst": "ood_syst", "scene": "ood_scene"}


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


def settings_of(data: ml_collections.ConfigDict) -> triplets.Settings:
  return triplets.Settings(
    image_size=data.image_size,
    num_train=data.num_train,
    num_eval=data.num_eval,
    scene=data.scene,
    noise_sigma=data.noise_sigma,
    max_shift=data.max_shift,
    split_seed=data.split_seed,
    seed=data.seed,
    comp_fraction=data.comp_fraction,
    num_syst_objects=data.num_syst_objects,
    objects=data.objects,
  )


def object_names(data: ml_collections.ConfigDict) -> tuple[str, ...]:
  return triplets.OBJECT_SETS[data.objects]


@cached_per_config(maxsize=4)
def load_splits(data: ml_collections.ConfigDict) -> dict[str, dict[str, np.ndarray]]:
  """Every split of the ShapeTriplets dataset the config names (built on first use if allowed)."""
  return triplets.load(settings_of(data), data.data_dir or None, data.generate)


@dataclasses.dataclass
class SeedStackedBatches:
  """One shuffled batch per seed stacked on axis 1 (`[B, S, ...]`; the batch axis stays first so
  the loop shards it)."""

  sources: list
  global_batch_size: int

  def batch(self, step: int, process_index: int = 0, process_count: int = 1):
    parts = [s.batch(step, process_index, process_count) for s in self.sources]
    return {name: np.stack([p[name] for p in parts], axis=1) for name in parts[0]}


def train_batches(
  config: ml_collections.ConfigDict, fields=("before", "after", "action", "object")
):
  train = load_splits(config.data)["train"]
  arrays = {name: train[name] for name in fields}
  seeds = [config.seed * 1000 + s for s in range(config.num_seeds)]
  sources = [batching.from_arrays(arrays, config.batch_size, seed) for seed in seeds]
  return SeedStackedBatches(sources, config.batch_size)


def warmup_batches(config: ml_collections.ConfigDict):
  """Single images (every before and after image of the training pairs), one order per seed."""
  train = load_splits(config.data)["train"]
  images = {"image": np.concatenate([train["before"], train["after"]])}
  seeds = [config.seed * 1000 + 500 + s for s in range(config.num_seeds)]
  sources = [batching.from_arrays(images, config.warmup.batch_size, s) for s in seeds]
  return SeedStackedBatches(sources, config.warmup.batch_size)


def as_images(pixels: jax.Array) -> jax.Array:
  return pixels.astype(jnp.float32) / 255.0


# ---------------------------------------------------------------------------------------------------
# Models and the seed axis
# ---------------------------------------------------------------------------------------------------


def encoder_of(config: ml_collections.ConfigDict):
  m = config.model
  if m.encoder == "vit":
    return ViT(
      patch=m.vit_patch,
      width=m.vit_width,
      depth=m.vit_depth,
      num_heads=m.vit_heads,
      mlp_ratio=m.vit_mlp_ratio,
      image_size=m.vit_image_size,
    )
  return ConvEncoder(channels=tuple(m.channels), strides=tuple(m.strides), group_norm=m.group_norm)


@cached_per_config(maxsize=2)
def pretrained_encoder(config: ml_collections.ConfigDict) -> dict:
  """The encoder's parameters from `config.model.encoder_checkpoint` (a DINO ViT state dict saved as
  `.npz`, converted by `core.nn.vit_convert`); a key that does not fit is named in a `ConfigError`."""
  try:
    state_dict = vit_convert.read_npz(config.model.encoder_checkpoint)
    converted = vit_convert.dino_to_flax(state_dict, encoder_of(config), config.data.image_size)
    return converted["params"]
  except (ValueError, OSError) as error:  # CheckpointError, or not an .npz of arrays
    raise ConfigError(f"config.model.encoder_checkpoint: {error}") from None


def with_pretrained_encoder(config: ml_collections.ConfigDict, params: dict) -> dict:
  """`params` (stacked over seeds) with every seed's encoder replaced by the pretrained one, when
  `config.model.encoder_checkpoint` names one (all seeds start from the same backbone)."""
  if not config.model.encoder_checkpoint:
    return params
  stacked = jax.tree.map(
    lambda a: jnp.broadcast_to(a, (config.num_seeds, *a.shape)), pretrained_encoder(config)
  )
  return {"params": {**params["params"], "encoder": stacked}}


def model_of(config: ml_collections.ConfigDict) -> cde.DeltaPairModel:
  m = config.model
  return cde.DeltaPairModel(
    encoder=encoder_of(config),
    kind="vanilla" if m.kind in BASELINES else m.kind,
    num_actions=len(triplets.ACTIONS),
    embed_dim=m.embed_dim,
    hidden=m.hidden,
    top_k=m.top_k,
    classifier_hidden=m.classifier_hidden,
    per_patch=m.kind == "cde_patch" and m.patch_loss == "per_patch",
    delta_top_k=config.loss.sparsity_top_k if config.loss.sparsity_kind == "topk" else 0,
  )


def adversary_of(config: ml_collections.ConfigDict) -> cde.Adversary:
  return cde.Adversary(config.model.embed_dim, len(object_names(config.data)))


def loss_weights(config: ml_collections.ConfigDict, step=None) -> cde.LossWeights:
  """The loss weights at `step`: SupCon and L1 ramp up linearly over the first `loss.ramp_fraction`
  of training (0: full weight from the start), so that they act on deltas the CE has shaped; with
  `loss.sparsity_kind = "l1_schedule"` the L1 is off for that share and then ramps up linearly to its
  full weight at the last step."""
  w = config.loss
  ramp = sparsity_ramp = 1.0
  if step is not None and w.ramp_fraction > 0 and not cde.is_zero_weight(w.supcon + w.sparsity):
    ramp = sparsity_ramp = jnp.minimum(1.0, step / (w.ramp_fraction * config.steps))
  if step is not None and w.sparsity_kind == "l1_schedule":
    start = w.ramp_fraction * config.steps
    sparsity_ramp = jnp.clip((step - start) / max(config.steps - start, 1.0), 0.0, 1.0)
  return cde.LossWeights(
    w.ce, ramp * w.supcon, sparsity_ramp * w.sparsity, w.temperature, w.sparsity_kind
  )


def per_seed(config: ml_collections.ConfigDict, fn):
  """`fn` mapped over the leading seed axis of every argument (module docstring)."""
  mode = config.seed_batching
  if mode == "auto":
    mode = "unroll" if jax.default_backend() == "cpu" else "vmap"
  if mode == "vmap":
    return jax.vmap(fn)

  def unrolled(*args):
    outs = [fn(*jax.tree.map(lambda a, s=s: a[s], args)) for s in range(config.num_seeds)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

  return unrolled


def seed_keys(rng: jax.Array, num_seeds: int) -> jax.Array:
  return jax.vmap(lambda s: jax.random.fold_in(rng, s))(jnp.arange(num_seeds))


def optimizer(learning_rate: float, grad_clip: float) -> optax.GradientTransformation:
  """Adam (the paper's and Causal Triplet's optimiser), global-norm clipping when `grad_clip > 0`."""
  adam = optax.adam(learning_rate)
  return optax.chain(optax.clip_by_global_norm(grad_clip), adam) if grad_clip > 0 else adam


def _image_shape(config) -> tuple[int, int, int, int]:
  return (1, config.data.image_size, config.data.image_size, 3)


# ---------------------------------------------------------------------------------------------------
# Warm-up: masked reconstruction of single images (optional)
# ---------------------------------------------------------------------------------------------------


def grid_shape(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """The encoder's patch grid (h, w) at the configured image size."""
  encoder = encoder_of(config)
  images = jnp.zeros(_image_shape(config))
  out = jax.eval_shape(lambda: encoder.init_with_output(jax.random.key(0), images)[0])
  shape = cde.encoder_features(out)[0].shape
  return shape[1], shape[2]


def init_warmup(config, rng, inputs=None):
  del inputs
  model = cde.MaskedReconstruction(encoder_of(config))
  opt = optimizer(config.warmup.learning_rate, config.optim.grad_clip)
  images, mask = jnp.zeros(_image_shape(config)), jnp.zeros((1, *grid_shape(config)), bool)
  params = jax.vmap(lambda key: model.init(key, images, mask))(seed_keys(rng, config.num_seeds))
  params = with_pretrained_encoder(config, params)
  return {"params": params, "opt_state": jax.vmap(opt.init)(params)}


def warmup_step(config, state, batch, rng):
  model = cde.MaskedReconstruction(encoder_of(config))
  opt = optimizer(config.warmup.learning_rate, config.optim.grad_clip)
  grid = grid_shape(config)

  def one_seed(params, opt_state, pixels, key):
    images = as_images(pixels)
    mask = jax.random.uniform(key, (images.shape[0], *grid)) < config.warmup.mask_ratio

    def loss_fn(p):
      return cde.masked_reconstruction_loss(model.apply(p, images, mask), images, mask)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  pixels = jnp.swapaxes(batch["image"], 0, 1)
  keys = seed_keys(rng, config.num_seeds)
  params, opt_state, loss = per_seed(config, one_seed)(
    state["params"], state["opt_state"], pixels, keys
  )
  return {"params": params, "opt_state": opt_state}, {"loss": loss.mean()}


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


def init_state(config, rng, inputs) -> dict:
  model, opt = model_of(config), optimizer(config.optim.learning_rate, config.optim.grad_clip)
  images = jnp.zeros(_image_shape(config))
  keys = seed_keys(rng, config.num_seeds)
  params = jax.vmap(lambda key: model.init(key, images, images))(keys)
  if "warmup" in inputs:
    params = {
      "params": {**params["params"], "encoder": inputs["warmup"]["params"]["params"]["encoder"]}
    }
  else:
    params = with_pretrained_encoder(config, params)
  state = {
    "params": params,
    "opt_state": jax.vmap(opt.init)(params),
    "step": jnp.zeros((config.num_seeds,), jnp.int32),
  }
  if config.model.kind == "icm":
    adversary = adversary_of(config)
    zeros = jnp.zeros((1, config.model.embed_dim))
    adv = jax.vmap(lambda key: adversary.init(jax.random.fold_in(key, 1), zeros))(keys)
    adv_opt = optimizer(config.optim.learning_rate, config.optim.grad_clip)
    state.update(adversary=adv, adversary_opt_state=jax.vmap(adv_opt.init)(adv))
  return state


def pair_loss(config, params, adversary_params, batch, step) -> tuple[jax.Array, dict]:
  """One seed's training objective: CDE's `L_CE + a_c L_SupCon + a_s L_sparse`, the vanilla CE,
  ICM's `L_CE - lambda * CE(adversary(z), object)` (the model maximises the adversary's loss), or
  SMS's `L_CE + w * L_SMS(p1, p2)` on the blocks the action leaves alone."""
  model, kind = model_of(config), config.model.kind
  out = model.apply(params, as_images(batch["before"]), as_images(batch["after"]))
  if kind in ("cde_global", "cde_patch"):
    per_patch = kind == "cde_patch" and config.model.patch_loss == "per_patch"
    loss, parts = cde.cde_loss(out, batch["action"], loss_weights(config, step), per_patch)
  else:
    loss = cde.cross_entropy(out.logits, batch["action"])
    parts = {"ce": loss}
  if kind == "icm":
    adversary_logits = adversary_of(config).apply(adversary_params, out.embedding)
    parts["adversary_ce"] = cde.cross_entropy(adversary_logits, batch["object"])
    loss = loss - config.loss.adversary * parts["adversary_ce"]
  if kind == "sms":
    blocks = jnp.asarray(ACTION_BLOCKS)[batch["action"]]
    parts["block_mse"] = cde.block_invariance_loss(out.before, out.after, blocks, NUM_BLOCKS)
    loss = loss + config.loss.sms * parts["block_mse"]
  parts["accuracy"] = jnp.mean(jnp.argmax(out.logits, -1) == batch["action"])
  return loss, (parts, out.embedding)


def adversary_update(config, adversary_params, opt_state, embedding, objects):
  """The ICM critic's step: predict the object from the (frozen) action embedding."""
  adversary, opt = (
    adversary_of(config),
    optimizer(config.optim.learning_rate, config.optim.grad_clip),
  )

  def loss_fn(p):
    return cde.cross_entropy(adversary.apply(p, jax.lax.stop_gradient(embedding)), objects)

  grads = jax.grad(loss_fn)(adversary_params)
  updates, opt_state = opt.update(grads, opt_state, adversary_params)
  return optax.apply_updates(adversary_params, updates), opt_state


def train_step(config, state, batch, rng):
  del rng
  opt = optimizer(config.optim.learning_rate, config.optim.grad_clip)
  icm = config.model.kind == "icm"

  def one_seed(seed_state, seed_batch):
    adversary = seed_state.get("adversary")
    (loss, (parts, embedding)), grads = jax.value_and_grad(
      lambda p: pair_loss(config, p, adversary, seed_batch, seed_state["step"]), has_aux=True
    )(seed_state["params"])
    updates, opt_state = opt.update(grads, seed_state["opt_state"], seed_state["params"])
    new = {
      "params": optax.apply_updates(seed_state["params"], updates),
      "opt_state": opt_state,
      "step": seed_state["step"] + 1,
    }
    if icm:
      new["adversary"], new["adversary_opt_state"] = adversary_update(
        config, adversary, seed_state["adversary_opt_state"], embedding, seed_batch["object"]
      )
    return new, {"loss": loss, "grad_norm": optax.tree.norm(grads), **parts}

  seed_batch = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), batch)
  state, metrics = per_seed(config, one_seed)(state, seed_batch)
  return state, jax.tree.map(jnp.mean, metrics)


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=16)
def _forward_fn(config: ml_collections.ConfigDict):
  """Jitted `(stacked params, before, after) -> per seed {logits, embedding, before, after,
  patch_index}` (`[S, B, ...]`); the same images go to every seed."""
  model = model_of(config)

  def one_seed(params, before, after):
    out = model.apply(params, as_images(before), as_images(after))
    fields = {"logits": out.logits, "embedding": out.embedding}
    fields.update(before=out.before, after=out.after)
    if out.patch_index is not None:
      fields["patch_index"] = out.patch_index
    return fields

  def run(params, before, after):
    copies = jax.tree.map(
      lambda a: jnp.broadcast_to(a, (config.num_seeds, *a.shape)), (before, after)
    )
    return per_seed(config, one_seed)(params, *copies)

  return jax.jit(run)


def forward(config, params, split: dict, count: int | None = None) -> dict[str, np.ndarray]:
  """The seeds' outputs on the first `count` pairs of `split` (all by default), in chunks of
  `config.eval.chunk` (the last padded), one compilation for all chunks."""
  fn, size = _forward_fn(config), config.eval.chunk
  total = len(split["action"]) if count is None else min(count, len(split["action"]))
  parts = []
  for start in range(0, total, size):
    stop = min(start + size, total)
    pad = size - (stop - start)
    before, after = (
      np.concatenate([split[f][start:stop], np.repeat(split[f][stop - 1 : stop], pad, 0)])
      for f in ("before", "after")
    )
    out = fn(params, jnp.asarray(before), jnp.asarray(after))
    parts.append({k: np.asarray(v)[:, : stop - start] for k, v in out.items()})
  return {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}


def _accuracy(out, split) -> np.ndarray:
  """Per-seed accuracy `[S]`."""
  n = out["logits"].shape[1]
  return np.mean(np.argmax(out["logits"], -1) == split["action"][None, :n], axis=1)


def _accuracy_by_action(out, split) -> np.ndarray:
  """`[A]` accuracy per true action, mean over seeds (-1 where the split has no such pair)."""
  n = out["logits"].shape[1]
  actions = split["action"][:n]
  correct = np.argmax(out["logits"], -1) == actions[None]
  return np.array(
    [
      correct[:, actions == a].mean() if np.any(actions == a) else -1.0
      for a in range(len(triplets.ACTIONS))
    ]
  )


def _antonym_cosines(embeddings: np.ndarray, actions: np.ndarray) -> dict[str, float]:
  means = cde.action_means(embeddings, actions, len(triplets.ACTIONS))
  cos = cde.cosine_matrix(means)
  names = triplets.ACTIONS
  return {
    f"cos_{a}_{b}": float(cos[names.index(a), names.index(b)]) for a, b in triplets.ANTONYM_PAIRS
  }


def probes(embeddings: np.ndarray, split: dict) -> dict[str, float]:
  """The representation probes of one seed on one split (module docstring of `core.causal_delta`)."""
  n = len(embeddings)
  actions, objects = split["action"][:n], split["object"][:n]
  out = {
    "delta_sparsity": cde.sparsity_fraction(embeddings),
    "invariance_ratio": cde.invariance_ratio(embeddings, actions),
    "object_dependence_ratio": cde.object_dependence_ratio(embeddings, actions, objects),
  }
  cosines = _antonym_cosines(embeddings, actions)
  out.update(cosines)
  out["antonym_cosine"] = float(np.mean(list(cosines.values())))
  return out


def topk_in_target(patch_index: np.ndarray, split: dict, grid: tuple[int, int], size: int):
  """Fraction of the selected patches whose centre lies inside the target's box `[S]`."""
  gh, gw = grid
  rows, cols = np.divmod(patch_index, gw)
  cy, cx = (rows + 0.5) * size / gh, (cols + 0.5) * size / gw
  box = split["target_box"][None, : patch_index.shape[1], None]
  inside = (cx >= box[..., 0]) & (cx <= box[..., 2]) & (cy >= box[..., 1]) & (cy <= box[..., 3])
  return inside.mean(axis=(1, 2))


def evaluate(config, state, rng) -> dict:
  """Accuracies per split and seed, the gap, the probes on the IID split (means over seeds, and
  per seed), a 2-D projection and example predictions of seed 0."""
  del rng
  splits, params = load_splits(config.data), state["params"]
  results, per_seed_values = {}, {}
  outputs = {}
  for split in EVAL_SPLITS:
    outputs[split] = forward(config, params, splits[split])
    per_seed_values[f"{RESULT_NAMES[split]}_accuracy"] = _accuracy(outputs[split], splits[split])
  train_out = forward(config, params, splits["train"], config.eval.num_train)
  per_seed_values["train_accuracy"] = _accuracy(train_out, splits["train"])
  iid = per_seed_values["iid_accuracy"]
  ood = (per_seed_values["ood_comp_accuracy"] + per_seed_values["ood_syst_accuracy"]) / 2
  per_seed_values["ood_accuracy"] = ood
  per_seed_values["gap"] = iid - ood
  seed_probes = [probes(e, splits["iid"]) for e in outputs["iid"]["embedding"]]
  for name in seed_probes[0]:
    per_seed_values[name] = np.array([p[name] for p in seed_probes])
  projector_delta = outputs["iid"]["after"] - outputs["iid"]["before"]
  per_seed_values["projector_antonym_cosine"] = np.array(
    [np.mean(list(_antonym_cosines(d, splits["iid"]["action"]).values())) for d in projector_delta]
  )
  if "patch_index" in outputs["iid"]:
    grid = grid_shape(config)
    for split in ("iid", "comp"):
      per_seed_values[f"topk_in_target_{split}"] = topk_in_target(
        outputs[split]["patch_index"], splits[split], grid, config.data.image_size
      )
  for name, values in per_seed_values.items():
    results[name] = float(np.mean(values))
    results[f"{name}_per_seed"] = np.asarray(values, np.float64)
  for split in ("iid", "comp", "syst"):
    results[f"{RESULT_NAMES[split]}_accuracy_by_action"] = _accuracy_by_action(
      outputs[split], splits[split]
    )
  results.update(_pictures(config, outputs, splits))
  return results


def _pictures(config, outputs, splits) -> dict[str, np.ndarray]:
  """Seed 0's 2-D projection of the first IID embeddings, the cosine matrix of its action means, and
  its predictions on the first pairs of the comp split (for the figures)."""
  count, k = config.eval.num_projection, config.eval.num_examples
  embeddings = outputs["iid"]["embedding"][0]
  actions = splits["iid"]["action"][: len(embeddings)]
  means = cde.action_means(embeddings, actions, len(triplets.ACTIONS))
  return {
    "projection_2d": cde.pca_2d(embeddings[:count]),
    "projection_action": actions[:count].astype(np.float64),
    "cosine_matrix": cde.cosine_matrix(means),
    "example_prediction_comp": np.argmax(outputs["comp"]["logits"][0, :k], -1).astype(np.float64),
  }


def example_figure(config, state, title: str = ""):
  """Example pairs (before over after) with true and predicted actions, and the 2-D projection."""
  splits = load_splits(config.data)
  outputs = {
    "iid": forward(config, state["params"], splits["iid"], config.eval.num_projection),
    "comp": forward(config, state["params"], splits["comp"], config.eval.num_examples),
  }
  return example_figure_from(config, _pictures(config, outputs, splits), title)


def example_figure_from(config, results: dict, title: str = ""):
  """The example figure from an arm's results (`example_prediction_comp`, `projection_*`)."""
  from methods.base import figure_grid

  splits = load_splits(config.data)
  k = config.eval.num_examples
  fig, axes = figure_grid(2, k + 2, panel_size=(1.3, 1.5), figsize=(1.3 * (k + 2) + 1.5, 3.4))
  split = "comp"
  predictions = np.asarray(results[f"example_prediction_{split}"], int)
  for i in range(k):
    for row, field in enumerate(("before", "after")):
      ax = axes[row, i]
      ax.imshow(splits[split][field][i], interpolation="nearest")
      ax.set_xticks([])
      ax.set_yticks([])
    truth = triplets.ACTIONS[splits[split]["action"][i]]
    guess = triplets.ACTIONS[predictions[i]]
    noun = triplets.ALL_OBJECTS[splits[split]["object"][i]]
    axes[0, i].set_title(f"{truth}\n{noun}", fontsize=7)
    axes[1, i].set_xlabel(guess, fontsize=7, color="green" if truth == guess else "red")
  axes[0, 0].set_ylabel("before", fontsize=7)
  axes[1, 0].set_ylabel("after", fontsize=7)
  gs = axes[0, k].get_gridspec()
  for ax in axes[:, k:].ravel():
    ax.remove()
  ax = fig.add_subplot(gs[:, k:])
  scatter_projection(ax, results)
  fig.suptitle(title or "OOD-comp pairs: true (top) and predicted (bottom) actions", fontsize=9)
  fig.tight_layout()
  return fig


def scatter_projection(ax, results: dict) -> None:
  points = np.asarray(results["projection_2d"])
  actions = np.asarray(results["projection_action"], int)
  cmap = __import__("matplotlib").colormaps["tab10"]
  for a, name in enumerate(triplets.ACTIONS):
    rows = actions == a
    ax.scatter(points[rows, 0], points[rows, 1], s=5, color=cmap(a), label=name)
  ax.set_xticks([])
  ax.set_yticks([])
  ax.set_title("2-D PCA of the IID embeddings", fontsize=8)
  ax.legend(fontsize=6, markerscale=2, loc="best")


# ---------------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------------


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  """`warmup` (masked reconstruction, when `warmup.steps > 0`) then `train` (the pair model)."""
  out = []
  if config.warmup.steps > 0:
    out.append(
      Phase(
        name="warmup",
        num_steps=config.warmup.steps,
        init=functools.partial(init_warmup, config),
        step=functools.partial(warmup_step, config),
        data=lambda inputs: warmup_batches(config),
        outputs=lambda state, inputs: {"params": state["params"]},
      )
    )
  out.append(
    Phase(
      name="train",
      num_steps=config.steps,
      init=functools.partial(init_state, config),
      step=functools.partial(train_step, config),
      data=lambda inputs: train_batches(config),
      evaluate=lambda state, rng, inputs: evaluate(config, state, rng),
      artifacts=lambda state, rng, inputs: {"examples": example_figure(config, state)},
    )
  )
  return out
