"""Causal delta embeddings: ShapeTriplet splits and renderer (shapes, and shapes with digit objects),
the losses at known inputs (SupCon, L1, the SMS baseline's block MSE), the zero delta of an
intervention that changes nothing, a few steps of every model through the loop, a DINO-layout ViT
checkpoint through the method config, the study report, and configuration errors naming the field."""

import dataclasses
import hashlib
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import causal_delta as cde_config
from core import causal_delta as cde
from core.data import shape_triplets as triplets
from core.nn import vit_convert
from core.nn.cnn import ConvEncoder
from core.nn.vit import ViT
from experiments import loop
from methods import causal_delta
from methods.base import ConfigError, with_changes

phases_lib, study_lib = causal_delta.phases_lib, causal_delta.study_lib  # `.phases` is the function

TINY = triplets.Settings(num_train=96, num_eval=32)
DIGITS = dataclasses.replace(TINY, objects="shapes_digits", num_syst_objects=6)


# ---------------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "split_seed, objects, held",
  [(0, "shapes", 3), (1, "shapes", 3), (2, "shapes", 3), (3, "shapes", 3)]
  + [(0, "shapes_digits", 6), (1, "shapes_digits", 6)],
)
def test_splits_hold_out_what_they_should(split_seed, objects, held):
  settings = triplets.Settings(split_seed=split_seed, objects=objects, num_syst_objects=held)
  combos = triplets.combinations(settings)
  iid, comp, syst = set(combos.iid), set(combos.comp), set(combos.syst)
  assert not iid & comp and not iid & syst and not comp & syst
  assert not set(combos.train_objects) & set(combos.syst_objects)
  assert set(combos.train_objects) | set(combos.syst_objects) == set(range(settings.num_objects))
  assert len(combos.syst_objects) == held
  assert {o for _, o in syst} == set(combos.syst_objects)
  assert {o for _, o in iid | comp} == set(combos.train_objects)
  assert iid | comp == set(triplets.valid_pairs(combos.train_objects))
  assert len(comp) == round(0.3 * len(iid | comp))
  seen_verbs, seen_nouns = {a for a, _ in iid}, {o for _, o in iid}
  for verb, noun in comp:
    assert verb in triplets.ANTONYM and (triplets.ANTONYM[verb], noun) in iid
    assert verb in seen_verbs and noun in seen_nouns
  assert seen_verbs == set(range(len(triplets.ACTIONS)))  # every action is trained on
  assert np.all(triplets.AFFORDANCES[list(combos.train_objects)].sum(0) >= 2)


def test_antonyms_are_symmetric_and_afforded_together():
  for a, b in triplets.ANTONYM.items():
    assert triplets.ANTONYM[b] == a
    np.testing.assert_array_equal(triplets.AFFORDANCES[:, a], triplets.AFFORDANCES[:, b])


@pytest.mark.parametrize("settings", [TINY, DIGITS], ids=["shapes", "shapes_digits"])
def test_generated_records_respect_the_splits(settings):
  combos = triplets.combinations(settings)
  for split in triplets.SPLITS:
    records = triplets.generate(settings, split)
    pairs = set(zip(records["action"].tolist(), records["object"].tolist(), strict=True))
    assert pairs <= set(combos.pairs(split)), split
    palettes = triplets.SCENE_PALETTES if split == "scene" else triplets.TRAIN_PALETTES
    assert set(records["palette"].tolist()) <= set(palettes)
    assert records["before"].shape == (settings.split_size(split), 32, 32, 3)
    assert records["before"].dtype == np.uint8


def _digest(records: dict) -> str:
  digest = hashlib.sha256()
  for name in sorted(records):
    digest.update(name.encode() + np.ascontiguousarray(records[name]).tobytes())
  return digest.hexdigest()[:16]


