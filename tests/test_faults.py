"""Fault injection: preemption (SIGTERM), kill -9 while a checkpoint is written, corrupt checkpoints.

Bad batches (NaN, shape, dtype) and non-finite losses are covered in test_loop.py.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import chex
import jax
import launch
import pytest
from test_quant_diffusion import tiny_config

from configs import quant_diffusion as qdpm_config
from experiments import loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG = dict(steps=1500, log_every=10, checkpoint_every=500)


def _long_config():
  config = tiny_config()
  config.steps = LONG["steps"]
  config.loop.update(log_every=LONG["log_every"], checkpoint_every=LONG["checkpoint_every"])
  return config


def _flags(config) -> list[str]:
  """The command-line overrides that rebuild `config` from configs/quant_diffusion.py."""
  default = qdpm_config.get_config().to_dict()
  flags = []

  def walk(node, base, prefix):
    for key, value in node.items():
      if isinstance(value, dict):
        walk(value, base[key], f"{prefix}{key}.")
      elif value != base[key]:
        flags.append(f"--config.{prefix}{key}={value}")

  walk(config.to_dict(), default, "")
  return ["--config=configs/quant_diffusion.py", *flags]


def _env():
  return launch.subprocess_env(devices=4)


def _complete_steps(workdir):
  folder = os.path.join(workdir, "checkpoints", "train")
  return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def _results(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  return loop.run(
    _long_config(), str(tmp_path_factory.mktemp("whole")), devices=jax.devices()[:4]
  ).results


def _wait_for_rows(workdir, process, rows=5, timeout=120):
  path = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + timeout
  while time.time() < deadline and process.poll() is None:
    if os.path.exists(path) and sum(1 for _ in open(path)) >= rows:
      return
    time.sleep(0.05)
  raise AssertionError("the run never started logging")


@pytest.mark.slow  # by default: the six-step SIGTERM test in test_quant_diffusion.py
def test_sigterm_saves_exits_zero_and_resumes_to_the_same_result(tmp_path, uninterrupted):
  command = ["experiments/train.py", *_flags(_long_config()), f"--workdir={tmp_path}"]
  process = launch.start(command)
  try:
    _wait_for_rows(str(tmp_path), process)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode == 0, output[-2000:]
  assert "run the same command again to resume" in output
  steps = _complete_steps(str(tmp_path))
  assert 0 < steps[-1] < LONG["steps"] and not os.path.exists(tmp_path / "results.json")
  resumed = subprocess.run(
    [sys.executable, *command], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300
  )
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert f"resumed from step {steps[-1]}" in resumed.stderr
  chex.assert_trees_all_close(_results(str(tmp_path)), uninterrupted, rtol=1e-4)


KILL_WHILE_SAVING = """
import os, signal, sys
sys.path.insert(0, os.getcwd())
from experiments import checkpoints
original = checkpoints.PhaseCheckpoints.save
def save_then_die(self, step, state, record):
  original(self, step, state, record)
  if step == {step}:
    os.kill(os.getpid(), signal.SIGKILL)  # the asynchronous write is still in flight
checkpoints.PhaseCheckpoints.save = save_then_die
sys.argv = ["train.py"] + {flags}
from experiments import train
from absl import app
app.run(train.main)
"""


@pytest.mark.slow
def test_kill_during_checkpoint_write_resumes_from_the_last_complete_step(tmp_path, uninterrupted):
  flags = [*_flags(_long_config()), f"--workdir={tmp_path}"]
  script = KILL_WHILE_SAVING.format(step=1000, flags=repr(flags))
  killed = subprocess.run(
    [sys.executable, "-c", script], cwd=REPO, env=_env(), capture_output=True, timeout=300
  )
  assert killed.returncode == -signal.SIGKILL
  steps = _complete_steps(str(tmp_path))
  assert steps[-1] in (500, 1000), steps
  leftovers = glob.glob(str(tmp_path / "checkpoints/train/*tmp*"))
  assert steps[-1] == 500 or not leftovers  # a half-written 1000 is never listed as complete
  resumed = loop.run(_long_config(), str(tmp_path), devices=jax.devices()[:4]).results
  chex.assert_trees_all_close(resumed, uninterrupted, rtol=1e-4)


def test_truncated_checkpoint_names_the_step_and_never_reinitialises(tmp_path):
  loop.run(tiny_config(), str(tmp_path))
  last = _complete_steps(str(tmp_path))[-1]
  for path in glob.glob(str(tmp_path / f"checkpoints/train/{last}/state/d/*")):
    with open(path, "r+b") as f:
      f.truncate(16)
  with pytest.raises(loop.CheckpointError, match=f"step {last}"):
    loop.run(tiny_config(), str(tmp_path))


def test_unreadable_checkpoint_metadata_names_the_step(tmp_path):
  loop.run(tiny_config(), str(tmp_path))
  last = _complete_steps(str(tmp_path))[-1]
  with open(tmp_path / f"checkpoints/train/{last}/state/_METADATA", "w") as f:
    f.write("{not json")
  with pytest.raises(loop.CheckpointError, match=f"step {last}"):
    loop.run(tiny_config(), str(tmp_path))


def test_config_edit_that_changes_shapes_names_the_field(tmp_path):
  loop.run(tiny_config(), str(tmp_path))
  wider = tiny_config()
  wider.model.width = 48
  with pytest.raises(
    loop.CheckpointError,
    match=r"step 6 .*field (ema_)?params/params/Dense_\d+/\w+ is stored as float32\[\d+\]",
  ):
    loop.run(wider, str(tmp_path))
