"""CLIP's text transformer in Flax, with a converter from transformers' `CLIPTextModel` state dict.

The text encoder of CLIP (Radford et al. 2021, "Learning Transferable Visual Models From Natural
Language Supervision", ICML 2021, Sec. 2.4) that Stable Diffusion 1.5 conditions on (Rombach et al.
2022, "High-Resolution Image Synthesis with Latent Diffusion Models", CVPR 2022, Sec. 3.3: the
cross-attention context is the last hidden state of CLIP ViT-L/14's text tower, all 77 positions,
after its final LayerNorm). LightCtrl (ICLR 2026, github.com/GVCLab/LightCtrl) runs on SD-1.5
(Realistic Vision 5.1), whose `text_encoder` is this network.

The layout follows transformers' `CLIPTextModel` (`transformers/models/clip/modeling_clip.py`):

  x_0 = token_embedding[ids] + position_embedding[0..L-1]      learned positions, L <= 77
  x'_l = x_{l-1} + out_proj(MHA(layer_norm1(x_{l-1})))          causal self-attention, q/k/v with bias
  x_l = x'_l + fc2(act(fc1(layer_norm2(x'_l))))                  act: quick_gelu = x * sigmoid(1.702 x)
  out = final_layer_norm(x_L)                                    [N, L, D]

LayerNorms have eps `layer_norm_eps` (1e-5). ViT-L/14's text tower: width 768, 12 layers, 12 heads,
MLP 3072, vocabulary 49408. Parameter paths are the torch names with `.N` written `_N`
(`encoder/layers_3/self_attn/q_proj/kernel` for `text_model.encoder.layers.3.self_attn.q_proj.weight`).
No padding mask is applied, as in SD's pipelines (which pass none): padded positions only see what
is before them, so the padding does not change the earlier positions. The pooled (EOS) output and
the projection of the full CLIP model are not part of this port. `CLIPTokenizer` (from
`core.data.clip_tokenizer`) gives the `[N, 77]` ids.

Compute dtype: the Linears and the embedding lookup run in `dtype` (float32 by default); LayerNorms
and the softmax run in float32, and the output is float32.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from core.data.clip_tokenizer import CLIPTokenizer
from core.nn import attention as attention_lib
from core.nn.convert import CheckpointError, Rule, apply_rules, layer_norm, linear, param_shapes

__all__ = [
  "CLIPTextConfig",
  "CLIPTextModel",
  "CLIPTokenizer",
  "CheckpointError",
  "convert_clip_text",
]

ACTIVATIONS = {
  "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
  "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}
# transformers' CLIPTextConfig defaults, used for fields a config.json leaves out
TRANSFORMERS_DEFAULTS = {
  "vocab_size": 49408,
  "hidden_size": 512,
  "intermediate_size": 2048,
  "num_hidden_layers": 12,
  "num_attention_heads": 8,
  "max_position_embeddings": 77,
  "hidden_act": "quick_gelu",
  "layer_norm_eps": 1e-5,
}
PREFIX = "text_model."  # released CLIPTextModel checkpoints; transformers 5 drops it in memory


@dataclasses.dataclass(frozen=True)
class CLIPTextConfig:
  """The fields of transformers' `CLIPTextConfig` that shape the network (defaults: ViT-L/14)."""

  vocab_size: int = 49408
  hidden_size: int = 768
  intermediate_size: int = 3072
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  max_position_embeddings: int = 77
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5

  def __post_init__(self):
    for name in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_hidden_layers",
      "num_attention_heads",
      "max_position_embeddings",
    ):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"CLIPTextConfig.{name}: must be >= 1, got {getattr(self, name)}")
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
        f"CLIPTextConfig.hidden_size: {self.hidden_size} is not a multiple of "
        f"num_attention_heads={self.num_attention_heads}"
      )
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(
        f"CLIPTextConfig.hidden_act: must be one of {sorted(ACTIVATIONS)}, got {self.hidden_act!r}"
      )

  @classmethod
  def tiny(cls) -> CLIPTextConfig:
    """A small network of the same layout (77 positions, quick_gelu, MLP 4x the width)."""
    return cls(
      vocab_size=600,
      hidden_size=32,
      intermediate_size=128,
      num_hidden_layers=2,
      num_attention_heads=4,
    )

  @classmethod
  def from_transformers(cls, config: Mapping[str, Any]) -> CLIPTextConfig:
    """From a `config.json` of a `CLIPTextModel` (SD-1.5's `text_encoder/config.json`) or of a full
    `CLIPModel` (its `text_config`, e.g. openai/clip-vit-large-patch14); fields it leaves out take
    transformers' defaults."""
    config = dict(config)
    if "text_config" in config:
      config = dict(config["text_config"] or {})
    values = {k: config.get(k, default) for k, default in TRANSFORMERS_DEFAULTS.items()}
    return cls(**{k: v for k, v in values.items() if v is not None})


