r"""Mixed precision: XLA's compiled memory of each accelerator variant's model, float32 vs bfloat16.

  python experiments/bench_precision.py [--cases=qdpm_cifar10,latte_gpu] [--latte_blocks=28]

For the model of every accelerator variant at its config's shapes, compiles the program the variant
runs most (a training step with the optimizer update, or a sampling step) at
`config.model.dtype = "float32"` and at `"bfloat16"` and prints, with the float32 / bfloat16 ratios:
  * XLA's memory analysis of the compiled program on this backend
    (`jax.jit(f).lower(...).compile().memory_analysis()`): temporaries (activations, workspace) and
    arguments (parameters, optimizer state, inputs: float32 at both dtypes, so the ratio is 1).
  * the activations the step keeps for its backward pass (`activation_bytes`: the residuals of
    `jax.vjp` of the loss, or of the sampling step's output, w.r.t. the parameters, without those
    that are the parameters or inputs themselves): what the compute dtype halves on a bf16 backend,
    independent of the backend the script runs on.
On a CPU host the two disagree: XLA:CPU has no bf16 matrix units and rewrites each bf16 dot as an f32
dot between converted operands, with an f32 output converted back, so the compiled bf16
temporaries barely shrink (a 4096-wide MLP's gradient: 256 MiB in f32, 224 MiB in bf16) where a
GPU/TPU keeps bf16 buffers. The bf16 weight copies the dots read are counted in the activations.
Nothing is allocated for the analysis (arguments are abstract), so paper-scale models fit on a CPU
host. On a GPU or TPU the programs also run, and the median step-time ratio is printed.

Cases (config variant: program; the shapes are the config's unless the case says otherwise):
  qdpm_cifar10 / qdpm_gpu / qdpm_tpu_pod  quant_diffusion:<variant> training step, the global batch
                 (128 / 512 / 2048) on one device, CIFAR-10 images (3072 dims), width-2048 MLP.
  latte_gpu      bwcache:gpu, one computed sampling step of Latte-XL/2 (embed, 28 blocks, head; every
                 block's output returned, as the cache reads them), 8 videos of 16x32x32x4 latents
                 (about 20 s of compilation per dtype on a CPU host; `--latte_blocks` for fewer).
                 Its "activations" are the forward's as a backward pass would keep them; the
                 sampler itself keeps only the block outputs (float32 at both dtypes).
  w2s_gpu        w2s:gpu backbone pre-training step (12288 -> 2048 -> 2048 -> 1024 -> 8, batch 512);
                 the config keeps float32 (configs/w2s.py: this table's numbers are why).
  dcd_ssm_gpu    dcd_ssm:gpu training step of a 2-layer AUSSM (d_model 128, d_state 64), batch 64,
                 length 60; the config keeps float32 (configs/dcd_ssm.py says why).
  fgl_gpu        fgl:gpu student step on Cora's sizes (2708 nodes, 1433 features, 10556 edges plus
                 5-NN augmentation, 8 trees, hidden 256); the config keeps float32 (configs/fgl.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable

from absl import app, flags

_CASES = flags.DEFINE_list("cases", None, "Cases to run (default: all).")
_LATTE_BLOCKS = flags.DEFINE_integer("latte_blocks", 28, "Latte-XL/2 blocks compiled (all: 28).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per program on a GPU/TPU.")

DTYPES = ("float32", "bfloat16")


# ---------------------------------------------------------------------------------------------------
# Backend-independent: the activations kept for the backward pass
# ---------------------------------------------------------------------------------------------------

_ITEMSIZE = {
  "f64": 8,
  "f32": 4,
  "bf16": 2,
  "f16": 2,
  "s32": 4,
  "u32": 4,
  "s8": 1,
  "u8": 1,
  "bool": 1,
}
_RESIDUAL = re.compile(r"^(\w+)\[([\d,]*)\] (.*)$")


def activation_bytes(fn: Callable, params, *args) -> int:
  """Bytes of the residuals `jax.vjp(lambda p: fn(p, *args), params)` keeps, less those that are
  arguments (the parameters and inputs are stored anyway). Read from
  `jax.ad_checkpoint.print_saved_residuals`, the public view of that list."""
  import jax.ad_checkpoint

  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    jax.ad_checkpoint.print_saved_residuals(fn, params, *args)
  total = 0
  for line in printed.getvalue().splitlines():
    match = _RESIDUAL.match(line)
    if not match or "from the argument" in match.group(3) or match.group(1) not in _ITEMSIZE:
      continue
    dims = [int(d) for d in match.group(2).split(",") if d]
    total += math.prod(dims) * _ITEMSIZE[match.group(1)]
  return total


@dataclasses.dataclass
class Case:
  """A program at one compute dtype: `fn(*args)` with abstract `args`; `concrete()` makes real
  arguments for timing (default: zeros, a fixed key for key-typed leaves)."""

  fn: Callable
  args: tuple
  activations: tuple  # (loss or output fn(params, *rest), params, *rest) for `activation_bytes`
  donate: tuple[int, ...] = ()
  concrete: Callable | None = None


# ---------------------------------------------------------------------------------------------------
# The programs
# ---------------------------------------------------------------------------------------------------


def _key_spec():
  import jax

  return jax.eval_shape(lambda: jax.random.key(0))


def qdpm_case(variant: str, dtype: str) -> Case:
  import jax

  from configs import quant_diffusion as qdpm_config
  from methods import quant_diffusion

  config = qdpm_config.get_config(variant)
  config.model.dtype = dtype
  dim = 32 * 32 * 3
  state = jax.eval_shape(lambda: quant_diffusion.init_state(config, dim, jax.random.key(0)))
  batch = {"x": jax.ShapeDtypeStruct((config.batch_size, dim), "float32")}
  step = lambda s, b, r: quant_diffusion.train_step(config, s, b, r)  # noqa: E731
  loss = lambda p, x, r: quant_diffusion.per_example_nats(config, p, x, r).mean()  # noqa: E731
  key = _key_spec()
  activations = (loss, state["params"], batch["x"], key)
  return Case(step, (state, batch, key), activations, donate=(0,))


def latte_case(dtype: str, blocks: int) -> Case:
  import importlib

  import jax
  import jax.numpy as jnp

  from configs import bwcache as bwcache_config

  bwcache_phases = importlib.import_module("methods.bwcache.phases")
  config = bwcache_config.get_config("gpu")
  config.model.update(dtype=dtype, depth=blocks)
  net, model = bwcache_phases.dit(config), bwcache_phases.blockwise(config)
  x = jax.ShapeDtypeStruct(
    (config.cache.num_videos, *bwcache_phases.video_shape(config)), "float32"
  )
  t = jax.ShapeDtypeStruct(x.shape[:1], "float32")
  params = jax.eval_shape(net.init, jax.random.key(0), x, t)

  def computed_step(params, x, t):
    h0, c = model.embed(params, x, t)
    h, outputs = model.run_blocks(params, h0, c)
    return x - 0.02 * model.head(params, h, c), outputs

  def concrete():
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (params, x))
    return (*zeros, jnp.full(t.shape, 500.0))

  output = lambda p, x, t: computed_step(p, x, t)[0].sum()  # noqa: E731
  return Case(computed_step, (params, x, t), (output, params, x, t), concrete=concrete)


def w2s_case(dtype: str) -> Case:
  import importlib

  import jax
  import optax

  from configs import w2s as w2s_config

  classification = importlib.import_module("methods.w2s.classification")
  config = w2s_config.get_config("gpu")
  config.model.dtype = dtype
  num_classes = 2 ** len(config.tfds.pretrain_keys)  # the packed pre-training attributes
  dim = config.tfds.image_size**2 * 3
  net = classification.backbone_model(config, num_classes)
  optimizer = optax.adam(config.pretrain.learning_rate)
  state = jax.eval_shape(
    lambda: classification._train_state(
      net.init(jax.random.key(0), jax.numpy.zeros((1, dim))), optimizer
    )
  )
  batch_size = config.pretrain.batch_size
  batch = {
    "x": jax.ShapeDtypeStruct((batch_size, dim), "float32"),
    "label": jax.ShapeDtypeStruct((batch_size,), "int32"),
  }
  step = lambda s, b, r: classification.pretrain_step(net, optimizer, s, b, r)  # noqa: E731
  loss = lambda p, b: optax.softmax_cross_entropy_with_integer_labels(  # noqa: E731
    net.apply(p, b["x"]), b["label"]
  ).mean()
  return Case(step, (state, batch, _key_spec()), (loss, state["params"], batch), donate=(0,))


def dcd_ssm_case(dtype: str) -> Case:
  import jax

  import methods.dcd_ssm as dcd_ssm
  from configs import dcd_ssm as dcd_config

  config = dcd_config.get_config("gpu")
  config.model.update(dtype=dtype, num_layers=2, scan_implementation="auto")
  group = dcd_ssm.group_of(config)
  model = dcd_ssm.model_of(config, group)
  state = jax.eval_shape(lambda: dcd_ssm.init_state(config, model, group, jax.random.key(0)))
  shape = (config.batch_size, config.data.train_length)
  batch = {"x": jax.ShapeDtypeStruct(shape, "int32"), "y": jax.ShapeDtypeStruct(shape, "int32")}
  step = lambda s, b, r: dcd_ssm.train_step(config, model, s, b, r)  # noqa: E731
  loss = lambda p, b: dcd_ssm.cross_entropy(model, p, b)[0]  # noqa: E731
  return Case(step, (state, batch, _key_spec()), (loss, state["params"], batch), donate=(0,))


def fgl_case(dtype: str) -> Case:
  import importlib

  import jax
  import jax.numpy as jnp
  import optax

  from configs import fgl as fgl_config

  fgl_phases = importlib.import_module("methods.fgl.phases")
  config = fgl_config.get_config("gpu")
  config.model.dtype = dtype
  nodes, features, classes, trees = 2708, 1433, 7, config.fgl.num_trees
  edges = 10556 + 2 * config.fgl.knn * nodes
  module = fgl_phases.student_module(config, classes)
  tx = fgl_phases.optimizer(config.fgl.learning_rate, config.optim.weight_decay)
  spec = jax.ShapeDtypeStruct
  graph = {
    "x": spec((nodes, features), "float32"),
    "senders": spec((edges,), "int32"),
    "receivers": spec((edges,), "int32"),
    "attention": spec((edges,), "float32"),
    "labels": spec((nodes,), "int32"),
  }
  forest = {name: spec((trees, nodes), "float32") for name in ("weight_up", "weight_down")}
  forest["parent"] = spec((trees, nodes), "int32")

  def logits(params, graph, forest, rng):
    edge_args = (graph["senders"], graph["receivers"], graph["attention"])
    return module.apply(
      params, graph["x"], *edge_args, forest, deterministic=False, rngs={"dropout": rng}
    )

  def loss(params, graph, forest, rng):
    out = logits(params, graph, forest, rng)
    return optax.softmax_cross_entropy_with_integer_labels(out, graph["labels"]).mean()

  def step(state, graph, forest, rng):
    loss_value, grads = jax.value_and_grad(loss)(state["params"], graph, forest, rng)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    new_params = optax.apply_updates(state["params"], updates)
    return {"params": new_params, "opt_state": opt_state}, loss_value

  def init(rng, graph, forest):
    edge_args = (graph["senders"], graph["receivers"], graph["attention"])
    params = module.init(rng, graph["x"], *edge_args, forest)
    return {"params": params, "opt_state": tx.init(params)}

  state = jax.eval_shape(init, jax.random.key(0), graph, forest)

  def concrete():
    chain = jnp.broadcast_to(jnp.arange(-1, nodes - 1, dtype=jnp.int32), (trees, nodes))
    real_forest = {
      "parent": chain,
      "weight_up": jnp.full((trees, nodes), 0.5),
      "weight_down": jnp.full((trees, nodes), 0.5),
    }
    real_graph = {k: jnp.zeros(v.shape, v.dtype) for k, v in graph.items()}
    real_state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), state)
    return real_state, real_graph, real_forest, jax.random.key(0)

  key = _key_spec()
  activations = (loss, state["params"], graph, forest, key)
  return Case(step, (state, graph, forest, key), activations, donate=(0,), concrete=concrete)


def build(name: str, dtype: str) -> Case:
  if name.startswith("qdpm_"):
    return qdpm_case(name.removeprefix("qdpm_"), dtype)
  if name == "latte_gpu":
    return latte_case(dtype, _LATTE_BLOCKS.value)
  return {"w2s_gpu": w2s_case, "dcd_ssm_gpu": dcd_ssm_case, "fgl_gpu": fgl_case}[name](dtype)


CASES = (
  "qdpm_cifar10",
  "qdpm_gpu",
  "qdpm_tpu_pod",
  "latte_gpu",
  "w2s_gpu",
  "dcd_ssm_gpu",
  "fgl_gpu",
)


# ---------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------


def memory(case: Case):
  """(compiled program, its memory analysis)."""
  import jax

  compiled = jax.jit(case.fn, donate_argnums=case.donate).lower(*case.args).compile()
  return compiled, compiled.memory_analysis()


def _zeros_like(tree):
  import jax
  import jax.numpy as jnp

  def zeros(spec):
    if jax.dtypes.issubdtype(spec.dtype, jax.dtypes.prng_key):
      return jax.random.key(0)
    return jnp.zeros(spec.shape, spec.dtype)

  return jax.tree.map(zeros, tree)


def seconds_per_step(compiled, case: Case, repeats: int) -> float:
  """Median wall time of `repeats` runs after one warm-up (fresh arguments each run: donation)."""
  import jax

  make = case.concrete or (lambda: _zeros_like(case.args))
  jax.block_until_ready(compiled(*make()))
  times = []
  for _ in range(repeats):
    args = jax.block_until_ready(make())
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def measure(name: str, timed: bool, repeats: int) -> dict:
  row = {"case": name}
  for dtype in DTYPES:
    start = time.perf_counter()
    case = build(name, dtype)
    compiled, stats = memory(case)
    row[f"temp_{dtype}"] = stats.temp_size_in_bytes
    row[f"argument_{dtype}"] = stats.argument_size_in_bytes
    row[f"activations_{dtype}"] = activation_bytes(*case.activations)
    row[f"compile_s_{dtype}"] = time.perf_counter() - start
    if timed:
      row[f"step_s_{dtype}"] = seconds_per_step(compiled, case, repeats)
  return row


def _mib(n: float) -> str:
  return f"{n / 2**20:,.1f}"


def _ratio(a: float, b: float) -> str:
  return f"{a / b:.2f}" if b else "-"


def table(rows: list[dict], timed: bool) -> str:
  header = [
    "case",
    "XLA temp f32 MiB",
    "XLA temp bf16 MiB",
    "ratio",
    "XLA args f32 MiB",
    "XLA args bf16 MiB",
    "ratio",
    "activations f32 MiB",
    "activations bf16 MiB",
    "ratio",
  ]
  header += ["step f32/bf16"] if timed else []
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for r in rows:
    cells = [
      r["case"],
      _mib(r["temp_float32"]),
      _mib(r["temp_bfloat16"]),
      _ratio(r["temp_float32"], r["temp_bfloat16"]),
      _mib(r["argument_float32"]),
      _mib(r["argument_bfloat16"]),
      _ratio(r["argument_float32"], r["argument_bfloat16"]),
      _mib(r["activations_float32"]),
      _mib(r["activations_bfloat16"]),
      _ratio(r["activations_float32"], r["activations_bfloat16"]),
    ]
    cells += [_ratio(r["step_s_float32"], r["step_s_bfloat16"])] if timed else []
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv):
  del argv
  from experiments import runtime

  runtime.setup()
  import jax

  names = _CASES.value or list(CASES)
  unknown = sorted(set(names) - set(CASES))
  if unknown:
    sys.exit(f"--cases: unknown {unknown}; known: {list(CASES)}")
  backend = jax.default_backend()
  timed = backend != "cpu"
  print(
    f"backend {backend} ({jax.devices()[0].device_kind}); latte_gpu compiles "
    f"{_LATTE_BLOCKS.value} of Latte-XL/2's 28 blocks"
  )
  rows = []
  for name in names:
    rows.append(measure(name, timed, _REPEATS.value))
    r = rows[-1]
    print(
      f"  {name}: compiled in {r['compile_s_float32']:.0f} s + {r['compile_s_bfloat16']:.0f} s",
      flush=True,
    )
  print(table(rows, timed))
  if not timed:
    print("step-time ratios need a GPU or TPU (XLA:CPU has no bf16 matrix units); not measured")


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  app.run(main)
