"""The shared transformer core: attention implementations vs the jnp reference for every mask kind,
the Pallas kernels (interpret mode, and lowered for GPU and TPU), RoPE, the module's inputs and
outputs, and FSDP on 8 fake devices."""

import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.nn import attention as attn
from core.nn import transformer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def qkv(batch, q_len, kv_len, heads, kv_heads, head_dim, seed=0, dtype=jnp.float32):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  return (
    jax.random.normal(kq, (batch, q_len, heads, head_dim), dtype),
    jax.random.normal(kk, (batch, kv_len, kv_heads, head_dim), dtype),
    jax.random.normal(kv, (batch, kv_len, kv_heads, head_dim), dtype),
  )


def make_mask(kind: str, batch: int, q_len: int, kv_len: int, heads: int, seed: int = 0):
  """Every mask kind; each query sees at least one key."""
  rng = np.random.default_rng(seed)
  if kind == "causal":
    return attn.causal_mask()
  if kind == "bidirectional":
    return attn.bidirectional_mask()
  if kind == "prefix":
    return attn.prefix_lm_mask(rng.integers(0, q_len + 1, batch))
  if kind in ("segment", "causal_segment"):
    ids = np.sort(rng.integers(0, 3, (batch, q_len)), axis=1)
    return attn.segment_mask(ids, causal=kind == "causal_segment")
  if kind == "padding":
    valid = rng.random((batch, kv_len)) < 0.7
    valid[:, 0] = True
    return attn.padding_mask(valid)
  if kind == "cache":  # a decode step: queries at slots [pos, pos + q_len) of a kv_len cache
    start = rng.integers(0, kv_len - q_len + 1, batch)
    return attn.causal_mask(q_positions=start[:, None] + np.arange(q_len)[None])
  dense = rng.random((batch, heads, q_len, kv_len)) < 0.5  # "arbitrary", per head
  dense[..., 0] = True
  return dense


SELF_MASKS = (
  "causal",
  "bidirectional",
  "prefix",
  "segment",
  "causal_segment",
  "padding",
  "arbitrary",
)
SHAPES = [  # batch, q_len, kv_len, heads, kv_heads, head_dim
  (2, 37, 37, 4, 2, 16),
  (1, 64, 64, 2, 2, 8),
  (3, 5, 5, 4, 1, 32),
]


