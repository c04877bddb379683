"""CLIP's image tower and both projections in Flax, with converters from transformers' `CLIPModel`.

The dual encoder of CLIP (Radford et al. 2021, "Learning Transferable Visual Models From Natural
Language Supervision", ICML 2021, Sec. 2.4-2.5): an image and a text map into one joint space where
the cosine similarity of their embeddings scores how well they match. The layout follows transformers'
`CLIPVisionModelWithProjection` and `CLIPModel.get_text_features`
(`transformers/models/clip/modeling_clip.py`):

  z_0 = [class_embedding; conv_p(x)] + position_embedding    p x p stride-p patches, no conv bias
  z_0 <- pre_layrnorm(z_0)                                   (the torch name keeps its typo)
  z_l = pre-LN blocks as the text tower's, without a mask    quick_gelu MLP, q/k/v with bias
  image_embeds = visual_projection(post_layernorm(z_L[:, 0]))   no bias

  text_embeds = text_projection(final_layer_norm(x_L)[n, argmax(ids[n])])   no bias

The text side pools at the EOS token, found as the position of the largest id (CLIP's EOS, 49407, is
the largest id of its vocabulary; transformers does this for the released configs, whose
`eos_token_id` is the legacy 2). The embeddings are returned unnormalised, as `get_image_features`
and `get_text_features` return them. ViT-L/14 (openai/clip-vit-large-patch14): width 1024, 24 layers,
16 heads, MLP 4096, 224 px, patch 14, projection 768. Parameter paths are the torch names with `.N`
written `_N`; `preprocess` resizes frames in [0, 1] to `image_size` (bilinear, the whole frame: no
centre crop) and normalises with CLIP's mean and standard deviation.
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

from core.nn import clip_text
from core.nn.convert import CheckpointError, Rule, apply_rules, layer_norm, linear, param_shapes

__all__ = [
  "CLIPTextWithProjection",
  "CLIPVisionConfig",
  "CLIPVisionModelWithProjection",
  "CheckpointError",
  "convert_clip_model",
  "convert_clip_text_projection",
  "convert_clip_vision",
  "preprocess",
]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# transformers' CLIPVisionConfig defaults, used for fields a config.json leaves out
TRANSFORMERS_DEFAULTS = {
  "hidden_size": 768,
  "intermediate_size": 3072,
  "num_hidden_layers": 12,
  "num_attention_heads": 12,
  "num_channels": 3,
  "image_size": 224,
  "patch_size": 32,
  "hidden_act": "quick_gelu",
  "layer_norm_eps": 1e-5,
}


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig:
  """The fields of transformers' `CLIPVisionConfig` (plus `projection_dim`) that shape the network
  (defaults: ViT-L/14)."""

  hidden_size: int = 1024
  intermediate_size: int = 4096
  num_hidden_layers: int = 24
  num_attention_heads: int = 16
  num_channels: int = 3
  image_size: int = 224
  patch_size: int = 14
  projection_dim: int = 768
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5

  def __post_init__(self):
    for name in (
      "hidden_size",
      "intermediate_size",
      "num_hidden_layers",
      "num_attention_heads",
      "num_channels",
      "image_size",
      "patch_size",
      "projection_dim",
    ):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"CLIPVisionConfig.{name}: must be >= 1, got {getattr(self, name)}")
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
        f"CLIPVisionConfig.hidden_size: {self.hidden_size} is not a multiple of "
        f"num_attention_heads={self.num_attention_heads}"
      )
    if self.image_size % self.patch_size:
      raise ValueError(
        f"CLIPVisionConfig.image_size: {self.image_size} is not a multiple of "
        f"patch_size={self.patch_size}"
      )
    if self.hidden_act not in clip_text.ACTIVATIONS:
      raise ValueError(
        f"CLIPVisionConfig.hidden_act: must be one of {sorted(clip_text.ACTIVATIONS)}, "
        f"got {self.hidden_act!r}"
      )

  @property
  def num_positions(self) -> int:
    return (self.image_size // self.patch_size) ** 2 + 1

  @classmethod
  def tiny(cls) -> CLIPVisionConfig:
    """A small network of the same layout (width 32, 2 layers, 32 px in 8 px patches)."""
    return cls(
      hidden_size=32,
      intermediate_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      image_size=32,
      patch_size=8,
      projection_dim=16,
    )

  @classmethod
  def from_transformers(cls, config: Mapping[str, Any]) -> CLIPVisionConfig:
    """From a full `CLIPModel`'s `config.json` (its `vision_config` and top-level `projection_dim`)
    or a `CLIPVisionConfig`'s; fields it leaves out take transformers' defaults (projection 512)."""
    config = dict(config)
    projection = config.get("projection_dim") or 512
    if "vision_config" in config:  # CLIPModel projects with its top-level projection_dim
      config = dict(config["vision_config"] or {})
    values = {k: config.get(k, default) for k, default in TRANSFORMERS_DEFAULTS.items()}
    values = {k: v for k, v in values.items() if v is not None}
    return cls(**values, projection_dim=projection)


class CLIPVisionModelWithProjection(nn.Module):
  """`apply(params, pixels)`: normalised pixels `[N, image_size, image_size, C]` (NHWC) ->
  `image_embeds [N, projection_dim]` float32 (unnormalised)."""

  config: CLIPVisionConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, pixels: jax.Array) -> jax.Array:
    config = self.config
    want = (config.image_size, config.image_size, config.num_channels)
    if pixels.ndim != 4 or tuple(pixels.shape[1:]) != want:
      raise ValueError(
        f"CLIPVisionModelWithProjection: pixels must be [N, *{want}], got {pixels.shape}"
      )
    x = nn.Conv(
      config.hidden_size,
      (config.patch_size,) * 2,
      strides=(config.patch_size,) * 2,
      padding="VALID",
      use_bias=False,
      dtype=self.dtype,
      name="patch_embedding",
    )(pixels.astype(self.dtype))
    x = x.reshape(x.shape[0], -1, config.hidden_size).astype(jnp.float32)
    cls = self.param("class_embedding", nn.initializers.normal(0.02), (config.hidden_size,))
    x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, x.shape[-1])), x], 1)
    table = nn.Embed(config.num_positions, config.hidden_size, name="position_embedding")
    x = clip_text.float32_layer_norm(config, "pre_layrnorm", x + table.embedding[None])
    x = clip_text.Encoder(config, self.dtype, causal=False, name="encoder")(x)
    pooled = clip_text.float32_layer_norm(config, "post_layernorm", x[:, 0])
    dense = nn.Dense(config.projection_dim, use_bias=False, name="visual_projection")
    return dense(pooled.astype(self.dtype)).astype(jnp.float32)


class CLIPTextWithProjection(nn.Module):
  """`apply(params, ids)`: ids `[N, L]` -> `text_embeds [N, projection_dim]` float32 (unnormalised):
  `clip_text.CLIPTextModel` pooled at the largest id of each row (EOS), then `text_projection`."""

  config: clip_text.CLIPTextConfig
  projection_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, ids: jax.Array) -> jax.Array:
    hidden = clip_text.CLIPTextModel(self.config, self.dtype, name="text_model")(ids)
    eos = jnp.argmax(jnp.asarray(ids), axis=-1)
    pooled = jnp.take_along_axis(hidden, eos[:, None, None], 1)[:, 0]
    dense = nn.Dense(self.projection_dim, use_bias=False, name="text_projection")
    return dense(pooled.astype(self.dtype)).astype(jnp.float32)


def preprocess(frames: jax.Array, config: CLIPVisionConfig) -> jax.Array:
  """Frames `[..., H, W, C]` in [0, 1] -> `[N, image_size, image_size, C]` normalised pixels
  (bilinear resize of the whole frame, then CLIP's mean / std)."""
  frames = jnp.asarray(frames, jnp.float32)
  if frames.ndim < 3 or frames.shape[-1] != config.num_channels:
    raise ValueError(
      f"clip_vision.preprocess: frames must be [..., H, W, {config.num_channels}], got {frames.shape}"
    )
  frames = frames.reshape(-1, *frames.shape[-3:])
  size = (frames.shape[0], config.image_size, config.image_size, frames.shape[-1])
  if frames.shape != size:
    frames = jax.image.resize(frames, size, "bilinear")
  return (frames - jnp.asarray(CLIP_MEAN)) / jnp.asarray(CLIP_STD)


# ---------------------------------------------------------------------------------------------------
# Converters
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def expected_shapes(config: CLIPVisionConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """`{flax path: shape}` of `CLIPVisionModelWithProjection(config)`'s parameters."""
  pixels = jax.ShapeDtypeStruct(
    (1, config.image_size, config.image_size, config.num_channels), jnp.float32
  )
  model = CLIPVisionModelWithProjection(config)
  return param_shapes(jax.eval_shape(model.init, jax.random.key(0), pixels))


def convert_clip_vision(state_dict: Mapping[str, np.ndarray], config: CLIPVisionConfig) -> dict:
  """A transformers `CLIPVisionModelWithProjection` state dict (`vision_model.*`,
  `visual_projection.weight`; numpy arrays) as `{"params": ...}` of
  `CLIPVisionModelWithProjection(config)`. An `embeddings.position_ids` buffer (older checkpoints)
  must be 0..P-1 and is dropped. A missing, unexpected or misshapen key raises `CheckpointError`."""
  state_dict = dict(state_dict)
  positions = state_dict.pop("vision_model.embeddings.position_ids", None)
  if positions is not None:
    want = np.arange(config.num_positions)[None]
    if np.shape(positions) != want.shape or not np.array_equal(positions, want):
      raise CheckpointError(
        f"vision_model.embeddings.position_ids: expected 0..{config.num_positions - 1}, "
        f"got shape {np.shape(positions)}"
      )
  expected = expected_shapes(config)
  return apply_rules(
    state_dict, _vision_rules(config, expected), expected, source="CLIPVisionModel"
  )


def _vision_rules(config: CLIPVisionConfig, expected) -> dict[str, Rule]:
  p = "vision_model."
  d, c, k = config.hidden_size, config.num_channels, config.patch_size
  rules: dict[str, Rule] = {
    f"{p}embeddings.class_embedding": ((d,), lambda w: {("class_embedding",): w}),
    f"{p}embeddings.patch_embedding.weight": (
      (d, c, k, k),
      lambda w: {("patch_embedding", "kernel"): np.transpose(w, (2, 3, 1, 0))},
    ),
    f"{p}embeddings.position_embedding.weight": (
      (config.num_positions, d),
      lambda w: {("position_embedding", "embedding"): w},
    ),
  }
  rules |= layer_norm(f"{p}pre_layrnorm", ("pre_layrnorm",), expected)
  rules |= layer_norm(f"{p}post_layernorm", ("post_layernorm",), expected)
  rules |= linear("visual_projection", ("visual_projection",), expected, bias=False)
  for i in range(config.num_hidden_layers):
    torch_layer, layer = f"{p}encoder.layers.{i}", ("encoder", f"layers_{i}")
    for name in ("layer_norm1", "layer_norm2"):
      rules |= layer_norm(f"{torch_layer}.{name}", layer + (name,), expected)
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj"):
      rules |= linear(f"{torch_layer}.{name}", layer + tuple(name.split(".")), expected)
    for name in ("mlp.fc1", "mlp.fc2"):
      rules |= linear(f"{torch_layer}.{name}", layer + tuple(name.split(".")), expected)
  return rules


def convert_clip_text_projection(
  state_dict: Mapping[str, np.ndarray], config: clip_text.CLIPTextConfig, projection_dim: int
) -> dict:
  """`text_model.*` and `text_projection.weight` of a transformers `CLIPModel` state dict as
  `{"params": ...}` of `CLIPTextWithProjection(config, projection_dim)`."""
  key = "text_projection.weight"
  if key not in state_dict:
    raise CheckpointError(f"CLIPTextWithProjection state dict: missing keys ['{key}']")
  weight = np.asarray(state_dict[key])
  if weight.shape != (projection_dim, config.hidden_size):
    raise CheckpointError(
      f"{key}: expected shape {(projection_dim, config.hidden_size)} for this model, got {weight.shape}"
    )
  text = {k: v for k, v in state_dict.items() if k != key}
  tower = clip_text.convert_clip_text(text, config)["params"]
  kernel = np.asarray(weight.T, np.float32)
  return {"params": {"text_model": tower, "text_projection": {"kernel": kernel}}}


def convert_clip_model(
  state_dict: Mapping[str, np.ndarray],
  text_config: clip_text.CLIPTextConfig,
  vision_config: CLIPVisionConfig,
) -> tuple[dict, dict]:
  """A full transformers `CLIPModel` state dict -> (vision params, text params); `logit_scale` is
  not used (retrieval ranks by cosine similarity)."""
  vision = {
    k: v for k, v in state_dict.items() if k.startswith(("vision_model.", "visual_projection."))
  }
  text = {k: v for k, v in state_dict.items() if k.startswith(("text_model.", "text_projection."))}
  other = sorted(state_dict.keys() - vision.keys() - text.keys() - {"logit_scale"})
  if other:
    raise CheckpointError(
      f"CLIPModel state dict does not fit the model: unexpected keys {other[:8]}"
    )
  return (
    convert_clip_vision(vision, vision_config),
    convert_clip_text_projection(text, text_config, vision_config.projection_dim),
  )
