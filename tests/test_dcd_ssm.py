"""DCD SSMs on group state tracking: group data, exact constructions, layers, the method in the loop."""

import itertools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import dcd_ssm as dcd_config
from core import dcd_constructions as constructions
from core.data import groups
from core.nn import ssm
from experiments import loop
from methods import dcd_ssm
from methods.base import ConfigError

ORDERS = {"Z6": 6, "Z2xZ4": 8, "S3": 6, "A4": 12, "A5": 60, "D4": 8, "Q8": 8, "S4": 24, "Z2": 2}
DERIVED_LENGTHS = {"Z6": 1, "Z2xZ4": 1, "S3": 2, "A4": 2, "D4": 2, "Q8": 2, "S4": 3, "A5": None}


# ---------------------------------------------------------------------------------------------------
# Groups and data
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_cayley_tables_are_groups(name):
  group = groups.by_name(name)
  table = group.table
  assert group.order == ORDERS[name]
  n = group.order
  for a in range(n):  # Latin square with identity 0 and inverses
    assert sorted(table[a]) == list(range(n)) and sorted(table[:, a]) == list(range(n))
    assert table[a, group.inverse[a]] == 0 and table[group.inverse[a], a] == 0
  triples = np.array(list(itertools.product(range(n), repeat=3))) if n <= 24 else None
  if triples is not None:  # associativity, exhaustively
    a, b, c = triples.T
    np.testing.assert_array_equal(table[table[a, b], c], table[a, table[b, c]])


@pytest.mark.parametrize("name, length", sorted(DERIVED_LENGTHS.items()))
def test_derived_length_is_the_depth_thm2_needs(name, length):
  group = groups.by_name(name)
  assert groups.derived_length(group) == length
  assert group.is_abelian() == (length == 1)
  assert groups.is_solvable(group) == (length is not None)


def test_quaternion_and_dihedral_are_different_groups_of_order_8():
  q8, d4 = groups.by_name("Q8"), groups.by_name("D4")
  involutions = lambda g: sum(g.element_order(x) == 2 for x in range(g.order))
  assert involutions(q8) == 1 and involutions(d4) == 5


@pytest.mark.parametrize("name", ["Z6", "Z2xZ4", "Z2xZ6", "Z2xZ2xZ2", "Z60"])
def test_cyclic_decomposition_gives_faithful_characters(name):
  group = groups.by_name(name)
  orders, coords = groups.cyclic_decomposition(group)
  assert math.prod(orders) == group.order
  assert len({tuple(c) for c in coords}) == group.order  # jointly injective
  for a, b in itertools.product(range(group.order), repeat=2):  # homomorphisms onto Z_{n_j}
    np.testing.assert_array_equal(
      (coords[a] + coords[b]) % np.array(orders), coords[group.table[a, b]]
    )


def test_prefix_products_follow_the_right_multiplication_order():
  group = groups.by_name("S3")
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 6, size=(4, 50))
  labels = groups.prefix_products(group, tokens)
  for row, label in zip(tokens, labels, strict=True):
    p = 0
    for t, x in enumerate(row):
      p = group.multiply(p, int(x))
      assert label[t] == p
  with pytest.raises(ValueError, match=r"element indices in \[0, 6\)"):
    groups.prefix_products(group, np.array([[6]]))


def test_batches_are_pure_functions_of_seed_and_step_and_split_over_processes():
  source = groups.tracking_batches(groups.by_name("A4"), length=20, global_batch_size=8, seed=3)
  first, again, other = source.batch(5), source.batch(5), source.batch(6)
  np.testing.assert_array_equal(first["x"], again["x"])
  assert not np.array_equal(first["x"], other["x"])
  halves = [source.batch(5, i, 2) for i in range(2)]
  np.testing.assert_array_equal(np.concatenate([h["x"] for h in halves]), first["x"])
  assert first["x"].dtype == np.int32 and first["y"].shape == (8, 20)
  evaluation = groups.evaluation_set(groups.by_name("A4"), 20, 8, seed=3)
  assert not np.array_equal(evaluation["x"], source.batch(0)["x"])
  np.testing.assert_array_equal(
    evaluation["x"], groups.evaluation_set(groups.by_name("A4"), 20, 8, seed=3)["x"]
  )


