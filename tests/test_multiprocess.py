"""Two processes on 127.0.0.1 (gloo collectives, 2 CPU devices each) train like one process with 4."""

import json
import os
import socket
import subprocess
import sys

import chex
import launch
import pytest
from test_faults import _flags  # the command line that rebuilds a config
from test_quant_diffusion import tiny_config

from experiments import loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(args, devices):
  return subprocess.Popen(
    [sys.executable, "experiments/train.py", *args],
    cwd=REPO,
    env=launch.subprocess_env(devices),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _finish(processes, timeout=240):
  outputs = []
  try:
    for p in processes:
      outputs.append(p.communicate(timeout=timeout)[0])
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, out in zip(processes, outputs, strict=True):
    assert p.returncode == 0, out[-3000:]
  return outputs


def _results(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


def test_two_processes_match_one_process(tmp_path):
  port = _free_port()
  multi = str(tmp_path / "multi")
  processes = [
    _launch(
      [
        *_flags(tiny_config()),
        f"--workdir={multi}",
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      ],
      devices=2,
    )
    for i in range(2)
  ]
  outputs = _finish(processes)
  # the one-process run in this process: the tests' four CPU devices
  single = loop.run(tiny_config(), str(tmp_path / "single")).results
  chex.assert_trees_all_close(_results(multi), single, rtol=1e-4)
  assert "step 6/6" in outputs[0]
  rows = [json.loads(line) for line in open(os.path.join(multi, "metrics.jsonl"))]
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7)), (
    "only process 0 writes metrics"
  )


if __name__ == "__main__":
  sys.exit(pytest.main([__file__]))