def test_default_data_is_unchanged_by_the_digit_option():
  """The shapes-only pairs are what the documented results were measured on (first release)."""
  assert triplets.config_name(TINY) == "custom-30df8039c357"
  assert _digest(triplets.generate_chunk(triplets.Settings(), "train", 0)) == "92fcaeb3c58d0ce5"
  multi = triplets.Settings(scene="multi")
  assert _digest(triplets.generate_chunk(multi, "comp", 3)) == "af8a730189f9a716"


def test_digit_objects_are_drawn_from_scikit_learn_digits():
  fields = triplets.digit_glyphs()
  assert len(fields) == 10 and sum(len(f) for f in fields) == 1797
  assert all(f.min() < 0 < f.max() for f in fields)  # ink and background in every class
  records = triplets.generate(DIGITS, "train")
  digit_rows = records["object"] >= len(triplets.OBJECTS)
  assert 0 < digit_rows.mean() < 1  # shapes and digits both appear
  assert not np.any(triplets.AFFORDANCES[len(triplets.OBJECTS) :, triplets.ACTIONS.index("fill")])
  with pytest.raises(ValueError, match="Settings.objects must be one of"):
    triplets.Settings(objects="letters")
  # two instances of one digit class differ (handwriting), the same instance does not
  qx, qy = np.meshgrid(np.linspace(-1, 1, 16), np.linspace(-1, 1, 16))
  q = np.broadcast_to(qx, (3, 16, 16)), np.broadcast_to(qy, (3, 16, 16))
  distance = triplets.glyph_distance(3, np.array([0.0, 0.0, 0.5]), *q)
  np.testing.assert_array_equal(distance[0], distance[1])
  assert np.any((distance[0] < 0) != (distance[2] < 0))


@pytest.mark.parametrize("objects", ["shapes", "shapes_digits"])
def test_renderer_is_deterministic_and_changes_only_the_target(objects):
  clean = triplets.Settings(
    num_train=64, num_eval=64, noise_sigma=0.0, max_shift=0, objects=objects, num_syst_objects=3
  )
  for scene in triplets.SCENES:
    settings = dataclasses.replace(clean, scene=scene)
    first = triplets.generate_chunk(settings, "train", 0)
    chex.assert_trees_all_equal(first, triplets.generate_chunk(settings, "train", 0))
    size = settings.image_size
    ys, xs = np.mgrid[:size, :size] + 0.5
    changed = np.any(first["before"] != first["after"], axis=-1)
    for i, (x0, y0, x1, y1) in enumerate(first["target_box"]):
      outside = (xs < x0) | (xs > x1) | (ys < y0) | (ys > y1)
      assert not np.any(changed[i] & outside), (scene, i)
      assert np.any(changed[i]), (scene, i, triplets.ACTIONS[first["action"][i]])


def test_tfds_builder_yields_the_generator_records(tmp_path):
  loaded = triplets.load(TINY, str(tmp_path), splits=("train", "comp"))
  assert triplets.is_prepared(TINY, str(tmp_path))
  for split in ("train", "comp"):
    chex.assert_trees_all_equal(loaded[split], triplets.generate(TINY, split))
  with pytest.raises(FileNotFoundError, match="not prepared"):
    triplets.load(triplets.Settings(num_train=8), str(tmp_path), generate_if_missing=False)


# ---------------------------------------------------------------------------------------------------
# Losses, deltas, probes
# ---------------------------------------------------------------------------------------------------


def naive_supcon(z, labels, tau):
  z = z / np.linalg.norm(z, axis=1, keepdims=True)
  losses = []
  for i in range(len(z)):
    positives = [p for p in range(len(z)) if p != i and labels[p] == labels[i]]
    if not positives:
      continue
    denominator = sum(math.exp(z[i] @ z[j] / tau) for j in range(len(z)) if j != i)
    losses.append(
      -np.mean([math.log(math.exp(z[i] @ z[p] / tau) / denominator) for p in positives])
    )
  return np.mean(losses) if losses else 0.0


