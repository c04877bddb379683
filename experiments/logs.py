"""Launcher logging: absl INFO for this codebase, warnings only from checkpointing internals."""

import logging

from absl import logging as absl_logging

_QUIET_PACKAGES = ("orbax", "etils", "tensorflow_datasets", "jax/_src")


class _QuietLibraries(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    noisy = any(f"/{name}/" in record.pathname for name in _QUIET_PACKAGES)
    return record.levelno >= logging.WARNING or not noisy


def setup() -> None:
  absl_logging.set_verbosity(absl_logging.INFO)
  absl_logging.get_absl_handler().addFilter(_QuietLibraries())
