"""Paper-scale variants without their data or weights stop at validation with one line naming the field.

Every variant of every config (each config's `VARIANTS`, so a new method is covered without editing
this file) is validated with its path fields pointing at an empty folder; a variant that needs
prepared data or weights must say which field, what it looked for and how to prepare it.
"""

import importlib
import os
import pkgutil
import subprocess
import sys

import pytest

import configs
from experiments import loop
from methods.base import ConfigError

PATH_FIELDS = ("data_dir", "checkpoint")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _variants():
  for info in pkgutil.iter_modules(configs.__path__):
    module = importlib.import_module(f"configs.{info.name}")
    for variant in getattr(module, "VARIANTS", ()):
      yield pytest.param(module, variant, id=f"{info.name}:{variant}")


def _point_paths_at(config, folder: str) -> None:
  """Every non-empty data_dir / checkpoint field of `config` (any depth) moved into `folder`."""
  for key, value in config.items():
    if hasattr(value, "items"):
      _point_paths_at(value, folder)
    elif key in PATH_FIELDS and isinstance(value, str) and value:
      config[key] = os.path.join(folder, os.path.basename(value.rstrip("/")) or "missing")


@pytest.mark.parametrize("module, variant", list(_variants()))
def test_variant_without_its_data_fails_in_one_line_naming_the_field(module, variant, tmp_path):
  config = module.get_config(None if variant == "default" else variant)
  _point_paths_at(config, str(tmp_path))
  try:
    loop.validate(config, data_devices=1)
  except ConfigError as error:
    message = str(error)
    assert variant != "default", message
    assert "\n" not in message, message
    field = message.split(":", 1)[0]
    assert field.startswith("config.") and field.endswith(PATH_FIELDS), message


def test_placeholder_paths_are_not_defaults():
  for param in _variants():
    module, variant = param.values
    config = module.get_config(None if variant == "default" else variant)
    flat = str(config.to_dict())
    assert "/path/to" not in flat, f"{module.__name__}:{variant} has a placeholder path"


def test_prepared_tfds_folder_passes_and_a_tfrecord_one_says_why_not(tmp_path):
  import tensorflow_datasets as tfds

  from core.data import prepared

  builder = tfds.builder("cifar10", data_dir=str(tmp_path))
  os.makedirs(builder.data_dir)
  builder.info.set_file_format("array_record", override=True)
  builder.info.write_to_directory(builder.data_dir)
  assert prepared.tfds_dataset_problem("cifar10", str(tmp_path)) is None
  builder.info.set_file_format("tfrecord", override=True)
  builder.info.write_to_directory(builder.data_dir)
  assert "stored as tfrecord" in prepared.tfds_dataset_problem("cifar10", str(tmp_path))
  assert "no prepared tfds dataset" in prepared.tfds_dataset_problem("cifar10", str(tmp_path / "x"))


def test_launcher_prints_one_line_and_no_traceback(tmp_path):
  result = subprocess.run(
    [
      sys.executable,
      "experiments/train.py",
      "--config=configs/quant_diffusion.py:cifar10",
      f"--config.data.data_dir={tmp_path}",
      f"--workdir={tmp_path / 'run'}",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr[-2000:]
  lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and lines[0].startswith("error: config.data.data_dir: no prepared"), lines
  assert "tfds build cifar10" in lines[0]
