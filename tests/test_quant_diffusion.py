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


def test_run_reports_every_metric_and_compiles_the_step_once(tmp_path):
  summary = loop.run(tiny_config(), str(tmp_path))
  results = summary.results
  for key in ("test_bpd", "train_bpd", "test_bpd_stderr", "on_grid_fraction", "null_bpd"):
    assert math.isfinite(results[key]), key
  assert summary.step_traces == {"train": 1}
  assert results["null_bpd"] == pytest.approx(math.log2(17), abs=1e-4)
  assert results["on_grid_fraction"] == 1.0
  assert 0.0 <= results["on_grid_fraction_before_t0"] <= 1.0
  assert os.path.exists(tmp_path / "samples.png")


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


@pytest.mark.parametrize("kind", ["vdm", "dequantized"])
def test_baselines_run_and_are_not_snapped_to_the_grid(tmp_path, kind):
  results = loop.run(tiny_config(kind=kind), str(tmp_path)).results
  assert math.isfinite(results["test_bpd"])
  assert results["on_grid_fraction"] < 0.5


def test_interrupted_run_resumes_to_the_same_results(tmp_path):
  whole = loop.run(tiny_config(), str(tmp_path / "whole")).results
  with pytest.raises(loop.Interrupted):
    loop.run(tiny_config(), str(tmp_path / "cut"), should_stop=lambda phase, step: step == 4)
  resumed = loop.run(tiny_config(), str(tmp_path / "cut")).results
  chex.assert_trees_all_close(resumed, whole, rtol=1e-5)


def test_one_and_four_devices_give_the_same_run(tmp_path):
  one = loop.run(tiny_config(), str(tmp_path / "one"), devices=jax.devices()[:1]).results
  four = loop.run(tiny_config(), str(tmp_path / "four"), devices=jax.devices()[:4]).results
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


def test_train_py_runs_a_few_steps_and_resumes(tmp_path):
  args = [
    sys.executable,
    "experiments/train.py",
    "--config=configs/quant_diffusion.py",
    f"--workdir={tmp_path}",
    "--config.steps=4",
    "--config.batch_size=16",
    "--config.model.width=16",
    "--config.model.depth=2",
    "--config.data.num_eval_examples=8",
    "--config.eval.num_u_samples=2",
    "--config.eval.num_samples=4",
    "--config.eval.sampler_steps=2",
    "--config.eval.mc_c_samples=2",
    "--config.loop.log_every=2",
  ]
  done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "step 4/4" in done.stderr and "steps/s" in done.stderr and "ETA" in done.stderr
  with open(tmp_path / "results.json") as f:
    assert "test_bpd" in json.load(f)
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
  bad = subprocess.run(
    args + ["--config.model.kidn=qdpm"], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert bad.returncode != 0 and "kidn" in bad.stderr


def test_input_benchmark_measures_both_arms():
  from experiments.bench_input import measure_input_overhead

  result = measure_input_overhead(tiny_config(), steps=8, blocks=2)
  assert result["fixed_batch_s_per_step"] > 0 and result["real_data_s_per_step"] > 0
  assert result["ratio"] == pytest.approx(
    result["real_data_s_per_step"] / result["fixed_batch_s_per_step"]
  )