def test_bad_group_names_and_series_are_named():
  with pytest.raises(ValueError, match="unknown group 'G7'"):
    groups.by_name("G7")
  s3 = groups.by_name("S3")
  reflection = next(g for g in range(6) if s3.element_order(g) == 2)
  flip = s3.generated([reflection])
  with pytest.raises(ValueError, match=r"series\[1\] is not normal in series\[2\]"):
    groups.check_series(s3, (frozenset({0}), flip, s3.elements))
  with pytest.raises(ValueError, match="not Abelian"):
    groups.check_series(s3, (frozenset({0}), s3.elements))


# ---------------------------------------------------------------------------------------------------
# Exact constructions (Thm 1, Thm 2)
# ---------------------------------------------------------------------------------------------------


def construction_accuracy(name, kind, layers, length, num=4, scan="sequential"):
  cascade = constructions.construction_for(name, kind, layers)
  need = cascade.required_sizes()
  model = ssm.StateTracker(
    cascade.group.order,
    cascade.group.order,
    d_model=max(32, need["d_model"]),
    d_state=8,
    d_hidden=max(32, need["d_hidden"]),
    num_layers=layers,
    kind=kind,
    scan_implementation=scan,
  )
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  params = constructions.construction_params(cascade, model, shapes)
  data = groups.evaluation_set(cascade.group, length, num, seed=0)
  logits = jax.jit(model.apply)(params, data["x"])
  return float(np.mean(np.asarray(logits).argmax(-1) == data["y"]))


@pytest.mark.parametrize(
  "name, kind, layers",
  [
    ("Z6", "aussm", 1),
    ("Z2xZ4", "aussm", 1),
    ("Z6", "simple_aussm", 1),
    ("S3", "aussm", 2),
    ("A4", "aussm", 2),
    ("Z4", "neg_mamba", 2),
    ("Z2xZ4", "neg_mamba", 2),
    ("Q8", "aussm", 2),
    ("S4", "aussm", 3),
  ],
)
def test_constructions_are_exact_on_long_sequences(name, kind, layers):
  assert construction_accuracy(name, kind, layers, length=2000) == 1.0


def test_s3_cascade_is_exact_at_ten_thousand_steps_in_float32():
  assert construction_accuracy("S3", "aussm", 2, length=10_000, num=2, scan="xla") == 1.0


def test_s3_cascade_has_the_structure_of_the_papers_example():
  """Layer 1: parity (angles 0, pi); layer 2: Z3 rotations whose direction depends on the parity."""
  cascade = constructions.s3_cascade()
  first, second = cascade.layers
  assert first.orders == (2,) and second.orders == (3,)
  np.testing.assert_allclose(np.unique(np.round(first.key_angles, 6)), [0.0, np.pi], atol=1e-6)
  second_turns = np.round(second.key_angles[:, 0] / (2 * np.pi / 3)).astype(int) % 3
  assert set(second_turns) == {0, 1, 2}  # +-2pi/3: both directions occur
  a4 = constructions.a4_cascade()
  assert [layer.orders for layer in a4.layers] == [(3,), (2, 2)]


def test_impossible_constructions_say_why():
  with pytest.raises(ValueError, match="A5 is not solvable"):
    constructions.build_cascade(groups.by_name("A5"))
  with pytest.raises(ValueError, match="S3 is not Abelian"):
    constructions.abelian_construction(groups.by_name("S3"))
  with pytest.raises(ValueError, match="not a 2-group"):
    constructions.construction_for("Z6", "neg_mamba", 2)
  with pytest.raises(ValueError, match="has 2 layers, the model 1"):
    constructions.construction_for("S3", "aussm", 1)


# ---------------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------------


def layer_eigenvalues(kind):
  layer = ssm.DCDLayer(d_state=8, kind=kind)
  u = jax.random.normal(jax.random.key(1), (2, 7, 5))
  params = layer.init(jax.random.key(0), u)
  h = layer.apply(params, u)
  return np.asarray(layer.apply(params, u, method=layer.eigenvalues)), h


