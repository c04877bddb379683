"""SD-1.5's UNet, IC-Light fc and AnimateDiff's motion modules in Flax against diffusers.

The fixtures (tests/fixtures/make_sd_unet.py) hold diffusers' `UNet2DConditionModel` and two
`MotionAdapter` state dicts at a tiny config of SD-1.5's layout (CrossAttnDownBlock2D + DownBlock2D,
UpBlock2D + CrossAttnUpBlock2D, GEGLU transformers; v1-5-3's adapter without a mid-block motion module
and one with it), randomly initialised, and the torch outputs on fixed inputs (the UNet, IC-Light's
8-channel UNet, `UNetMotionModel.from_unet2d`); the converted Flax UNet must reproduce them.
"""

import dataclasses
import functools
import json

import fixture_files
import jax
import numpy as np
import pytest

from core.nn import sd_unet, sd_unet_convert
from core.nn.convert import CheckpointError

ATOL = 1e-4


def _fixture(name):
  arrays = fixture_files.arrays(name)
  sub = functools.partial(fixture_files.state_dict, arrays)
  return arrays, sub


def _unet_fixture():
  arrays, sub = _fixture("sd_unet")
  return arrays, sub("unet/"), json.loads(str(arrays["config"]))


def iclight_offsets(shapes):
  """The generator's closed-form offsets (tests/fixtures/make_sd_unet.py `iclight_offsets`)."""
  shapes = {**shapes, "conv_in.weight": (shapes["conv_in.weight"][0], 8, 3, 3)}
  out = {}
  for i, key in enumerate(sorted(shapes)):
    scale = 0.3 if key == "conv_in.weight" else 0.05
    values = scale * np.cos(0.7 * np.arange(np.prod(shapes[key])) + i)
    out[key] = values.reshape(shapes[key]).astype(np.float32)
  return out


@functools.cache
def _jitted(config):
  return jax.jit(sd_unet.UNet(config).apply, static_argnums=4)


def _apply(config, params, x, t, text, frames=1):
  return np.asarray(_jitted(config)(params, x, t, text, frames))


def test_unet_matches_diffusers():
  arrays, state, cfg = _unet_fixture()
  config = sd_unet.UNetConfig.from_diffusers(cfg)
  assert config.heads == (2, 2) and not config.motion
  params = sd_unet_convert.convert_unet(state, config)
  out = _apply(config, params, arrays["x"], arrays["t"], arrays["text"])
  np.testing.assert_allclose(out, arrays["eps"], atol=ATOL)


def test_iclight_fc_widened_conv_in_matches_diffusers():
  arrays, base, cfg = _unet_fixture()
  config = sd_unet.UNetConfig.from_diffusers({**cfg, "in_channels": 8})
  offsets = iclight_offsets({k: v.shape for k, v in base.items()})
  params = sd_unet_convert.iclight_unet(base, offsets, config)
  assert params["params"]["conv_in"]["kernel"].shape == (3, 3, 8, 8)
  out = _apply(config, params, arrays["x8"], arrays["t"], arrays["text"])
  np.testing.assert_allclose(out, arrays["eps_iclight"], atol=ATOL)
  with pytest.raises(CheckpointError, match="in_channels = 8"):
    sd_unet_convert.iclight_unet(base, offsets, sd_unet.UNetConfig.from_diffusers(cfg))


def _motion(name):
  """The UNet of sd_unet.npz with the fixture's adapter `name` ("motion": v1-5-3's layout,
  "motion_mid": with a mid-block motion module): config, merged state dict, arrays."""
  arrays, sub = _fixture("sd_unet_motion")
  _, base, cfg = _unet_fixture()
  adapter = sub(f"{name}/")
  assert adapter and all(".motion_modules." in k for k in adapter)
  config = sd_unet.UNetConfig.from_diffusers(cfg)
  config = config.with_motion(json.loads(str(arrays[f"{name}_config"])))
  return config, sd_unet_convert.merge_motion(base, adapter), arrays