@pytest.mark.slow
def test_supcon_matches_a_double_loop_and_ignores_order():
  z = np.random.default_rng(0).normal(size=(6, 5))
  labels = np.array([0, 1, 0, 2, 1, 0])  # anchor 3 has no positive: skipped
  got = cde.supcon_loss(jnp.asarray(z), jnp.asarray(labels), 0.1)
  np.testing.assert_allclose(got, naive_supcon(z, labels, 0.1), rtol=1e-5, atol=1e-6)
  order = np.array([4, 2, 0, 5, 1, 3])
  permuted = cde.supcon_loss(jnp.asarray(z[order]), jnp.asarray(labels[order]), 0.1)
  np.testing.assert_allclose(permuted, got, rtol=1e-6)
  none = cde.supcon_loss(jnp.asarray(z), jnp.arange(6), 0.1)
  assert float(none) == 0.0
  grads = jax.grad(lambda e: cde.supcon_loss(e, jnp.asarray(labels), 0.1))(jnp.asarray(z))
  assert np.all(np.isfinite(grads))


def test_l1_and_the_combined_loss_at_known_inputs():
  deltas = jnp.array([[1.0, -2.0, 0.0, 1.0], [0.0, 0.0, 0.0, -4.0]])
  assert float(cde.sparsity_penalty(deltas)) == 4.0
  assert float(cde.sparsity_penalty(deltas, "l1_mean")) == 1.0
  assert (
    float(cde.sparsity_penalty(deltas, "l1_schedule")) == 4.0
  )  # the sum; its weight is scheduled
  # L1 of the unit delta: (4 / sqrt(6) + 4 / 4) / (2 sqrt(4)); scale-free
  expected = (4 / math.sqrt(6) + 1.0) / 4
  assert float(cde.sparsity_penalty(deltas, "l1_normalised")) == pytest.approx(expected, rel=1e-6)
  assert float(cde.sparsity_penalty(10 * deltas, "l1_normalised")) == pytest.approx(expected)
  with pytest.raises(ValueError, match="sparsity kind"):
    cde.sparsity_penalty(deltas, "l0")
  logits = jnp.zeros((2, 8))
  out = cde.PairOutput(logits, deltas, deltas, deltas)
  labels = jnp.array([3, 3])
  total, parts = cde.cde_loss(out, labels, cde.LossWeights(1.0, 2.0, 1.0, 0.1))
  assert parts["ce"] == pytest.approx(math.log(8), rel=1e-6)
  assert parts["sparsity"] == pytest.approx(4.0)
  expected = naive_supcon(np.asarray(deltas), np.asarray(labels), 0.1)
  assert parts["supcon"] == pytest.approx(expected, rel=1e-5)
  assert total == pytest.approx(math.log(8) + 2 * expected + 4.0, rel=1e-5)


@pytest.mark.parametrize("kind", ["cde_global", "cde_patch"])
def test_an_intervention_that_changes_nothing_gives_a_zero_delta(kind):
  model = cde.DeltaPairModel(ConvEncoder(), kind=kind, num_actions=8)
  images = jax.random.uniform(jax.random.key(0), (3, 32, 32, 3))
  params = model.init(jax.random.key(1), images, images)
  out = model.apply(params, images, images)
  assert out.embedding.shape == (3, 64) and out.logits.shape == (3, 8)
  np.testing.assert_array_equal(out.embedding, 0.0)
  assert float(cde.sparsity_penalty(out.embedding)) == 0.0
  other = model.apply(params, images, images[::-1])
  assert float(jnp.abs(other.embedding).sum()) > 0
  if kind == "cde_patch":
    assert out.patch_embedding.shape == (3, 4, 64) and out.patch_index.shape == (3, 4)


def test_top_k_coordinates_keeps_the_largest_magnitudes():
  delta = jnp.array([[0.5, -3.0, 0.1, 2.0, -0.2], [1.0, 0.0, 0.0, 0.0, 0.0]])
  kept = cde.top_k_coordinates(delta, 2)
  np.testing.assert_array_equal(kept[0], [0.0, -3.0, 0.0, 2.0, 0.0])
  np.testing.assert_array_equal(kept[1], delta[1])  # one non-zero, the zeros stay zero
  np.testing.assert_array_equal(cde.top_k_coordinates(-delta, 2), -kept)
  np.testing.assert_array_equal(cde.top_k_coordinates(delta, 5), delta)