@pytest.mark.parametrize("kind", ssm.EIGENVALUE_KINDS)
def test_eigenvalues_lie_in_the_ranges_of_the_papers_table(kind):
  lam, h = layer_eigenvalues(kind)
  assert h.shape == (2, 7, 8) and h.dtype == jnp.complex64 and lam.shape == (2, 7, 8)
  if kind == "mamba":
    assert np.all(lam.imag == 0) and np.all((lam.real > 0) & (lam.real <= 1))
  elif kind == "neg_mamba":
    assert np.all(lam.imag == 0) and np.all((lam.real > -1) & (lam.real <= 1))
  elif kind in ("aussm", "simple_aussm"):
    np.testing.assert_allclose(np.abs(lam), 1.0, atol=1e-6)
    assert np.std(np.angle(lam), axis=1).max() > 0  # input-dependent
  else:  # s4d: time-invariant, inside the unit disc
    np.testing.assert_array_equal(lam, np.broadcast_to(lam[:1, :1], lam.shape))
    assert np.all(np.abs(lam) < 1)


def test_dcd_layer_is_the_recurrence_it_claims():
  layer = ssm.DCDLayer(d_state=3, kind="aussm")
  u = jax.random.normal(jax.random.key(2), (1, 5, 4))
  params = layer.init(jax.random.key(0), u)
  lam = layer.apply(params, u, method=layer.eigenvalues)[0]
  b_re, b_im = np.split(np.asarray(u[0] @ params["params"]["b_proj"]["kernel"]), 2, -1)
  b = (
    b_re
    + 1j * b_im
    + np.asarray(params["params"]["b_proj"]["bias"][:3])
    + 1j * np.asarray(params["params"]["b_proj"]["bias"][3:])
  )
  h = np.asarray(params["params"]["h0"][0]) + 1j * np.asarray(params["params"]["h0"][1])
  out = np.asarray(layer.apply(params, u))[0]
  for t in range(5):
    h = lam[t] * h + b[t]
    np.testing.assert_allclose(out[t], h, atol=1e-5)


@pytest.mark.parametrize("kind", ssm.RECURRENCES)
@pytest.mark.parametrize("layers", [1, 2])
def test_state_tracker_shapes_and_scan_implementations_agree(kind, layers):
  model = ssm.StateTracker(6, 6, d_model=16, d_state=4, d_hidden=16, num_layers=layers, kind=kind)
  tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, 6)
  params = model.init(jax.random.key(0), tokens)
  logits = model.apply(params, tokens)
  assert logits.shape == (2, 9, 6) and logits.dtype == jnp.float32
  if kind != "gru":
    other = model.clone(scan_implementation="pallas").apply(params, tokens)
    np.testing.assert_allclose(np.asarray(other), np.asarray(logits), atol=1e-4)


def test_gru_block_is_the_textbook_gru_then_the_decoder():
  """Gating, state carry (from h_0 = 0) and readout of the GRU baseline, recomputed in numpy."""
  block = ssm.Block(d_model=6, d_state=2, d_hidden=5, kind="gru")
  u = np.asarray(jax.random.normal(jax.random.key(4), (1, 7, 6)))
  params = block.init(jax.random.key(0), jnp.asarray(u))
  p = jax.tree.map(np.asarray, params["params"])
  cell = p["GRUCell_0"]
  dense = lambda name, x: x @ cell[name]["kernel"] + cell[name].get("bias", 0.0)
  sigmoid = lambda x: 1 / (1 + np.exp(-x))
  h, features = np.zeros(4), []
  for x in u[0]:
    r = sigmoid(dense("ir", x) + dense("hr", h))
    z = sigmoid(dense("iz", x) + dense("hz", h))
    n = np.tanh(dense("in", x) + r * dense("hn", h))
    h = (1 - z) * n + z * h
    features.append(h)
  hidden = np.maximum(
    np.concatenate([features, u[0]], -1) @ p["hidden"]["kernel"] + p["hidden"]["bias"], 0
  )
  expected = hidden @ p["out"]["kernel"] + p["out"]["bias"]
  np.testing.assert_allclose(
    np.asarray(block.apply(params, jnp.asarray(u)))[0], expected, atol=1e-5
  )


