"""Causal delta embeddings: ShapeTriplet splits and renderer, the losses at known inputs, the zero
delta of an intervention that changes nothing, a few steps of every model through the loop, the
study report, and configuration errors naming the field."""

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import causal_delta as cde_config
from core import causal_delta as cde
from core.data import shape_triplets as triplets
from core.nn.cnn import ConvEncoder, PatchViT
from experiments import loop
from methods import causal_delta
from methods.base import ConfigError, with_changes

phases_lib, study_lib = causal_delta.phases_lib, causal_delta.study_lib  # `.phases` is the function

TINY = triplets.Settings(num_train=96, num_eval=32)


# ---------------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("split_seed", [0, 1, 2, 3])
def test_splits_hold_out_what_they_should(split_seed):
  combos = triplets.combinations(triplets.Settings(split_seed=split_seed))
  iid, comp, syst = set(combos.iid), set(combos.comp), set(combos.syst)
  assert not iid & comp and not iid & syst and not comp & syst
  assert not set(combos.train_objects) & set(combos.syst_objects)
  assert len(combos.syst_objects) == 3
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


def test_generated_records_respect_the_splits():
  combos = triplets.combinations(TINY)
  for split in triplets.SPLITS:
    records = triplets.generate(TINY, split)
    pairs = set(zip(records["action"].tolist(), records["object"].tolist(), strict=True))
    assert pairs <= set(combos.pairs(split)), split
    palettes = triplets.SCENE_PALETTES if split == "scene" else triplets.TRAIN_PALETTES
    assert set(records["palette"].tolist()) <= set(palettes)
    assert records["before"].shape == (TINY.split_size(split), 32, 32, 3)
    assert records["before"].dtype == np.uint8


def test_renderer_is_deterministic_and_changes_only_the_target():
  clean = triplets.Settings(num_train=64, num_eval=64, noise_sigma=0.0, max_shift=0)
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
  assert float(cde.l1_sparsity(deltas)) == 4.0
  assert float(cde.l1_sparsity(deltas, "mean")) == 1.0
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
  assert float(cde.l1_sparsity(out.embedding)) == 0.0
  other = model.apply(params, images, images[::-1])
  assert float(jnp.abs(other.embedding).sum()) > 0
  if kind == "cde_patch":
    assert out.patch_embedding.shape == (3, 4, 64) and out.patch_index.shape == (3, 4)


def test_top_k_keeps_the_largest_patch_deltas():
  deltas = jnp.zeros((1, 6, 2)).at[0, 4].set(3.0).at[0, 1].set(-2.0).at[0, 5].set(0.5)
  selected, index = cde.top_k_patches(deltas, 2)
  assert index.tolist() == [[4, 1]]
  np.testing.assert_array_equal(selected[0], deltas[0, jnp.array([4, 1])])


def test_vit_encoder_gives_the_patch_grid():
  vit = PatchViT(patch=4, width=16, depth=1, num_heads=2)
  images = jnp.zeros((2, 32, 32, 3))
  grid = vit.apply(vit.init(jax.random.key(0), images), images)
  assert grid.shape == (2, 8, 8, 16)


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
    dict(model__kind="icm", loss__supcon=0.0, loss__sparsity=0.0),
    dict(model__kind="cde_patch", model__patch_loss="per_patch", data__scene="multi"),
  ],
  ids=["icm", "patch_per_patch"],
)
def test_a_train_step_of_each_model_is_finite_and_changes_the_encoder(tmp_path, changes):
  config = tiny_config(tmp_path, **changes)
  state = phases_lib.init_state(config, jax.random.key(0), {})
  batch = phases_lib.train_batches(config).batch(0)
  new, metrics = jax.jit(lambda s, b: phases_lib.train_step(config, s, b, None))(state, batch)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  encoder = lambda s: s["params"]["params"]["encoder"]  # noqa: E731
  assert not np.allclose(jax.tree.leaves(encoder(new))[0], jax.tree.leaves(encoder(state))[0])
  if changes["model__kind"] == "icm":
    assert "adversary_ce" in metrics and "adversary" in new


def test_study_report_states_the_claims(tmp_path):
  config = tiny_config(tmp_path, num_seeds=3)
  arms = dict(study_lib.study_arms(config))
  assert set(arms) >= {"vanilla", "icm", "cde", "cde_ce", "multi_cde_patch"}
  assert arms["multi_cde_patch"].data.scene == "multi" and arms["vanilla"].loss.supcon == 0
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
  assert "multi_cde_patch_minus_global_ood_accuracy_pts" in report.summary
  assert "causal_delta_study" in report.figures


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
  ],
)
def test_bad_fields_are_named(tmp_path, changes, message):
  with pytest.raises(ConfigError, match=message):
    causal_delta.validate(tiny_config(tmp_path, **changes))


def test_gpu_variant_without_prepared_data_names_the_field():
  with pytest.raises(ConfigError, match=r"^config\.data\.data_dir: not set;.*single64"):
    causal_delta.validate(cde_config.get_config("gpu"))
