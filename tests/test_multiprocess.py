"""Two processes on 127.0.0.1 (gloo collectives, 2 CPU devices each) train like one process with 4."""

import json
import os
import socket
import sys

import chex
import launch
import pytest
from test_faults import _flags  # the command line that rebuilds a config
from test_quant_diffusion import tiny_config

from experiments import loop


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# experiments/train.py, slowed: the process imports its method 35 s after the other, past the 30 s
# that a CPU collective (gloo) waits for its peers
_LAGGING_TRAIN = """
import runpy, sys, time
import methods
get_method = methods.get_method
methods.get_method = lambda name: (time.sleep(35), get_method(name))[1]
sys.argv[0] = "experiments/train.py"
runpy.run_path("experiments/train.py", run_name="__main__")
"""


def _launch(args, devices, lagging=False):
  command = ["-c", _LAGGING_TRAIN] if lagging else ["experiments/train.py"]
  return launch.start([*command, *args], devices)


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


def _launch_two(workdir, lagging=False):
  port = _free_port()
  return [
    _launch(
      [
        *_flags(tiny_config()),
        f"--workdir={workdir}",
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      ],
      devices=2,
      lagging=lagging and i == 1,
    )
    for i in range(2)
  ]


def test_two_processes_match_one_process(tmp_path):
  multi = str(tmp_path / "multi")
  outputs = _finish(_launch_two(multi))
  # the one-process run in this process: the tests' four CPU devices
  single = loop.run(tiny_config(), str(tmp_path / "single")).results
  chex.assert_trees_all_close(_results(multi), single, rtol=1e-4)
  assert "step 6/6" in outputs[0]
  rows = [json.loads(line) for line in open(os.path.join(multi, "metrics.jsonl"))]
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7)), (
    "only process 0 writes metrics"
  )


@pytest.mark.slow
def test_a_process_far_behind_the_other_still_trains(tmp_path):
  workdir = str(tmp_path / "multi")
  outputs = _finish(_launch_two(workdir, lagging=True))
  assert "step 6/6" in outputs[0]
  single = loop.run(tiny_config(), str(tmp_path / "single")).results
  chex.assert_trees_all_close(_results(workdir), single, rtol=1e-4)


if __name__ == "__main__":
  sys.exit(pytest.main([__file__]))
