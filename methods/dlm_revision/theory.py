"""E1 and E2 of the DLM-revision method: the paper's constructions run as exact programs.

E1 (`separation_evaluate`): the exact samplers of D_n^xor (revision, Thm 4.1; remasking, Thm 4.2; the
monotone chain) against naive monotone MDLM decoding with a window predictor and with the global
exact conditional (Thm 4.5's obstruction). E2 (`space_*`): XOR-tree circuits as monotone CoT and in
place with revision or remasking (Thm 3.2), and transition models learned from their traces; and the
XOR chain, a deep narrow circuit (width 2, size 2n), as monotone CoT and in place with revision
(`space_chain_*`: footprint size against width).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import dlm_programs as programs
from core import masked_diffusion as md
from core import optim
from core.data import parity
from methods.base import EvaluationChunks

MASK_ID = programs.MASK


# ---------------------------------------------------------------------------------------------------
# E1: exact separation on D_n^xor
# ---------------------------------------------------------------------------------------------------


def separation_programs(n: int) -> dict[str, programs.Program]:
  """The exact samplers: revision (Thm 4.1), remasking (Thm 4.2), the monotone chain."""
  return {
    "revision": programs.revision_parity(n),
    "remasking": programs.remasking_parity(n),
    "monotone_chain": programs.monotone_chain_parity(n),
  }


def _parity_metrics(outputs, tv: bool) -> dict:
  metrics = {"violation": jnp.mean(parity.parity_violation(outputs))}
  if tv:
    metrics["tv"] = parity.even_parity_tv(outputs)
  return metrics


def _program_metrics(program: programs.Program, key, num_samples: int, tv: bool) -> dict:
  """Violation rate, TV to D_n^xor (if `tv`), footprint, remasks and revisions per sample."""
  out = programs.run(program, key, num_samples)
  return _parity_metrics(out.outputs, tv) | {
    "footprint": jnp.max(out.footprint).astype(jnp.float32),
    "remasks": jnp.mean(out.remasks.astype(jnp.float32)),
    "revisions": jnp.mean(out.revisions.astype(jnp.float32)),
  }


@functools.lru_cache(maxsize=32)
def _exact_programs_fn(n: int, num_samples: int, tv: bool):
  """Jitted `rng -> {program: metrics}` for the three exact programs at n (one compilation)."""
  table = separation_programs(n)

  def measure(rng):
    return {
      name: _program_metrics(program, jax.random.fold_in(rng, j), num_samples, tv)
      for j, (name, program) in enumerate(table.items())
    }

  return jax.jit(measure)


@functools.lru_cache(maxsize=32)
def _naive_sampler(n: int, num_samples: int, tv: bool):
  """Jitted `(rng, T, radius) -> metrics`: MDLM ancestral decoding (`core.masked_diffusion`) with
  the window predictor; T and the window are traced, so one compilation per n."""
  spec = md.sampler_spec("ancestral", "none")

  def measure(rng, num_rounds, radius):
    logits_fn = lambda tokens: programs.window_parity_logits(tokens, radius)
    out = md.sample(logits_fn, spec, rng, num_samples, n, MASK_ID, num_rounds)
    return _parity_metrics(out.tokens, tv) | {
      "footprint": jnp.max(out.footprint).astype(jnp.float32),
      "remasks": jnp.zeros(()),
      "revisions": jnp.mean(out.changed.astype(jnp.float32)),
      "nfe": jnp.mean(out.nfe.astype(jnp.float32)),
    }

  return jax.jit(measure)


def _naive_metrics(n: int, rng, num_samples: int, tv: bool, rounds: int, radius: int) -> dict:
  values = _naive_sampler(n, num_samples, tv)(rng, rounds, radius)
  return {k: float(v) for k, v in values.items()} | {"rounds": float(rounds)}


def separation_chunk(config, rng, i: int) -> dict:
  """E1 at one length n = `separation.lengths[i]`: `<program>/<metric>` for every program, and the
  exact sampler's TV at the same sample size (`tv_noise_floor`)."""
  sep = config.separation
  n = sep.lengths[i]
  tv = n <= sep.tv_max_length
  exact = parity.sample_even_parity(np.random.default_rng([config.seed, n]), n, sep.num_samples)
  key = jax.random.fold_in(rng, i)
  values = _exact_programs_fn(n, sep.num_samples, tv)(key)
  measured = {
    name: {k: float(v) for k, v in values[name].items()} | {"rounds": float(program.num_rounds)}
    for name, program in separation_programs(n).items()
  }
  for j, rounds in enumerate(sep.naive_rounds):
    for k, (label, radius) in enumerate((("naive", sep.window // 2), ("global", n))):
      sub = jax.random.fold_in(key, 100 + 2 * j + k)
      measured[f"{label}_T{rounds}"] = _naive_metrics(n, sub, sep.num_samples, tv, rounds, radius)
  out = {"tv_noise_floor": float(parity.even_parity_tv(exact)) if tv else math.nan}
  for name, metrics in measured.items():
    metrics.setdefault("tv", math.nan)
    out |= {f"{name}/{metric}": value for metric, value in metrics.items()}
  return out


def separation_combine(config, chunks: list[dict]) -> dict:
  """Per program, arrays over `separation.lengths`: `sep_<program>_<metric>`; the exact sampler's TV
  at the same sample size (`sep_tv_noise_floor`); headline scalars."""
  table: dict[str, dict[str, list[float]]] = {}
  for chunk in chunks:
    for key, value in chunk.items():
      if "/" in key:
        name, metric = key.split("/")
        table.setdefault(name, {}).setdefault(metric, []).append(float(value))
  results = {
    "sep_lengths": np.asarray(config.separation.lengths, np.float64),
    "sep_tv_noise_floor": [float(chunk["tv_noise_floor"]) for chunk in chunks],
  }
  for name, metrics in table.items():
    for metric, values in metrics.items():
      results[f"sep_{name}_{metric}"] = np.asarray(values)
  exact_names = tuple(separation_programs(2))
  results["sep_max_violation_exact"] = max(max(table[k]["violation"]) for k in exact_names)
  naive = [k for k in table if k.startswith("naive_")]
  results["sep_min_violation_naive"] = min(min(table[k]["violation"]) for k in naive)
  for name in exact_names:
    results[f"sep_max_rounds_{name}"] = max(table[name]["rounds"])
  return results


def separation_evaluate(config, rng) -> EvaluationChunks:
  """E1 in one chunk per n of `separation.lengths` (`n<n>`), so a long paper-scale run saves and
  resumes per length. Programs: the three exact samplers, and for each T of `separation.naive_rounds`
  the naive monotone MDLM with the window predictor (`naive_T<T>`) and with the global exact
  conditional (`global_T<T>`)."""
  names = [f"n{n}" for n in config.separation.lengths]
  return EvaluationChunks(
    names=names,
    run=lambda name: separation_chunk(config, rng, names.index(name)),
    combine=lambda done: separation_combine(config, [done[name] for name in names]),
  )


# ---------------------------------------------------------------------------------------------------
# E2: space (XOR trees), the predictor learned from traces
# ---------------------------------------------------------------------------------------------------


def space_learned_keys(config) -> list[tuple[str, int]]:
  """(kind, n) of every transition model the space phase trains."""
  if not config.space.train_steps:
    return []
  return [(kind, n) for n in config.space.learn_lengths for kind in programs.XOR_TREES]


def space_model(config, program: programs.Program) -> md.Denoiser:
  s = config.space
  return md.Denoiser(
    num_tokens=2,
    num_outputs=programs.NUM_VALUES,
    length=program.length,
    width=s.width,
    depth=s.depth,
    num_heads=s.num_heads,
    num_rounds=program.num_rounds,
  )


def _space_name(kind: str, n: int) -> str:
  return f"{kind}_n{n}"


def space_init(config, rng, inputs=None) -> dict:
  if not space_learned_keys(config):
    return {"rng": jax.random.key_data(rng)}
  params = {}
  for i, (kind, n) in enumerate(space_learned_keys(config)):
    program = programs.XOR_TREES[kind](n)
    tokens = jnp.zeros((1, program.length), jnp.int32)
    params[_space_name(kind, n)] = space_model(config, program).init(
      jax.random.fold_in(rng, i), tokens, jnp.zeros((1,), jnp.int32)
    )
  return {"params": params, "opt_state": space_optimizer(config).init(params)}


def space_optimizer(config) -> optax.GradientTransformation:
  """Adam on a warmup-cosine schedule; every transition model has its own parameters, so the sum of
  their losses trains each on its own gradient (no clipping: it would couple them)."""
  schedule = optim.warmup_cosine(config.space.learning_rate, 100, config.space.train_steps)
  return optim.clipped_adam(schedule, grad_clip=None)


def _transition_loss(config, kind: str, n: int, params, rng) -> jax.Array:
  """Cross-entropy of the model's next-value law against the program's own next state (teacher
  forcing on a fresh trace), on the positions the topology makes active in the sampled round."""
  program = programs.XOR_TREES[kind](n)
  batch = config.space.batch_size
  trace_rng, round_rng = jax.random.split(rng)
  trace = programs.run(program, trace_rng, batch, keep_trace=True).trace  # [R + 1, B, L]
  rounds = jax.random.randint(round_rng, (batch,), 0, program.num_rounds)
  rows = jnp.arange(batch)
  states, targets = trace[rounds, rows], trace[rounds + 1, rows]
  active = jnp.asarray(programs.active_table(program))[rounds]
  logits = space_model(config, program).apply(params, states, rounds)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.sum(ce * active) / jnp.maximum(jnp.sum(active), 1)


def space_step(config, state, batch, rng):
  """One Adam step on the sum of the independent models' losses (each model's own gradient)."""
  del batch
  keys = space_learned_keys(config)

  def loss_fn(params):
    losses = [
      _transition_loss(config, kind, n, params[_space_name(kind, n)], jax.random.fold_in(rng, i))
      for i, (kind, n) in enumerate(keys)
    ]
    return sum(losses) / len(losses), losses

  (loss, losses), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  updates, opt_state = space_optimizer(config).update(grads, state["opt_state"], state["params"])
  metrics = {"loss": loss} | {
    f"space_loss_{_space_name(k, n)}": v for (k, n), v in zip(keys, losses, strict=True)
  }
  return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, metrics


def _tree_metrics(program: programs.Program, key, num_samples: int) -> dict:
  """Validity (every output a bit, root = parity of the inputs), input bias, footprints."""
  out = programs.run(program, key, num_samples)
  inputs, root = out.outputs[:, :-1], out.outputs[:, -1]
  bits = jnp.all(out.outputs < 2, axis=-1)
  return {
    "validity": jnp.mean(bits & (root == jnp.sum(inputs, -1) % 2)),
    "input_bias": jnp.abs(jnp.mean(jnp.where(inputs < 2, inputs, 0.5)) - 0.5),
    "footprint": jnp.max(out.footprint).astype(jnp.float32),
    "final_footprint": jnp.max(jnp.sum(out.states != programs.MASK, -1)).astype(jnp.float32),
  }


def _chain_metrics(program: programs.Program, key, num_samples: int) -> dict:
  """Validity of the XOR chain's output (a_{n-2}, c_{n-1}, a_{n-1}): all bits and the last the XOR
  of the first two; the peak footprint."""
  out = programs.run(program, key, num_samples)
  prev, coin, acc = out.outputs[:, 0], out.outputs[:, 1], out.outputs[:, 2]
  bits = jnp.all(out.outputs < 2, axis=-1)
  return {
    "validity": jnp.mean(bits & (acc == (prev + coin) % 2)),
    "footprint": jnp.max(out.footprint).astype(jnp.float32),
  }


def _trees_metrics(
  trees: dict[str, programs.Program], rng, num_samples: int, metric_fn=_tree_metrics
) -> dict:
  """`{kind: metrics}` for several circuits in one jitted call, plus their rounds and lengths."""

  def measure(key):
    return {
      kind: metric_fn(program, jax.random.fold_in(key, j), num_samples)
      for j, (kind, program) in enumerate(trees.items())
    }

  values = jax.jit(measure)(rng)
  return {
    kind: {k: float(v) for k, v in values[kind].items()}
    | {"rounds": float(program.num_rounds), "length": float(program.length)}
    for kind, program in trees.items()
  }


def _learned_tree(config, kind: str, n: int, params) -> programs.Program:
  program = programs.XOR_TREES[kind](n)
  model = space_model(config, program)

  def probs_fn(states, r):
    rounds = jnp.full(states.shape[:1], r, jnp.int32)
    return jax.nn.softmax(model.apply(params, states, rounds))

  return programs.learned_program(program, probs_fn)


def space_evaluate(config, state, rng) -> dict:
  """Arrays over `space.lengths` per tree kind (`space_<kind>_<metric>`), and the learned trees'
  validity and footprint over `space.learn_lengths` (`space_learned_<kind>_<metric>`)."""
  s = config.space
  results: dict = {"space_lengths": np.asarray(s.lengths, np.float64)}
  for i, n in enumerate(s.lengths):
    trees = {kind: build(n) for kind, build in programs.XOR_TREES.items()}
    for kind, metrics in _trees_metrics(trees, jax.random.fold_in(rng, i), s.num_samples).items():
      for metric, value in metrics.items():
        results.setdefault(f"space_{kind}_{metric}", []).append(value)
  for i, n in enumerate(s.lengths):
    chains = {kind: build(n) for kind, build in programs.XOR_CHAINS.items()}
    key = jax.random.fold_in(rng, 500 + i)
    for kind, metrics in _trees_metrics(chains, key, s.num_samples, _chain_metrics).items():
      for metric, value in metrics.items():
        results.setdefault(f"space_chain_{kind}_{metric}", []).append(value)
  learned = space_learned_keys(config)
  if learned:
    results["space_learn_lengths"] = np.asarray(s.learn_lengths, np.float64)
  for i, n in enumerate(s.learn_lengths if learned else ()):
    trees = {
      kind: _learned_tree(config, kind, n, state["params"][_space_name(kind, n)])
      for kind in programs.XOR_TREES
    }
    key = jax.random.fold_in(rng, 1000 + i)
    for kind, metrics in _trees_metrics(trees, key, s.num_samples).items():
      for metric in ("validity", "footprint", "input_bias"):
        results.setdefault(f"space_learned_{kind}_{metric}", []).append(metrics[metric])
  results = {k: np.asarray(v) if isinstance(v, list) else v for k, v in results.items()}
  lengths = np.asarray(s.lengths, np.float64)
  gap = results["space_monotone_footprint"] - results["space_remasking_footprint"]
  chain_gap = results["space_chain_monotone_footprint"] - results["space_chain_revision_footprint"]
  if len(lengths) > 1:
    results["space_footprint_gap_slope"] = float(np.polyfit(lengths, gap, 1)[0])
    results["space_chain_footprint_gap_slope"] = float(np.polyfit(lengths, chain_gap, 1)[0])
  results["space_chain_max_footprint_revision"] = float(
    results["space_chain_revision_footprint"].max()
  )
  results["space_min_validity_chain"] = float(
    min(results[f"space_chain_{k}_validity"].min() for k in programs.XOR_CHAINS)
  )
  results["space_min_validity_exact"] = float(
    min(results[f"space_{k}_validity"].min() for k in programs.XOR_TREES)
  )
  if learned:
    results["space_min_validity_learned"] = float(
      min(results[f"space_learned_{k}_validity"].min() for k in programs.XOR_TREES)
    )
  return results
