r"""Throughput of the many-chain SGD/SGLD samplers of the porous-SGD study, in chain-steps per second.

  python experiments/bench_chains.py --config=configs/sgd_porous.py [--steps=1000] [--chains=1,1024,8192]

For each chain count, one toy (`--model`) and each batch size of the config, times a jitted block of
`--steps` iterations of every chain (a vmap over chains inside a `lax.scan` over steps, as the study's
chain phases run) after a call that compiles it, and prints chain-steps/s and the speed-up over one
chain (what the chain axis buys). With several devices the chain axis is sharded over them, as the
loop shards the chain state. A throughput print, not a timed assertion.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags


def define_flags() -> None:
  """The command line's flags; defined only when run as a script, so importing this module (as the
  tests do) leaves the process's flags to whoever owns them."""
  config_flags.DEFINE_config_file(
    "config", None, "configs/sgd_porous.py[:variant]", lock_config=True
  )
  flags.DEFINE_integer("steps", 1000, "Iterations per timed block.")
  flags.DEFINE_list("chains", ["1", "1024", "8192"], "Chain counts to time.")
  flags.DEFINE_string("model", "A", "Toy model: R, A, A0 or B.")
  flags.mark_flags_as_required(["config"])


def measure_chain_throughput(config, model: str, batch_size: int, chains: int, steps: int) -> dict:
  """Median seconds of `steps` SGD iterations of `chains` chains of toy `model`, and chain-steps/s."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from core import slt
  from experiments import sharding
  from kernels.timing import median_seconds
  from methods.sgd_porous import toys

  table = jnp.asarray(toys.toy_data(config, model)["table"])
  lr = jnp.full((chains,), config.toys.learning_rates[0], jnp.float32)
  noise = jnp.zeros((chains,), jnp.float32)
  mesh = sharding.make_mesh()
  devices = sharding.data_size(mesh)
  spec = P(sharding.DATA_AXIS) if chains % devices == 0 else P()
  w = jax.device_put(
    jax.random.uniform(jax.random.key(0), (chains, 2), minval=-1.0, maxval=1.0),
    NamedSharding(mesh, spec),
  )

  @jax.jit
  def block(w, key):
    def iteration(w, k):
      return slt.toy_iteration(model, table, w, k, lr, noise, batch_size, config.toys.box), None

    return jax.lax.scan(iteration, w, jax.random.split(key, steps))[0]

  seconds = median_seconds(block, w, jax.random.key(1), repeats=3)
  return {"seconds": seconds, "chain_steps_per_s": chains * steps / seconds, "devices": devices}


def main(argv):
  del argv
  from experiments import runtime

  runtime.setup()
  args = flags.FLAGS
  config = args.config
  for batch_size in sorted(set(config.toys.batch_sizes) | {config.toys.sgld_batch_size}):
    single = None
    for chains in (int(c) for c in args.chains):
      result = measure_chain_throughput(config, args.model, batch_size, chains, args.steps)
      if chains == 1:
        single = result["chain_steps_per_s"]
      speedup = result["chain_steps_per_s"] / single if single else float("nan")
      logging.info(
        "toy %s, batch %d, %d chains on %d device(s): %.3g chain-steps/s (x%.0f over one chain)",
        args.model,
        batch_size,
        chains,
        result["devices"],
        result["chain_steps_per_s"],
        speedup,
      )


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  define_flags()
  app.run(main)
