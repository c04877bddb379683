"""QDPM end to end through the shared loop: results, resume, devices, validation, tfds loading, study."""

import json
import math
import os
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from configs import quant_diffusion as qdpm_config
from core.data import images
from experiments import loop
from methods import quant_diffusion
from methods.base import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(**model):
  config = qdpm_config.get_config()
  config.model.update(dict(width=32, depth=2, time_features=8, **model))
  config.batch_size = 16
  config.steps = 6
  config.data.num_eval_examples = 16
  config.eval.update(num_u_samples=4, chunk=8, num_samples=4, sampler_steps=4, mc_c_samples=8)
  config.loop.update(log_every=2, checkpoint_every=3)
  return config


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """One run of `tiny_config()` on all four devices, shared by the tests that read or compare it."""
  workdir = tmp_path_factory.mktemp("qdpm")
  return loop.run(tiny_config(), str(workdir)), workdir


def test_run_reports_every_metric_and_compiles_the_step_once(tiny_run):
  summary, workdir = tiny_run
  results = summary.results
  for key in ("test_bpd", "train_bpd", "test_bpd_stderr", "on_grid_fraction", "null_bpd"):
    assert math.isfinite(results[key]), key
  assert summary.step_traces == {"train": 1}
  assert results["null_bpd"] == pytest.approx(math.log2(17), abs=1e-4)
  assert results["on_grid_fraction"] == 1.0
  assert 0.0 <= results["on_grid_fraction_before_t0"] <= 1.0
  assert os.path.exists(workdir / "samples.png")


@pytest.mark.slow
def test_known_entropy_run_reports_every_estimate_against_the_entropy(tmp_path):
  config = tiny_config()
  config.data.update(name="markov_levels", num_train=64)
  config.eval.update(log_t_samples=4, mc_c_repeats=2)
  results = loop.run(config, str(tmp_path)).results
  assert results["entropy_bpd"] == pytest.approx(2.0433, abs=1e-4)
  for _, kind, prefix in quant_diffusion.ENTROPY_ESTIMATES:
    if kind == "qdpm":
      assert math.isfinite(results[f"{prefix}_gap"]) and results[f"{prefix}_gap_stderr"] > 0, prefix
  # delta_hat starts at zero (zero-initialised output layer), so six steps leave the bound ~log2 K
  assert results["test_bpd_gap"] == pytest.approx(results["null_bpd_gap"], abs=0.05)
  assert len(results["test_bpd_monte_carlo_C_repeats_gap"]) == 2
  assert os.path.exists(tmp_path / "samples.png")


@pytest.mark.parametrize("kind", ["vdm", pytest.param("dequantized", marks=pytest.mark.slow)])
def test_baselines_run_and_are_not_snapped_to_the_grid(tmp_path, kind):
  results = loop.run(tiny_config(kind=kind), str(tmp_path)).results
  assert math.isfinite(results["test_bpd"])
  assert results["on_grid_fraction"] < 0.5


def test_interrupted_run_resumes_to_the_same_results(tiny_run, tmp_path):
  whole = tiny_run[0].results
  with pytest.raises(loop.Interrupted):
    loop.run(tiny_config(), str(tmp_path / "cut"), should_stop=lambda phase, step: step == 4)
  resumed = loop.run(tiny_config(), str(tmp_path / "cut")).results
  chex.assert_trees_all_close(resumed, whole, rtol=1e-5)


def test_one_and_four_devices_give_the_same_run(tiny_run, tmp_path):
  assert len(jax.devices()) == 4  # the shared run is on four devices
  one = loop.run(tiny_config(), str(tmp_path / "one"), devices=jax.devices()[:1]).results
  four = tiny_run[0].results
  chex.assert_trees_all_close(one, four, rtol=1e-4)


@pytest.mark.parametrize("levels", [2, 5, 17])
def test_requantized_digits_use_every_level_of_the_grid(levels):
  splits = images.digits(levels)
  values = np.unique(splits["train"]["image"])
  np.testing.assert_array_equal(values, np.arange(levels))
  assert splits["train"]["image"].shape == (1500, 8, 8) and splits["test"]["image"].shape == (
    297,
    8,
    8,
  )


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("data.num_levels", 18, "config.data.num_levels: digits need 2..17"),
    ("model.kind", "ddpm", "config.model.kind: must be one of"),
    ("eval.num_u_samples", 0, "config.eval.num_u_samples: must be positive"),
    ("model.t_min", 200.0, "config.model.t_min: need 0 < t_min < t_max"),
  ],
)
def test_bad_fields_are_named(tmp_path, field, value, message):
  config = tiny_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ConfigError, match=message):
    loop.run(config, str(tmp_path))