@pytest.mark.parametrize(
  "kind, top_k",
  [
    ("cde_global", 0),
    pytest.param("cde_global", 8, marks=pytest.mark.slow),
    pytest.param("cde_patch", 0, marks=pytest.mark.slow),
    ("cde_patch", 8),
  ],
)
def test_cde_logits_depend_only_on_the_delta(kind, top_k):
  """Identical images give the logits of a zero delta whatever the scene; swapping the pair negates
  the embedding. A model that also saw p(x) (as ResPair does) fails both."""
  model = cde.DeltaPairModel(ConvEncoder(), kind=kind, num_actions=8, delta_top_k=top_k)
  scenes = jax.random.uniform(jax.random.key(0), (4, 32, 32, 3))
  after = jnp.clip(scenes + 0.3 * jax.random.uniform(jax.random.key(2), scenes.shape), 0, 1)
  params = model.init(jax.random.key(1), scenes, after)
  same = model.apply(params, scenes, scenes)
  np.testing.assert_allclose(same.logits, jnp.broadcast_to(same.logits[0], same.logits.shape))
  forward, backward = model.apply(params, scenes, after), model.apply(params, after, scenes)
  np.testing.assert_allclose(backward.embedding, -forward.embedding, atol=1e-6)
  assert float(jnp.abs(forward.embedding).sum()) > 0
  if top_k:
    np.testing.assert_array_less((jnp.abs(forward.embedding) > 0).sum(-1), top_k + 1)
  vanilla = cde.DeltaPairModel(ConvEncoder(), kind="vanilla", num_actions=8)
  v_params = vanilla.init(jax.random.key(1), scenes, after)
  v_same = vanilla.apply(v_params, scenes, scenes)
  assert float(jnp.abs(v_same.logits - v_same.logits[0]).max()) > 1e-4


def test_the_l1_schedule_starts_after_the_ramp_and_ends_at_full_weight():
  config = cde_config.get_config()
  config.loss.sparsity_kind = "l1_schedule"
  weight = lambda step: float(phases_lib.loss_weights(config, step).sparsity)
  start = config.loss.ramp_fraction * config.steps
  assert weight(0) == weight(start) == 0.0
  assert 0.0 < weight((start + config.steps) / 2) < 1.0
  assert weight(config.steps) == pytest.approx(config.loss.sparsity)
  # the default L1 ramps with SupCon over the first ramp_fraction
  config.loss.sparsity_kind = "l1_mean"
  assert weight(start / 2) == pytest.approx(0.5) and weight(start) == 1.0


def test_sms_blocks_follow_causal_triplet():
  """One block per action, antonyms sharing one: here exactly the attribute families."""
  blocks = cde.action_blocks(len(triplets.ACTIONS), triplets.ANTONYM)
  families = [triplets.FAMILIES.index(triplets.FAMILY[a]) for a in triplets.ACTIONS]
  assert blocks.tolist() == families and phases_lib.NUM_BLOCKS == 5
  mask = cde.block_mask(5, 64)
  np.testing.assert_array_equal(mask.sum(0), 1.0)  # every coordinate in exactly one block
  assert mask.sum(1).tolist() == [12, 12, 12, 12, 16]  # 64 // 5 each, the 4 left over in the last
  with pytest.raises(ValueError, match="num_blocks <= dim"):
    cde.block_mask(6, 5)


def naive_block_mse(z1, z2, blocks, num_blocks):
  """Causal Triplet's `sparse_criterion_with_label`, written out with numpy."""
  ratio, extra = z1.shape[1] // num_blocks, z1.shape[1] % num_blocks
  one_hot = np.eye(num_blocks)[blocks]
  action = np.concatenate([np.repeat(one_hot, ratio, 1), np.repeat(one_hot[:, -1:], extra, 1)], 1)
  return np.mean((z1 * (1 - action) - z2 * (1 - action)) ** 2)


