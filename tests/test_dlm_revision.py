"""DLM revision: exact programs against enumeration, sampler invariants, the MDLM loss, the parity code,
a smoke run through the loop, validation and the study report."""

import importlib
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import dlm_revision as dlm_config
from core import dlm_programs as programs
from core import masked_diffusion as md
from core.data import parity
from experiments import loop
from methods.base import ConfigError

learned = importlib.import_module("methods.dlm_revision.learned")
study = importlib.import_module("methods.dlm_revision.study")


def _tv_to_even_parity(law: dict, n: int) -> float:
  even = {tuple(int(b) for b in x) for x in parity.even_parity_strings(n)}
  support = set(law) | even
  return 0.5 * sum(abs(law.get(x, 0.0) - (1 / len(even) if x in even else 0.0)) for x in support)


# ---------------------------------------------------------------------------------------------------
# E1: the exact programs
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "build", [programs.revision_parity, programs.remasking_parity, programs.monotone_chain_parity]
)
@pytest.mark.parametrize(
  "n", [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(6, marks=pytest.mark.slow)]
)
def test_exact_programs_are_uniform_over_even_strings_by_enumeration(build, n):
  law = programs.exact_output_distribution(build(n))
  assert sum(law.values()) == pytest.approx(1.0, abs=1e-6)
  assert _tv_to_even_parity(law, n) < 1e-6


def test_program_rounds_are_constant_for_revision_and_remasking_and_linear_for_the_chain():
  for n in (4, 8, 32, 128):
    assert programs.revision_parity(n).num_rounds == 2
    assert programs.remasking_parity(n).num_rounds == 6
    assert programs.monotone_chain_parity(n).num_rounds == n // 2 + 1


@pytest.mark.parametrize(
  "build, kind",
  [
    (programs.revision_parity, "revision"),
    (programs.remasking_parity, "remasking"),
    (programs.monotone_chain_parity, "monotone"),
  ],
)
def test_programs_only_use_the_moves_of_their_class(build, kind):
  program = build(8)
  out = programs.run(program, jax.random.key(0), 512)
  assert program.kind == kind
  assert int(out.remasks.sum()) == 0 or kind == "remasking"
  assert int(out.revisions.sum()) == 0 or kind == "revision"
  assert int(out.remasks.sum() + out.revisions.sum()) > 0 or kind == "monotone"
  assert float(parity.parity_violation(out.outputs).max()) == 0.0


def test_naive_local_monotone_sampler_violates_parity_half_the_time_exactly():
  for rounds in (2, 6):
    law = programs.exact_output_distribution(programs.local_monotone_parity(6, 3, rounds))
    odd = sum(p for x, p in law.items() if sum(x) % 2)
    assert odd == pytest.approx(0.5, abs=1e-6)
  law = programs.exact_output_distribution(programs.local_monotone_parity(6, 13, 6))
  assert 0.0 < sum(p for x, p in law.items() if sum(x) % 2) < 0.5  # global predictor: ties only


def test_window_denoiser_in_the_mdlm_sampler_matches_the_program():
  spec = md.sampler_spec()
  out = md.sample(
    lambda x: programs.window_parity_logits(x, 1), spec, jax.random.key(1), 4000, 6, 2, 4
  )
  assert float(parity.parity_violation(out.tokens).mean()) == pytest.approx(0.5, abs=0.04)
  assert int(out.changed.sum()) == 0


@pytest.mark.parametrize(
  "n", [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow), 16]
)
def test_xor_trees_are_exact_with_size_vs_width_footprints(n):
  depth = int(math.log2(n))
  for kind, build in programs.XOR_TREES.items():
    program = build(n)
    out = programs.run(program, jax.random.key(n), 256)
    inputs, root = np.asarray(out.outputs[:, :-1]), np.asarray(out.outputs[:, -1])
    np.testing.assert_array_equal(root, inputs.sum(1) % 2)
    footprint = int(out.footprint.max())
    if kind == "monotone":
      assert footprint == 2 * n - 1 and program.num_rounds == depth + 1
    else:
      assert footprint <= 1.5 * n + 1 and program.num_rounds <= 2 * (depth + 1)
    assert int(out.remasks.sum()) == 0 or kind == "remasking"
    assert int(out.revisions.sum()) == 0 or kind == "revision"
  assert programs.xor_tree_remasking(8).num_rounds == 2 * 3


