r"""Times shared-context + per-sample-buffer decode attention against context size and checks that
the implementations agree.

  python -m kernels.buffer_attention.bench [--context_sizes=256,1024,4096] [--batch=64]

For each context size N it prints the time of `reference` (the context broadcast to every sample),
`xla` (einsums against the shared copy) and `pallas`, the largest deviation from `reference`, and
the bytes of the broadcast copy the reference makes (`B x N x kv_heads x D`, K and V). On CPU the
Pallas kernel runs in the Pallas interpreter: its column checks correctness only, not speed.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from kernels.buffer_attention import api
from kernels.timing import median_seconds

DEFAULT_CONTEXT_SIZES = (256, 1024, 4096)


def _inputs(batch, queries, heads, dim, context, slots, seed=0):
  keys = jax.random.split(jax.random.key(seed), 6)
  return (
    jax.random.normal(keys[0], (batch, queries, heads, dim)),
    jax.random.normal(keys[1], (1, context, heads, dim)),
    jax.random.normal(keys[2], (1, context, heads, dim)),
    jax.random.normal(keys[3], (batch, slots, heads, dim)),
    jax.random.normal(keys[4], (batch, slots, heads, dim)),
    jax.random.randint(keys[5], (batch, queries), 0, slots + 1),
  )


def run(
  context_sizes=DEFAULT_CONTEXT_SIZES,
  batch: int = 64,
  queries: int = 2,
  heads: int = 4,
  dim: int = 16,
  slots: int = 32,
  repeats: int = 3,
) -> dict:
  """`{implementation: [ms per N]}`, the max deviation from `reference` and the broadcast bytes."""
  fns = {
    name: jax.jit(lambda *a, name=name: api.buffer_attention(*a, implementation=name))
    for name in ("reference", "xla", "pallas")
  }
  times = {name: [] for name in fns}
  errors, copies = [], []
  for context in context_sizes:
    args = _inputs(batch, queries, heads, dim, context, slots)
    expected = fns["reference"](*args)
    error = 0.0
    for name, fn in fns.items():
      times[name].append(1e3 * median_seconds(fn, *args, repeats=repeats))
      error = max(error, float(jnp.max(jnp.abs(fn(*args) - expected))))
    errors.append(error)
    copies.append(api.broadcast_bytes(batch, context, heads, dim))
  return {
    "context_sizes": list(context_sizes),
    "times_ms": times,
    "max_abs_error": errors,
    "broadcast_bytes": copies,
  }


def report(result: dict) -> str:
  names = list(result["times_ms"])
  lines = [
    f"backend: {jax.default_backend()}",
    "N      " + "".join(f"{n + ' ms':>16}" for n in names) + f"{'max |err|':>12}{'copy MB':>10}",
  ]
  for i, n in enumerate(result["context_sizes"]):
    cells = "".join(f"{result['times_ms'][name][i]:16.3f}" for name in names)
    copy = result["broadcast_bytes"][i] / 1e6
    lines.append(f"{n:<7d}{cells}{result['max_abs_error'][i]:12.2e}{copy:10.1f}")
  if jax.default_backend() == "cpu":
    lines.append("CPU: the Pallas column is the interpreter (correctness only, not speed).")
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--context_sizes", default=",".join(map(str, DEFAULT_CONTEXT_SIZES)))
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  sizes = tuple(int(n) for n in args.context_sizes.split(","))
  print(report(run(sizes, args.batch, repeats=args.repeats)))


if __name__ == "__main__":
  main()
