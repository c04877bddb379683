r"""The AR buffer three ways: our buffer TNP beside the first author's PyTorch implementation
(conorhassan/AR-nanoTabPFN), both trained at one model size on the same GP batches, then compared on
joint log-likelihood per target on the same held-out tasks and on joint-sampling time.

  pip install -e ".[peers]"
  python experiments/peers/ar_buffer.py --official_repo=PATH/TO/AR-nanoTabPFN [--seeds=0,1] \
      [--steps=400] [--context_sizes=64,256,1024] [--json=runs/peers_ar_buffer.json]

Run against conorhassan/AR-nanoTabPFN at commit 359bfce66771f07e3274738fc07e0fb4db8042db. What is taken
from the checkout (the package `ar_tabpfn`, imported from `--official_repo`), unchanged:
  * `model/model.py:ARTabPFN`: embedder (linear x and y embeddings + a 3-way marker), post-LN
    two-stage transformer (the feature attention runs over one column here: 1-D inputs), learned AR
    position tokens, the mixture-of-Gaussians head and its loss;
  * `model/attention.py:create_row_mask`: the training mask (context bidirectional, buffer causal,
    the first half of the target chunks of length K see buffer prefixes 1..K, the rest only the
    context), so the targets per task must be a multiple of 2K (`--num_targets`);
  * `train.py:train`: the training loop (AdamW betas 0.9/0.95, warmup + cosine `LambdaLR`, global
    norm clipping), run with `Config(device="cpu")`, no AMP, no compile, no checkpoints, no wandb;
  * `model/inference.py:ARTabPFNPredictor`: `evaluate_joint_density` (one teacher-forced pass, target i
    sees buffer entries < i) for the joint and, one target at a time, the marginals, and
    `sample_sequence` (the KV-cached sampler) with both backends: `triton_shared_context` (the context
    prefilled once at batch 1, shared by all streams: `hybrid_attention` takes its PyTorch path, as
    the checkout does for non-CUDA tensors) and `flex_attention` (a per-stream cache).
What the driver changes from outside:
  * `flex_attention` in `ar_tabpfn.model.attention` and `ar_tabpfn.model.inference` is replaced by
    `dense_flex_attention`: the BlockMask's own `mask_mod` evaluated on the full index grid, then
    `torch.nn.functional.scaled_dot_product_attention` with that boolean mask (the same scale,
    1/sqrt(head_dim)). PyTorch 2.13 has no flex-attention backward on CPU, and its eager CPU forward
    is an unfused debugging path; the driver checks on the held-out tasks that the replacement gives
    the eager flex forward's densities (`flex_check_max_abs_diff`).
  * The data: `train` reads batches from a `torch.utils.data.Dataset` of `DataAttr`s
    (`OfficialBatches`) instead of its tabular SCM prior (`OnlineTabularDataset`), so that both sides
    see the same GP batches (the paper's GP task; the checkout ships only the tabular prior).
Nothing else of the checkout is used (its Triton kernels need CUDA).

Per seed, `--steps` batches are drawn once from our GP generator (`methods/ar_buffer/phases.py:
sample_tasks`, the config `configs/ar_buffer.py` with the flags' sizes): each batch has ONE context
size N ~ U{min..max} (the official model takes no padding mask); ours sees the context padded to the
maximum with `ctx_valid`, the official model its first N points; buffer and targets are the same
points. Each side keeps its own training mix (ours: half the targets context-only, half a random
prefix v ~ U{1..K}; official: chunked prefixes 1..K, `--ours_visible=official` gives ours the
official pattern). Both use the same width, depth, heads, feed-forward width, buffer size K, number of
mixture components, learning rate and schedule. Reported: per-target joint log-likelihood of the
buffer (one pass, M = K targets) and of independent marginals on `--eval_tasks` held-out tasks
(`eval.seed`, the same for every seed, `--eval_orders` random orders averaged in log space), the
exact GP oracle of both, the paired per-task difference; then the time of B joint sample streams of
M targets per context size N, every sampler compiled or warmed up once, then timed `--repeats`
times in alternation in one process (median).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import time

from absl import app, flags, logging

OFFICIAL_COMMIT = "359bfce66771f07e3274738fc07e0fb4db8042db"
OFFICIAL_BACKENDS = ("triton_shared_context", "flex_attention")


FLAG_NAMES: list[str] = []  # the flags `define_flags` adds, written to the JSON


def define_flags(flag_values=flags.FLAGS) -> None:
  define = dict(flag_values=flag_values)
  before = set(flag_values)
  flags.DEFINE_string("official_repo", None, "A checkout of conorhassan/AR-nanoTabPFN.", **define)
  flags.DEFINE_list("seeds", ["0", "1"], "Seeds: batches, initialisation of both models.", **define)
  flags.DEFINE_integer("steps", 400, "Training steps of each model (one batch each).", **define)
  flags.DEFINE_integer("batch_size", 32, "Tasks per batch.", **define)
  flags.DEFINE_integer("width", 64, "d_model of both models.", **define)
  flags.DEFINE_integer("depth", 4, "Layers of both models.", **define)
  flags.DEFINE_integer("num_heads", 4, "Attention heads of both models.", **define)
  flags.DEFINE_integer(
    "mlp_hidden", 128, "Feed-forward width (ours SwiGLU, official GELU).", **define
  )
  flags.DEFINE_integer(
    "buffer_size", 16, "K: buffer trained, and targets evaluated jointly.", **define
  )
  flags.DEFINE_integer(
    "num_components", 4, "Mixture components of both heads (official: >= 2).", **define
  )
  flags.DEFINE_integer(
    "min_context", 4, "Training context size N ~ U{min..max} per batch.", **define
  )
  flags.DEFINE_integer(
    "max_context", 32, "Training context size N ~ U{min..max} per batch.", **define
  )
  flags.DEFINE_integer("num_targets", 32, "Training targets per task (a multiple of 2K).", **define)
  flags.DEFINE_float("learning_rate", 5e-4, "Peak learning rate of both.", **define)
  flags.DEFINE_integer("warmup_steps", 100, "Linear warmup, then cosine to 0 at --steps.", **define)
  flags.DEFINE_enum(
    "ours_visible",
    "ours",
    ["ours", "official"],
    "Our training prefixes: random or chunked.",
    **define,
  )
  flags.DEFINE_integer("eval_tasks", 256, "Held-out tasks (the same for every seed).", **define)
  flags.DEFINE_integer("eval_context", 16, "Context points of each held-out task.", **define)
  flags.DEFINE_integer("eval_orders", 4, "Random decode orders averaged per task.", **define)
  flags.DEFINE_list(
    "context_sizes", ["64", "256", "1024"], "N of the sampling benchmark.", **define
  )
  flags.DEFINE_integer("num_samples", 16, "B: joint sample streams per benchmark task.", **define)
  flags.DEFINE_integer(
    "repeats", 3, "Timed runs of every sampler (median), warm-up excluded.", **define
  )
  flags.DEFINE_list(
    "official_backends", list(OFFICIAL_BACKENDS), "Official samplers timed.", **define
  )
  flags.DEFINE_integer("threads", 1, "CPU threads of both frameworks (torch and XLA).", **define)
  flags.DEFINE_string("json", "runs/peers_ar_buffer.json", "Where results are written.", **define)
  flags.mark_flags_as_required(["official_repo"], flag_values=flag_values)
  FLAG_NAMES[:] = sorted(set(flag_values) - before)


# ---------------------------------------------------------------------------------------------------
# The official code, from the checkout
# ---------------------------------------------------------------------------------------------------


def check_checkout(repo: str) -> str:
  """The checkout's absolute path; a one-line exit naming --official_repo when it is not one."""
  repo = os.path.abspath(repo)
  needed = ("ar_tabpfn/model/model.py", "ar_tabpfn/model/inference.py", "ar_tabpfn/train.py")
  missing = [p for p in needed if not os.path.isfile(os.path.join(repo, p))]
  if missing:
    raise SystemExit(
      f"error: --official_repo: {repo} is not a conorhassan/AR-nanoTabPFN checkout "
      f"(no {missing[0]})"
    )
  return repo


