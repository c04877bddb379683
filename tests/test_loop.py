"""The shared loop on a tiny two-phase method: files, resume, devices, guards, registry, validation."""

import json
import os

import chex
import jax
import numpy as np
import pytest

import methods
from experiments import loop
from methods.base import ConfigError, with_changes

methods.register("toy", "toy_method")
import toy_method  # noqa: E402


def _config(**overrides):
  return with_changes(toy_method.get_config(), **overrides)


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_run_writes_the_workdir_and_chains_phases(tmp_path):
  summary = loop.run(_config(), str(tmp_path))
  for name in (
    "config.json",
    "metrics.jsonl",
    "results.json",
    "phases/fit.json",
    "checkpoints/fit",
  ):
    assert os.path.exists(tmp_path / name), name
  with open(tmp_path / "results.json") as f:
    results = json.load(f)
  assert set(results) == {"w_error", "w_norm", "w_abs"}
  assert summary.step_traces == {"fit": 1, "check": 0}
  assert len(results["w_abs"]) == 3 and summary.results["w_abs"] == results["w_abs"]
  rows = _rows(tmp_path)
  evaluations = [r for r in rows if r["phase"] == "check"]
  assert "eval/w_norm" in evaluations[0] and "eval/w_abs" not in evaluations[0]
  assert [r["step"] for r in rows if r["phase"] == "fit" and "loss" in r] == list(range(1, 13))


def test_interrupted_run_resumes_to_the_same_result(tmp_path):
  whole = loop.run(_config(), str(tmp_path / "whole")).results
  with pytest.raises(loop.Interrupted) as stop:
    loop.run(_config(), str(tmp_path / "cut"), should_stop=lambda phase, step: step == 6)
  assert stop.value.step == 6
  resumed = loop.run(_config(), str(tmp_path / "cut")).results
  chex.assert_trees_all_close(resumed, whole, rtol=1e-6)
  steps = [r["step"] for r in _rows(tmp_path / "cut") if r["phase"] == "fit" and "loss" in r]
  assert steps == list(range(1, 13)), "resume must not duplicate metric rows"


def test_one_and_four_devices_agree(tmp_path):
  one = loop.run(_config(), str(tmp_path / "one"), devices=jax.devices()[:1]).results
  four = loop.run(_config(), str(tmp_path / "four"), devices=jax.devices()[:4]).results
  chex.assert_trees_all_close(one, four, rtol=1e-5)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  with pytest.raises(loop.NonFiniteLossError, match="at step 7"):
    loop.run(_config(nan_at_step=7), str(tmp_path))
  assert max(int(s) for s in os.listdir(tmp_path / "checkpoints/fit") if s.isdigit()) == 4


def test_bad_batch_names_the_field(tmp_path):
  with pytest.raises(loop.BadBatchError, match="step 3, field 'x' holds NaN"):
    loop.run(_config(bad_batch_at_step=3), str(tmp_path))


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"steps": 0}, "config.steps: must be positive"),
    ({"batch_size": -8}, "config.batch_size: must be positive"),
    ({"batch_size": 6}, "config.batch_size: 6 is not divisible by the 4 devices"),
    ({"loop__log_every": 0}, "config.loop.log_every: must be positive"),
    ({"method": "nope"}, "config.method: unknown method 'nope'; known methods: .*quant_diffusion"),
  ],
)
def test_bad_config_fails_before_compiling(tmp_path, overrides, message):
  with pytest.raises(ConfigError, match=message):
    loop.run(_config(**overrides), str(tmp_path), devices=jax.devices()[:4])
  assert not os.path.exists(tmp_path / "checkpoints")


def test_workdir_of_another_method_is_refused(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"method": "quant_diffusion"}))
  with pytest.raises(ConfigError, match="holds a run of method 'quant_diffusion'"):
    loop.run(_config(), str(tmp_path))


def test_checkpoint_of_another_shape_gets_a_clear_error(tmp_path):
  loop.run(_config(steps=4), str(tmp_path))
  import toy_method as toy

  original = toy._phases

  def wider(config):
    fit, check = original(config)
    import dataclasses

    import jax.numpy as jnp

    init = lambda rng, inputs: {"w": jnp.zeros((5,)), "step": jnp.zeros((), jnp.int32)}
    return [dataclasses.replace(fit, init=init, num_steps=8), check]

  toy.METHOD = toy.Method(name="toy", phases=wider)
  try:
    with pytest.raises(
      loop.CheckpointError, match=r"step 4 .*field w is stored as float32\[3\].*wants float32\[5\]"
    ):
      loop.run(_config(steps=8), str(tmp_path))
  finally:
    toy.METHOD = toy.Method(name="toy", phases=original)


def test_batch_checker_names_shape_changes():
  checker = loop._BatchChecker("p")
  checker.check({"x": np.zeros((2, 3), np.float32)}, 0)
  with pytest.raises(loop.BadBatchError, match="field 'x'"):
    checker.check({"x": np.zeros((2, 4), np.float32)}, 1)
  with pytest.raises(loop.BadBatchError, match="field 'x'"):
    checker.check({"x": np.zeros((2, 3), np.int32)}, 2)