def test_sms_loss_ignores_the_intervened_block_only():
  rng = np.random.default_rng(0)
  z1, z2 = rng.normal(size=(4, 11)), rng.normal(size=(4, 11))
  blocks = np.array([0, 2, 1, 2])
  got = cde.block_invariance_loss(jnp.asarray(z1), jnp.asarray(z2), jnp.asarray(blocks), 3)
  np.testing.assert_allclose(got, naive_block_mse(z1, z2, blocks, 3), rtol=1e-6)
  # a change inside each pair's own block costs nothing; one outside it does
  own = jnp.asarray(cde.block_mask(3, 11)[blocks])
  moved = jnp.asarray(z1) + 5.0 * own
  assert float(cde.block_invariance_loss(jnp.asarray(z1), moved, jnp.asarray(blocks), 3)) == 0.0
  other = jnp.asarray(z1) + 5.0 * (1 - own)
  value = cde.block_invariance_loss(jnp.asarray(z1), other, jnp.asarray(blocks), 3)
  assert float(value) == pytest.approx(25.0 * float((1 - own).mean()))


def test_top_k_keeps_the_largest_patch_deltas():
  deltas = jnp.zeros((1, 6, 2)).at[0, 4].set(3.0).at[0, 1].set(-2.0).at[0, 5].set(0.5)
  selected, index = cde.top_k_patches(deltas, 2)
  assert index.tolist() == [[4, 1]]
  np.testing.assert_array_equal(selected[0], deltas[0, jnp.array([4, 1])])


def test_vit_encoder_gives_the_cls_token_and_the_patch_grid():
  images = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  for image_size, grid in ((0, 8), (48, 12)):
    vit = ViT(patch=4, width=16, depth=1, num_heads=2, image_size=image_size)
    out, params = jax.eval_shape(vit.init_with_output, jax.random.key(1), images)
    chex.assert_shape((out.cls, out.grid), [(2, 16), (2, grid, grid, 16)])
    assert params["params"]["pos_embed"].shape == (1, 1 + grid * grid, 16)
    feature_grid, global_feature = cde.encoder_features(out)
    assert feature_grid is out.grid and global_feature is out.cls  # Model A reads the CLS token


def test_probes_at_known_embeddings():
  actions = np.array([0, 0, 1, 1])
  objects = np.array([0, 1, 0, 1])
  antiparallel = np.array([[2.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-3.0, 0.0]])
  assert cde.invariance_ratio(antiparallel, actions) == pytest.approx(0.0, abs=1e-12)
  assert cde.object_dependence_ratio(antiparallel, actions, objects) == pytest.approx(
    0.0, abs=1e-12
  )
  means = cde.action_means(antiparallel, actions, 2)
  assert cde.cosine_matrix(means)[0, 1] == pytest.approx(-1.0)
  assert cde.sparsity_fraction(np.array([[1.0, 0.001, 0.0, 0.5]])) == 0.5


# ---------------------------------------------------------------------------------------------------
# Through the loop
# ---------------------------------------------------------------------------------------------------


def tiny_config(tmp_path, **changes):
  config = cde_config.get_config()
  config.data.update(num_train=96, num_eval=32, data_dir=str(tmp_path / "tfds"))
  config.model.update(channels=(8, 16, 16), embed_dim=16, hidden=16, classifier_hidden=16)
  config.update(batch_size=16, steps=3, num_seeds=2)
  config.eval.update(chunk=32, num_train=32, num_projection=32, num_examples=4)
  config.loop.update(log_every=1, checkpoint_every=2)
  return with_changes(config, **changes)