@pytest.mark.parametrize("implementation", attn.available_implementations())
@pytest.mark.parametrize("kind", SELF_MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_implementation_matches_the_reference_for_every_mask(implementation, kind, shape):
  batch, q_len, kv_len, heads, kv_heads, head_dim = shape
  q, k, v = qkv(*shape, seed=q_len)
  mask = make_mask(kind, batch, q_len, kv_len, heads, seed=q_len)
  expected = attn.attention(q, k, v, mask, implementation="reference")
  got = attn.attention(q, k, v, mask, implementation=implementation)
  chex.assert_shape(got, q.shape)
  chex.assert_trees_all_close(got, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("implementation", attn.available_implementations())
def test_cache_style_and_cross_attention_masks(implementation):
  q, k, v = qkv(2, 3, 19, 4, 2, 16)
  for kind in ("cache", "arbitrary", "padding"):
    mask = make_mask(kind, 2, 3, 19, 4)
    expected = attn.attention(q, k, v, mask, implementation="reference")
    got = attn.attention(q, k, v, mask, implementation=implementation)
    chex.assert_trees_all_close(got, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kind", SELF_MASKS)
@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(map(str, s)))
def test_chunked_attention_in_small_blocks_matches_the_reference(kind, shape):
  """Blocks of 16 queries (37 and 64: a short last block and exact blocks): every mask kind."""
  batch, q_len, kv_len, heads, kv_heads, head_dim = shape
  q, k, v = qkv(*shape, seed=q_len + 1)
  mask = attn.as_mask(make_mask(kind, batch, q_len, kv_len, heads, seed=q_len + 1))
  expected = attn.attention(q, k, v, mask, implementation="reference")
  got = attn.chunked_attention(q, k, v, mask, 1 / np.sqrt(head_dim), block=16)
  chex.assert_trees_all_close(got, expected, atol=2e-5, rtol=2e-5)


def test_chunked_causal_blocks_skip_only_keys_no_query_sees():
  """A prefill into a longer cache (kv_len > q_len, plain causal): the slots after the prompt and
  each block's future keys are skipped; poisoning them with NaN must not reach the output."""
  q, k, v = qkv(2, 40, 48, 4, 2, 8, seed=3)
  poisoned_v = v.at[:, 40:].set(jnp.nan)
  got = attn.chunked_attention(q, k, poisoned_v, attn.causal_mask(), 1 / np.sqrt(8), block=16)
  expected = attn.attention(q, k[:, :40], v[:, :40], attn.causal_mask(), implementation="reference")
  chex.assert_trees_all_close(got, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU default")
def test_cpu_default_is_chunked_only_for_long_queries():
  q, k, _ = qkv(1, attn.CHUNK + 1, attn.CHUNK + 1, 2, 2, 8)
  assert attn.default_implementation(q, k, attn.causal_mask()) == "chunked"
  assert attn.default_implementation(q[:, : attn.CHUNK], k, attn.causal_mask()) == "xla"


def test_reference_is_softmax_attention_written_out():
  q, k, v = qkv(1, 4, 6, 1, 1, 8)
  mask = make_mask("arbitrary", 1, 4, 6, 1)
  logits = np.einsum("qd,kd->qk", q[0, :, 0], k[0, :, 0]) / np.sqrt(8)
  logits = np.where(mask[0, 0], logits, -np.inf)
  weights = np.exp(logits - logits.max(1, keepdims=True))
  weights /= weights.sum(1, keepdims=True)
  out = attn.attention(q, k, v, mask, implementation="reference")
  np.testing.assert_allclose(out[0, :, 0], weights @ np.asarray(v[0, :, 0]), atol=1e-5)


def test_mask_helpers_build_the_expected_patterns():
  prefix = np.asarray(attn.prefix_lm_mask([2]).to_dense(1, 4, 4))[0, 0]
  np.testing.assert_array_equal(prefix, [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
  segments = np.asarray(attn.segment_mask([[0, 0, 1]], causal=True).to_dense(1, 3, 3))[0, 0]
  np.testing.assert_array_equal(segments, [[1, 0, 0], [1, 1, 0], [0, 0, 1]])
  cache = np.asarray(attn.causal_mask(q_positions=[[1], [3]]).to_dense(2, 1, 4))[:, 0, 0]
  np.testing.assert_array_equal(cache, [[1, 1, 0, 0], [1, 1, 1, 1]])
  assert attn.bidirectional_mask().to_dense(2, 3, 5).shape == (2, 1, 3, 5)


# Interpret mode runs the kernels' Python on CPU: small shapes, the masks the kernels take natively.
KERNEL_MASKS = ("causal", "bidirectional", "causal_segment")


@pytest.mark.parametrize("kernel", [attn.pallas_gpu_attention, attn.pallas_tpu_attention])
@pytest.mark.parametrize("kind", KERNEL_MASKS)
def test_pallas_kernels_in_interpret_mode_match_the_reference(kernel, kind):
  q, k, v = qkv(1, 21, 21, 2, 1, 16, seed=3)
  mask = make_mask(kind, 1, 21, 21, 2, seed=3)
  expected = attn.attention(q, k, v, mask, implementation="reference")
  got = kernel(q, k, v, mask, scale=0.25, interpret=True)
  chex.assert_trees_all_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", [attn.pallas_gpu_attention, attn.pallas_tpu_attention])
def test_pallas_kernels_fall_back_to_xla_for_masks_they_cannot_express(kernel):
  q, k, v = qkv(2, 9, 9, 2, 2, 8)
  for kind in ("prefix", "padding", "arbitrary"):
    mask = make_mask(kind, 2, 9, 9, 2)
    got = kernel(q, k, v, attn.as_mask(mask), scale=8**-0.5, interpret=True)
    chex.assert_trees_all_close(
      got, attn.attention(q, k, v, mask, implementation="reference"), atol=2e-5
    )


@pytest.mark.parametrize(
  "platform, kernel, target",
  [
    ("cuda", attn.pallas_gpu_attention, "__gpu$xla.gpu.triton"),
    ("tpu", attn.pallas_tpu_attention, "tpu_custom_call"),
  ],
)
def test_pallas_flash_attention_lowers_for_its_accelerator(platform, kernel, target):
  shape = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((2, 256), jnp.int32)

  def f(q, k, v, segment_ids):
    return kernel(q, k, v, attn.segment_mask(segment_ids, causal=True), scale=0.125)

  try:
    exported = jax.export.export(
      jax.jit(f),
      platforms=[platform],
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(target)],
    )(shape, shape, shape, ids)
  except Exception as error:  # noqa: BLE001 - an unlowerable platform is a skip, with its reason
    pytest.skip(f"{platform} lowering from CPU failed in jax {jax.__version__}: {error}")
  assert target in exported.mlir_module()
  assert exported.out_avals[0].shape == (2, 256, 4, 64)


def test_bad_arguments_are_named():
  q, k, v = qkv(1, 4, 4, 2, 2, 8)
  with pytest.raises(ValueError, match="implementation must be one of .*'xla'.*got 'flash'"):
    attn.attention(q, k, v, implementation="flash")
  if jax.default_backend() == "cpu":
    with pytest.raises(
      ValueError,
      match="'cudnn' is not available on backend 'cpu'; available: xla, chunked, reference",
    ):
      attn.attention(q, k, v, implementation="cudnn")
  with pytest.raises(ValueError, match=r"k must have shape \(1, \*, \*, 8\), got \(1, 4, 2, 4\)"):
    attn.attention(q, k[..., :4], v[..., :4])
  with pytest.raises(ValueError, match="k has 3 heads, which do not divide q's 2 heads"):
    attn.attention(q, *qkv(1, 4, 4, 3, 3, 8)[1:])
  with pytest.raises(TypeError, match="q, k, v must share a dtype"):
    attn.attention(q, k.astype(jnp.bfloat16), v)
  with pytest.raises(
    ValueError, match=r"mask must have shape \(1, 1\|2, 4, 4\), got \(1, 1, 4, 5\)"
  ):
    attn.attention(q, k, v, jnp.ones((1, 1, 4, 5), bool))
  with pytest.raises(TypeError, match="mask must be boolean"):
    attn.attention(q, k, v, jnp.ones((1, 1, 4, 4)))
  with pytest.raises(ValueError, match=r"mask.segment_ids must have shape \(1, 4\)"):
    attn.attention(q, k, v, attn.segment_mask(np.zeros((1, 3))))
  with pytest.raises(ValueError, match="q must have shape \\[batch, length, heads, head_dim\\]"):
    attn.attention(q[0], k, v)


# ---------------------------------------------------------------------------------------------------
# RoPE and the module
# ---------------------------------------------------------------------------------------------------


def test_rope_scores_depend_only_on_the_relative_position():
  q, k, _ = qkv(1, 1, 1, 1, 1, 16, seed=5)

  def score(m, n):
    rq = transformer.rope(q, jnp.array([[m]]))
    rk = transformer.rope(k, jnp.array([[n]]))
    return float(jnp.sum(rq * rk))

  for m, n, shift in ((3, 1, 10), (0, 7, 4), (20, 20, 33)):
    assert score(m, n) == pytest.approx(score(m + shift, n + shift), rel=1e-4, abs=1e-4)
  assert score(3, 1) != pytest.approx(score(3, 2), rel=1e-3)
  chex.assert_trees_all_close(transformer.rope(q, jnp.zeros((1, 1))), q)


def small_model(**overrides):
  kwargs = dict(vocab_size=13, width=32, depth=2, num_heads=4, num_kv_heads=2)
  kwargs.update(overrides)
  return transformer.Transformer(**kwargs)


def init(model, tokens=None, **kwargs):
  return jax.jit(model.init)(jax.random.key(0), tokens, **kwargs)


def jitted_apply(model):
  """`model.apply`, compiled (eager Flax dispatches op by op, slowly on CPU)."""
  return jax.jit(model.apply, static_argnames=("return_hidden",))


def test_outputs_have_the_documented_shapes_and_dtypes():
  tokens = jnp.arange(14, dtype=jnp.int32).reshape(2, 7) % 13
  for dtype in (jnp.float32, jnp.bfloat16):
    model = small_model(dtype=dtype, mlp="gelu", tie_embeddings=False)
    params = init(model, tokens, mask=attn.causal_mask())
    out = jitted_apply(model)(params, tokens, mask=attn.causal_mask(), return_hidden=True)
    chex.assert_shape(out.logits, (2, 7, 13))
    chex.assert_shape(out.hidden_states, (3, 2, 7, 32))
    chex.assert_shape(out.features, (2, 7, 32))
    assert out.logits.dtype == jnp.float32 and out.hidden_states.dtype == dtype
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    chex.assert_tree_all_finite(out.logits)
  assert jitted_apply(model)(params, tokens, mask=attn.causal_mask()).hidden_states is None


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_logits_at_is_the_full_logits_gathered_at_those_positions(tie_embeddings):
  tokens = jnp.arange(14, dtype=jnp.int32).reshape(2, 7) % 13
  model = small_model(tie_embeddings=tie_embeddings)
  params = init(model, tokens, mask=attn.causal_mask())
  at = jnp.array([[6, 0, 3], [2, 2, 5]])
  full = model.apply(params, tokens, mask=attn.causal_mask()).logits
  picked = model.apply(params, tokens, mask=attn.causal_mask(), logits_at=at).logits
  chex.assert_shape(picked, (2, 3, 13))
  np.testing.assert_allclose(picked, jnp.take_along_axis(full, at[..., None], 1), rtol=1e-5)


def test_causal_mask_hides_the_future_and_packed_segments_match_separate_sequences():
  model = small_model()
  a, b = jnp.array([[1, 2, 3, 4, 5]]), jnp.array([[6, 7, 8]])
  params = init(model, a, mask=attn.causal_mask())
  apply = jitted_apply(model)
  logits = lambda tokens, **kw: apply(params, tokens, **kw).logits  # noqa: E731
  changed = a.at[0, 3:].set(9)
  chex.assert_trees_all_close(
    logits(a, mask=attn.causal_mask())[:, :3], logits(changed, mask=attn.causal_mask())[:, :3]
  )
  assert not np.allclose(logits(a)[:, :3], logits(changed)[:, :3])  # no mask: bidirectional
  packed = jnp.concatenate([a, b], axis=1)
  segments = jnp.array([[0] * 5 + [1] * 3])
  positions = jnp.array([[0, 1, 2, 3, 4, 0, 1, 2]])
  together = logits(packed, positions=positions, mask=attn.segment_mask(segments, causal=True))
  alone = [logits(x, mask=attn.causal_mask()) for x in (a, b)]
  chex.assert_trees_all_close(together, jnp.concatenate(alone, axis=1), atol=1e-5)


@pytest.mark.slow
def test_continuous_embeddings_prepend_or_replace_tokens():
  model = small_model(input_dim=5)
  tokens = jnp.ones((2, 4), jnp.int32)
  embeddings = jax.random.normal(jax.random.key(1), (2, 3, 5))
  params = init(model, tokens, embeddings=embeddings)
  apply = jitted_apply(model)
  prepended = apply(params, tokens, embeddings, return_hidden=True)
  chex.assert_shape(prepended.logits, (2, 7, 13))
  where = jnp.array([[True, False, False, True]] * 2)
  at_tokens = jax.random.normal(jax.random.key(2), (2, 4, 5))
  replaced = apply(params, tokens, at_tokens, embeddings_at=where, return_hidden=True)
  plain = apply(params, tokens, return_hidden=True)
  chex.assert_trees_all_close(replaced.hidden_states[0][:, 1:3], plain.hidden_states[0][:, 1:3])
  assert not np.allclose(replaced.hidden_states[0][:, 0], plain.hidden_states[0][:, 0])
  continuous = small_model(vocab_size=0, input_dim=5)
  cparams = init(continuous, None, embeddings=embeddings)
  out = jitted_apply(continuous)(cparams, None, embeddings, mask=attn.causal_mask())
  assert out.logits is None and out.features.shape == (2, 3, 32)


def test_bad_module_inputs_are_named():
  tokens = jnp.ones((2, 4), jnp.int32)
  with pytest.raises(ValueError, match="num_heads=5 must divide width=32"):
    init(small_model(num_heads=5, num_kv_heads=None), tokens)
  with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
    init(small_model(num_kv_heads=3), tokens)
  with pytest.raises(ValueError, match="mlp must be one of"):
    init(small_model(mlp="relu"), tokens)
  model = small_model()
  params = init(model, tokens)
  with pytest.raises(ValueError, match="tokens must be int \\[batch, length\\]"):
    model.apply(params, tokens.astype(jnp.float32))
  with pytest.raises(
    ValueError, match=r"embeddings must have shape \[2, length, 32\], got \(2, 3, 7\)"
  ):
    model.apply(params, tokens, jnp.zeros((2, 3, 7)))
  with pytest.raises(ValueError, match=r"positions must have shape \[2 or 1, 4\], got \(2, 3\)"):
    model.apply(params, tokens, positions=jnp.zeros((2, 3), jnp.int32))
  cache = transformer.init_cache(model, 2, 16)
  with pytest.raises(ValueError, match="mask is required with a cache"):
    model.apply(params, tokens, cache=cache)
  with pytest.raises(ValueError, match=r"cache\['k'\] must have shape \[depth=2, batch=2"):
    model.apply(params, tokens, mask=attn.causal_mask(), cache=transformer.init_cache(model, 3, 16))


# ---------------------------------------------------------------------------------------------------
# FSDP on 8 fake devices
# ---------------------------------------------------------------------------------------------------

_FSDP_SCRIPT = r"""
from experiments import runtime
runtime.configure_xla_cpu()
import jax
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp, numpy as np
from experiments import sharding
from core.nn import attention, transformer

assert len(jax.devices()) == 8
model = transformer.Transformer(vocab_size=40, width=64, depth=2, num_heads=4, num_kv_heads=2)
tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (8, 24)), jnp.int32)
init = lambda rng: model.init(rng, tokens, mask=attention.causal_mask())
forward = lambda params, tokens: model.apply(params, tokens, mask=attention.causal_mask()).logits
params = jax.jit(init)(jax.random.key(0))
one = jax.jit(forward)(jax.device_put(params, jax.devices()[0]), tokens)

mesh = sharding.make_mesh()
shardings = sharding.state_shardings(mesh, jax.eval_shape(init, jax.random.key(0)), "fsdp", 256)
specs = [s.spec for s in jax.tree.leaves(shardings)]
sharded = sum("data" in spec for spec in specs)
assert sharded >= 8, specs
params8 = jax.jit(init, out_shardings=shardings)(jax.random.key(0))
kernel = params8["params"]["block_0"]["mlp"]["gate"]["kernel"]
assert kernel.addressable_shards[0].data.size * 8 == kernel.size, kernel.sharding
eight = jax.jit(forward)(params8, jax.device_put(tokens, sharding.batch_sharding(mesh)))
np.testing.assert_allclose(np.asarray(eight), np.asarray(one), atol=2e-5, rtol=2e-5)
print("fsdp ok", sharded, "of", len(specs), "leaves sharded")
"""


@pytest.mark.slow
def test_fsdp_on_eight_devices_gives_the_logits_of_one():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run(
    [sys.executable, "-c", _FSDP_SCRIPT],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "fsdp ok" in done.stdout