@pytest.mark.parametrize("n", [pytest.param(3, marks=pytest.mark.slow), 6])
def test_xor_chain_footprint_is_its_size_monotone_and_its_width_with_revision(n):
  """The deep narrow circuit: monotone CoT holds all 2n gates, revision four positions; both
  output the running parity of the n coins they drew, and the output law is exactly uniform over
  the four consistent triples."""
  monotone, revision = programs.xor_chain_monotone(n), programs.xor_chain_revision(n)
  out = programs.run(monotone, jax.random.key(n), 512)
  coins = np.asarray(out.states[:, :n])
  np.testing.assert_array_equal(np.asarray(out.outputs[:, 2]), coins.sum(1) % 2)
  assert int(out.footprint.max()) == 2 * n and monotone.num_rounds == n + 1
  assert int(out.remasks.sum()) == 0 and int(out.revisions.sum()) == 0
  out = programs.run(revision, jax.random.key(n + 1), 512, keep_trace=True)
  drawn = np.asarray(out.trace[1 : n + 1, :, programs.CHAIN_NEXT]).T  # coin t drawn in round t
  np.testing.assert_array_equal(np.asarray(out.outputs[:, 2]), drawn.sum(1) % 2)
  assert int(out.footprint.max()) == 4 and revision.num_rounds == n + 1
  assert int(out.remasks.sum()) == 0 and int(out.revisions.sum()) > 0
  valid = {(a, b, (a + b) % 2) for a in (0, 1) for b in (0, 1)}
  for program in (monotone, revision):
    law = programs.exact_output_distribution(program)
    assert set(law) == valid
    np.testing.assert_allclose(list(law.values()), 0.25, atol=1e-6)


def test_learned_program_copies_inactive_positions():
  program = programs.xor_tree_monotone(4)
  uniform = lambda states, r: jnp.full((*states.shape, 3), 1 / 3)
  out = programs.run(programs.learned_program(program, uniform), jax.random.key(0), 64, True)
  trace = np.asarray(out.trace)
  table = programs.active_table(program)
  for r in range(program.num_rounds):
    frozen = ~table[r]
    np.testing.assert_array_equal(trace[r + 1][:, frozen], trace[r][:, frozen])


# ---------------------------------------------------------------------------------------------------
# Samplers
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def code():
  return parity.parity_code(16, 4, 0)


def _oracle(code):
  return lambda x: jnp.log(jnp.clip(parity.bayes_denoiser_probs(x, code.groups), 1e-6, 1.0))


@pytest.fixture(scope="module")
def run_sampler(code):
  fn = jax.jit(
    lambda spec, rng, rounds, extra, blocks: md.sample(
      _oracle(code), spec, rng, 512, code.length, 2, rounds, extra, blocks
    )
  )
  return lambda name, rounds, extra=6, blocks=None, seed=0: fn(
    jax.tree.map(jnp.asarray, md.sampler_spec(*learned.SAMPLER_SPECS[name])),
    jax.random.key(seed),
    rounds,
    extra,
    jnp.zeros(code.length, jnp.int32) if blocks is None else jnp.asarray(blocks),
  )


@pytest.mark.parametrize("name", ["ancestral", "topk"])
@pytest.mark.parametrize("rounds", [1, 3, 16])
def test_monotone_samplers_never_change_a_revealed_token(run_sampler, name, rounds):
  out = run_sampler(name, rounds)
  assert int(out.changed.sum()) == 0
  assert int(jnp.sum(out.tokens == 2)) == 0  # nothing left masked
  assert int(out.nfe.max()) <= rounds and int(out.footprint.min()) == 16
  if name == "topk":
    assert int(out.nfe.min()) == min(rounds, 16)  # every round reveals, so every round is a pass