def test_default_model_runs_through_the_loop_with_a_warmup(tmp_path):
  config = tiny_config(tmp_path, warmup__steps=2, warmup__batch_size=16)
  summary = loop.run(config, str(tmp_path / "run"))
  results = summary.results
  assert summary.step_traces == {"warmup": 1, "train": 1}
  for key in ("iid_accuracy", "ood_comp_accuracy", "ood_syst_accuracy", "gap", "antonym_cosine"):
    assert math.isfinite(results[key]), key
    assert len(results[f"{key}_per_seed"]) == 2
  assert results["gap"] == pytest.approx(
    results["iid_accuracy"] - (results["ood_comp_accuracy"] + results["ood_syst_accuracy"]) / 2
  )
  assert (tmp_path / "run" / "examples.png").exists()


@pytest.mark.parametrize(
  "changes",
  [
    pytest.param(
      dict(model__kind="icm", loss__supcon=0.0, loss__sparsity=0.0), marks=pytest.mark.slow
    ),
    dict(
      model__kind="sms",
      loss__supcon=0.0,
      loss__sparsity=0.0,
      data__objects="shapes_digits",
      data__num_syst_objects=6,
    ),
    pytest.param(
      dict(model__kind="cde_patch", model__patch_loss="per_patch", data__scene="multi"),
      marks=pytest.mark.slow,
    ),
  ],
  ids=["icm", "sms_on_digits", "patch_per_patch"],
)
def test_a_train_step_of_each_model_is_finite_and_changes_the_encoder(tmp_path, changes):
  config = tiny_config(tmp_path, **changes)
  state = phases_lib.init_state(config, jax.random.key(0), {})
  batch = phases_lib.train_batches(config).batch(0)
  new, metrics = jax.jit(lambda s, b: phases_lib.train_step(config, s, b, None))(state, batch)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  encoder = lambda s: s["params"]["params"]["encoder"]  # noqa: E731
  assert not np.allclose(jax.tree.leaves(encoder(new))[0], jax.tree.leaves(encoder(state))[0])
  kind = changes.get("model__kind", "cde_global")
  if kind == "icm":
    assert "adversary_ce" in metrics and "adversary" in new
  if kind == "sms":
    assert float(metrics["block_mse"]) > 0
  if "data__objects" in changes:
    assert batch["object"].max() >= len(triplets.OBJECTS)  # digit classes are trained on


def test_study_report_states_the_claims(tmp_path):
  config = tiny_config(tmp_path, num_seeds=3, study__digit_arms=("vanilla", "sms", "cde"))
  arms = dict(study_lib.study_arms(config))
  assert set(arms) >= {"vanilla", "icm", "sms", "cde", "cde_ce", "multi_cde_patch", "digits_sms"}
  assert arms["multi_cde_patch"].data.scene == "multi" and arms["vanilla"].loss.supcon == 0
  assert arms["sms"].model.kind == "sms" and arms["sms"].loss.sms > 0
  assert arms["digits_cde"].data.objects == "shapes_digits"
  assert arms["digits_cde"].data.num_syst_objects == 6 and arms["cde"].data.objects == "shapes"
  rng = np.random.default_rng(0)
  results = {}
  for name in arms:
    result = {}
    for key in ("iid_accuracy", "ood_comp_accuracy", "ood_syst_accuracy", "ood_scene_accuracy"):
      result[f"{key}_per_seed"] = rng.uniform(0.5, 1.0, 3)
    for key in ("train_accuracy", "gap", "ood_accuracy", "delta_sparsity", "invariance_ratio"):
      result[f"{key}_per_seed"] = rng.uniform(0.0, 1.0, 3)
    for key in ("object_dependence_ratio", "antonym_cosine"):
      result[f"{key}_per_seed"] = rng.uniform(-1.0, 1.0, 3)
    result.update({k.removesuffix("_per_seed"): float(np.mean(v)) for k, v in result.items()})
    result["projection_2d"] = rng.normal(size=(32, 2))
    result["projection_action"] = rng.integers(0, 8, 32).astype(float)
    result["cosine_matrix"] = np.eye(8)
    result["example_prediction_comp"] = np.zeros(4)
    results[name] = result
  report = study_lib.report(config, results)
  assert [row["arm"] for row in report.rows] == list(arms)
  for key in ("ood_comp_gain_cde_vs_vanilla_pts", "gap_ratio_cde_over_vanilla"):
    assert key in report.summary
  for key in ("ood_syst_gain_cde_vs_sms_pts", "digits_gap_ratio_cde_over_sms", "sms_gap"):
    assert key in report.summary
  sms_row = report.rows[[row["arm"] for row in report.rows].index("sms")]
  assert sms_row["loss"] == "CE + 1 block MSE"
  assert "multi_cde_patch_minus_global_ood_accuracy_pts" in report.summary
  assert "causal_delta_study" in report.figures