def dense_flex_attention(query, key, value, block_mask=None, **unused):
  """flex_attention's result for a boolean `mask_mod`, by a dense mask: the BlockMask's own
  `mask_mod` on the `[Q, KV]` index grid, then `scaled_dot_product_attention`."""
  import torch
  import torch.nn.functional as F

  if unused.get("score_mod") is not None:
    raise NotImplementedError("dense_flex_attention: score_mod is not used by the checkout")
  q_len, kv_len = query.shape[-2], key.shape[-2]
  mask = None
  if block_mask is not None:
    zero = torch.zeros((), dtype=torch.long)
    q_idx = torch.arange(q_len)[:, None]
    kv_idx = torch.arange(kv_len)[None, :]
    mask = torch.broadcast_to(block_mask.mask_mod(zero, zero, q_idx, kv_idx), (q_len, kv_len))
  return F.scaled_dot_product_attention(query, key, value, attn_mask=mask)


def official_modules(repo: str, dense: bool = True):
  """`(model module, inference module, train module)` imported from the checkout; with `dense`,
  flex_attention replaced by `dense_flex_attention` (module docstring)."""
  repo = check_checkout(repo)
  if repo not in sys.path:
    sys.path.insert(0, repo)
  with contextlib.redirect_stdout(io.StringIO()):
    attention = importlib.import_module("ar_tabpfn.model.attention")
    inference = importlib.import_module("ar_tabpfn.model.inference")
    model = importlib.import_module("ar_tabpfn.model.model")
    train = importlib.import_module("ar_tabpfn.train")
  if dense:
    attention.flex_attention = dense_flex_attention
    inference.flex_attention = dense_flex_attention
  return model, inference, train


