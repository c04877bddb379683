"""Shared-context + per-sample-buffer attention: the Pallas kernel (interpret mode) and the XLA version
against the broadcast reference on odd shapes, its lowering for GPU and TPU from this CPU machine,
the input checks, and the shared transformer's `shared_cache` path built on it."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.nn import attention as attn
from core.nn import transformer
from kernels import lowering
from kernels.buffer_attention import api, buffer_attention, pallas, reference

# (batch, queries, heads, kv_heads, head_dim, context, slots, context batch)
SHAPES = {
  "decode": (5, 2, 4, 4, 16, 37, 9, 1),
  "gqa_odd": (3, 3, 6, 2, 7, 130, 5, 1),
  "teacher_forcing": (2, 32, 4, 4, 16, 16, 16, 1),
  "per_stream_context": (3, 2, 4, 4, 8, 20, 4, 3),
  "no_buffer": (2, 1, 2, 1, 4, 3, 0, 1),
  "one": (1, 1, 1, 1, 2, 1, 1, 1),
}


def inputs(batch, queries, heads, kv_heads, dim, context, slots, context_batch, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(batch * 1000 + context), 6)
  normal = lambda k, shape: jax.random.normal(k, shape).astype(dtype)  # noqa: E731
  return (
    normal(keys[0], (batch, queries, heads, dim)),
    normal(keys[1], (context_batch, context, kv_heads, dim)),
    normal(keys[2], (context_batch, context, kv_heads, dim)),
    normal(keys[3], (batch, slots, kv_heads, dim)),
    normal(keys[4], (batch, slots, kv_heads, dim)),
    jax.random.randint(keys[5], (batch, queries), -1, slots + 2),
  )


@pytest.mark.parametrize(
  "name",
  [
    n if n in ("gqa_odd", "per_stream_context") else pytest.param(n, marks=pytest.mark.slow)
    for n in SHAPES
  ],
)
def test_kernel_and_xla_match_the_broadcast_reference(name):
  args = inputs(*SHAPES[name])
  expected = buffer_attention(*args, implementation="reference")
  assert expected.shape == args[0].shape and expected.dtype == jnp.float32
  for implementation in ("pallas", "xla"):
    out = buffer_attention(*args, implementation=implementation)
    chex.assert_trees_all_close(out, expected, atol=1e-5, rtol=1e-5)


def test_kernel_tiles_the_context_and_blocks_streams():
  """Several context tiles (16 keys each, the last one partial) and 32-row blocks of streams."""
  q, ck, cv, bk, bv, lengths = inputs(*SHAPES["decode"])
  expected = reference.broadcast_reference(q, ck, cv, bk, bv, lengths, 0.25)
  out = pallas.buffer_attention_pallas(
    q,
    ck,
    cv,
    bk,
    bv,
    lengths,
    scale=0.25,
    block_sizes=pallas.BlockSizes(rows=32, context=16),
    interpret=True,
  )
  chex.assert_trees_all_close(out, expected, atol=1e-5, rtol=1e-5)
  layout = pallas.make_layout(5, 2, 37, 9, 16, False, pallas.BlockSizes(rows=32, context=16))
  assert layout.padded_context == 48 and layout.streams_per_block == 8 and layout.slots == 16


@pytest.mark.slow
def test_bfloat16_inputs():
  args = inputs(*SHAPES["gqa_odd"], dtype=jnp.bfloat16)
  expected = buffer_attention(*args, implementation="reference").astype(jnp.float32)
  out = buffer_attention(*args, implementation="pallas")
  assert out.dtype == jnp.bfloat16
  chex.assert_trees_all_close(out.astype(jnp.float32), expected, atol=3e-2)


def test_a_query_reads_only_its_own_streams_visible_buffer():
  """Changing stream 1's buffer beyond query 0's visible prefix, or stream 0's buffer, leaves stream
  1's first query unchanged."""
  q, ck, cv, bk, bv, _ = inputs(*SHAPES["decode"])
  lengths = jnp.full((5, 2), 3)
  base = buffer_attention(q, ck, cv, bk, bv, lengths, implementation="pallas")
  bv2 = bv.at[1, 3:].add(5.0).at[0].add(5.0)
  moved = buffer_attention(q, ck, cv, bk, bv2, lengths, implementation="pallas")
  chex.assert_trees_all_close(moved[1], base[1], atol=1e-6)
  assert not np.allclose(moved[0], base[0])


def _export(fn, platform, *args):
  checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  with lowering.verified_triton():
    return jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=checks)(*args)


