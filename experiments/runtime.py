"""Launcher set-up: absl INFO for this codebase (warnings only from library internals), and JAX's
persistent compilation cache, so repeated runs and study arms reuse compiled programs."""

import logging
import os

from absl import logging as absl_logging

_QUIET_PACKAGES = ("orbax", "etils", "tensorflow_datasets", "jax/_src")


class _QuietLibraries(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    noisy = any(f"/{name}/" in record.pathname for name in _QUIET_PACKAGES)
    return record.levelno >= logging.WARNING or not noisy


# XLA:CPU's concurrency-optimised scheduler deadlocked programs with many small loops (random numbers,
# Newton steps) on 2-core machines: every worker idle, confirmed with gdb. Off by default here.
XLA_CPU_FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)


def configure_xla_cpu() -> None:
  """Adds `XLA_CPU_FLAGS` to $XLA_FLAGS; takes effect if called before JAX starts its backend."""
  flags = os.environ.get("XLA_FLAGS", "").split()
  for flag in XLA_CPU_FLAGS:
    if flag.split("=")[0] not in " ".join(flags):
      flags.append(flag)
  os.environ["XLA_FLAGS"] = " ".join(flags)


def setup() -> None:
  configure_xla_cpu()
  absl_logging.set_verbosity(absl_logging.INFO)
  absl_logging.get_absl_handler().addFilter(_QuietLibraries())
  enable_compilation_cache()


def enable_compilation_cache() -> None:
  """Caches compiled programs under $JAX_COMPILATION_CACHE_DIR (default ~/.cache/iclr26-jax/xla)."""
  import jax

  default = os.path.join(os.path.expanduser("~"), ".cache", "iclr26-jax", "xla")
  jax.config.update(
    "jax_compilation_cache_dir", os.environ.get("JAX_COMPILATION_CACHE_DIR", default)
  )
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
