"""The shared transformer against Hugging Face transformers on a tiny random Llama (the `peers` extra:
`pip install -e ".[peers]"`; skipped without torch and transformers): the converted model's logits and
greedy tokens equal transformers' own, and the benchmark's table reports what it measured."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from core import decoding  # noqa: E402
from experiments import bench_peers  # noqa: E402

# A shape no benchmark default uses: 3 heads sharing 1 kv head, odd width per head
TINY = dict(width=48, depth=2, heads=3, kv_heads=1, vocab=97, mlp_hidden=80, init_std=0.2)


@pytest.fixture(scope="module")
def models():
  hf_model = bench_peers.hf_llama(**TINY, max_positions=64, seed=3)
  model, params = bench_peers.converted(hf_model)
  return hf_model, model, params


def test_converted_logits_equal_transformers(models):
  hf_model, model, params = models
  tokens = np.random.default_rng(5).integers(0, TINY["vocab"], (2, 23))
  assert bench_peers.logit_difference(model, params, hf_model, tokens) < 1e-4


def test_greedy_tokens_equal_transformers_generate(models):
  hf_model, model, params = models
  prompts = np.random.default_rng(6).integers(0, TINY["vocab"], (2, 9))
  ours = decoding.generate(
    model,
    params,
    jnp.asarray(prompts),
    jnp.full((2,), 9, jnp.int32),
    jax.random.key(0),
    max_new_tokens=12,
    sampling=decoding.GREEDY,
  ).tokens
  with torch.inference_mode():
    theirs = hf_model.generate(
      torch.as_tensor(prompts),
      attention_mask=torch.ones((2, 9), dtype=torch.long),
      max_new_tokens=12,
      min_new_tokens=12,
      do_sample=False,
      pad_token_id=0,
      eos_token_id=None,
    )[:, 9:]
  np.testing.assert_array_equal(np.asarray(ours), theirs.numpy())


def test_a_wrong_conversion_is_caught(models):
  """The equality check fails when one weight is off: it compares two models, not one with itself."""
  hf_model, model, params = models
  bad = jax.tree_util.tree_map_with_path(
    lambda path, x: x * 1.01 if "block_1" in jax.tree_util.keystr(path) else x, params
  )
  tokens = np.random.default_rng(7).integers(0, TINY["vocab"], (1, 11))
  assert bench_peers.logit_difference(model, bad, hf_model, tokens) > 1e-3


def test_train_step_losses_agree_and_rates_are_reported():
  hf_model = bench_peers.hf_llama(**TINY, max_positions=64, seed=4)  # its own: training moves it
  model, params = bench_peers.converted(hf_model)
  measure = functools.partial(bench_peers.measure_train, model, params, hf_model)
  result = measure(batch=2, length=16, repeats=2)
  assert result["loss_gap"] < 1e-4
  assert result["ours_tokens_per_s"] > 0 and result["theirs_tokens_per_s"] > 0
  assert result["ours_xla_bytes"] > 0
