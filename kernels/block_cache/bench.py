r"""Times the fused indicator-and-refresh kernel against the XLA reference and checks that they agree.

  python -m kernels.block_cache.bench [--shapes=6x16x128x64,28x8x4096x1152] [--dtype=float32]

For each `[blocks, videos, tokens, hidden]` shape it prints the time of `xla` (the jnp reference:
two reductions, the store refreshed by returning `current`) and `pallas` (one pass that also writes
the store), the largest relative deviation of the indicator, the kernel's bandwidth (it reads
`current` and `previous` and writes the store once) and the ratio `xla / pallas` (above 1: the kernel
is faster). On a GPU or TPU `pallas` is the compiled kernel (Triton, Mosaic TPU); on CPU it runs in
the Pallas interpreter, which times interpret mode against the reference: agreement only.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from kernels.block_cache import api
from kernels.timing import median_seconds

# configs/bwcache.py: the default 6-block DiT's 16 videos, Latte-XL's (gpu variant) 28 blocks
DEVICE_SHAPES = ((6, 16, 128, 64), (28, 8, 4096, 1152))
CPU_SHAPES = ((6, 16, 128, 64), (6, 4, 256, 128))
KERNEL_BY_BACKEND = {
  "cpu": "the Pallas interpreter (timing interpret mode against the XLA reference)",
  "gpu": "the compiled Triton kernel",
  "tpu": "the compiled Mosaic TPU kernel",
}


def run(shapes, dtype=jnp.float32, repeats: int = 5) -> list[dict]:
  """One row per shape: times in ms, the indicator's max relative error, GB/s, xla / pallas."""
  fns = {
    name: jax.jit(lambda c, p, name=name: api.relative_l1_update(c, p, implementation=name))
    for name in ("xla", "pallas")
  }
  rows = []
  for shape in shapes:
    k1, k2 = jax.random.split(jax.random.key(0))
    current = jax.random.normal(k1, shape, dtype)
    previous = current + 0.05 * jax.random.normal(k2, shape, dtype)
    row = {"shape": shape}
    for name, fn in fns.items():
      row[f"{name}_ms"] = 1e3 * median_seconds(fn, current, previous, repeats=repeats)
    want, got = fns["xla"](current, previous)[0], fns["pallas"](current, previous)[0]
    row["max_rel_error"] = float(jnp.max(jnp.abs(got - want) / jnp.abs(want)))
    moved = 3 * np.prod(shape) * jnp.dtype(dtype).itemsize
    row["pallas_gb_s"] = moved / (row["pallas_ms"] * 1e6)
    row["ratio"] = row["xla_ms"] / row["pallas_ms"]
    rows.append(row)
  return rows


def report(rows) -> str:
  backend = jax.default_backend()
  lines = [
    f"backend: {backend}; pallas = {KERNEL_BY_BACKEND.get(backend)}",
    f"{'shape':>22}{'xla ms':>12}{'pallas ms':>12}{'max rel err':>13}{'GB/s':>9}{'xla/pallas':>12}",
  ]
  for r in rows:
    shape = "x".join(map(str, r["shape"]))
    lines.append(
      f"{shape:>22}{r['xla_ms']:12.3f}{r['pallas_ms']:12.3f}{r['max_rel_error']:13.2e}"
      f"{r['pallas_gb_s']:9.1f}{r['ratio']:12.2f}"
    )
  if backend == "cpu":
    lines.append("CPU: interpret mode, so the pallas column and the ratio say nothing about speed.")
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", default=None, help="e.g. 6x16x128x64,28x8x4096x1152")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  if args.shapes:
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
  else:
    shapes = CPU_SHAPES if jax.default_backend() == "cpu" else DEVICE_SHAPES
  print(report(run(shapes, jnp.dtype(args.dtype), args.repeats)))


if __name__ == "__main__":
  main()