class SelfAttention(nn.Module):
  """transformers' `CLIPAttention` (scale head_dim**-0.5): causal in the text tower, unmasked in the
  vision tower (`core/nn/clip_vision.py`). `config` is either tower's config: the encoder reads only
  the fields they share."""

  config: Any
  dtype: Any = jnp.float32
  causal: bool = True

  @nn.compact
  def __call__(self, x):
    n, length, d = x.shape
    heads = self.config.num_attention_heads
    q, k, v = (
      nn.Dense(d, dtype=self.dtype, name=name)(x).reshape(n, length, heads, d // heads)
      for name in ("q_proj", "k_proj", "v_proj")
    )
    mask = attention_lib.causal_mask() if self.causal else None
    out = attention_lib.attention(q, k, v, mask)
    return nn.Dense(d, dtype=self.dtype, name="out_proj")(out.reshape(n, length, d))


class Mlp(nn.Module):
  config: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.config.intermediate_size, dtype=self.dtype, name="fc1")(x)
    h = ACTIVATIONS[self.config.hidden_act](h)
    return nn.Dense(self.config.hidden_size, dtype=self.dtype, name="fc2")(h)


class EncoderLayer(nn.Module):
  """transformers' `CLIPEncoderLayer`: pre-norm self-attention and MLP, both residual; the residual
  stream stays float32."""

  config: Any
  dtype: Any = jnp.float32
  causal: bool = True

  @nn.compact
  def __call__(self, x):
    h = float32_layer_norm(self.config, "layer_norm1", x).astype(self.dtype)
    attention = SelfAttention(self.config, self.dtype, self.causal, name="self_attn")
    x = x + attention(h).astype(jnp.float32)
    h = float32_layer_norm(self.config, "layer_norm2", x).astype(self.dtype)
    return x + Mlp(self.config, self.dtype, name="mlp")(h).astype(jnp.float32)


def float32_layer_norm(config, name: str, x):
  """LayerNorm with `config.layer_norm_eps`, computed in float32 (either tower's config)."""
  norm = nn.LayerNorm(epsilon=config.layer_norm_eps, use_fast_variance=False, name=name)
  return norm(x.astype(jnp.float32))


class Embeddings(nn.Module):
  """transformers' `CLIPTextEmbeddings`: token embedding plus learned absolute positions."""

  config: CLIPTextConfig

  @nn.compact
  def __call__(self, ids):
    config = self.config
    tokens = nn.Embed(config.vocab_size, config.hidden_size, name="token_embedding")(ids)
    table = nn.Embed(config.max_position_embeddings, config.hidden_size, name="position_embedding")
    return (tokens + table.embedding[: ids.shape[1]]).astype(jnp.float32)


class Encoder(nn.Module):
  """transformers' `CLIPEncoder`, of the text tower (`causal`) or of the vision tower."""

  config: Any
  dtype: Any = jnp.float32
  causal: bool = True

  @nn.compact
  def __call__(self, x):
    for i in range(self.config.num_hidden_layers):
      x = EncoderLayer(self.config, self.dtype, self.causal, name=f"layers_{i}")(x)
    return x


