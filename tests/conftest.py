"""Four fake CPU devices for every test, set before JAX initialises its backends, the launchers' XLA
CPU flags, and a compilation cache shared by the tests of a session (many tests compile the same small
programs)."""

import os
import sys
import tempfile

from experiments import runtime

runtime.configure_xla_cpu()  # before JAX starts its backend

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update(
  "jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "iclr26-jax-test-cache")
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