def test_cifar10_variant_reads_tfds_without_downloading():
  import tensorflow_datasets as tfds

  config = qdpm_config.get_config("cifar10")
  config.data.num_eval_examples = 4
  config.batch_size = 4
  with tfds.testing.mock_data(num_examples=8):
    splits = quant_diffusion.load_splits(config)
    batch = quant_diffusion.train_batches(config, splits["train"]).batch(1)
  assert splits["test"].shape == (4, 3072) and batch["x"].shape == (4, 3072)
  assert batch["x"].dtype == np.float32 and batch["x"].min() >= 0 and batch["x"].max() <= 255
  np.testing.assert_array_equal(batch["x"], np.round(batch["x"]))


def test_study_report_orders_the_models():
  results = {
    kind: dict(
      test_bpd=b,
      test_bpd_stderr=0.01,
      train_bpd=b,
      null_bpd=4.09,
      on_grid_fraction=g,
      on_grid_fraction_before_t0=0.01,
      log2_num_levels=4.09,
      memorization_floor_bpd=0.16,
    )
    for kind, b, g in (("qdpm", 2.0, 1.0), ("vdm", 2.5, 0.0), ("dequantized", 2.9, 0.0))
  }
  report = quant_diffusion.report(qdpm_config.get_config("study"), results)
  assert report.summary["qdpm_below_vdm"] and report.summary["vdm_below_dequantized"]
  assert [row["model"] for row in report.rows] == ["qdpm", "vdm", "dequantized"]
  assert "bpd_and_on_grid" in report.figures


def test_train_py_names_a_mistyped_flag(tmp_path):
  """(The SIGTERM test below runs train.py to the end: progress lines, metrics rows, results.)"""
  args = [
    sys.executable,
    "experiments/train.py",
    "--config=configs/quant_diffusion.py",
    f"--workdir={tmp_path}",
    "--config.model.kidn=qdpm",
  ]
  bad = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert bad.returncode != 0 and "kidn" in bad.stderr


SIGTERM_AT_STEP = """
import os, signal, sys
sys.path.insert(0, os.getcwd())
from experiments import loop
asks = loop._agreed_stop
def preempt_at(should_stop, phase, step, at_log_step):
  if step == {step}:
    os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's notice, at a known step
  return asks(should_stop, phase, step, at_log_step)
loop._agreed_stop = preempt_at
sys.argv = ["train.py"] + {flags}
from experiments import train
from absl import app
app.run(train.main)
"""


def test_sigterm_mid_run_saves_exits_zero_and_train_py_resumes_it(tmp_path, tiny_run):
  """train.py end to end at six steps with SIGTERM's handler: the signal arrives after step 2, the
  run saves, exits 0 and says how to resume; the same command finishes it (progress lines, one
  metrics row per step) with the uninterrupted results. (test_faults.py sends the signal from
  outside at a random step of a 1500-step run: slow set.)"""
  from test_faults import _complete_steps, _env, _flags  # command line and checkpoints of a run

  flags = [*_flags(tiny_config()), f"--workdir={tmp_path}"]
  script = SIGTERM_AT_STEP.format(step=2, flags=repr(flags))
  stopped = subprocess.run(
    [sys.executable, "-c", script],
    cwd=REPO,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert stopped.returncode == 0, stopped.stderr[-2000:]
  assert "run the same command again to resume" in stopped.stderr
  assert _complete_steps(str(tmp_path))[-1] == 2
  assert not os.path.exists(tmp_path / "results.json")
  resumed = subprocess.run(
    [sys.executable, "experiments/train.py", *flags],
    cwd=REPO,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "resumed from step 2" in resumed.stderr
  assert "step 6/6" in resumed.stderr and "steps/s" in resumed.stderr and "ETA" in resumed.stderr
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
  with open(tmp_path / "results.json") as f:
    chex.assert_trees_all_close(json.load(f), tiny_run[0].results, rtol=1e-4)


def test_input_benchmark_measures_both_arms():
  from experiments.bench_input import measure_input_overhead

  result = measure_input_overhead(tiny_config(), steps=8, blocks=2)
  assert result["fixed_batch_s_per_step"] > 0 and result["real_data_s_per_step"] > 0
  assert result["ratio"] == pytest.approx(
    result["real_data_s_per_step"] / result["fixed_batch_s_per_step"]
  )