class CLIPTextModel(nn.Module):
  """`apply(params, ids)`: ids `[N, L]` (int, L <= max_position_embeddings) -> the last hidden state
  after the final LayerNorm, `[N, L, hidden_size]` float32."""

  config: CLIPTextConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, ids: jax.Array) -> jax.Array:
    config = self.config
    ids = jnp.asarray(ids)
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
      raise ValueError(f"CLIPTextModel: ids must be integers [N, L], got {ids.dtype} {ids.shape}")
    if ids.shape[1] > config.max_position_embeddings:
      raise ValueError(
        f"CLIPTextModel: ids {ids.shape} are longer than max_position_embeddings="
        f"{config.max_position_embeddings}"
      )
    x = Embeddings(config, name="embeddings")(ids)
    x = Encoder(config, self.dtype, name="encoder")(x)
    return float32_layer_norm(config, "final_layer_norm", x)


# ---------------------------------------------------------------------------------------------------
# Converter
# ---------------------------------------------------------------------------------------------------


def convert_clip_text(state_dict: Mapping[str, np.ndarray], config: CLIPTextConfig) -> dict:
  """A transformers `CLIPTextModel` state dict (torch names, numpy arrays) as `{"params": ...}` of
  `CLIPTextModel(config)` (float32). Keys carry the `text_model.` prefix of released checkpoints
  (SD-1.5's `text_encoder`) or, where no key has it, none (transformers 5 in memory); a full
  `CLIPModel`'s state dict is read by passing its `text_model.` keys. The
  `embeddings.position_ids` buffer that older checkpoints hold must be 0..P-1 and is dropped.
  Linear weights `[out, in]` become kernels `[in, out]`. A missing, unexpected or misshapen key
  raises `CheckpointError` naming it."""
  prefix = PREFIX if any(key.startswith(PREFIX) for key in state_dict) else ""
  state_dict = dict(state_dict)
  positions = state_dict.pop(f"{prefix}embeddings.position_ids", None)
  if positions is not None:
    want = np.arange(config.max_position_embeddings)[None]
    if np.shape(positions) != want.shape or not np.array_equal(positions, want):
      raise CheckpointError(
        f"{prefix}embeddings.position_ids: expected 0..{config.max_position_embeddings - 1} "
        f"of shape {want.shape}, got shape {np.shape(positions)}"
      )
  expected = expected_shapes(config)
  rules = _rules(config, expected, prefix)
  return apply_rules(state_dict, rules, expected, source="CLIPTextModel")


@functools.lru_cache(maxsize=8)
def expected_shapes(config: CLIPTextConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """`{flax path: shape}` of `CLIPTextModel(config)`'s parameters (traced once per config)."""
  ids = jax.ShapeDtypeStruct((1, config.max_position_embeddings), jnp.int32)
  return param_shapes(jax.eval_shape(CLIPTextModel(config).init, jax.random.key(0), ids))


def _embedding(torch_name: str, path: tuple[str, ...], expected) -> dict[str, Rule]:
  shape = expected[path + ("embedding",)]
  return {f"{torch_name}.weight": (shape, lambda w: {path + ("embedding",): w})}


def _rules(config: CLIPTextConfig, expected, prefix: str) -> dict[str, Rule]:
  p = prefix
  rules = _embedding(f"{p}embeddings.token_embedding", ("embeddings", "token_embedding"), expected)
  rules |= _embedding(
    f"{p}embeddings.position_embedding", ("embeddings", "position_embedding"), expected
  )
  rules |= layer_norm(f"{p}final_layer_norm", ("final_layer_norm",), expected)
  for i in range(config.num_hidden_layers):
    torch_layer, layer = f"{p}encoder.layers.{i}", ("encoder", f"layers_{i}")
    for name in ("layer_norm1", "layer_norm2"):
      rules |= layer_norm(f"{torch_layer}.{name}", layer + (name,), expected)
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj"):
      rules |= linear(f"{torch_layer}.{name}", layer + tuple(name.split(".")), expected)
    for name in ("mlp.fc1", "mlp.fc2"):
      rules |= linear(f"{torch_layer}.{name}", layer + tuple(name.split(".")), expected)
  return rules
