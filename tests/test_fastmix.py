"""FastMix: the hypergradient against autodiff, the reparametrisation, the known optimum, the
baselines' maths, and runs of the method through the shared loop."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize

from configs import fastmix as fastmix_config
from core import mixture
from core.data import mixture_sources, text
from core.nn import attention
from core.nn.transformer import Transformer
from experiments import loop
from methods import fastmix
from methods.base import ConfigError
from methods.fastmix import study, tasks

W_STAR = np.array([0.5, 0.3, 0.2, 0.0, 0.0, 0.0])


# ---------------------------------------------------------------------------------------------------
# The hypergradient (Eq. 5) against autodiff
# ---------------------------------------------------------------------------------------------------


def bigram_problem(num_sources=3, rows=4, length=6, vocab=7):
  """A depth-0 shared transformer, per-source token batches and a target batch."""
  model = Transformer(vocab_size=vocab, width=8, depth=0, num_heads=2, tie_embeddings=False)
  keys = jax.random.split(jax.random.key(0), 3)
  sources = jax.random.randint(keys[0], (num_sources, rows, length + 1), 0, vocab)
  target = jax.random.randint(keys[1], (rows, length + 1), 0, vocab)
  params = model.init(keys[2], target[:, :-1], mask=attention.causal_mask())

  def losses(p, tokens):
    return tasks.next_token_losses(model, p, {"tokens": tokens}).mean()

  def source_losses(p):
    return jax.vmap(lambda t: losses(p, t))(sources)

  return params, source_losses, lambda p: losses(p, target), sources


@pytest.mark.slow
def test_one_step_hypergradient_equals_autodiff_through_the_unrolled_step():
  params, source_losses, target_loss, _ = bigram_problem()
  logits, lr = jnp.array([0.3, -0.2, 0.1]), 0.5

  @jax.jit
  def both(params, logits):
    reference = mixture.unrolled_hypergradient(source_losses, target_loss, params, logits, lr, 1)
    alpha = mixture.mixture_weights(logits)
    source_grads = jax.jacrev(source_losses)(params)  # leading K axis
    grads = jax.tree.map(lambda g: jnp.tensordot(alpha, g, 1), source_grads)
    stepped = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    dl_dalpha = mixture.hypergradient(jax.grad(target_loss)(stepped), source_grads, lr)
    closed_form = mixture.outer_gradient(logits, dl_dalpha, entropy_weight=0.0)
    return reference, closed_form, mixture.softmax_chain(logits, dl_dalpha)

  reference, closed_form, explicit = both(params, logits)
  chex.assert_trees_all_close(closed_form, reference, atol=1e-6, rtol=1e-4)
  chex.assert_trees_all_close(explicit, closed_form, atol=1e-7)


@pytest.mark.slow
def test_head_only_form_is_exact_when_only_the_head_trains():
  params, source_losses, target_loss, _ = bigram_problem()
  head = tasks.head_of(params)
  logits, lr = jnp.array([0.0, 0.5, -0.5]), 0.3

  def head_sources(h):
    return source_losses(tasks.with_head(params, h))

  def head_target(h):
    return target_loss(tasks.with_head(params, h))

  reference = mixture.unrolled_hypergradient(head_sources, head_target, head, logits, lr, 1)
  alpha = mixture.mixture_weights(logits)
  source_grads = jax.jacrev(head_sources)(head)
  stepped = jax.tree.map(lambda p, g: p - lr * jnp.tensordot(alpha, g, 1), head, source_grads)
  dl_dalpha = mixture.hypergradient(jax.grad(head_target)(stepped), source_grads, lr)
  chex.assert_trees_all_close(
    mixture.outer_gradient(logits, dl_dalpha, 0.0), reference, atol=1e-6, rtol=1e-4
  )


def softmax_regression_problem(num_sources=4, rows=5, dim=3, classes=4):
  """A linear softmax classifier, per-source labelled batches and a target batch (plain jnp, so
  the unrolled reference compiles in a moment)."""
  keys = jax.random.split(jax.random.key(11), 5)
  x = jax.random.normal(keys[0], (num_sources, rows, dim))
  y = jax.random.randint(keys[1], (num_sources, rows), 0, classes)
  xt = jax.random.normal(keys[2], (rows, dim))
  yt = jax.random.randint(keys[3], (rows,), 0, classes)
  params = {"w": 0.5 * jax.random.normal(keys[4], (dim, classes))}

  def loss(p, inputs, labels):
    logp = jax.nn.log_softmax(inputs @ p["w"])
    return -jnp.take_along_axis(logp, labels[:, None], 1).mean()

  def source_losses(p):
    return jax.vmap(lambda a, b: loss(p, a, b))(x, y)

  return params, source_losses, lambda p: loss(p, xt, yt)


def _one_step_sum_along_sgd(source_losses, target_loss, params, logits, lr, steps):
  """The sum over an SGD path of the closed-form one-step hypergradients (Eq. 5) at each step."""
  alpha = mixture.mixture_weights(logits)
  total, w = jnp.zeros_like(logits), params
  for _ in range(steps):
    source_grads = jax.jacrev(source_losses)(w)
    w_next = jax.tree.map(lambda p, g: p - lr * jnp.tensordot(alpha, g, 1), w, source_grads)
    dl_dalpha = mixture.hypergradient(jax.grad(target_loss)(w_next), source_grads, lr)
    total, w = total + mixture.outer_gradient(logits, dl_dalpha, 0.0), w_next
  return total


def test_truncated_hypergradient_matches_the_sgd_reference_up_to_second_order_in_the_step():
  """Over n SGD steps the exact hypergradient (autodiff through the unrolled SGD path, the
  reference) equals the sum of the per-step closed forms (Eq. 5, n2 = 1) up to terms of order
  lr^2 n^2 (the Hessian couplings the truncation drops): the relative gap is small and halves
  with the step size."""
  params, source_losses, target_loss = softmax_regression_problem()
  logits = jnp.array([0.4, -0.3, 0.2, 0.0])

  @functools.partial(jax.jit, static_argnums=0)
  def gap(lr):
    exact = mixture.unrolled_hypergradient(source_losses, target_loss, params, logits, lr, 4)
    truncated = _one_step_sum_along_sgd(source_losses, target_loss, params, logits, lr, 4)
    return jnp.linalg.norm(exact - truncated) / jnp.linalg.norm(exact)

  gaps = [float(gap(lr)) for lr in (0.1, 0.05)]
  assert 0.0 < gaps[1] < gaps[0] < 0.3, gaps
  assert gaps[0] / gaps[1] == pytest.approx(2.0, rel=0.3), gaps


def test_entropy_term_pushes_towards_uniform_with_the_papers_sign_and_away_with_the_codes():
  logits = jnp.array([1.0, 0.0, -1.0])
  flat = jnp.zeros(3)
  paper = mixture.outer_gradient(logits, flat, 1.0, entropy_sign=1.0)
  code = mixture.outer_gradient(logits, flat, 1.0, entropy_sign=-1.0)
  descended = mixture.mixture_weights(logits - 0.1 * paper)
  ascended = mixture.mixture_weights(logits - 0.1 * code)
  entropy = -mixture.negative_entropy(mixture.mixture_weights(logits))
  assert -mixture.negative_entropy(descended) > entropy > -mixture.negative_entropy(ascended)


def quadratic_task(centres: np.ndarray, target: np.ndarray) -> tasks.Task:
  """Sources whose examples are the points `centres[i]`, loss 0.5 ||w - x||^2: the inner optimum
  of `sum_i alpha_i L_i` is `sum_i alpha_i c_i`, so with independent centres the target point
  `sum_i w*_i c_i` is reached exactly at alpha = w*."""
  k = len(centres)

  def token_losses(params, inputs):
    return 0.5 * jnp.sum((params["w"] - inputs["x"]) ** 2, -1, keepdims=True)

  return tasks.Task(
    name="quadratic",
    source_names=tuple(f"s{i}" for i in range(k)),
    fields=("x",),
    model=None,
    init_params=lambda rng: {"w": jnp.zeros(centres.shape[1])},
    token_losses=token_losses,
    stratified=None,
    mixture=None,
    validation_batch=None,
    validation_set={"x": jnp.asarray(target)[None]},
    test_set={"x": jnp.asarray(target)[None]},
  )


def test_the_search_recovers_a_known_optimum_on_a_quadratic_task():
  """`search.outer_round` (the method's Alg. 1 step: n1 AdamW steps, the hypergradient, Adam on z)
  on a task whose best mixture is known in closed form, at a w* no other test uses."""
  from methods.fastmix import search

  w_star = np.array([0.15, 0.6, 0.25])
  centres = np.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.5], [0.5, 0.0, 2.0]])
  task = quadratic_task(centres, w_star @ centres)
  config = fastmix_config.get_config()
  config.steps, config.fastmix.inner_steps = 4000, 5
  config.optim.update(learning_rate=0.05, schedule="constant", warmup_steps=1)
  config.fastmix.update(outer_lr=0.05, entropy_weight=0.0)
  rows = 2
  source = jnp.repeat(jnp.arange(3), rows)
  train = {"x": jnp.broadcast_to(jnp.repeat(jnp.asarray(centres), rows, 0), (5, 3 * rows, 3))}
  val = {"x": jnp.broadcast_to(jnp.asarray(w_star @ centres), (4, 3))}
  state = search.init_one(config, task, jax.random.key(3))
  step = jax.jit(lambda s: search.outer_round(config, task, s, train, val, source=source)[0])
  start = mixture.l1_distance(mixture.mixture_weights(state["logits"]), w_star)
  for _ in range(400):
    state = step(state)
  found = mixture.mixture_weights(state["logits"])
  assert float(start) > 0.5
  np.testing.assert_allclose(found, w_star, atol=0.03)


# ---------------------------------------------------------------------------------------------------
# The reparametrisation: mixture ratios as loss weights (Sec. 3.1)
# ---------------------------------------------------------------------------------------------------


def test_normalised_weighted_mean_is_the_alpha_weighted_sum_with_equal_counts():
  losses = jnp.asarray(np.random.default_rng(0).random(12), jnp.float32)
  source = jnp.repeat(jnp.arange(3), 4)
  alpha = jnp.array([0.6, 0.1, 0.3])
  per_source = mixture.per_source_mean(losses, source, 3)
  np.testing.assert_allclose(
    mixture.weighted_loss(losses, source, alpha), jnp.dot(alpha, per_source), rtol=1e-6
  )


def test_sampling_by_ratio_and_uniform_sampling_with_loss_weights_agree_in_expectation():
  sources, _ = text.mixture_search_sources(8, seed=1)
  alpha = np.array([0.4, 0.1, 0.2, 0.05, 0.15, 0.1])
  score = lambda symbols: sources.log_likelihoods(symbols)[0] / symbols.shape[1]  # noqa: E731
  batches = 40
  sampled = [
    score(
      text.MarkovText(sources.with_weights(alpha), 16, 240, 0, 0).generate(n)["tokens"][:, 1:] - 5
    )
    for n in range(batches)
  ]
  weighted = []
  for n in range(batches):
    batch = text.MarkovText(sources, 16, 240, 0, 1, stratified=True).generate(n)
    values = score(batch["tokens"][:, 1:] - 5)
    weighted.append(mixture.weighted_loss(jnp.asarray(values), batch["source"], jnp.asarray(alpha)))
  sampled_mean = np.mean([s.mean() for s in sampled])
  spread = np.std([s.mean() for s in sampled]) / math.sqrt(batches)
  assert abs(sampled_mean - np.mean(weighted)) < 4 * spread + 1e-3


def test_stratified_batches_hold_every_source_in_order():
  sources, names = text.mixture_search_sources(8)
  batch = text.MarkovText(sources, 5, 12, 0, 0, stratified=True).generate(3)
  np.testing.assert_array_equal(batch["source"], np.repeat(np.arange(6), 2))
  assert names == ("relevant_0", "relevant_1", "relevant_2", "noise", "adversarial", "irrelevant")
  with pytest.raises(ValueError, match="divisible by the 6 sources"):
    text.MarkovText(sources, 5, 10, 0, 0, stratified=True)


# ---------------------------------------------------------------------------------------------------
# The corpus's best mixture is the analytic one
# ---------------------------------------------------------------------------------------------------


def test_the_bigram_optimum_over_the_simplex_is_the_target_mixture():
  sources, _ = text.mixture_search_sources(16)
  target = sources.with_weights(W_STAR)
  loss = lambda a: text.bigram_cross_entropy(target, np.clip(a, 1e-12, None), 16)  # noqa: E731
  found = optimize.minimize(
    loss,
    np.full(6, 1 / 6),
    method="SLSQP",
    bounds=[(0, 1)] * 6,
    constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1}],
    options={"ftol": 1e-12, "maxiter": 500},
  )
  np.testing.assert_allclose(found.x, W_STAR, atol=2e-3)
  assert loss(W_STAR) < loss(np.full(6, 1 / 6)) - 0.1


def test_the_full_context_optimum_is_the_target_mixture_gibbs():
  sources, _ = text.mixture_search_sources(16)
  symbols, _ = sources.with_weights(W_STAR).sample(np.random.default_rng(0), 4000, 16)
  loss = lambda a: -sources.with_weights(a).mixture_log_likelihood(symbols).mean()  # noqa: E731
  rng = np.random.default_rng(1)
  for _ in range(5):
    step = rng.normal(size=3) * 0.05
    nearby = W_STAR.copy()
    nearby[:3] = np.clip(nearby[:3] + step - step.mean(), 0.01, None)
    assert loss(W_STAR) < loss(nearby / nearby.sum())


def test_a_depth_0_transformer_predicts_from_the_current_token_only():
  model = Transformer(vocab_size=9, width=8, depth=0, num_heads=2, tie_embeddings=False)
  tokens = jnp.array([[1, 2, 3, 4], [7, 7, 3, 4]])
  params = model.init(jax.random.key(0), tokens, mask=attention.causal_mask())
  logits = model.apply(params, tokens, mask=attention.causal_mask()).logits
  np.testing.assert_allclose(logits[0, 2:], logits[1, 2:], atol=1e-6)
  assert set(params["params"]) == {"embed", "final_norm", "unembed"}


# ---------------------------------------------------------------------------------------------------
# Baselines' maths
# ---------------------------------------------------------------------------------------------------


def test_regmix_mixtures_lie_on_its_grid_of_the_simplex():
  draws = np.asarray(mixture.regmix_mixtures(jax.random.key(0), jnp.ones(6), 200, minimum=0.01))
  np.testing.assert_allclose(draws.sum(1), 1.0, atol=1e-5)
  assert draws.min() >= 0 and np.all((draws == 0) | (draws >= 0.005))
  assert (draws == 0).mean() > 0.1  # small Dirichlet strengths give sparse mixtures


@pytest.mark.parametrize("kind", mixture.REGRESSORS)
def test_regressors_find_the_minimum_of_a_smooth_loss_surface(kind):
  centre = jnp.array([0.5, 0.3, 0.2])
  inputs = jax.random.dirichlet(jax.random.key(1), jnp.ones(3), (60,))
  targets = jnp.sum((inputs - centre) ** 2, -1)
  candidates = jax.random.dirichlet(jax.random.key(2), jnp.ones(3), (4000,))

  @jax.jit
  def fit_and_pick(weights):
    model = mixture.fit_regressor(kind, inputs, targets, weights=weights)
    return mixture.regmix_select(model, candidates, 20), model.loo_error

  best, _ = fit_and_pick(jnp.ones(60))
  assert float(mixture.l1_distance(best, centre)) < 0.15
  _, loo_error = fit_and_pick((jnp.arange(60) < 30).astype(jnp.float32))
  assert np.isfinite(float(loo_error))


def test_climb_draws_close_in_on_a_sparse_centre_only_without_a_floor():
  """CLIMB's Dirichlet draws narrow onto the centre as the concentration grows; a floor on every
  source keeps them a fixed distance from a centre that puts 0 on some sources."""
  centre = jnp.array([0.7, 0.0, 0.0, 0.3, 0.0, 0.0])

  def mean_l1(concentration, floor):
    draws = mixture.climb_candidates(jax.random.key(5), centre, concentration, 2000, floor)
    return float(jnp.abs(draws - centre).sum(-1).mean())

  plain = [mean_l1(c, 0.0) for c in (20.0, 180.0)]
  floored = [mean_l1(c, 0.05) for c in (20.0, 180.0)]
  assert plain[1] < 0.5 * plain[0] and plain[1] < 0.08
  assert floored[1] > 0.25  # 6 x 0.05 / 1.3 of the mass stays off the centre's support


def test_doremi_update_and_lattice():
  alpha = mixture.doremi_update(jnp.full(4, 0.25), jnp.array([1.0, 0, 0, 0]), 1.0, 0.1)
  assert float(alpha.sum()) == pytest.approx(1.0) and alpha[0] > alpha[1] >= 0.1 / 4
  lattice = mixture.simplex_lattice(6, (0, 1, 2), 10)
  assert lattice.shape == (66, 6) and np.allclose(lattice.sum(1), 1)
  assert np.any(np.all(np.isclose(lattice, W_STAR), axis=1))


# ---------------------------------------------------------------------------------------------------
# Digits domains
# ---------------------------------------------------------------------------------------------------


def test_digit_domains_split_the_digits_with_noisy_labels_and_a_target_domain():
  domains = mixture_sources.digit_domains(0)
  assert domains.sizes == (600, 300, 300, 300, 100)
  assert len(domains.validation) == 100 and len(domains.test) == 97
  clean = domains.sources[0]
  assert clean.images.dtype == np.float32 and clean.images.shape[1:] == (8, 8)
  source, index = mixture_sources.stratified_indices(domains.sizes, 3, np.random.default_rng(0))
  batch = domains.gather(source, index)
  np.testing.assert_array_equal(batch["source"], np.repeat(np.arange(5), 3))
  assert batch["x"].shape == (15, 8, 8) and batch["y"].dtype == np.int32


# ---------------------------------------------------------------------------------------------------
# Runs through the shared loop
# ---------------------------------------------------------------------------------------------------


def tiny_config(**changes):
  config = fastmix_config.get_config()
  config.data.update(rows_per_source=2, seq_len=8, vocab_size=8)
  config.steps = 8
  config.fastmix.inner_steps = 4
  config.optim.warmup_steps = 2
  config.regmix.update(num_proxies=4, proxy_counts=(2, 4), num_candidates=200, top_k=5)
  config.climb.update(proxies_per_round=(2, 2), num_candidates=100, top_k=3)
  config.sweep.resolution = 2
  config.eval.update(num_examples=32, batch_size=16, timing_repeats=1)
  config.loop.update(log_every=4, checkpoint_every=4)
  for key, value in changes.items():
    section, _, field = key.rpartition("__")
    (config[section] if section else config)[field] = value
  return config


def test_default_run_writes_the_headline_keys_and_compiles_each_step_once(tmp_path):
  summary = loop.run(tiny_config(fastmix__num_seeds=2), str(tmp_path))
  results = summary.results
  for key in ("mixture_l1_error", "target_loss", "oracle_loss", "cost_ratio_vs_regmix"):
    assert math.isfinite(results[key]), key
  assert summary.step_traces == {"search": 1, "regmix": 1, "retrain": 1}
  mixtures = np.asarray(results["mixture"])
  assert mixtures.shape == (2, 6) and np.allclose(mixtures.sum(1), 1, atol=1e-5)
  assert np.asarray(results["trajectory"]).shape == (2, 3, 6)
  assert results["search_cost_steps"] == pytest.approx(2 * (4 + 1))
  assert np.asarray(results["target_loss/models"]).shape == (2, 2)


@pytest.mark.slow
def test_interrupted_search_resumes_to_the_same_mixture(tmp_path):
  config = tiny_config(compare_regmix=False)
  whole = loop.run(config, str(tmp_path / "whole")).results
  with pytest.raises(loop.Interrupted):
    loop.run(config, str(tmp_path / "cut"), should_stop=lambda phase, step: step == 1)
  resumed = loop.run(config, str(tmp_path / "cut")).results
  np.testing.assert_allclose(resumed["mixture"], whole["mixture"], rtol=1e-5)
  assert resumed["target_loss"] == pytest.approx(whole["target_loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["uniform", "oracle", "regmix", "climb", "doremi", "sweep"])
def test_every_baseline_runs_and_reports_its_mixture(tmp_path, mixer):
  results = loop.run(tiny_config(mixer=mixer), str(tmp_path)).results
  mixtures = np.asarray(results["mixture"])
  assert mixtures.shape == (1, 6) and np.allclose(mixtures.sum(1), 1, atol=1e-4)
  assert math.isfinite(results["target_loss"]) and math.isfinite(results["mixture_l1_error"])
  if mixer == "oracle":
    assert results["mixture_l1_error"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow
def test_digits_search_runs_and_compares_with_the_reference_mixtures(tmp_path):
  config = tiny_config(
    data__name="digits", data__rows_per_source=4, model__depth=1, compare_regmix=False
  )
  results = loop.run(config, str(tmp_path)).results
  assert np.asarray(results["mixture"]).shape == (1, 5)
  for key in ("target_accuracy", "uniform_accuracy", "target_only_accuracy"):
    assert 0 <= results[key] <= 1
  assert "mixture_l1_error" not in results


@pytest.mark.slow
def test_tokenised_domains_are_read_from_data_dir(tmp_path):
  for split, names in (("train", ("a", "b")), ("validation", ("b",))):
    (tmp_path / split).mkdir()
    for i, name in enumerate(names):
      np.save(tmp_path / split / f"{name}.npy", (np.arange(5000) * (i + 3)) % 11)
  config = tiny_config(data__name="pile", compare_regmix=False)
  config.data.update(data_dir=str(tmp_path), domains=("a", "b"), target_domain="b", vocab_size=11)
  results = loop.run(config, str(tmp_path / "run")).results
  assert np.asarray(results["mixture"]).shape == (1, 2) and math.isfinite(results["target_loss"])


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("data.target_weights", (0.5, 0.5), "config.data.target_weights: must be 6"),
    ("fastmix.inner_steps", 3, "config.fastmix.inner_steps: must divide steps"),
    ("fastmix.hypergradient", "lm_head", "config.fastmix.hypergradient: must be one of"),
    ("fastmix.entropy_sign", "minus", "config.fastmix.entropy_sign: must be one of"),
    ("mixer", "bayesopt", "config.mixer: must be one of"),
    ("regmix.proxy_counts", (8,), "config.regmix.proxy_counts: must be increasing"),
    ("model.depth", -1, "config.model.depth: must be >= 0"),
  ],
)
def test_bad_fields_are_named(field, value, message):
  config = tiny_config()
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(ConfigError, match=message):
    loop.validate(config, data_devices=1)


def test_gpu_variant_names_its_data_dir():
  with pytest.raises(ConfigError, match=r"config\.data\.data_dir: missing token files"):
    loop.validate(fastmix_config.get_config("gpu"), data_devices=1)


def test_checkpoint_round_trip(tmp_path):
  config = tiny_config()
  task = tasks.load_task(config)
  params = task.init_params(jax.random.key(3))
  path = str(tmp_path / "proxy.npz")
  tasks.save_checkpoint(path, params)
  chex.assert_trees_all_close(tasks.load_checkpoint(path, params), params)


# ---------------------------------------------------------------------------------------------------
# Study report
# ---------------------------------------------------------------------------------------------------


def fake_arm(l1, cost, seeds=1, rounds=3):
  alpha = np.tile(W_STAR * (1 - l1 / 2) + l1 / 12, (seeds, 1))
  return {
    "mixture": alpha.tolist(),
    "mixture_l1_error": l1,
    "unused_source_weight": l1 / 2,
    "ideal_target_loss": 2.06 + l1 / 10,
    "target_loss": 2.08 + l1 / 10,
    "oracle_loss": 2.08,
    "target_minus_oracle_loss": l1 / 10,
    "target_excess_over_oracle": l1 / 20,
    "search_cost_steps": cost,
    "search_seconds": cost / 1000,
    "trajectory": np.tile(alpha[:, None], (1, rounds, 1)).tolist(),
  }


def test_study_report_puts_the_methods_side_by_side():
  config = fastmix_config.get_config("study")
  results = {name: fake_arm(0.1, 3150.0, seeds=3) for name in study.FASTMIX_ARMS}
  results["uniform"] = fake_arm(1.0, 0.0)
  results["regmix"] = fake_arm(0.5, 64 * 3000.0)
  results["regmix"].update(
    curve_counts=[4, 64],
    curve_cost_steps=[12000.0, 192000.0],
    curve_l1_error=[1.2, 0.08],
    curve_mixtures=[W_STAR.tolist()] * 2,
    curve_ideal_target_loss=[2.3, 2.07],
  )
  results["sweep"] = fake_arm(0.0, 66 * 3000.0)
  results["sweep"].update(
    proxy_losses=[2.1, 2.2], proxy_ideal_losses=[2.06, 2.15], ideal_best_mixture=W_STAR.tolist()
  )
  report = study.report(config, results)
  assert report.summary["cost_ratio_vs_regmix"] == pytest.approx(192000 / 3150)
  assert report.summary["regmix_matched"] and report.summary["fastmix_within_0.15"]
  assert [row["method"] for row in report.rows][:3] == ["fastmix", "fastmix_head", "fastmix_beta"]
  assert "fastmix_study" in report.figures
  names = [name for name, _ in fastmix.study_arms(config)]
  assert names[:3] == ["fastmix", "fastmix_head", "fastmix_beta"] and "digits_fastmix" in names
