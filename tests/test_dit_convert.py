"""Latte checkpoints into VideoDiT: the converted model against a numpy Latte written from the torch layout.

The state dict is random, laid out as Latte stores it (Linear weights [out, in], a fused qkv Linear, a
Conv2d patch embedding, sin-cos `pos_embed` / `temp_embed` buffers); the reference forward below reads
those arrays directly in Latte's own video layout (B, F, C, H, W), so nothing in it comes from the
converter or from `VideoDiT`.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from configs import bwcache as bwcache_config
from core.nn import dit_convert
from core.nn.dit import VideoDiT
from methods import bwcache
from methods.base import ConfigError

F, C, S, P = 4, 4, 8, 2  # frames, latent channels, latent size, patch
D, HEADS, DEPTH, FREQ, CLASSES = 32, 2, 2, 16, 3
G = S // P  # patches per side


def latte_model(**overrides) -> VideoDiT:
  kwargs = dict(
    patch=(1, P, P),
    hidden=D,
    depth=DEPTH,
    heads=HEADS,
    mlp_ratio=4,
    attention="alternating",
    positions="latte",
    learn_sigma=True,
    num_classes=CLASSES,
    time_frequencies=FREQ,
    time_scale=1.0,
  )
  return VideoDiT((F, S, S, C), **(kwargs | overrides))


def _sincos(pos, dim):  # MAE's 1D table: [sin, cos] of pos / 10000^(2i/dim)
  omega = 1.0 / 10000 ** (np.arange(dim // 2) / (dim / 2.0))
  out = np.outer(pos.reshape(-1).astype(np.float64), omega)
  return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def _pos_embed(dim, grid):  # MAE's 2D table: meshgrid(w, h), first half from the w grid
  gw, gh = np.meshgrid(np.arange(grid, dtype=np.float32), np.arange(grid, dtype=np.float32))
  return np.concatenate([_sincos(gw, dim // 2), _sincos(gh, dim // 2)], axis=1)


def latte_state_dict(seed: int = 0, scale: float = 0.2) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)

  def r(*shape):
    return (scale * rng.standard_normal(shape)).astype(np.float32)

  sd = {
    "x_embedder.proj.weight": r(D, C, P, P),
    "x_embedder.proj.bias": r(D),
    "t_embedder.mlp.0.weight": r(D, FREQ),
    "t_embedder.mlp.0.bias": r(D),
    "t_embedder.mlp.2.weight": r(D, D),
    "t_embedder.mlp.2.bias": r(D),
    "y_embedder.embedding_table.weight": r(CLASSES + 1, D),
    "pos_embed": _pos_embed(D, G)[None].astype(np.float32),
    "temp_embed": _sincos(np.arange(F), D)[None].astype(np.float32),
    "final_layer.adaLN_modulation.1.weight": r(2 * D, D),
    "final_layer.adaLN_modulation.1.bias": r(2 * D),
    "final_layer.linear.weight": r(P * P * 2 * C, D),
    "final_layer.linear.bias": r(P * P * 2 * C),
  }
  for i in range(DEPTH):
    b = f"blocks.{i}."
    sd |= {
      b + "attn.qkv.weight": r(3 * D, D),
      b + "attn.qkv.bias": r(3 * D),
      b + "attn.proj.weight": r(D, D),
      b + "attn.proj.bias": r(D),
      b + "mlp.fc1.weight": r(4 * D, D),
      b + "mlp.fc1.bias": r(4 * D),
      b + "mlp.fc2.weight": r(D, 4 * D),
      b + "mlp.fc2.bias": r(D),
      b + "adaLN_modulation.1.weight": r(6 * D, D),
      b + "adaLN_modulation.1.bias": r(6 * D),
    }
  return sd


# ---------------------------------------------------------------------------------------------------
# Latte's forward in numpy, from the torch-layout arrays
# ---------------------------------------------------------------------------------------------------


def _linear(sd, name, x):
  return x @ sd[name + ".weight"].astype(np.float64).T + sd[name + ".bias"]


def _silu(x):
  return x / (1.0 + np.exp(-x))


def _layer_norm(x, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)


def _modulate(x, shift, scale):
  return x * (1 + scale[:, None]) + shift[:, None]


def latte_attention(sd, name, x):
  """timm Attention: fused qkv reshaped (B, N, 3, heads, head_dim), softmax(q k^T / sqrt(hd)) v, proj."""
  b, n, d = x.shape
  qkv = _linear(sd, name + ".qkv", x).reshape(b, n, 3, HEADS, d // HEADS).transpose(2, 0, 3, 1, 4)
  q, k, v = qkv
  logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // HEADS)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  out = (weights @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
  return _linear(sd, name + ".proj", out)


def latte_block(sd, i, x, c):
  mod = _linear(sd, f"blocks.{i}.adaLN_modulation.1", _silu(c))
  shift1, scale1, gate1, shift2, scale2, gate2 = np.split(mod, 6, axis=1)
  x = x + gate1[:, None] * latte_attention(
    sd, f"blocks.{i}.attn", _modulate(_layer_norm(x), shift1, scale1)
  )
  h = _linear(sd, f"blocks.{i}.mlp.fc1", _modulate(_layer_norm(x), shift2, scale2))
  h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
  return x + gate2[:, None] * _linear(sd, f"blocks.{i}.mlp.fc2", h)


def latte_forward(sd, x, t, y):
  """Latte.forward for x (B, F, C, H, W), integer steps t (B,), labels y (B,); returns the eps half."""
  b = x.shape[0]
  patches = x.reshape(b * F, C, G, P, G, P)
  w = sd["x_embedder.proj.weight"].astype(np.float64)
  tokens = np.einsum("ncupvq,dcpq->nuvd", patches, w).reshape(b * F, G * G, D)
  tokens = tokens + sd["x_embedder.proj.bias"] + sd["pos_embed"]
  half = FREQ // 2
  args = t[:, None] * np.exp(-math.log(10000) * np.arange(half) / half)[None]
  t_freq = np.concatenate([np.cos(args), np.sin(args)], axis=1)
  c = _linear(sd, "t_embedder.mlp.2", _silu(_linear(sd, "t_embedder.mlp.0", t_freq)))
  c = c + sd["y_embedder.embedding_table.weight"][y]
  c_spatial, c_temporal = np.repeat(c, F, axis=0), np.repeat(c, G * G, axis=0)
  for i in range(0, DEPTH, 2):
    tokens = latte_block(sd, i, tokens, c_spatial)
    tokens = tokens.reshape(b, F, G * G, D).transpose(0, 2, 1, 3).reshape(b * G * G, F, D)
    if i == 0:
      tokens = tokens + sd["temp_embed"]
    tokens = latte_block(sd, i + 1, tokens, c_temporal)
    tokens = tokens.reshape(b, G * G, F, D).transpose(0, 2, 1, 3).reshape(b * F, G * G, D)
  shift, scale = np.split(
    _linear(sd, "final_layer.adaLN_modulation.1", _silu(c_spatial)), 2, axis=1
  )
  out = _linear(sd, "final_layer.linear", _modulate(_layer_norm(tokens), shift, scale))
  out = np.einsum("nhwpqc->nchpwq", out.reshape(b * F, G, G, P, P, 2 * C))
  return out.reshape(b, F, 2 * C, S, S)[:, :, :C]


# ---------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted():
  sd = latte_state_dict()
  return sd, dit_convert.latte_to_flax(sd, latte_model())


def test_converted_tree_matches_init(converted):
  _, params = converted
  model = latte_model()
  init = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, F, S, S, C)), jnp.zeros((1,)))
  chex.assert_trees_all_equal_shapes_and_dtypes(params, init)


@pytest.mark.parametrize("block", [0, 1])
def test_one_block_equals_latte_with_fused_qkv(converted, block):
  """Block 0 attends within frames, block 1 across frames; Latte sees both as plain sequences."""
  sd, params = converted
  rng = np.random.default_rng(1)
  h = rng.standard_normal((2, F * G * G, D)).astype(np.float32)
  c = rng.standard_normal((2, D)).astype(np.float32)
  ours = latte_model().apply(params, h, c, method=lambda m, h, c: m.blocks[block](h, c))
  if block == 0:  # (B, F*S, D) -> Latte's (B*F, S, D), conditions repeated per frame
    seq, cond = h.reshape(2 * F, G * G, D), np.repeat(c, F, axis=0)
    expected = latte_block(sd, 0, seq.astype(np.float64), cond).reshape(2, F * G * G, D)
  else:  # -> (B*S, F, D)
    seq = h.reshape(2, F, G * G, D).transpose(0, 2, 1, 3).reshape(2 * G * G, F, D)
    out = latte_block(sd, 1, seq.astype(np.float64), np.repeat(c, G * G, axis=0))
    expected = out.reshape(2, G * G, F, D).transpose(0, 2, 1, 3).reshape(2, F * G * G, D)
  np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


def test_full_forward_equals_latte(converted):
  sd, params = converted
  rng = np.random.default_rng(2)
  x = rng.standard_normal((2, F, C, S, S))
  t, y = np.array([3.0, 517.0]), np.array([1, CLASSES])  # a class and the unconditional label
  ours = latte_model().apply(
    params, jnp.asarray(x.transpose(0, 1, 3, 4, 2), jnp.float32), jnp.asarray(t), jnp.asarray(y)
  )
  chex.assert_shape(ours, (2, F, S, S, C))
  expected = latte_forward(sd, x, t, y).transpose(0, 1, 3, 4, 2)
  np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=2e-4)


def test_missing_unexpected_and_misshapen_keys_are_named():
  sd = latte_state_dict()
  model = latte_model()
  missing = {k: v for k, v in sd.items() if k != "blocks.1.attn.qkv.bias"}
  with pytest.raises(
    dit_convert.CheckpointError, match=r"missing keys \['blocks.1.attn.qkv.bias'\]"
  ):
    dit_convert.latte_to_flax(missing, model)
  with pytest.raises(dit_convert.CheckpointError, match=r"unexpected keys \['blocks.2.attn.qkv"):
    dit_convert.latte_to_flax(
      sd | {"blocks.2.attn.qkv.weight": sd["blocks.0.attn.qkv.weight"]}, model
    )
  bad = sd | {"blocks.0.attn.qkv.weight": np.zeros((3 * D, D + 1), np.float32)}
  with pytest.raises(
    dit_convert.CheckpointError, match=r"blocks.0.attn.qkv.weight: expected shape"
  ):
    dit_convert.latte_to_flax(bad, model)
  with pytest.raises(
    dit_convert.CheckpointError, match="final_layer.linear.weight: expected shape"
  ):
    dit_convert.latte_to_flax(sd, latte_model(learn_sigma=False))
  with pytest.raises(dit_convert.CheckpointError, match="temp_embed: differs"):
    dit_convert.latte_to_flax(sd | {"temp_embed": sd["temp_embed"] + 0.1}, model)
  with pytest.raises(dit_convert.CheckpointError, match="positions='latte'"):
    dit_convert.latte_to_flax(sd, latte_model(positions="sincos3d"))


def latte_method_config(path):
  config = bwcache_config.get_config()
  config.data.update(frames=F, size=S, channels=C)
  config.model.update(
    hidden=D,
    depth=DEPTH,
    heads=HEADS,
    patch=(1, P, P),
    attention="alternating",
    positions="latte",
    learn_sigma=True,
    num_classes=CLASSES,
    time_frequencies=FREQ,
    checkpoint=str(path),
    checkpoint_format="latte",
  )
  config.diffusion.kind = "ddpm"
  config.cache.sampler = "ddim"
  return config


@pytest.mark.slow
def test_safetensors_loader_through_the_method_config(tmp_path):
  sd = latte_state_dict()
  path = tmp_path / "latte.safetensors"
  save_file(sd, str(path))
  config = latte_method_config(path)
  bwcache.validate(config)
  state = bwcache.init_train_state(config, jax.random.key(0))
  chex.assert_trees_all_equal(state["params"], dit_convert.latte_to_flax(sd, latte_model()))
  assert bwcache.phases(config)[0].num_steps == 0


def test_loader_names_the_config_field_for_a_bad_state_dict(tmp_path):
  sd = latte_state_dict()
  del sd["final_layer.linear.bias"]
  path = tmp_path / "latte.safetensors"
  save_file(sd, str(path))
  with pytest.raises(ConfigError, match=r"config.model.checkpoint: .*final_layer.linear.bias"):
    bwcache.init_train_state(latte_method_config(path), jax.random.key(0))
