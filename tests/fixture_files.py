"""The upstream-reference fixtures of `tests/fixtures/` (written by `tests/fixtures/make_*.py` with
torch, diffusers and transformers): their arrays by name, and the state dict stored under a prefix."""

import pathlib

from core.nn.convert import read_npz

FOLDER = pathlib.Path(__file__).with_name("fixtures")


def arrays(name: str) -> dict:
  """Every array of `tests/fixtures/<name>.npz`."""
  return read_npz(str(FOLDER / f"{name}.npz"))


def state_dict(stored: dict, prefix: str = "state_dict.") -> dict:
  """The entries of `stored` whose names start with `prefix`, without it."""
  return {k[len(prefix) :]: v for k, v in stored.items() if k.startswith(prefix)}