def test_input_term_and_block_norm_change_only_what_they_name():
  tokens = jax.random.randint(jax.random.key(5), (2, 9), 0, 6)
  plain = ssm.StateTracker(6, 6, d_model=16, d_state=4, d_hidden=16, num_layers=2)
  params = plain.init(jax.random.key(0), tokens)["params"]
  normed = plain.clone(block_norm=True).init(jax.random.key(0), tokens)["params"]
  assert set(normed) - set(params) == {"norm_0", "norm_1", "final_norm"}
  no_b = plain.clone(input_term="none")
  layer = no_b.init(jax.random.key(0), tokens)["params"]["layer_0"]["recurrence"]
  assert "b_proj" not in layer and "b_proj" in params["layer_0"]["recurrence"]
  # with b = 0 and |lambda| = 1 the state keeps the modulus of h0 at every step
  dcd = ssm.DCDLayer(d_state=3, input_term="none")
  u = jax.random.normal(jax.random.key(6), (1, 50, 4))
  dcd_params = dcd.init(jax.random.key(0), u)
  np.testing.assert_allclose(np.abs(np.asarray(dcd.apply(dcd_params, u))), 1.0, atol=1e-5)


def test_bad_model_inputs_are_named():
  with pytest.raises(ValueError, match="kind must be one of"):
    ssm.StateTracker(6, 6, kind="lstm").init(jax.random.key(0), jnp.zeros((1, 3), jnp.int32))
  with pytest.raises(ValueError, match=r"tokens of shape \[batch, time\]"):
    ssm.StateTracker(6, 6).init(jax.random.key(0), jnp.zeros((3,), jnp.int32))


# ---------------------------------------------------------------------------------------------------
# The method through the shared loop
# ---------------------------------------------------------------------------------------------------


def tiny_config(**changes):
  config = dcd_config.get_config()
  config.model.update(d_model=16, d_state=4, d_hidden=16, scan_implementation="sequential")
  config.data.train_length = 8
  config.batch_size = 8
  config.steps = 4
  config.eval.update(lengths=(8, 16), window=4, num_sequences=8, batch_size=8, write_figure=True)
  config.loop.update(log_every=2, checkpoint_every=2)
  for path, value in changes.items():
    section, field = path.split(".")
    config[section][field] = value
  return config


def test_training_run_writes_the_length_generalisation_results(tmp_path):
  summary = loop.run(tiny_config(), str(tmp_path))
  assert summary.step_traces == {"train": 1}
  with open(tmp_path / "results.json") as f:
    results = json.load(f)
  assert 0 <= results["accuracy_at_train_length"] <= 1
  assert results["longest_length_over_90"] in (0, 8, 16)
  assert os.path.exists(tmp_path / "accuracy_by_position.png")
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]


def test_construction_run_tracks_s3_without_training(tmp_path):
  config = tiny_config(**{"data.group": "S3", "model.num_layers": 2, "model.init": "construction"})
  config.evaluate_only = True
  results = loop.run(config, str(tmp_path)).results
  assert results["accuracy_all_positions"] == 1.0 and results["longest_length_over_90"] == 16
  assert results["state_growth"] == pytest.approx(1.0, abs=1e-4)  # b = 0: states stay on circles


