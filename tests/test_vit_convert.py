"""DINO ViT checkpoints into `core.nn.vit.ViT`: the converted model against a numpy DINO forward.

The state dict is random, laid out as DINO's released ViT-S/16 backbone (`dino_deitsmall16_pretrain.pth`,
github.com/facebookresearch/dino `vision_transformer.py`): width 384, 6 heads, 16-px patches, a
[1, 197, 384] position table for 224-px images, with 2 of the 12 blocks to stay fast. The reference
forward below reads those arrays in DINO's own NCHW layout and resizes the position table inside the
forward as `interpolate_pos_encoding` does (a per-pixel loop over torch's bicubic formula), so
nothing in it comes from the converter or from `ViT`.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from core.nn import vit_convert
from core.nn.vit import IMAGENET_MEAN, IMAGENET_STD, ViT

D, HEADS, P, DEPTH, N = 384, 6, 16, 2, 14  # ViT-S/16 at 224 px: a 14 x 14 grid


def dino_model(**overrides) -> ViT:
  return ViT(**(dict(patch=P, width=D, depth=DEPTH, num_heads=HEADS, mlp_ratio=4) | overrides))


def dino_state_dict(seed: int = 0, scale: float = 0.1) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)

  def r(*shape, loc=0.0):
    return (loc + scale * rng.standard_normal(shape)).astype(np.float32)

  sd = {
    "cls_token": r(1, 1, D),
    "pos_embed": r(1, 1 + N * N, D),
    "patch_embed.proj.weight": r(D, 3, P, P),
    "patch_embed.proj.bias": r(D),
    "norm.weight": r(D, loc=1.0),
    "norm.bias": r(D),
  }
  for i in range(DEPTH):
    b = f"blocks.{i}."
    sd |= {
      b + "norm1.weight": r(D, loc=1.0),
      b + "norm1.bias": r(D),
      b + "attn.qkv.weight": r(3 * D, D),
      b + "attn.qkv.bias": r(3 * D),
      b + "attn.proj.weight": r(D, D),
      b + "attn.proj.bias": r(D),
      b + "norm2.weight": r(D, loc=1.0),
      b + "norm2.bias": r(D),
      b + "mlp.fc1.weight": r(4 * D, D),
      b + "mlp.fc1.bias": r(4 * D),
      b + "mlp.fc2.weight": r(D, 4 * D),
      b + "mlp.fc2.bias": r(D),
    }
  return sd


# ---------------------------------------------------------------------------------------------------
# DINO's forward in numpy, from the torch-layout arrays
# ---------------------------------------------------------------------------------------------------


def _linear(sd, name, x):
  return x @ sd[name + ".weight"].astype(np.float64).T + sd[name + ".bias"]


def _layer_norm(sd, name, x, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * sd[name + ".weight"] + sd[name + ".bias"]


def torch_bicubic(image, scale_factor, a=-0.75):
  """`F.interpolate(image[None], scale_factor=s, mode="bicubic")` (align_corners=False) for a
  `[C, n, n]` array: output size floor(n * s), source `(i + 0.5) / s - 0.5`, borders clamped."""
  channels, n, _ = image.shape
  size = math.floor(n * scale_factor)

  def cc1(x):
    return ((a + 2) * x - (a + 3)) * x * x + 1

  def cc2(x):
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

  def taps(o):
    real = (o + 0.5) / scale_factor - 0.5
    base = math.floor(real)
    t = real - base
    weights = (cc2(t + 1), cc1(t), cc1(1 - t), cc2(2 - t))
    return [(min(max(base - 1 + k, 0), n - 1), weights[k]) for k in range(4)]

  out = np.zeros((channels, size, size))
  for oy in range(size):
    for ox in range(size):
      for iy, wy in taps(oy):
        for ix, wx in taps(ox):
          out[:, oy, ox] += wy * wx * image[:, iy, ix]
  return out


def dino_positions(sd, grid):
  """`VisionTransformer.interpolate_pos_encoding` for a `grid x grid` patch input."""
  table = sd["pos_embed"].astype(np.float64)
  if grid == N:
    return table
  patches = table[0, 1:].reshape(N, N, D).transpose(2, 0, 1)
  patches = torch_bicubic(patches, (grid + 0.1) / N)
  return np.concatenate([table[:, :1], patches.transpose(1, 2, 0).reshape(1, grid * grid, D)], 1)


def dino_attention(sd, name, x):
  b, n, d = x.shape
  qkv = _linear(sd, name + ".qkv", x).reshape(b, n, 3, HEADS, d // HEADS).transpose(2, 0, 3, 1, 4)
  q, k, v = qkv
  logits = q @ k.transpose(0, 1, 3, 2) * (d // HEADS) ** -0.5
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return _linear(sd, name + ".proj", (weights @ v).transpose(0, 2, 1, 3).reshape(b, n, d))


def dino_forward(sd, x):
  """All tokens after the final norm, `[B, 1 + g*g, D]`, for a normalised `(B, 3, H, W)` input."""
  b, _, h, _ = x.shape
  g = h // P
  patches = x.reshape(b, 3, g, P, g, P)
  w = sd["patch_embed.proj.weight"].astype(np.float64)
  tokens = np.einsum("bcupvq,dcpq->buvd", patches, w).reshape(b, g * g, D)
  tokens = tokens + sd["patch_embed.proj.bias"]
  cls = np.broadcast_to(sd["cls_token"], (b, 1, D))
  x = np.concatenate([cls, tokens], axis=1) + dino_positions(sd, g)
  for i in range(DEPTH):
    x = x + dino_attention(sd, f"blocks.{i}.attn", _layer_norm(sd, f"blocks.{i}.norm1", x))
    hidden = _linear(sd, f"blocks.{i}.mlp.fc1", _layer_norm(sd, f"blocks.{i}.norm2", x))
    hidden = 0.5 * hidden * (1 + erf(hidden / math.sqrt(2)))  # nn.GELU(): the exact GELU
    x = x + _linear(sd, f"blocks.{i}.mlp.fc2", hidden)
  return _layer_norm(sd, "norm", x)


# ---------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def state_dict():
  return dino_state_dict()


@pytest.mark.parametrize(
  "size",
  [pytest.param(224, marks=pytest.mark.slow), 48],
  ids=["224px_own_grid", "48px_interpolated"],
)
def test_converted_model_equals_dino(state_dict, size):
  model = dino_model()
  params = vit_convert.dino_to_flax(state_dict, model, size)
  init = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, size, size, 3)))
  chex.assert_trees_all_equal_shapes_and_dtypes(params, init)
  images = np.random.default_rng(1).uniform(size=(2, size, size, 3))
  out = jax.jit(model.apply)(params, jnp.asarray(images, jnp.float32))
  normalised = (images - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
  expected = dino_forward(state_dict, normalised.transpose(0, 3, 1, 2))
  g = size // P
  chex.assert_shape((out.cls, out.grid), [(2, D), (2, g, g, D)])
  np.testing.assert_allclose(out.cls, expected[:, 0], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out.grid, expected[:, 1:].reshape(2, g, g, D), rtol=1e-4, atol=1e-4)


def test_position_interpolation_is_dinos_bicubic():
  rng = np.random.default_rng(2)
  table = rng.standard_normal((5 * 5, 3))
  for grid in (2, 3, 8):
    got = vit_convert.interpolate_positions(table, grid)
    square = table.reshape(5, 5, 3).transpose(2, 0, 1)
    expected = torch_bicubic(square, (grid + 0.1) / 5).transpose(1, 2, 0).reshape(-1, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
  np.testing.assert_array_equal(vit_convert.interpolate_positions(table, 5), table)
  constant = vit_convert.interpolate_positions(np.full((25, 2), 0.3), 7)
  np.testing.assert_allclose(constant, 0.3, rtol=1e-12)  # the weights sum to one
  with pytest.raises(ValueError, match="not a square grid"):
    vit_convert.interpolate_positions(table[:24], 3)


def test_missing_unexpected_and_misshapen_keys_are_named(state_dict):
  model, error = dino_model(), vit_convert.CheckpointError
  missing = {k: v for k, v in state_dict.items() if k != "blocks.1.attn.qkv.bias"}
  with pytest.raises(error, match=r"missing keys \['blocks.1.attn.qkv.bias'\]"):
    vit_convert.dino_to_flax(missing, model, 32)
  extra = state_dict | {"blocks.2.mlp.fc1.weight": state_dict["blocks.0.mlp.fc1.weight"]}
  with pytest.raises(error, match=r"unexpected keys \['blocks.2.mlp.fc1.weight'\]"):
    vit_convert.dino_to_flax(extra, model, 32)
  bad = state_dict | {"blocks.0.mlp.fc2.weight": np.zeros((D, 3 * D), np.float32)}
  with pytest.raises(error, match=r"blocks.0.mlp.fc2.weight: expected shape \(384, 1536\)"):
    vit_convert.dino_to_flax(bad, model, 32)
  with pytest.raises(error, match=r"patch_embed.proj.weight: expected shape \(384, 3, 8, 8\)"):
    vit_convert.dino_to_flax(state_dict, dino_model(patch=8), 32)
  with pytest.raises(error, match=r"pos_embed: expected shape \(1, 1 \+ n\*n, 384\)"):
    vit_convert.dino_to_flax(state_dict | {"pos_embed": np.zeros((1, 196, D))}, model, 32)
  with pytest.raises(error, match=r"cls_token: expected shape \(1, 1, 192\)"):
    vit_convert.dino_to_flax(state_dict, dino_model(width=192), 32)


def test_npz_round_trip(state_dict, tmp_path):
  path = tmp_path / "dino.npz"
  np.savez(path, **state_dict)
  loaded = vit_convert.read_npz(str(path))
  assert loaded.keys() == state_dict.keys()
  np.testing.assert_array_equal(
    loaded["blocks.1.attn.qkv.weight"], state_dict["blocks.1.attn.qkv.weight"]
  )