def test_nfe_counts_passes_and_skips_rounds_that_change_nothing(run_sampler):
  assert int(run_sampler("ancestral", 1).nfe.max()) == 1
  late = run_sampler("ancestral", 256)  # 16 tokens over 256 rounds: most rounds reveal nothing
  assert int(late.rounds) == 256 and int(late.nfe.max()) <= 16


def test_revision_capped_per_check_fixes_every_violation_in_one_round(run_sampler, code):
  out = run_sampler("revision_blocks", 1, blocks=code.group_ids())
  assert float(parity.validity(out.tokens, code.groups).mean()) == 1.0
  np.testing.assert_array_equal(np.asarray(out.nfe), 2 + (np.asarray(out.changed) > 0))
  vanilla = run_sampler("ancestral", 1)
  assert float(parity.validity(vanilla.tokens, code.groups).mean()) < 0.3


@pytest.mark.parametrize("name", ["revision", "remask_confidence"])
def test_corrective_samplers_reach_validity_with_the_exact_denoiser(run_sampler, code, name):
  out = run_sampler(name, 2, extra=10)
  assert float(parity.validity(out.tokens, code.groups).mean()) > 0.97
  assert float(parity.pattern_tv(out.tokens, code.groups)) < 0.1  # flips keep each check uniform


def test_ancestral_reveal_probabilities_follow_the_linear_schedule():
  num_rounds = 7
  q = np.asarray([md.ancestral_reveal_probability(r, num_rounds) for r in range(num_rounds)])
  still_masked = np.cumprod(1 - q)
  np.testing.assert_allclose(still_masked, 1 - np.arange(1, num_rounds + 1) / num_rounds, atol=1e-6)


def test_remdm_schedule_keeps_the_masked_fraction_of_the_schedule():
  num_rounds, loop_rounds, eta = 6, 3, 0.1
  masked = 1.0
  for r in range(num_rounds + loop_rounds):
    q, sigma = (float(v) for v in md.remdm_schedule(r, num_rounds, loop_rounds, eta))
    assert 0.0 <= q <= 1.0 and 0.0 <= sigma <= eta + 1e-6
    masked = masked * (1 - q) + (1 - masked) * sigma
    step = min(r + 1, num_rounds - 1) if r < num_rounds - 1 + loop_rounds else num_rounds
    assert masked == pytest.approx(1 - step / num_rounds, abs=1e-6)


# ---------------------------------------------------------------------------------------------------
# MDLM loss and the parity code
# ---------------------------------------------------------------------------------------------------


def test_uniform_denoiser_nelbo_is_log_two_per_token():
  rng = jax.random.key(0)
  x0 = jax.random.randint(rng, (4096, 16), 0, 2)
  t = md.stratified_times(jax.random.key(1), 4096)
  noisy = md.corrupt(jax.random.key(2), x0, t, 2, correction_rate=0.0)
  assert float(jnp.mean(noisy.masked)) == pytest.approx(float(jnp.mean(t)), abs=0.01)
  _, nelbo = md.masked_diffusion_loss(jnp.zeros((4096, 16, 2)), x0, noisy.masked, t)
  assert float(nelbo.mean()) == pytest.approx(math.log(2), rel=0.03)
  chex.assert_shape(nelbo, (4096,))


def test_self_correction_corrupts_a_fraction_pi_t_of_unmasked_tokens():
  x0 = jnp.zeros((2048, 32), jnp.int32)
  t = jnp.full((2048,), 0.5)
  noisy = md.corrupt(jax.random.key(3), x0, t, 2, correction_rate=0.2)
  unmasked = ~noisy.masked
  rate = float(jnp.sum(noisy.replaced) / jnp.sum(unmasked))
  assert rate == pytest.approx(0.1, abs=0.01)
  assert float(jnp.mean(noisy.tokens[noisy.replaced] == 1)) == pytest.approx(0.5, abs=0.05)
  assert not bool(jnp.any(noisy.replaced & noisy.masked))


