"""`core.nn.sd_vae` against diffusers' `AutoencoderKL`.

`fixtures/sd_vae.npz` (written by `fixtures/make_sd_vae.py` with torch and diffusers) holds a tiny
randomly initialised diffusers `AutoencoderKL` of Stable Diffusion 1.5's layout, its config and its
encode / decode outputs on fixed inputs. The state dict is converted with `convert_vae` and the Flax
network must give the same outputs.
"""

import dataclasses
import json

import fixture_files
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.nn import sd_vae

ATOL = 1e-4


@pytest.fixture(scope="module")
def fixture():
  arrays = fixture_files.arrays("sd_vae")
  state_dict = fixture_files.state_dict(arrays)
  config = sd_vae.VAEConfig.from_diffusers(json.loads(str(arrays["config_json"])))
  return state_dict, config, arrays


@pytest.fixture(scope="module")
def converted(fixture):
  state_dict, config, _ = fixture
  return sd_vae.convert_vae(state_dict, config)


def test_config_reads_diffusers_json_and_tiny_is_the_fixture_layout(fixture):
  _, config, _ = fixture
  assert config == sd_vae.VAEConfig.tiny()
  assert config.scaling_factor == pytest.approx(0.18215) and config.downsampling == 4


def test_encode_and_decode_match_diffusers(fixture, converted):
  _, config, arrays = fixture
  model = sd_vae.AutoencoderKL(config)

  def both(params, x, z):  # one compiled program for both halves
    return model.apply(params, x, method="encode"), model.apply(params, z, method="decode")

  (mean, logvar), decoded = jax.jit(both)(converted, arrays["x"], arrays["z"])
  assert mean.shape == logvar.shape == (2, 4, 6, config.latent_channels)
  np.testing.assert_allclose(mean, arrays["mean"], atol=ATOL, rtol=1e-4)
  np.testing.assert_allclose(logvar, arrays["logvar"], atol=ATOL, rtol=1e-4)
  assert decoded.shape == (2, 16, 24, 3)
  np.testing.assert_allclose(decoded, arrays["decoded"], atol=ATOL, rtol=1e-4)


def test_old_attention_names_convert_to_the_same_parameters(fixture, converted):
  state_dict, config, _ = fixture
  renamed = {}
  for key, value in state_dict.items():
    for new, old in sd_vae.OLD_ATTENTION_NAMES.items():
      key = key.replace(f".attentions.0.{new}.", f".attentions.0.{old}.")
    renamed[key] = value
  assert renamed.keys() != state_dict.keys()
  old = sd_vae.convert_vae(renamed, config)
  jax.tree.map(np.testing.assert_array_equal, old, converted)
  mixed = renamed | {
    "encoder.mid_block.attentions.0.to_q.bias": renamed["encoder.mid_block.attentions.0.query.bias"]
  }
  with pytest.raises(sd_vae.CheckpointError, match="mixes attention names"):
    sd_vae.convert_vae(mixed, config)


def test_optional_parts_follow_the_config(fixture):
  state_dict, config, _ = fixture
  config = dataclasses.replace(config, use_quant_conv=False, mid_block_add_attention=False)
  kept = {k: v for k, v in state_dict.items() if "quant_conv" not in k or "post_" in k}
  kept = {k: v for k, v in kept.items() if ".attentions." not in k}
  params = sd_vae.convert_vae(kept, config)["params"]
  assert "quant_conv" not in params and "post_quant_conv" in params
  assert "attentions_0" not in params["decoder"]["mid_block"]
  with pytest.raises(sd_vae.CheckpointError, match=r"unexpected keys \['decoder.mid_block"):
    sd_vae.convert_vae({k: v for k, v in state_dict.items() if "quant_conv." not in k}, config)


def test_conversion_errors_name_the_key(fixture):
  state_dict, config, _ = fixture
  error = sd_vae.CheckpointError
  key = "decoder.up_blocks.1.resnets.2.conv1.weight"
  with pytest.raises(error, match=rf"missing keys \['{key}'\]"):
    sd_vae.convert_vae({k: v for k, v in state_dict.items() if k != key}, config)
  extra = "encoder.down_blocks.3.resnets.0.conv1.bias"
  with pytest.raises(error, match=rf"unexpected keys \['{extra}'\]"):
    sd_vae.convert_vae(state_dict | {extra: np.zeros(8, np.float32)}, config)
  bad = state_dict | {"quant_conv.weight": np.zeros((8, 8, 3, 3), np.float32)}
  with pytest.raises(error, match=r"quant_conv.weight: expected shape \(8, 8, 1, 1\)"):
    sd_vae.convert_vae(bad, config)


def test_sd15_layout_has_diffusers_parameter_count_and_shapes(fixture):
  _, _, arrays = fixture
  config = sd_vae.VAEConfig()
  model = sd_vae.AutoencoderKL(config)
  x = jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32)
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  assert sum(leaf.size for leaf in jax.tree.leaves(params)) == int(arrays["sd15_param_count"])
  mean, _ = jax.eval_shape(lambda p, x: model.apply(p, x, method="encode"), params, x)
  assert mean.shape == (1, 8, 8, 4)
  out = jax.eval_shape(lambda p, z: model.apply(p, z, method="decode"), params, mean)
  assert out.shape == (1, 64, 64, 3)


def test_bad_inputs_and_configs_are_named():
  model = sd_vae.AutoencoderKL(sd_vae.VAEConfig.tiny())
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4, 4, 3)))
  with pytest.raises(ValueError, match=r"x must be \[N, H, W, 3\].*got shape \(1, 6, 8, 3\)"):
    model.apply(params, jnp.zeros((1, 6, 8, 3)), method="encode")
  with pytest.raises(ValueError, match=r"multiples of 4, got shape \(1, 8, 6, 3\)"):
    model.apply(params, jnp.zeros((1, 8, 6, 3)), method="encode")
  with pytest.raises(ValueError, match=r"z must be \[N, h, w, 4\]"):
    model.apply(params, jnp.zeros((1, 2, 2, 3)), method="decode")
  with pytest.raises(
    ValueError, match="VAEConfig.block_out_channels: .* multiple of norm_num_groups"
  ):
    sd_vae.VAEConfig(block_out_channels=(8, 12), norm_num_groups=8)
  base = {"block_out_channels": [8, 8], "layers_per_block": 1}
  with pytest.raises(ValueError, match="up_block_types must be 2 x 'UpDecoderBlock2D'"):
    sd_vae.VAEConfig.from_diffusers(base | {"up_block_types": ["AttnUpDecoderBlock2D"] * 2})
  with pytest.raises(ValueError, match="latents_mean must be null"):
    sd_vae.VAEConfig.from_diffusers(base | {"latents_mean": [0.0] * 4})
  with pytest.raises(ValueError, match="act_fn must be 'silu'"):
    sd_vae.VAEConfig.from_diffusers(base | {"act_fn": "gelu"})
  with pytest.raises(ValueError, match="has no 'layers_per_block'"):
    sd_vae.VAEConfig.from_diffusers({"block_out_channels": [8]})