LOWERED = [
  pytest.param(name, platform, marks=[] if name == "study_decode" else [pytest.mark.slow])
  for name in ("study_decode", "gqa_odd", "per_stream_context")
  for platform in ("cuda", "tpu")
]


@pytest.mark.parametrize("name, platform", LOWERED)
def test_kernel_lowers_for_gpu_and_tpu_from_cpu(name, platform):
  """`jax.export` for cuda (Triton, checked by the Triton verifier) and tpu (Mosaic): the default
  implementation holds the kernel, and the shared context is never broadcast to the streams."""
  shape = (32, 2, 4, 4, 16, 1024, 16, 1) if name == "study_decode" else SHAPES[name]
  for dtype in (jnp.float32, jnp.bfloat16):
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inputs(*shape, dtype=dtype)]
    text = _export(api.buffer_attention, platform, *args).mlir_module()
    assert lowering.KERNEL_CALLS[platform] in text
    if name == "study_decode":
      assert "32x1024x" not in text  # no [B, N, ...] copy of the context


def test_cpu_programs_use_xla_without_kernel():
  args = inputs(*SHAPES["decode"])
  text = jax.jit(buffer_attention).lower(*args).as_text()
  assert "tpu_custom_call" not in text and "triton" not in text


@pytest.mark.parametrize(
  "change, message",
  [
    (lambda a: {**a, "q": a["q"][0]}, "q must have shape"),
    (lambda a: {**a, "context_k": a["context_k"][..., :3]}, "context_k must have shape"),
    (lambda a: {**a, "buffer_v": a["buffer_v"][:1]}, "buffer_v must have shape"),
    (lambda a: {**a, "buffer_lengths": a["buffer_lengths"].astype(jnp.float32)}, "buffer_lengths"),
    (lambda a: {**a, "context_v": a["context_v"].astype(jnp.bfloat16)}, "context_v must have q's"),
  ],
)
def test_bad_inputs_name_the_argument(change, message):
  names = ("q", "context_k", "context_v", "buffer_k", "buffer_v", "buffer_lengths")
  args = change(dict(zip(names, inputs(*SHAPES["decode"]), strict=True)))
  with pytest.raises((ValueError, TypeError), match=message):
    buffer_attention(**args)
  with pytest.raises(ValueError, match="implementation must be one of"):
    buffer_attention(*inputs(*SHAPES["decode"]), implementation="triton")


@pytest.mark.slow
def test_transformer_shared_cache_equals_attending_to_the_prefix_tokens():
  """`Transformer(..., shared_cache=prefill cache)` over new tokens == one pass over [prefix, new
  tokens] with the prefix visible to all and a causal mask among the new tokens; a mask the kernel
  cannot express (padding) takes the broadcast path and agrees too."""
  model = transformer.Transformer(vocab_size=0, width=16, depth=2, num_heads=2, use_rope=False)
  prefix = jax.random.normal(jax.random.key(0), (1, 7, 16))
  new = jax.random.normal(jax.random.key(1), (3, 5, 16))
  params = model.init(jax.random.key(2), embeddings=new)
  cache = model.apply(
    params,
    embeddings=prefix,
    positions=jnp.arange(7)[None],
    mask=attn.bidirectional_mask(),
    cache=transformer.init_cache(model, 1, 7),
  ).cache
  joint = jnp.concatenate([jnp.broadcast_to(prefix, (3, 7, 16)), new], axis=1)
  causal = np.tril(np.ones((5, 5), bool))
  dense = np.block(
    [[np.ones((7, 7), bool), np.zeros((7, 5), bool)], [np.ones((5, 7), bool), causal]]
  )
  full = model.apply(params, embeddings=joint, mask=dense[None, None]).features[:, 7:]
  shared = model.clone(shared_attention_implementation="pallas")
  out = shared.apply(params, embeddings=new, mask=attn.causal_mask(), shared_cache=cache)
  chex.assert_trees_all_close(out.features, full, atol=1e-5)
  padded = model.apply(
    params,
    embeddings=new,
    mask=attn.padding_mask(np.ones((3, 5), bool), causal=True),
    shared_cache=cache,
  )
  chex.assert_trees_all_close(padded.features, full, atol=1e-5)
  with pytest.raises(ValueError, match="shared_cache"):
    model.apply(params, embeddings=new, mask=None, shared_cache={"k": cache["k"][:, :, :, :1]})


@pytest.mark.slow
def test_bench_reports_every_implementation():
  from kernels.buffer_attention import bench

  result = bench.run(context_sizes=(16, 40), batch=3, repeats=1)
  assert set(result["times_ms"]) == {"reference", "xla", "pallas"}
  assert max(result["max_abs_error"]) < 1e-5
  assert "N" in bench.report(result)
