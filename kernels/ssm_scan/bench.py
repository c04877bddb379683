r"""Times the scan implementations against sequence length and checks that they agree.

  python -m kernels.ssm_scan.bench [--lengths=256,1024,4096,16384] [--dim=128] [--batch=2]

For each T it prints the time of `sequential` (`lax.scan`), `xla` (`lax.associative_scan`) and `pallas`
on complex64 inputs, the largest deviation from `sequential`, the ratio `xla / pallas` (above 1: the
kernel is faster than XLA), and per implementation the growth `time(T) / time(T_prev)` and the
log-log slope over all T (1 = linear in T; the sequential and Pallas scans do O(T) work, the
associative scan O(T log T)). On a GPU or TPU `pallas` is the compiled kernel (Triton, Mosaic TPU),
so one command measures it: `python -m kernels.ssm_scan.bench`. On CPU it runs in the Pallas
interpreter: its column checks correctness and linear growth only, not speed.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from kernels.ssm_scan import api
from kernels.timing import median_seconds

DEFAULT_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
KERNEL_BY_BACKEND = {
  "cpu": "the Pallas interpreter (timing interpret mode against the XLA reference)",
  "gpu": "the compiled Triton kernel",
  "tpu": "the compiled Mosaic TPU kernel",
}


def _inputs(batch: int, length: int, dim: int, seed: int = 0):
  keys = jax.random.split(jax.random.key(seed), 4)
  theta = jax.random.uniform(keys[0], (batch, length, dim), minval=-np.pi, maxval=np.pi)
  radius = jax.random.uniform(keys[1], (batch, length, dim), minval=0.9, maxval=1.0)
  a = (radius * jnp.exp(1j * theta)).astype(jnp.complex64)
  b = (jax.random.normal(keys[2], (batch, length, dim)) * 0.1).astype(jnp.complex64)
  h0 = jax.random.normal(keys[3], (batch, dim)).astype(jnp.complex64)
  return a, b, h0


def run(lengths=DEFAULT_LENGTHS, batch: int = 2, dim: int = 128, repeats: int = 3) -> dict:
  """`{implementation: [ms per length]}` and the max deviation from `sequential` per length."""
  fns = {
    name: jax.jit(lambda a, b, h0, name=name: api.ssm_scan(a, b, h0, implementation=name))
    for name in ("sequential", "xla", "pallas")
  }
  times = {name: [] for name in fns}
  errors = []
  for length in lengths:
    a, b, h0 = _inputs(batch, length, dim)
    reference = fns["sequential"](a, b, h0)
    error = 0.0
    for name, fn in fns.items():
      times[name].append(1e3 * median_seconds(fn, a, b, h0, repeats=repeats))
      error = max(error, float(jnp.max(jnp.abs(fn(a, b, h0) - reference))))
    errors.append(error)
  return {"lengths": list(lengths), "times_ms": times, "max_abs_error": errors}


def slope(lengths, times) -> float:
  """Least-squares slope of log(time) against log(T)."""
  return float(np.polyfit(np.log(lengths), np.log(times), 1)[0])


def report(result: dict) -> str:
  lengths, times = result["lengths"], result["times_ms"]
  names = list(times)
  lines = [
    f"backend: {jax.default_backend()}; pallas = {KERNEL_BY_BACKEND.get(jax.default_backend())}",
    "T      " + "".join(f"{n + ' ms':>16}" for n in names) + f"{'max |err|':>12}{'xla/pallas':>12}",
  ]
  for i, length in enumerate(lengths):
    cells = "".join(f"{times[n][i]:16.2f}" for n in names)
    ratio = times["xla"][i] / times["pallas"][i]
    lines.append(f"{length:<7d}{cells}{result['max_abs_error'][i]:12.2e}{ratio:12.2f}")
  lines.append("growth time(T)/time(T_prev):")
  for n in names:
    ratios = [times[n][i] / times[n][i - 1] for i in range(1, len(lengths))]
    lines.append(f"  {n:<11}" + " ".join(f"{r:5.2f}" for r in ratios))
  if len(lengths) > 1:
    lines.append(
      "log-log slope (1 = linear): "
      + ", ".join(f"{n} {slope(lengths, times[n]):.2f}" for n in names)
    )
  if jax.default_backend() == "cpu":
    lines.append(
      "CPU: the Pallas column is interpret-mode correctness only (the Pallas interpreter, not a "
      "compiled kernel); its speed means nothing, only its agreement and its linear growth."
    )
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--dim", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  lengths = tuple(int(t) for t in args.lengths.split(","))
  print(report(run(lengths, args.batch, args.dim, args.repeats)))


if __name__ == "__main__":
  main()
