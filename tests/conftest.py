"""Four fake CPU devices for every test, set before JAX initialises its backends."""

import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", 4)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
