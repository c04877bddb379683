"""Meshes from config.mesh, FSDP vs replicated state: the same training on 4 fake devices."""

import chex
import jax
import pytest
from jax.sharding import PartitionSpec as P
from test_quant_diffusion import tiny_config

from experiments import loop, sharding
from methods import quant_diffusion
from methods.base import ConfigError


def test_mesh_fills_the_free_axis_and_rejects_bad_shapes():
  mesh = sharding.make_mesh((("data", -1), ("model", 2)), jax.devices()[:4])
  assert dict(mesh.shape) == {"data": 2, "model": 2}
  with pytest.raises(
    sharding.MeshError, match="config.mesh: sizes \\[3\\] multiply to 3, not the 4"
  ):
    sharding.make_mesh((("data", 3),), jax.devices()[:4])
  with pytest.raises(sharding.MeshError, match="needs a 'data' axis"):
    sharding.make_mesh((("model", -1),), jax.devices()[:4])


def test_fsdp_splits_large_leaves_along_their_largest_divisible_axis():
  assert sharding.fsdp_spec((64, 512), 4, 1024) == P(None, "data")
  assert sharding.fsdp_spec((512, 6), 4, 1024) == P("data")
  assert sharding.fsdp_spec((7, 9), 4, 1) == P()
  assert sharding.fsdp_spec((64,), 4, 1024) == P()


def test_fsdp_and_replicated_state_train_alike(tmp_path):
  replicated = tiny_config()
  fsdp = tiny_config()
  fsdp.sharding, fsdp.fsdp_min_size = "fsdp", 256
  mesh = sharding.make_mesh(devices=jax.devices()[:4])
  phase = quant_diffusion.phases(fsdp)[0]
  abstract = jax.eval_shape(phase.init, jax.random.key(0), {})
  specs = [s.spec for s in jax.tree.leaves(sharding.state_shardings(mesh, abstract, "fsdp", 256))]
  assert any("data" in spec for spec in specs), "FSDP must shard some leaves"
  a = loop.run(replicated, str(tmp_path / "replicated"), devices=jax.devices()[:4]).results
  b = loop.run(fsdp, str(tmp_path / "fsdp"), devices=jax.devices()[:4]).results
  chex.assert_trees_all_close(a, b, rtol=1e-4)


@pytest.mark.slow
def test_model_axis_in_the_mesh_runs_unchanged(tmp_path):
  config = tiny_config()
  config.mesh = (("data", 2), ("model", 2))
  results = loop.run(config, str(tmp_path), devices=jax.devices()[:4]).results
  assert results["on_grid_fraction"] == 1.0


def test_unknown_strategy_is_named(tmp_path):
  config = tiny_config()
  config.sharding = "zero3"
  with pytest.raises(ConfigError, match="config.sharding: must be one of"):
    loop.run(config, str(tmp_path))
