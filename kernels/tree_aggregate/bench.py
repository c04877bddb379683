r"""Times the tree aggregator against dense all-pairs attention as n grows (linear vs quadratic).

  python -m kernels.tree_aggregate.bench [--sizes=1000,10000,100000,1000000] [--features=16]

Trees are random recursive trees (depth ~ ln n) with shuffled node labels. Dense attention is
softmax(Q K^T / sqrt(f)) V over all n^2 pairs, computed in row chunks so memory stays O(chunk n);
it is skipped above `--dense_max_n` (its time there would be minutes). Each cell is the median of
`--repeats` jitted calls after a warm-up; `xla/pallas` above 1 means the kernel beats the
level-synchronous XLA sweep. On a GPU or TPU the Pallas column is the compiled kernel (Triton, Mosaic
TPU): `python -m kernels.tree_aggregate.bench` measures it (on TPU up to `--pallas_max_n` = 30000
nodes, what fits VMEM). On CPU it runs in interpret mode (an emulator), timed up to 1000 nodes: it
shows correctness, not kernel speed.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from kernels.timing import median_seconds
from kernels.tree_aggregate.api import tree_aggregate

KERNEL_BY_BACKEND = {
  "cpu": "the Pallas interpreter (timing interpret mode against the XLA sweeps)",
  "gpu": "the compiled Triton kernel",
  "tpu": "the compiled Mosaic TPU kernel",
}


# The interpreter is slow; the TPU kernel keeps a tree's columns in VMEM (pallas.py: ~40k nodes).
PALLAS_MAX_N = {"cpu": 1000, "tpu": 30000}


def random_tree(n: int, rng: np.random.Generator) -> np.ndarray:
  """A random recursive tree (node i hangs under a uniform earlier node), labels shuffled."""
  parent = np.full(n, -1, np.int32)
  parent[1:] = (rng.random(n - 1) * np.arange(1, n)).astype(np.int32)
  relabel = rng.permutation(n).astype(np.int32)
  shuffled = np.full(n, -1, np.int32)
  shuffled[relabel[1:]] = relabel[parent[1:]]
  return shuffled


def dense_attention(q, k, v, chunk: int = 1024):
  """softmax(q k^T / sqrt(f)) v over all pairs, in row chunks (O(n^2 f) work, O(chunk n) memory)."""
  n, f = q.shape
  pad = -n % chunk
  blocks = jnp.pad(q, ((0, pad), (0, 0))).reshape(-1, chunk, f)

  def rows(qb):
    return jax.nn.softmax(qb @ k.T / np.sqrt(f), axis=-1) @ v

  return jax.lax.map(rows, blocks).reshape(-1, f)[:n]


def run(sizes, features: int, repeats: int, dense_max_n: int, pallas_max_n: int, seed: int = 0):
  """Returns rows {n, depth, <implementation>_ms..., dense_ms, ratio}; prints a table as it goes."""
  rng = np.random.default_rng(seed)
  implementations = ["sequential", "xla", "pallas"]
  rows = []
  cpu = jax.default_backend() == "cpu"
  header = ["n", "depth"] + [f"{i}_ms" for i in implementations]
  header += ["dense_ms", "dense/best_tree", "xla/pallas"]
  print(" ".join(f"{h:>16}" for h in header), flush=True)
  for n in sizes:
    parent = random_tree(n, rng)
    x = jnp.asarray(rng.normal(size=(n, features)), jnp.float32)
    weight = jnp.asarray(rng.uniform(0.1, 0.9, n), jnp.float32)
    row = {"n": n, "depth": _depth(parent)}
    for impl in implementations:
      if impl == "pallas" and n > pallas_max_n:
        row[f"{impl}_ms"] = None
        continue
      fn = jax.jit(lambda x, p, w, impl=impl: tree_aggregate(x, p, w, implementation=impl))
      row[f"{impl}_ms"] = 1e3 * median_seconds(fn, x, jnp.asarray(parent), weight, repeats=repeats)
    if n <= dense_max_n:
      fn = jax.jit(dense_attention)
      row["dense_ms"] = 1e3 * median_seconds(fn, x, x, x, repeats=max(1, repeats // 2))
    else:
      row["dense_ms"] = None
    best = min(row[f"{i}_ms"] for i in implementations[:2])
    row["ratio"] = row["dense_ms"] / best if row["dense_ms"] else None
    row["xla_over_pallas"] = row["xla_ms"] / row["pallas_ms"] if row["pallas_ms"] else None
    rows.append(row)
    cells = [row["n"], row["depth"]] + [row[f"{i}_ms"] for i in implementations]
    cells += [row["dense_ms"], row["ratio"], row["xla_over_pallas"]]
    print(" ".join(f"{_fmt(c):>16}" for c in cells), flush=True)
  if cpu:
    print("CPU: the pallas column is interpret mode (an emulator): correctness only, not speed.")
  _print_slopes(rows, implementations[:2] + ["dense"])
  return rows


def _depth(parent: np.ndarray) -> int:
  from kernels.tree_aggregate.layout import node_depths

  return int(jnp.max(node_depths(jnp.asarray(parent))))


def _print_slopes(rows, names) -> None:
  """Least-squares slope of log(time) against log(n): ~1 for linear, ~2 for quadratic."""
  for name in names:
    points = [(r["n"], r[f"{name}_ms"]) for r in rows if r.get(f"{name}_ms")]
    if len(points) >= 2:
      n, t = np.log(np.array(points, dtype=np.float64)).T
      print(f"log-log slope {name}: {np.polyfit(n, t, 1)[0]:.2f}")


def _fmt(value) -> str:
  if value is None:
    return "-"
  return f"{value:.4g}" if isinstance(value, float) else str(value)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="1000,10000,100000,1000000")
  parser.add_argument("--features", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--dense_max_n", type=int, default=30000)
  parser.add_argument("--pallas_max_n", type=int, default=None, help="default: per backend")
  args = parser.parse_args()
  backend = jax.default_backend()
  print(f"backend: {backend}; pallas = {KERNEL_BY_BACKEND.get(backend)}; features: {args.features}")
  sizes = [int(s) for s in args.sizes.split(",")]
  pallas_max_n = args.pallas_max_n or PALLAS_MAX_N.get(backend, max(sizes))
  run(sizes, args.features, args.repeats, args.dense_max_n, pallas_max_n)


if __name__ == "__main__":
  main()