def set_flex(official, dense: bool) -> None:
  """Switches the checkout between `dense_flex_attention` and PyTorch's own flex_attention."""
  from torch.nn.attention import flex_attention

  _, inference, _ = official
  attention = sys.modules["ar_tabpfn.model.attention"]
  fn = dense_flex_attention if dense else flex_attention.flex_attention
  attention.flex_attention = inference.flex_attention = fn


def official_model(official, values):
  model_module = official[0]
  return model_module.ARTabPFN(
    d_model=values.width,
    n_heads=values.num_heads,
    n_layers=values.depth,
    d_ff=values.mlp_hidden,
    num_features=1,
    buffer_size=values.buffer_size,
    num_components=values.num_components,
  )


def official_batches(batches):
  """A map-style `Dataset` of the checkout's `DataAttr` over the shared batches (numpy dicts)."""
  import torch

  data_attr = sys.modules["ar_tabpfn.data.data"].DataAttr
  column = lambda a: torch.tensor(a, dtype=torch.float32)[..., None]  # noqa: E731

  class OfficialBatches(torch.utils.data.Dataset):
    def __len__(self):
      return len(batches) + 1  # train()'s prefetcher reads one batch ahead

    def __getitem__(self, i):
      b = batches[min(i, len(batches) - 1)]
      n = b["size"]
      return data_attr(
        xc=column(b["x_ctx"][:, :n]),
        yc=column(b["y_ctx"][:, :n]),
        xb=column(b["x_buf"]),
        yb=column(b["y_buf"]),
        xt=column(b["x_tgt"]),
        yt=column(b["y_tgt"]),
      )

  return OfficialBatches()