# ---------------------------------------------------------------------------------------------------
# A pretrained ViT through the method config
# ---------------------------------------------------------------------------------------------------

VIT = dict(encoder="vit", vit_patch=4, vit_width=16, vit_depth=1, vit_heads=2, vit_mlp_ratio=2)


def dino_layout_state_dict(width=16, depth=1, patch=4, mlp=32, grid=3, seed=0):
  """Random arrays under DINO's torch names and layouts (`core/nn/vit_convert.py`), at a `grid`
  position table other than the model's, so the converter resizes it."""
  rng = np.random.default_rng(seed)
  shapes = {
    "cls_token": (1, 1, width),
    "pos_embed": (1, 1 + grid * grid, width),
    "patch_embed.proj.weight": (width, 3, patch, patch),
    "patch_embed.proj.bias": (width,),
    "norm.weight": (width,),
    "norm.bias": (width,),
  }
  for i in range(depth):
    for name, shape in (
      ("norm1", (width,)),
      ("norm2", (width,)),
      ("attn.qkv", (3 * width, width)),
      ("attn.proj", (width, width)),
      ("mlp.fc1", (mlp, width)),
      ("mlp.fc2", (width, mlp)),
    ):
      shapes[f"blocks.{i}.{name}.weight"] = shape
      shapes[f"blocks.{i}.{name}.bias"] = (shape[0],)
  return {k: (0.1 * rng.standard_normal(v)).astype(np.float32) for k, v in shapes.items()}


def pretrained_config(tmp_path, state_dict):
  path = tmp_path / "dino.npz"
  np.savez(path, **state_dict)
  config = tiny_config(tmp_path, **{f"model__{k}": v for k, v in VIT.items()})
  config.model.encoder_checkpoint = str(path)
  return config


def init_jitted(config):
  return jax.jit(lambda key: phases_lib.init_state(config, key, {}))(jax.random.key(0))


def test_pretrained_vit_starts_every_seed(tmp_path):
  state_dict = dino_layout_state_dict()
  config = pretrained_config(tmp_path, state_dict)
  causal_delta.validate(config)
  expected = vit_convert.dino_to_flax(state_dict, phases_lib.encoder_of(config), 32)["params"]
  assert expected["pos_embed"].shape == (1, 65, 16)  # the 3x3 table resized to the 8x8 grid
  # the state's tree (traced, not compiled) holds the converted encoder for every seed
  abstract = jax.eval_shape(lambda key: phases_lib.init_state(config, key, {}), jax.random.key(0))
  stacked = jax.tree.map(lambda a: (config.num_seeds, *a.shape), expected)
  chex.assert_trees_all_equal(
    jax.tree.map(lambda a: a.shape, abstract["params"]["params"]["encoder"]), stacked
  )
  params = phases_lib.with_pretrained_encoder(config, {"params": {"encoder": None, "head": 1}})
  assert params["params"]["head"] == 1
  for seed in range(config.num_seeds):
    encoder = jax.tree.map(lambda a, s=seed: a[s], params["params"]["encoder"])
    chex.assert_trees_all_close(encoder, expected)