def test_parity_code_groups_partition_positions_and_samples_are_codewords(code):
  assert sorted(code.groups.reshape(-1).tolist()) == list(range(16))
  x = code.sample(np.random.default_rng(0), 500)
  assert x.dtype == np.int32 and x.shape == (500, 16)
  assert float(parity.validity(x, code.groups).mean()) == 1.0
  assert float(parity.pattern_tv(x, code.groups)) < 0.1
  flipped = x.copy()
  flipped[:, code.groups[0, 0]] ^= 1
  np.testing.assert_array_equal(np.asarray(parity.check_satisfied(flipped, code.groups))[:, 0], 0)


def test_bayes_denoiser_determines_a_lone_masked_bit_and_flags_odd_checks(code):
  x = code.sample(np.random.default_rng(1), 4)
  masked = x.copy()
  masked[:, code.groups[0, 0]] = 2
  probs = np.asarray(parity.bayes_denoiser_probs(masked, code.groups))
  np.testing.assert_allclose(probs[np.arange(4), code.groups[0, 0], x[:, code.groups[0, 0]]], 1.0)
  masked[:, code.groups[0, 1]] = 2
  np.testing.assert_allclose(probs[:, code.groups[1, 0]].max(-1), 1.0)
  probs = np.asarray(parity.bayes_denoiser_probs(masked, code.groups))
  np.testing.assert_allclose(probs[:, code.groups[0, 0]], 0.5)
  bad = x.copy()
  bad[:, code.groups[2, 0]] ^= 1
  probs = np.asarray(parity.bayes_denoiser_probs(bad, code.groups))
  current = np.take_along_axis(probs, bad[..., None], -1)[..., 0]
  np.testing.assert_allclose(current[:, code.groups[2]], 0.75)
  np.testing.assert_allclose(current[:, code.groups[3]], 1.0)


def test_even_parity_tv_and_enumeration():
  strings = parity.even_parity_strings(5)
  assert strings.shape == (16, 5) and np.all(strings.sum(1) % 2 == 0)
  assert float(parity.even_parity_tv(strings)) == pytest.approx(0.0, abs=1e-6)
  odd = strings.copy()
  odd[:, 0] ^= 1
  assert float(parity.even_parity_tv(odd)) == pytest.approx(1.0)


def test_nfe_at_validity_interpolates_in_log_nfe():
  nfe = np.array([2.0, 4.0, 8.0])
  assert learned.nfe_at_validity(nfe, np.array([0.5, 0.9, 1.0]), 0.95) == pytest.approx(
    math.sqrt(32)
  )
  assert learned.nfe_at_validity(nfe, np.array([0.96, 0.97, 1.0]), 0.95) == 2.0
  assert math.isnan(learned.nfe_at_validity(nfe, np.array([0.1, 0.2, 0.3]), 0.95))


# ---------------------------------------------------------------------------------------------------
# Through the loop, validation, study
# ---------------------------------------------------------------------------------------------------


def tiny_config(**changes):
  config = dlm_config.get_config()
  config.separation.update(lengths=(4,), num_samples=256, naive_rounds=(2,))
  config.space.update(lengths=(4,), learn_lengths=(4,), train_steps=2, num_samples=64)
  config.space.update(batch_size=8, width=16, depth=1, num_heads=2)
  config.model.update(width=16, depth=1, num_heads=2)
  config.data.length = 8
  config.steps, config.batch_size, config.num_seeds = 3, 8, 2
  config.sampling.update(rounds=(1, 2), reference_rounds=2, num_samples=16, extra_rounds=3)
  config.loop.update(log_every=1, checkpoint_every=2)
  for key, value in changes.items():
    config[key] = value
  return config