def train_official(official, values, seed: int, batches):
  import torch

  train_module = official[2]
  torch.manual_seed(seed)
  model = official_model(official, values)
  config = train_module.Config(device="cpu")
  config.training = train_module.TrainingConfig(
    max_steps=len(batches), grad_clip=1.0, compile_model=False, use_amp=False
  )
  config.optimizer = train_module.OptimizerConfig(
    lr=values.learning_rate, betas=(0.9, 0.95), weight_decay=0.0
  )
  config.scheduler = train_module.SchedulerConfig(
    use_scheduler=True, warmup_steps=min(values.warmup_steps, len(batches) // 2)
  )
  config.checkpoint = train_module.CheckpointConfig(save_dir="")
  config.logging = train_module.LoggingConfig(use_wandb=False, log_interval=max(len(batches), 1))
  log = io.StringIO()
  start = time.perf_counter()
  with contextlib.redirect_stdout(log):
    model = train_module.train(model, official_batches(batches), config)
  seconds = time.perf_counter() - start
  logging.info("official training: %s", log.getvalue().strip().splitlines()[-1:])
  return model.eval(), seconds


def official_log_likelihoods(official, model, tasks, values) -> dict:
  """Per-task per-target joint (one teacher-forced pass, averaged over orders) and marginal LLs."""
  import numpy as np
  import torch

  predictor = official[1].ARTabPFNPredictor.from_trained_model(model, backend="flex_attention")
  xc, yc, xt, yt, orders = eval_split(tasks, values)
  t, o, m = orders.shape
  rows = lambda a: np.repeat(a, o, axis=0)  # noqa: E731
  perm = orders.reshape(t * o, m)
  xt_o = np.take_along_axis(rows(xt), perm, axis=1)
  yt_o = np.take_along_axis(rows(yt), perm, axis=1)
  f = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
  with torch.no_grad():
    joint = predictor.evaluate_joint_density(
      f(rows(xc))[..., None], f(rows(yc)), f(xt_o)[..., None], f(yt_o)
    )
    one = lambda a: np.repeat(a, m, axis=0)  # noqa: E731
    marginal = predictor.evaluate_joint_density(
      f(one(xc))[..., None], f(one(yc)), f(xt.reshape(-1, 1))[..., None], f(yt.reshape(-1, 1))
    )
  joint = joint.numpy().sum(-1).reshape(t, o).mean(1) / m
  return {"joint": joint, "marginal": marginal.numpy().reshape(t, m).mean(1)}


def flex_check(official, model, tasks, values, count: int = 8) -> float:
  """Max abs difference of the official joint densities, dense replacement vs PyTorch's flex."""
  import numpy as np

  few = {k: v[:count] for k, v in tasks.items()}
  dense = official_log_likelihoods(official, model, few, values)
  set_flex(official, dense=False)
  try:
    with contextlib.redirect_stderr(io.StringIO()):
      flex = official_log_likelihoods(official, model, few, values)
  finally:
    set_flex(official, dense=True)
  return float(max(np.abs(dense[k] - flex[k]).max() for k in dense))


# ---------------------------------------------------------------------------------------------------
# Ours, and the data both sides share
# ---------------------------------------------------------------------------------------------------


def ar_buffer_phases():
  """`methods/ar_buffer/phases.py` (the package exports its `phases` function under that name)."""
  return importlib.import_module("methods.ar_buffer.phases")


def our_config(values, seed: int):
  from configs import ar_buffer as config_lib

  config = config_lib.get_config()
  config.seed = seed
  config.steps = values.steps
  config.batch_size = values.batch_size
  m, d, e = config.model, config.data, config.eval
  m.width, m.depth, m.num_heads = values.width, values.depth, values.num_heads
  m.mlp_hidden, m.embed_hidden = values.mlp_hidden, values.width
  m.max_buffer, m.num_components = values.buffer_size, values.num_components
  d.min_context, d.max_context, d.num_targets = (
    values.min_context,
    values.max_context,
    values.num_targets,
  )
  config.optim.learning_rate, config.optim.warmup_steps = values.learning_rate, values.warmup_steps
  e.num_tasks, e.num_context, e.num_targets = (
    values.eval_tasks,
    values.eval_context,
    values.buffer_size,
  )
  e.num_orders = values.eval_orders
  return config


def official_visible(batch: int, num_targets: int, num_buffer: int):
  """`create_row_mask`'s prefixes as visible counts: target chunks of K, the first half of them
  seeing buffer entries `<= offset` (v = offset + 1), the rest none."""
  import numpy as np

  offset = np.arange(num_targets)
  visible = np.where(offset < num_targets // 2, offset % num_buffer + 1, 0)
  return np.broadcast_to(visible, (batch, num_targets)).astype(np.int32)


def shared_batches(config, values, seed: int) -> list[dict]:
  """`--steps` batches of GP tasks (numpy): padded context with one size per batch, buffer,
  targets and our visible prefixes."""
  import jax
  import numpy as np

  from core import neural_process as tnp

  phases = ar_buffer_phases()

  d, k, b = config.data, config.model.max_buffer, config.batch_size
  n_max, m = d.max_context, d.num_targets

  @jax.jit
  def draw(key):
    k_task, k_size, k_visible = jax.random.split(key, 3)
    tasks = phases.sample_tasks(config, k_task, b, n_max + k + m)
    size = jax.random.randint(k_size, (), d.min_context, n_max + 1)
    return tasks["x"], tasks["y"], size, tnp.training_visible(k_visible, b, m, k)

  out = []
  for step in range(values.steps):
    x, y, size, visible = map(np.asarray, draw(jax.random.fold_in(jax.random.key(seed), step)))
    if values.ours_visible == "official":
      visible = official_visible(b, m, k)
    out.append(
      {
        "x_ctx": x[:, :n_max],
        "y_ctx": y[:, :n_max],
        "ctx_valid": np.arange(n_max)[None] < np.full((b, 1), size),
        "size": int(size),
        "x_buf": x[:, n_max : n_max + k],
        "y_buf": y[:, n_max : n_max + k],
        "x_tgt": x[:, n_max + k :],
        "y_tgt": y[:, n_max + k :],
        "visible": visible,
      }
    )
  return out


def train_ours(config, batches):
  """`methods/ar_buffer/phases.py`'s init, loss and optimiser on the given batches."""
  import jax
  import optax

  phases = ar_buffer_phases()

  model, opt = phases.make_model(config), phases.optimizer(config)

  @jax.jit
  def step(state, batch):
    grad_fn = jax.value_and_grad(lambda p: phases.loss_fn(model, p, batch)[0])
    loss, grads = grad_fn(state["params"])
    updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

  state = phases.init_state(config, jax.random.key(config.seed))
  start = time.perf_counter()
  for batch in batches:
    state, loss = step(state, {k: v for k, v in batch.items() if k != "size"})
  logging.info("ours training: final loss %.4f", float(loss))
  return state["params"], time.perf_counter() - start


def eval_split(tasks, values):
  n = values.eval_context
  return tasks["x"][:, :n], tasks["y"][:, :n], tasks["x"][:, n:], tasks["y"][:, n:], tasks["orders"]


def our_log_likelihoods(config, params, tasks, values) -> dict:
  import jax
  import numpy as np

  from core import neural_process as tnp

  phases = ar_buffer_phases()

  model, k = phases.make_model(config), config.model.max_buffer
  xc, yc, xt, yt, orders = eval_split(tasks, values)
  t, o, m = orders.shape
  rows = lambda a: np.repeat(a, o, axis=0)  # noqa: E731
  perm = orders.reshape(t * o, m)
  xt_o, yt_o = np.take_along_axis(rows(xt), perm, 1), np.take_along_axis(rows(yt), perm, 1)
  joint = jax.jit(lambda p: tnp.joint_log_density(model, p, rows(xc), rows(yc), xt_o, yt_o, k))
  marginal = jax.jit(lambda p: tnp.marginal_log_density(model, p, xc, yc, xt, yt))
  return {
    "joint": np.asarray(joint(params)).reshape(t, o).mean(1) / m,
    "marginal": np.asarray(marginal(params)) / m,
  }


def oracle_log_likelihoods(config, tasks, values) -> dict:
  import jax
  import numpy as np

  from core.data import gp_tasks

  phases = ar_buffer_phases()

  prior = phases.prior_of(config)
  xc, yc, xt, yt, _ = eval_split(tasks, values)
  args = (xc, yc, xt, yt, tasks["lengthscale"], tasks["kernel"])
  m = xt.shape[1]
  joint = jax.vmap(lambda *a: gp_tasks.conditional_log_density(*a, prior=prior))(*args)
  marginal = jax.vmap(lambda *a: gp_tasks.marginal_log_density(*a, prior=prior))(*args)
  return {"joint": np.asarray(joint) / m, "marginal": np.asarray(marginal) / m}


# ---------------------------------------------------------------------------------------------------
# Sampling time: ours (compiled) and the official KV-cached sampler, side by side
# ---------------------------------------------------------------------------------------------------


def sampling_task(config, num_context: int, num_targets: int):
  import jax
  import numpy as np

  phases = ar_buffer_phases()

  task = phases.sample_tasks(
    config, jax.random.key(config.benchmark.seed), 1, num_context + num_targets
  )
  x, y = np.asarray(task["x"][0]), np.asarray(task["y"][0])
  return x[:num_context], y[:num_context], x[num_context:]


def samplers(config, params, official, official_model_, values, num_context: int) -> dict:
  """`{name: fn()}`: every sampler ready to run, compiled (ours) or warmed up (both) once."""
  import jax
  import torch

  from core import neural_process as tnp

  phases = ar_buffer_phases()

  b, m = values.num_samples, values.buffer_size
  x_ctx, y_ctx, x_tgt = sampling_task(config, num_context, m)
  model, k = phases.make_model(config), config.model.max_buffer
  noise = tnp.sampling_noise(jax.random.key(1), b, m, config.model.num_components)
  compiled = (
    jax.jit(lambda p, e: tnp.sample_joint(model, p, x_ctx, y_ctx, x_tgt, e, k)[0])
    .lower(params, noise)
    .compile()
  )
  fns = {"ours": lambda: jax.block_until_ready(compiled(params, noise))}
  f = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
  xc = f(x_ctx)[None, :, None].expand(b, -1, -1).contiguous()
  yc = f(y_ctx)[None].expand(b, -1).contiguous()
  xt = f(x_tgt)[None, :, None].expand(b, -1, -1).contiguous()
  for backend in values.official_backends:
    predictor = official[1].ARTabPFNPredictor.from_trained_model(official_model_, backend=backend)

    def run(predictor=predictor):
      with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
        return predictor.sample_sequence(xc, yc, xt)

    fns[f"official_{backend}"] = run
  for fn in fns.values():
    fn()  # warm-up: compilation, mask construction, allocator
  return fns


def time_sampling(config, params, official, official_model_, values) -> list[dict]:
  import numpy as np

  rows = []
  for n in (int(s) for s in values.context_sizes):
    fns = samplers(config, params, official, official_model_, values, n)
    times = {name: [] for name in fns}
    for _ in range(values.repeats):
      for name, fn in fns.items():
        start = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - start)
    row = {"context_size": n, **{name: float(np.median(t)) for name, t in times.items()}}
    logging.info("sampling N=%d: %s", n, row)
    rows.append(row)
  return rows


# ---------------------------------------------------------------------------------------------------
# One seed, all seeds, the table
# ---------------------------------------------------------------------------------------------------


def parameter_counts(params, official_model_) -> dict:
  import jax

  return {
    "ours": int(sum(a.size for a in jax.tree.leaves(params))),
    "official": int(sum(p.numel() for p in official_model_.parameters())),
  }


def run_seed(values, seed: int, official, tasks) -> dict:
  import numpy as np

  config = our_config(values, seed)
  batches = shared_batches(config, values, seed)
  params, ours_s = train_ours(config, batches)
  model, official_s = train_official(official, values, seed, batches)
  ours = our_log_likelihoods(config, params, tasks, values)
  theirs = official_log_likelihoods(official, model, tasks, values)
  diff = theirs["joint"] - ours["joint"]
  result = {
    "seed": seed,
    "train_seconds": {"ours": ours_s, "official": official_s},
    "parameters": parameter_counts(params, model),
    "paired_joint_official_minus_ours": float(diff.mean()),
    "paired_joint_se": float(diff.std(ddof=1) / np.sqrt(len(diff))),
  }
  for side, lls in (("ours", ours), ("official", theirs)):
    for kind, per_task in lls.items():
      result[f"{side}_{kind}"] = float(per_task.mean())
  if seed == int(values.seeds[0]):
    result["flex_check_max_abs_diff"] = flex_check(official, model, tasks, values)
    result["sampling"] = time_sampling(config, params, official, model, values)
  return result


def markdown(seeds: list[dict], oracle: dict) -> str:
  from methods.base import t_interval_cell as interval

  lines = [
    f"{len(seeds)} seeds; joint LL per target (nats), mean ± 95% t-interval over seeds",
    "",
    "| model | buffer joint (one pass, K = M) | independent marginals | joint - marginals |",
    "|---|---|---|---|",
  ]
  for side in ("official", "ours"):
    joint = [s[f"{side}_joint"] for s in seeds]
    marginal = [s[f"{side}_marginal"] for s in seeds]
    gain = [j - g for j, g in zip(joint, marginal, strict=True)]
    lines.append(f"| {side} | {interval(joint)} | {interval(marginal)} | {interval(gain)} |")
  o_joint, o_marginal = float(oracle["joint"].mean()), float(oracle["marginal"].mean())
  lines.append(f"| GP oracle | {o_joint:.3f} | {o_marginal:.3f} | {o_joint - o_marginal:.3f} |")
  lines += [
    "",
    "| seed | official - ours (paired, ± s.e. over tasks) | parameters official / ours |",
  ]
  lines.append("|---|---|---|")
  for s in seeds:
    p = s["parameters"]
    lines.append(
      f"| {s['seed']} | {s['paired_joint_official_minus_ours']:+.3f} ± {s['paired_joint_se']:.3f} "
      f"| {p['official']} / {p['ours']} |"
    )
  timed = next(s for s in seeds if "sampling" in s)
  lines += [
    "",
    f"flex check (dense replacement vs PyTorch flex, max abs diff): "
    f"{timed['flex_check_max_abs_diff']:.2e}",
  ]
  if timed["sampling"]:
    lines += ["", *sampling_table(timed["sampling"])]
  return "\n".join(lines)


def sampling_table(rows: list[dict]) -> list[str]:
  names = [k for k in rows[0] if k != "context_size"]
  others = [n for n in names if n != "ours"]
  lines = [
    "| N | "
    + " | ".join(f"{n} s" for n in names)
    + " | "
    + " | ".join(f"{n} / ours" for n in others)
    + " |",
    "|---" * (1 + len(names) + len(others)) + "|",
  ]
  for row in rows:
    cells = [f"{row[n]:.4f}" for n in names] + [f"{row[n] / row['ours']:.1f}x" for n in others]
    lines.append(f"| {row['context_size']} | " + " | ".join(cells) + " |")
  return lines


def validate(values) -> None:
  if values.num_targets % (2 * values.buffer_size):
    raise SystemExit(
      f"error: --num_targets={values.num_targets} must be a multiple of 2 * --buffer_size "
      f"({2 * values.buffer_size}): the official training mask splits targets into chunks of K"
    )
  if values.num_components < 2:
    raise SystemExit("error: --num_components must be >= 2 (the official mixture head)")
  unknown = set(values.official_backends) - set(OFFICIAL_BACKENDS)
  if unknown:
    raise SystemExit(f"error: --official_backends: unknown {sorted(unknown)}")


def limit_threads(threads: int) -> None:
  """The same CPU threads for both sides; before JAX starts its backend."""
  import torch

  torch.set_num_threads(threads)
  if threads == 1:
    extra = "--xla_cpu_multi_thread_eigen=false"  # XLA:CPU: no Eigen thread pool
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {extra}".strip()


def main(argv):
  del argv
  values = flags.FLAGS
  repo = check_checkout(values.official_repo)
  validate(values)
  from experiments import runtime

  limit_threads(values.threads)
  runtime.setup()
  official = official_modules(repo)
  phases = ar_buffer_phases()

  tasks = phases.eval_tasks(our_config(values, int(values.seeds[0])))
  oracle = oracle_log_likelihoods(our_config(values, 0), tasks, values)
  seeds = []
  for seed in (int(s) for s in values.seeds):
    seeds.append(run_seed(values, seed, official, tasks))
    logging.info("seed %d: %s", seed, json.dumps(seeds[-1]))
  table = markdown(seeds, oracle)
  print(table)
  if values.json:
    os.makedirs(os.path.dirname(values.json) or ".", exist_ok=True)
    with open(values.json, "w") as f:
      json.dump(
        {
          "official_commit": OFFICIAL_COMMIT,
          "flags": {name: values[name].value for name in FLAG_NAMES},
          "oracle_joint": float(oracle["joint"].mean()),
          "oracle_marginal": float(oracle["marginal"].mean()),
          "seeds": seeds,
          "markdown": table,
        },
        f,
        indent=2,
        default=str,
      )


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  define_flags()
  app.run(main)