@pytest.mark.slow
def test_the_pretrained_vit_is_fine_tuned_through_the_loop(tmp_path):
  config = pretrained_config(tmp_path, dino_layout_state_dict())
  state = init_jitted(config)
  batch = phases_lib.train_batches(config).batch(0)
  new, metrics = jax.jit(lambda s, b: phases_lib.train_step(config, s, b, None))(state, batch)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  encoder = lambda s: s["params"]["params"]["encoder"]  # noqa: E731
  assert not np.allclose(encoder(new)["cls_token"], encoder(state)["cls_token"])
  assert not np.allclose(
    encoder(new)["blocks_0"]["attn"]["qkv"]["kernel"],
    encoder(state)["blocks_0"]["attn"]["qkv"]["kernel"],
  )
  arm = with_changes(config, steps=2, warmup__steps=1, warmup__batch_size=16)  # warm-up from DINO
  summary = loop.run(arm, str(tmp_path / "run"))
  assert (
    math.isfinite(summary.results["ood_accuracy"]) and 0 <= summary.results["iid_accuracy"] <= 1
  )


def test_a_checkpoint_that_does_not_fit_names_the_field_and_the_key(tmp_path):
  state_dict = dino_layout_state_dict()
  del state_dict["blocks.0.mlp.fc2.bias"]
  config = pretrained_config(tmp_path, state_dict)
  with pytest.raises(
    ConfigError, match=r"^config\.model\.encoder_checkpoint: .*blocks.0.mlp.fc2.bias"
  ):
    phases_lib.with_pretrained_encoder(config, {"params": {}})


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "changes, message",
  [
    (dict(model__kind="resnet"), "config.model.kind: must be one of"),
    (dict(model__kind="vanilla"), "config.loss.supcon: the vanilla baseline trains on CE only"),
    (dict(data__scene="kitchen"), "config.data.scene: must be one of"),
    (dict(model__top_k=65), "config.model.top_k: exceeds the encoder's 8x8 patches"),
    (dict(data__num_syst_objects=6), "config.data.num_syst_objects: no 6 classes"),
    (dict(data__generate=False), "config.data.data_dir: no prepared tfds dataset"),
    (dict(model__kind="sms"), "config.loss.supcon: the sms baseline trains on CE only"),
    (
      dict(model__kind="sms", loss__supcon=0.0, loss__sparsity=0.0, loss__sms=0.0),
      "config.loss.sms: must be > 0",
    ),
    (dict(data__objects="letters"), "config.data.objects: must be one of"),
    (dict(loss__sparsity_kind="l0"), "config.loss.sparsity_kind: must be one of"),
    (
      dict(loss__sparsity_kind="topk", loss__sparsity_top_k=4097),
      r"config.loss.sparsity_top_k: exceeds the delta's model.embed_dim=\d+",
    ),
    (
      dict(data__objects="shapes_digits", data__num_syst_objects=18),
      "config.data.num_syst_objects: must be below the 18 classes",
    ),
    (dict(model__encoder="vit", model__vit_patch=5), "config.model.vit_patch: must divide"),
    (dict(model__encoder="vit", model__vit_image_size=-1), "config.model.vit_image_size: must"),
    (dict(model__encoder_checkpoint="dino.npz"), "config.model.encoder: a DINO checkpoint needs"),
    (
      dict(model__encoder="vit", model__encoder_checkpoint="missing.npz"),
      "config.model.encoder_checkpoint: no file at 'missing.npz'; expected DINO ViT-S/16",
    ),
  ],
)
def test_bad_fields_are_named(tmp_path, changes, message):
  with pytest.raises(ConfigError, match=message):
    causal_delta.validate(tiny_config(tmp_path, **changes))


def test_gpu_variant_without_prepared_data_names_the_field():
  with pytest.raises(ConfigError, match=r"^config\.data\.data_dir: not set;.*single64"):
    causal_delta.validate(cde_config.get_config("gpu"))


def test_gpu_variant_without_the_dino_weights_names_the_field():
  config = cde_config.get_config("gpu")
  config.data.generate = True  # past the data check
  with pytest.raises(ConfigError, match=r"^config\.model\.encoder_checkpoint: not set;.*\.npz"):
    causal_delta.validate(config)
