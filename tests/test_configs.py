"""Every variant of every config builds and passes the loop's and its method's validation.

Paper-scale variants name files that exist only where they run (checkpoints, tfds data); those may
fail validation, but only with a `ConfigError` that names the path field.
"""

import importlib
import pkgutil

import pytest

import configs
from experiments import loop

PATH_FIELDS = ("checkpoint", "data_dir")


def _variants():
  for info in pkgutil.iter_modules(configs.__path__):
    module = importlib.import_module(f"configs.{info.name}")
    for variant in getattr(module, "VARIANTS", ()):
      yield pytest.param(module, variant, id=f"{info.name}:{variant}")


@pytest.mark.parametrize("module, variant", list(_variants()))
def test_variant_validates(module, variant):
  config = module.get_config(None if variant == "default" else variant)
  try:
    loop.validate(config, data_devices=1)
  except loop.ConfigError as error:
    assert variant != "default", error
    assert any(field in str(error) for field in PATH_FIELDS), error


def test_unknown_variant_names_the_choices():
  from configs import frontdoor

  with pytest.raises(ValueError, match="unknown config variant 'studdy'; known variants: .*study"):
    frontdoor.get_config("studdy")