@pytest.mark.parametrize(
  "name",
  ["motion", pytest.param("motion_mid", marks=pytest.mark.slow)],  # v1-5-3 has no mid module
)
def test_motion_unet_matches_unet_motion_model(name):
  config, state, arrays = _motion(name)
  assert config.motion and config.motion_mid_block == (name == "motion_mid")
  params = sd_unet_convert.convert_unet(state, config)
  frames = int(arrays["num_frames"])
  out = _apply(config, params, arrays["x"], arrays["t"], arrays["text"], frames)
  np.testing.assert_allclose(out, arrays[f"{name}_eps"], atol=ATOL)
  # the frames interact: the first frame's output moves when only the last frame's input does
  x = arrays["x"].copy()
  x[-1] += 1.0
  moved = _apply(config, params, x, arrays["t"], arrays["text"], frames)
  assert np.abs(moved[0] - out[0]).max() > 1e-3


def test_errors_name_the_key():
  _, state, cfg = _unet_fixture()
  config = sd_unet.UNetConfig.from_diffusers(cfg)
  key = "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"
  missing = {k: v for k, v in state.items() if k != key}
  with pytest.raises(CheckpointError, match="missing keys.*attn2.to_k.weight"):
    sd_unet_convert.convert_unet(missing, config)
  with pytest.raises(CheckpointError, match=f"{key}: expected shape"):
    sd_unet_convert.convert_unet({**state, key: state[key][:, :3]}, config)
  with pytest.raises(CheckpointError, match="unexpected keys.*extra.weight"):
    sd_unet_convert.convert_unet({**state, "extra.weight": np.zeros(1)}, config)
  with pytest.raises(
    CheckpointError, match="model.diffusion_model.input_blocks.0.0.weight: an original LDM"
  ):
    sd_unet_convert.convert_unet(
      {"model.diffusion_model.input_blocks.0.0.weight": np.zeros(1)}, config
    )
  with pytest.raises(CheckpointError, match="'conv_in.weight' is not a motion-module key"):
    sd_unet_convert.merge_motion(state, {"conv_in.weight": state["conv_in.weight"]})


def test_motion_position_buffers_are_checked():
  config, state, _ = _motion("motion")
  pe = "up_blocks.1.motion_modules.1.transformer_blocks.0.pos_embed.pe"
  np.testing.assert_allclose(state[pe], sd_unet.frame_positions(8, 8), atol=1e-6)
  with pytest.raises(CheckpointError, match=f"{pe}: not the sinusoidal"):
    sd_unet_convert.convert_unet({**state, pe: state[pe] + 0.1}, config)
  # v1-5-3's adapter onto a model that expects a mid-block module: the missing key is named
  mid = dataclasses.replace(config, motion_mid_block=True)
  with pytest.raises(CheckpointError, match="missing keys.*mid_block.motion_modules.0"):
    sd_unet_convert.convert_unet(state, mid)
  with pytest.raises(ValueError, match="motion_layers_per_block"):
    config.with_motion({"motion_layers_per_block": 3})


def test_config_refuses_other_layouts_and_names_torch_keys():
  _, _, cfg = _unet_fixture()
  with pytest.raises(ValueError, match="down_block_types"):
    sd_unet.UNetConfig.from_diffusers({**cfg, "down_block_types": ["DownBlock2D"] * 2})
  with pytest.raises(ValueError, match="use_linear_projection"):
    sd_unet.UNetConfig.from_diffusers({**cfg, "use_linear_projection": True})
  sd15 = sd_unet.UNetConfig.sd15(in_channels=8, motion=True)
  assert sd15.block_out_channels == (320, 640, 1280, 1280) and sd15.heads == (8,) * 4
  assert (
    sd_unet_convert.torch_name(
      ("mid_block_attentions_0", "transformer_blocks_0", "ff", "net_0", "proj", "kernel")
    )
    == "mid_block.attentions.0.transformer_blocks.0.ff.net.0.proj.weight"
  )
  assert (
    sd_unet_convert.torch_name(("time_embedding_linear_1", "bias"))
    == "time_embedding.linear_1.bias"
  )