def test_learned_experiment_runs_through_the_loop(tmp_path):
  summary = loop.run(tiny_config(experiments=("learned",)), str(tmp_path))
  results = summary.results
  assert summary.step_traces == {"train": 1, "sampling": 0}
  for key in ("validity_vanilla", "validity_revision", "nfe_ratio_at_equal_validity"):
    assert key in results
  assert 0.0 <= results["validity_revision"] <= 1.0
  assert np.asarray(results["curve_revision_validity/seeds"]).shape == (2, 2)
  assert results["oracle_curve_ancestral_changed"] == [0.0, 0.0]
  assert (tmp_path / "validity_vs_nfe.png").exists()


@pytest.mark.slow
def test_program_experiments_run_through_the_loop(tmp_path):
  config = tiny_config(experiments=("separation", "space"))
  config.space.train_steps = 0
  summary = loop.run(config, str(tmp_path))
  results = summary.results
  assert summary.step_traces == {"separation": 0, "space": 0}
  assert results["sep_max_violation_exact"] == 0.0
  assert results["sep_min_violation_naive"] > 0.3
  assert results["sep_revision_rounds"] == [2.0] and results["sep_monotone_chain_rounds"] == [3.0]
  assert results["space_monotone_footprint"] == [7.0]
  assert results["space_remasking_footprint"] == [6.0]
  assert results["space_min_validity_exact"] == 1.0
  assert results["space_chain_monotone_footprint"] == [8.0]
  assert results["space_chain_revision_footprint"] == [4.0]
  assert results["space_min_validity_chain"] == 1.0
  assert "space_min_validity_learned" not in results


@pytest.mark.slow
def test_space_phase_learns_transition_models_through_the_loop(tmp_path):
  summary = loop.run(tiny_config(experiments=("space",)), str(tmp_path))
  assert summary.step_traces == {"space": 1}
  assert 0.0 <= summary.results["space_min_validity_learned"] <= 1.0
  assert summary.results["space_learned_monotone_footprint"] == [7.0]


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("experiments", ("learned", "oops"), "config.experiments: must be a non-empty subset"),
    ("separation.lengths", (8, 9), "config.separation.lengths: must be even"),
    ("space.lengths", (8, 12), "config.space.lengths: XOR trees need powers of 2"),
    ("sampling.samplers", ("ancestral", "gibbs"), "config.sampling.samplers: unknown"),
    ("sampling.reference_rounds", 3, "config.sampling.reference_rounds"),
    ("data.group_size", 5, "config.data.group_size"),
  ],
)
def test_bad_fields_are_named(tmp_path, field, value, message):
  config = dlm_config.get_config()
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(ConfigError, match=message):
    loop.run(config, str(tmp_path))


def _fake_arm(config, validity_scale: float) -> dict:
  rounds = list(config.sampling.rounds)
  arm = {"curve_rounds": rounds}
  for prefix in ("", "oracle_"):
    for name in config.sampling.samplers:
      base = np.linspace(0.1, 1.0, len(rounds)) * validity_scale
      arm[f"{prefix}curve_{name}_validity"] = base.tolist()
      arm[f"{prefix}curve_{name}_validity/seeds"] = [base.tolist(), base.tolist()]
      for metric in ("nfe", "fidelity_tv", "unique", "changed", "footprint", "rounds"):
        arm[f"{prefix}curve_{name}_{metric}"] = [float(r) for r in rounds]
      arm[f"{prefix}nfe_at_target_{name}"] = 8.0
    arm[f"{prefix}validity_vanilla"] = 0.3
    arm[f"{prefix}validity_revision"] = 0.99
    arm[f"{prefix}nfe_revision"] = 9.0
    arm[f"{prefix}nfe_ratio_at_equal_validity"] = 4.0
  return arm


