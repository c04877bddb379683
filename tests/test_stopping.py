"""Stopping on request in every kind of phase: SIGTERM/SIGINT in a real subprocess (training,
an evaluation in chunks, a study arm, one long call caught by the backstop), the chunk protocol in
process, and the memory check before a phase's first step."""

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

import methods
from experiments import loop, stopping, studies
from methods.base import ConfigError, EvaluationChunks, Phase

methods.register("stopper", "stop_method")
import stop_method  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = """
import os, sys
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests")]
import methods
methods.register("stopper", "stop_method")
from absl import app
from experiments import {launcher}
sys.argv = [{launcher!r}] + {flags!r}
app.run({launcher}.main)
"""
SLOW_TRAIN = dict(steps=150, step_seconds=0.02)
SLOW_CHUNKS = dict(num_chunks=4, chunk_seconds=0.75)


def _config(**changes):
  config = stop_method.get_config()
  config.update(changes)
  return config


def _fast(config):
  """The same computation without the pauses (results do not depend on them)."""
  fast = _config(**config.to_dict())
  fast.update(step_seconds=0.0, chunk_seconds=0.0)
  return fast


def _start(launcher, workdir, grace_s=20.0, **changes):
  flags = [f"--config={REPO}/tests/stop_method.py", f"--workdir={workdir}"]
  flags += [f"--config.{k}={v}" for k, v in changes.items()] + [f"--stop_grace_s={grace_s}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  script = SCRIPT.format(launcher=launcher, flags=flags)
  return subprocess.Popen(
    [sys.executable, "-c", script],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _wait_for(path, process, timeout=120):
  deadline = time.time() + timeout
  while time.time() < deadline and process.poll() is None:
    if os.path.exists(path) and os.path.getsize(path) > 0:
      return
    time.sleep(0.02)
  output = process.communicate(timeout=30)[0] if process.poll() is not None else ""
  raise AssertionError(f"{path} never appeared: {output[-2000:]}")


def _signal_and_wait(process, signum):
  """Sends `signum`; returns (exit code, seconds until the process ended, its output)."""
  sent = time.time()
  process.send_signal(signum)
  try:
    output = process.communicate(timeout=60)[0]
  finally:
    if process.poll() is None:
      process.kill()
  return process.returncode, time.time() - sent, output


def _finish(launcher, workdir, **changes):
  process = _start(launcher, workdir, **changes)
  output = process.communicate(timeout=300)[0]
  assert process.returncode == 0, output[-3000:]
  return output


def _results(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


@pytest.mark.slow  # two subprocesses: tens of seconds on a shared 2-core machine
def test_sigint_in_training_saves_exits_130_without_a_traceback_and_resumes(tmp_path):
  workdir = str(tmp_path / "run")
  process = _start("train", workdir, **SLOW_TRAIN)
  _wait_for(os.path.join(workdir, "metrics.jsonl"), process)
  code, seconds, output = _signal_and_wait(process, signal.SIGINT)
  assert code == 130 and seconds < 10, output[-3000:]
  assert "Traceback" not in output and "KeyboardInterrupt" not in output
  assert "stopped in phase 'train' at step" in output
  saved = [int(s) for s in os.listdir(os.path.join(workdir, "checkpoints", "train")) if s.isdigit()]
  assert 0 < max(saved) < SLOW_TRAIN["steps"]
  assert f"resumed from step {max(saved)}" in _finish("train", workdir, **SLOW_TRAIN)
  whole = loop.run(_fast(_config(**SLOW_TRAIN)), str(tmp_path / "whole")).results
  chex.assert_trees_all_close(_results(workdir), whole, rtol=1e-6)


def test_sigterm_between_evaluation_chunks_saves_them_and_the_rerun_runs_only_the_rest(tmp_path):
  workdir = str(tmp_path / "run")
  process = _start("train", workdir, **SLOW_CHUNKS)
  _wait_for(os.path.join(workdir, "phases", "evaluate", "part0.json"), process)
  code, seconds, output = _signal_and_wait(process, signal.SIGTERM)
  assert code == 0 and seconds < SLOW_CHUNKS["chunk_seconds"] * 2 + 4, output[-3000:]
  assert "stopped in phase 'evaluate' after evaluation chunk 'part" in output
  saved = sorted(os.listdir(os.path.join(workdir, "phases", "evaluate")))
  assert 1 <= len(saved) < SLOW_CHUNKS["num_chunks"] and not os.path.exists(
    os.path.join(workdir, "results.json")
  )
  rerun = _finish("train", workdir, **SLOW_CHUNKS)
  ran_again = [f"part{i}" for i in range(4) if f": part{i}\n" in rerun]
  assert ran_again == [f"part{i}" for i in range(len(saved), 4)], rerun[-3000:]
  whole = loop.run(_fast(_config(**SLOW_CHUNKS)), str(tmp_path / "whole")).results
  assert _results(workdir) == whole  # the same floats, not merely close


@pytest.mark.slow  # two subprocesses: tens of seconds on a shared 2-core machine
def test_sigterm_in_a_study_arm_keeps_the_finished_arm_and_resumes_the_other(tmp_path):
  workdir = str(tmp_path / "study")
  process = _start("study", workdir, **SLOW_TRAIN)
  _wait_for(os.path.join(workdir, "second", "metrics.jsonl"), process)
  code, seconds, output = _signal_and_wait(process, signal.SIGTERM)
  assert code == 0 and seconds < 10, output[-3000:]
  assert os.path.exists(os.path.join(workdir, "first", "results.json"))
  assert not os.path.exists(os.path.join(workdir, "second", "results.json"))
  rerun = _finish("study", workdir, **SLOW_TRAIN)
  assert "first finished earlier" in rerun
  whole = studies.run_study(_fast(_config(**SLOW_TRAIN)), str(tmp_path / "whole"))
  chex.assert_trees_all_close(_results(workdir)["arms"], whole["arms"], rtol=1e-6)


@pytest.mark.slow  # two subprocesses: tens of seconds on a shared 2-core machine
def test_a_stop_inside_one_long_call_exits_after_the_grace_period_naming_what_was_saved(tmp_path):
  workdir = str(tmp_path / "run")
  process = _start("train", workdir, grace_s=2.0, blocking_seconds=600)
  _wait_for(os.path.join(workdir, "phases", "evaluate.json"), process)
  time.sleep(0.5)  # inside the blocking evaluation
  code, seconds, output = _signal_and_wait(process, signal.SIGTERM)
  assert code == 0 and 2.0 <= seconds < 8, output[-3000:]
  assert "Last saved: phase 'blocking' step 0" in output  # its init's checkpoint
  assert os.path.exists(os.path.join(workdir, "phases", "evaluate.json"))


def _catches(pid: int, signum: int) -> bool:
  with open(f"/proc/{pid}/status") as f:
    caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
  return bool(caught >> (signum - 1) & 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_while_the_launcher_starts_exits_at_once_with_its_code(tmp_path, signum, code):
  workdir = str(tmp_path / "run")
  process = launch.start(
    ["experiments/train.py", "--config=configs/quant_diffusion.py", f"--workdir={workdir}"]
  )
  deadline = time.time() + 60
  # Python catches SIGINT from the start; SIGTERM is caught once the launcher's first lines ran
  while not _catches(process.pid, signal.SIGTERM):
    if process.poll() is not None or time.time() > deadline:
      process.kill()
      raise AssertionError(f"never caught SIGTERM: {process.communicate()[0][-3000:]}")
    time.sleep(0.002)
  time.sleep(0.05)
  exit_code, seconds, output = _signal_and_wait(process, signum)
  assert exit_code == code and seconds < 10, output[-3000:]
  assert f"{signal.Signals(signum).name} before the run started: nothing to save" in output
  assert "Traceback" not in output and not os.path.exists(workdir)


def test_exit_codes_follow_the_signal():
  assert stopping.exit_code_for(signal.SIGTERM) == 0
  assert stopping.exit_code_for(signal.SIGINT) == 130


# ---------------------------------------------------------------------------------------------------
# The chunk protocol and the memory check, in process
# ---------------------------------------------------------------------------------------------------


def test_chunks_stopped_after_each_one_resume_to_the_uninterrupted_results(tmp_path):
  config = _config(steps=2, num_chunks=3)
  whole = loop.run(config, str(tmp_path / "whole")).results
  workdir = tmp_path / "cut"
  folder = workdir / "phases" / "evaluate"
  saved = lambda: len(list(folder.iterdir())) if folder.exists() else 0
  stopped_after = []
  for _ in range(3):  # each run stops after its first new chunk, but never after the last
    before = saved()
    try:
      summary = loop.run(
        config, str(workdir), should_stop=lambda p, s, before=before: saved() > before
      )
    except loop.Interrupted as stop:
      assert stop.phase == "evaluate"
      stopped_after.append(stop.chunk)
  assert stopped_after == ["part0", "part1"]
  assert summary.results == whole


def test_default_combine_is_the_union_and_clashing_chunk_names_fail(tmp_path, monkeypatch):
  def phases(config):
    evaluate = lambda state, rng, inputs: EvaluationChunks(
      names=["a", "b"], run=lambda name: {"x": 1.0} if name == "a" else {"y": [2.0, 3.0]}
    )
    return [Phase(name="only", num_steps=0, init=lambda rng, inputs: {"w": rng}, evaluate=evaluate)]

  monkeypatch.setattr(stop_method, "METHOD", stop_method.METHOD.__class__("stopper", phases))
  assert loop.run(_config(), str(tmp_path / "one")).results == {"x": 1.0, "y": [2.0, 3.0]}

  def clashing(config):
    evaluate = lambda state, rng, inputs: EvaluationChunks(
      names=["a", "b"], run=lambda name: {"x": 1.0}
    )
    return [Phase(name="only", num_steps=0, init=lambda rng, inputs: {"w": rng}, evaluate=evaluate)]

  monkeypatch.setattr(stop_method, "METHOD", stop_method.METHOD.__class__("stopper", clashing))
  with pytest.raises(ValueError, match=r"chunk b reports metric names .*\['x'\]"):
    loop.run(_config(), str(tmp_path / "two"))


def test_a_step_too_big_for_the_device_stops_before_running_naming_phase_bytes_and_fields(
  tmp_path, monkeypatch
):
  monkeypatch.setattr(loop, "device_memory", lambda mesh: (4, "a tiny test device"))
  with pytest.raises(ConfigError) as error:
    loop.run(_config(), str(tmp_path))
  message = str(error.value)
  assert message.startswith("phase 'train' init needs ")
  assert "but 4 B are available (a tiny test device); reduce config.mesh=" in message
  assert "\n" not in message and not (tmp_path / "checkpoints" / "train" / "0").exists()
  sized = Phase(name="p", num_steps=1, init=None, sized_by=("steps", "loop.log_every"))
  assert loop.sizing_fields(sized, _config()).startswith("config.steps=4, config.loop.log_every=1")


def test_memory_need_counts_donated_arguments_once():
  jitted = jax.jit(lambda x: x * 2.0, donate_argnums=0)
  compiled = jitted.lower(jax.ShapeDtypeStruct((1000,), "float32")).compile()
  need = loop.memory_need(compiled)
  assert need.arguments == need.outputs == 4000
  assert need.total == need.arguments + need.outputs + need.temporaries - need.aliased
  assert loop.memory_need(compiled).total < 3 * 4000


# ---------------------------------------------------------------------------------------------------
# The methods' chunked evaluations
# ---------------------------------------------------------------------------------------------------


def _as_saved(values):
  return json.loads(json.dumps({k: loop._result_value(v) for k, v in values.items()}))


@pytest.mark.slow  # compiles every arm twice: minutes on a shared 2-core machine
def test_lightctrl_arms_one_per_process_equal_all_arms_at_once():
  """Each arm run by a fresh runner (as after a resume) gives the metrics of `run_arms`."""
  from test_lightctrl import _random_state, tiny_config

  from methods.lightctrl import pipeline

  config = tiny_config()
  state, rng = _random_state(config), jax.random.key(3)
  whole = _as_saved(pipeline.arm_metrics(config, *pipeline.run_arms(config, state, rng)))
  names = pipeline.arm_chunks(config, state, rng, {}).names
  done = {name: _as_saved(pipeline.arm_chunks(config, state, rng, {}).run(name)) for name in names}
  evaluation = {}
  combined = _as_saved(pipeline.arm_chunks(config, state, rng, evaluation).combine(done))
  chex.assert_trees_all_close(combined, whole, rtol=1e-6)
  assert "videos" not in evaluation  # the artifacts rerun the arms rather than show a partial set


def test_dlm_separation_stopped_after_one_length_resumes_to_the_same_results(tmp_path):
  from test_dlm_revision import tiny_config

  config = tiny_config(experiments=("separation",))
  config.separation.lengths = (4, 6)
  whole = loop.run(config, str(tmp_path / "whole")).results
  folder = tmp_path / "cut" / "phases" / "separation"
  with pytest.raises(loop.Interrupted, match="after evaluation chunk 'n4'"):
    loop.run(config, str(tmp_path / "cut"), should_stop=lambda p, s: folder.exists())
  assert sorted(p.name for p in folder.iterdir()) == ["n4.json"]
  assert loop.run(config, str(tmp_path / "cut")).results == whole
  assert whole["sep_lengths"] == [4.0, 6.0] and whole["sep_max_violation_exact"] == 0.0
