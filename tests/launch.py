"""The environment of a test's launcher subprocess: CPU only, the tests' XLA flags (tests/conftest.py
put them in $XLA_FLAGS) without a fake device count of the caller's, and `JAX_NUM_CPU_DEVICES`;
`start` runs a command of the repository in it."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subprocess_env(devices: int = 4) -> dict:
  flags = [
    f
    for f in os.environ.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  return dict(
    os.environ, XLA_FLAGS=" ".join(flags), JAX_NUM_CPU_DEVICES=str(devices), JAX_PLATFORMS="cpu"
  )


def start(args, devices: int = 4) -> subprocess.Popen:
  """`python ARGS` from the repository root in `subprocess_env(devices)`; stdout and stderr merged
  into one text pipe."""
  return subprocess.Popen(
    [sys.executable, *args],
    cwd=REPO,
    env=subprocess_env(devices),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
