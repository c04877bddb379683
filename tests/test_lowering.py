"""`train.py --lower_only`: every phase's init and step lowered for GPU and TPU from this CPU machine,
at this machine's devices and at a 256-device pod mesh, with one line per program and failures as lines
(experiments/lowering.py)."""

import os
import subprocess
import sys

import pytest

from configs import dcd_ssm, quant_diffusion
from experiments import lowering
from kernels import lowering as kernel_lowering

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines(checks):
  return [check.line() for check in checks]


def test_dcd_ssm_lowers_for_both_platforms_with_the_scan_kernel_in_its_step():
  checks = lowering.lower_config(dcd_ssm.get_config(), ("cuda", "tpu"), num_devices=1)
  assert [(c.what, c.platform) for c in checks] == [
    ("train/init", "cuda"),
    ("train/step", "cuda"),
    ("train/init", "tpu"),
    ("train/step", "tpu"),
  ]
  assert all(c.ok for c in checks), _lines(checks)
  steps = [c for c in checks if c.what == "train/step"]
  assert all(c.kernels >= 2 for c in steps), "the forward and backward scans are Pallas kernels"


def test_a_kernel_in_a_multi_device_step_lowers_because_the_loop_traces_under_the_mesh():
  """XLA cannot partition a Mosaic call over devices; traced under the mesh (as the loop does), each
  kernel runs per device in a shard_map (kernels/partitioning.py)."""
  checks = lowering.lower_config(dcd_ssm.get_config(), ("cuda", "tpu"), num_devices=4)
  assert all(c.ok for c in checks), _lines(checks)


@pytest.mark.slow
def test_without_the_mesh_context_the_tpu_step_fails_with_a_hint(monkeypatch):
  monkeypatch.setattr(lowering, "TRACE_IN_MESH", False)
  checks = lowering.lower_config(dcd_ssm.get_config(), ("cuda", "tpu"), num_devices=4)
  failed = [c for c in checks if not c.ok]
  assert [(c.what, c.platform) for c in failed] == [("train/step", "tpu")]
  assert lowering.UNPARTITIONED_KERNEL in failed[0].error
  assert "jax.set_mesh" in failed[0].error


def test_fsdp_at_pod_scale_lowers_on_an_abstract_mesh_of_256_devices():
  config = quant_diffusion.get_config()
  config.mesh = (("data", 64), ("model", 4))
  config.sharding, config.fsdp_min_size = "fsdp", 2**10
  checks = lowering.lower_config(config, ("tpu",), num_devices=256)
  assert [c.line().split(" (")[0] for c in checks] == [
    "ok      train/init [tpu]",
    "ok      train/step [tpu]",
  ]
  config.sharding = "replicate"
  replicated = lowering.lower_config(config, ("tpu",), num_devices=256)
  # the lines' memory: FSDP over 64 x 4 devices holds a fraction of the replicated state per device
  for fsdp, whole in zip(checks, replicated, strict=True):
    assert 0 < fsdp.output_bytes < whole.output_bytes / 4, (fsdp.line(), whole.line())
  assert "per device; temporaries after compiling" in checks[1].line()


def test_an_indivisible_batch_at_pod_scale_is_one_line_and_exit_status_1():
  """The default mesh puts all 256 devices on the data axis: batch 128 does not split."""
  command = [
    sys.executable,
    "experiments/train.py",
    "--config=configs/quant_diffusion.py",
    "--lower_only=tpu",
    "--lower_devices=256",
  ]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 1, result.stderr[-2000:]
  assert result.stdout.splitlines() == [
    "FAILED  config at 256 devices: ConfigError: config.batch_size: 128 is not divisible by the "
    "256 devices of the mesh's data axis",
    "quant_diffusion:default lowered for tpu at 256 devices: 0 ok, 1 failed",
  ]


def test_a_program_that_does_not_lower_is_a_failed_line_and_the_rest_still_run(monkeypatch, capsys):
  real_lower = kernel_lowering.lower

  def lower(fn, platform, *args, **kwargs):
    if platform == "cuda" and kwargs.get("donate_argnums") == 0:
      raise ValueError("Mosaic GPU kernel exceeds available shared memory\nmore detail")
    return real_lower(fn, platform, *args, **kwargs)

  monkeypatch.setattr(kernel_lowering, "lower", lower)
  assert lowering.main(quant_diffusion.get_config(), ("cuda", "tpu"), None) == 1
  out = capsys.readouterr().out.splitlines()
  assert [line.split(" (")[0] for line in out[:4]] == [
    "ok      train/init [cuda]",
    "FAILED  train/step [cuda]: ValueError: Mosaic GPU kernel exceeds available shared memory",
    "ok      train/init [tpu]",
    "ok      train/step [tpu]",
  ]
  assert out[4].endswith("3 ok, 1 failed")


def test_unknown_platform_is_named():
  (check,) = lowering.lower_config(dcd_ssm.get_config(), ("gpu",))
  assert not check.ok and "platforms must be in ('cuda', 'tpu')" in check.line()
