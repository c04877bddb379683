"""Four fake CPU devices for every test, set before JAX initialises its backends, the launchers' XLA
CPU flags plus four that cut compile time to about a third, and a compilation cache of the larger
programs shared by the test processes of a session (the workers and the launcher subprocesses compile
the same steps)."""

import os
import sys
import tempfile

from experiments import runtime

# Tests spend most of their time compiling small programs: LLVM's cheap pipeline halves that and slows
# the small runs less than it saves; XLA:CPU's older elemental emitters compile fusions in half the time
# of its MLIR fusion emitters (same numbers, checked on the whole suite); one LLVM module per program
# instead of parts compiled in parallel, since the workers already keep every core busy (7-12% less
# compile time in paired runs). Subprocesses (the launcher tests) inherit them through $XLA_FLAGS
# (tests/launch.py).
_TEST_XLA_FLAGS = (
  "--xla_backend_optimization_level=0",
  "--xla_llvm_disable_expensive_passes=true",
  "--xla_cpu_use_fusion_emitters=false",
  "--xla_cpu_parallel_codegen_split_count=1",
)
os.environ["XLA_FLAGS"] = " ".join((os.environ.get("XLA_FLAGS", ""), *_TEST_XLA_FLAGS)).strip()
runtime.configure_xla_cpu()  # before JAX starts its backend

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
# the launcher subprocesses read the same cache through $JAX_COMPILATION_CACHE_DIR (experiments/runtime.py)
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
  tempfile.gettempdir(), "iclr26-jax-test-cache"
)
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
# only programs that took 0.5 s to compile: writing every small eager op's executable to disk cost a
# fifth of the suite's wall time and saves nothing within a process (JAX's in-memory cache has them)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