def test_length_metrics_find_the_longest_generalising_length():
  config = tiny_config()
  config.eval.update(lengths=(8, 16, 32, 64), window=4)
  curve = np.where(np.arange(64) < 20, 1.0, 1 / 6)
  metrics = dcd_ssm.length_metrics(config, curve)
  assert metrics["longest_length_over_90"] == 16 and metrics["accuracy_at_train_length"] == 1.0
  assert metrics["accuracy_at_32"] == pytest.approx(1 / 6)


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"data.group": "G7"}, "config.data.group: unknown group"),
    ({"model.kind": "lstm"}, "config.model.kind: must be one of"),
    ({"data.train_length": 10}, "config.eval.lengths: must include data.train_length"),
    ({"model.init": "construction", "data.group": "A5"}, "config.model.init: .*A5 is not solvable"),
    (
      {"model.init": "construction", "model.block_norm": True},
      "config.model.block_norm: the const",
    ),
    ({"model.input_term": "linear"}, "config.model.input_term: must be one of"),
    (
      {"model.init": "construction", "data.group": "A4", "model.num_layers": 2},
      "config.model.d_model",
    ),
  ],
)
def test_bad_fields_are_named(tmp_path, changes, message):
  with pytest.raises(ConfigError, match=message):
    loop.run(tiny_config(**changes), str(tmp_path))


def test_study_arms_cover_the_study_grid_and_the_report_reads_them():
  config = dcd_config.get_config("study")
  arms = dict(dcd_ssm.study_arms(config))
  study = config.study
  for group in ("Z6", "Z2xZ4", "S3", "A4", "A5"):
    for kind in ("aussm", "neg_mamba", "mamba"):
      for layers in (1, 2):
        assert f"e2_{group}_{kind}_{layers}L_seed0" in arms
  e1 = arms["e1_S4_aussm_3L"]
  assert e1.evaluate_only and e1.model.d_model >= 48 and max(e1.eval.lengths) == 10_000
  e3 = [a for name, a in arms.items() if name.startswith("e3_")]
  assert len(e3) == len(study.e3_sigmas) * study.e3_seeds
  assert {a.model.init_noise for a in e3} == set(study.e3_sigmas)
  fake = {
    name: {
      "accuracy_at_train_length": 1.0,
      "accuracy_at_250": 0.5,
      "accuracy_at_240": float("sigma0_" in name),
      "longest_length_over_90": 120.0,
      "accuracy_all_positions": 1.0,
    }
    for name in arms
  }
  report = dcd_ssm.report(config, fake)
  assert report.summary["e3_success_rate_by_sigma"]["0"] == 1.0
  assert report.summary["e3_success_rate_by_sigma"]["1"] == 0.0
  assert "| Z6 | 120 |" in report.notes and "dcd_ssm_study" in report.figures
  assert len(report.rows) == len(study.e1_constructions) + 5 * len(study.e2_models) + 5


def test_sweep_variants_run_only_their_arms_and_report_them():
  assert all(dcd_ssm.study_arms(dcd_config.get_config(v)) for v in dcd_config.SWEEPS)
  variant = "aussm_sweep"  # its arms include a model change (RMSNorm blocks)
  config = dcd_config.get_config(variant)
  arms = dcd_ssm.study_arms(config)
  assert len(arms) == len(config.study.sweep) and all(n.startswith("sweep_") for n, _ in arms)
  for entry, (_, arm) in zip(config.study.sweep, arms, strict=True):
    group, kind, layers, lr, steps, length, *optional = entry
    seed, change = tuple(optional) + (0, "")[len(optional) :]
    assert arm.seed == seed
    assert arm.model.input_term == ("none" if change == "b0" else "affine")
    assert arm.model.block_norm == (change == "norm")
    assert (arm.data.group, arm.model.kind, arm.model.num_layers) == (group, kind, layers)
    assert (arm.optim.learning_rate, arm.steps, arm.data.train_length) == (lr, steps, length)
    assert length in arm.eval.lengths
    dcd_ssm.validate(arm)
  fake = {
    name: {f"accuracy_at_{L}": float(L <= 100) for L in arm.eval.lengths}
    | {"accuracy_at_train_length": 1.0, "longest_length_over_90": 100.0}
    for name, arm in arms[:-1]  # one arm unfinished: the report leaves it out
  }
  report = dcd_ssm.report(config, fake)
  assert len(report.rows) == len(arms) - 1 and f"dcd_ssm_{variant}" in report.figures
  assert set(report.summary["longest_length_over_90"]) == set(fake)
  assert "longest_length_over_90" in report.notes.splitlines()[0]