def test_study_arms_and_report():
  config = dlm_config.get_config("study")
  arms = dict(study.study_arms(config))
  assert list(arms) == ["programs", "mdlm", "self_correction", "self_correction_4bit"]
  assert tuple(arms["programs"].experiments) == ("separation", "space")
  assert arms["mdlm"].model.correction_rate == 0.0
  wide = arms["self_correction_4bit"]
  assert (wide.data.group_size, wide.data.curriculum_steps, wide.steps) == (4, 1500, 3000)
  assert wide.model.correction_rate == 0.1 and wide.sampling.oracle
  assert arms["self_correction"].data.group_size == 2 and arms["self_correction"].sampling.oracle
  assert not arms["mdlm"].sampling.oracle
  programs_arm = {
    "sep_lengths": [8, 10],
    "sep_tv_noise_floor": [0.01, 0.02],
    "space_lengths": [8, 16],
    "sep_max_violation_exact": 0.0,
  }
  for name in ("revision", "remasking", "monotone_chain", "naive_T2"):
    programs_arm |= {f"sep_{name}_violation": [0.0, 0.0], f"sep_{name}_tv": [0.01, float("nan")]}
    programs_arm[f"sep_{name}_rounds"] = [2.0, 2.0]
  for kind in study.TREES:
    programs_arm |= {f"space_{kind}_{m}": [1.0, 2.0] for m in ("footprint", "rounds", "validity")}
  results = {
    "programs": programs_arm,
    "mdlm": _fake_arm(config, 0.9),
    "self_correction": _fake_arm(config, 1.0),
  }
  report = study.report(config, results)
  assert report.summary["headline_arm"] == "self_correction"
  assert report.summary["nfe_ratio_at_equal_validity"] == 4.0
  assert len(report.rows) == 2 * 2 * len(config.sampling.samplers)
  wide = _fake_arm(config, 1.0) | {"nfe_ratio_at_equal_validity": 6.0}
  report = study.report(config, results | {"self_correction_4bit": wide})
  assert report.summary["headline_arm"] == "self_correction_4bit"
  assert report.summary["nfe_ratio_at_equal_validity"] == 6.0
  assert report.summary["self_correction/nfe_ratio_at_equal_validity"] == 4.0
  assert len(report.rows) == 3 * 2 * len(config.sampling.samplers)
  assert "E1" in report.notes and "E2" in report.notes
  assert "dlm_revision_study" in report.figures


def test_tied_curriculum_draws_codewords_whose_checks_copy_one_bit():
  """The curriculum's tied codewords are codewords (every 4-bit check even) whose check members
  agree up to the parity bit, and their share decays linearly to 0 at `curriculum_steps`."""
  learned = importlib.import_module("methods.dlm_revision.learned")
  code = parity.parity_code(12, 4, 3)
  words = learned.tied_codewords(code, np.random.default_rng(0), 200)
  assert np.all(np.asarray(parity.validity(jnp.asarray(words), jnp.asarray(code.groups))))
  blocks = words[:, code.groups]  # [N, G, 4]
  assert np.all(blocks[..., :3] == blocks[..., :1]) and np.all(
    blocks[..., 3] == blocks[..., 0] * 3 % 2
  )
  config = dlm_config.get_config()
  config.data.update(group_size=4, tied_fraction=0.8, curriculum_steps=100)
  assert [learned.tied_share(config, s) for s in (0, 50, 100, 400)] == pytest.approx(
    [0.8, 0.4, 0, 0]
  )
  config.data.curriculum_steps = 0
  assert learned.tied_share(config, 0) == 0.0
  # late in the curriculum a batch may draw no tied codeword at all
  assert learned.tied_codewords(code, np.random.default_rng(1), 0).shape == (0, 12)
  config.data.update(length=12, code_seed=3, tied_fraction=1.0, curriculum_steps=1000)
  config.batch_size, config.num_seeds = 4, 1
  tokens = learned.train_data(config).generate(999)["tokens"]  # share 0.001: no tied row here
  assert tokens.shape == (4, 1, 12)
