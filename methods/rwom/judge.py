"""R-WoM's listwise reward (paper Eq. 11): a judge that reads every candidate's imagined rollout in
one pass and returns a distribution over the candidates (`core.rwom.judge_scores`).

The judge is trained after the world model, on the world model's own imagined rollouts: states of
noisy-expert episodes on the train apps, `eval.candidates` proposals per state (the agents' uniform
proposal policy), each imagined `eval.imagine_steps` steps by the trained world model under the
retrieved tutorials (or none, at the world model's `data.tutorial_dropout` rate, so one judge serves
`wm` and `rwom`), and a ListNet loss against the environment's verdict: the target spreads its mass
uniformly over the candidates whose first action brings the task closest (the oracle's criterion).

  judge_examples   the sequences and targets, for training and for the held-out `judge_accuracy`.
  judge_phase_*    init and step of the `judge` phase.
  judge_choice     the agents' choice: argmax of the judge's scores.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import optim, rwom
from core.data import batching
from core.data import menuworld as mw
from core.nn.transformer import Transformer
from methods.rwom.world import env_of, headers, pending_index, propose, vocab_size, world_of

JUDGE_AGENTS = ("wm", "rwom")  # agents whose Eq. 11 is the listwise judge
IMAGINE_CHUNK = 512  # most rows per `imagine` call


def uses_judge(config) -> bool:
  """The judge is trained when agents run that use it (not in the agent-free simulation study)."""
  e = config.eval
  return bool(e.agent_splits) and any(agent in JUDGE_AGENTS for agent in e.agents)


def judge_model(config) -> Transformer:
  j = config.judge
  return Transformer(
    vocab_size=vocab_size(config), width=j.width, depth=j.depth, num_heads=j.num_heads
  )


def positions(config) -> np.ndarray:
  e = config.eval
  return rwom.judge_positions(world_of(config).layout.header, e.candidates, e.imagine_steps)


def imagine_chunked(imagine_fn, heads, goals, tokens, actions) -> rwom.Imagined:
  """`imagine_fn` over rows in chunks of `IMAGINE_CHUNK`, or of the power of two >= the row count
  when fewer (the last chunk padded: few compiled shapes, little padded work), as numpy."""
  n = len(tokens)
  chunk = min(IMAGINE_CHUNK, batching.power_of_two_at_least(n, minimum=8))
  parts = []
  for start in range(0, n, chunk):
    rows = np.arange(start, start + chunk) % n
    out = imagine_fn(heads[rows], goals[rows], tokens[rows], actions[rows])
    keep = min(chunk, n - start)
    parts.append([np.asarray(a)[:keep] for a in out])
  return rwom.Imagined(*(np.concatenate(p) for p in zip(*parts, strict=True)))


def judge_examples(config, imagine_fn, tasks, out, rows, context_heads, drop) -> dict:
  """Judge sequences `tokens [N, L]` and ListNet targets `target [N, m]` for the states `rows`
  (task, step) of rollouts `out`; `drop [N]` says which rows read no tutorials. Also the per-
  candidate rollout values (`value [N, m]`, `core.rwom.rollout_value` of the imagined milestones)
  for the `value_choice` comparison."""
  world, env, e = world_of(config), env_of(config), config.eval
  task, t = rows
  m, k = e.candidates, e.imagine_steps
  state, layout, goal = out["state"][task, t], tasks.layout[task], tasks.goal[task]
  rng = np.random.default_rng([config.seed, 61, len(task)])
  candidates = propose(rng, np.asarray(env.valid(layout, state)), m)  # [N, m]
  nxt = np.asarray(env.step(np.repeat(layout, m), np.repeat(state, m, 0), candidates.reshape(-1)))
  dist = np.asarray(env.distance(np.repeat(layout, m), nxt, np.repeat(goal, m, 0))).reshape(-1, m)
  best = dist == dist.min(1, keepdims=True)
  heads = np.where(
    drop[:, None, None], context_heads["none"][task], context_heads["retrieved"][task]
  )
  state_tokens = np.asarray(env.tokens(layout, state))
  actions = np.full((len(task) * m, k), -1, np.int32)
  actions[:, 0] = candidates.reshape(-1)
  rep = lambda a: np.repeat(a, m, 0)
  imagined = imagine_chunked(imagine_fn, rep(heads), rep(goal), rep(state_tokens), actions)
  head = heads[np.arange(len(task)), pending_index(state, goal)]
  unchanged = np.all(imagined.states[:, 0] == rep(state_tokens), -1).reshape(-1, m)
  value = rwom.rollout_value(
    jnp.asarray(imagined.milestone.reshape(-1, m, k)), unchanged, e.no_op_value
  )
  return {
    "tokens": judge_tokens(world.ids, head, state_tokens, imagined, m),
    "target": (best / best.sum(1, keepdims=True)).astype(np.float32),
    "best": best,
    "value": np.asarray(value),
  }


def judge_tokens(ids, head, state_tokens, imagined: rwom.Imagined, m: int) -> np.ndarray:
  """`core.rwom.judge_sequence` of rows `[N]` whose `m` candidates' rollouts are consecutive rows
  of `imagined` (`[N * m, k, ...]`)."""
  k = imagined.actions.shape[-1]
  tokens = rwom.judge_sequence(
    ids,
    jnp.asarray(head),
    jnp.asarray(state_tokens),
    jnp.asarray(imagined.actions).reshape(-1, m, k),
    jnp.asarray(imagined.states).reshape(-1, m, k, mw.STATE_TOKENS),
  )
  return np.asarray(tokens)


def training_examples(config, imagine_fn) -> dict:
  """`judge_examples` of `judge.states` states of fresh noisy-expert episodes on the train apps."""
  d, j = config.data, config.judge
  rng = np.random.default_rng([config.seed, 59])
  tasks = mw.sample_tasks(
    rng, j.episodes, range(config.world.train_apps), 1, d.task_sizes, None, config.world.name_prob
  )
  out = mw.rollouts(world_of(config).layouts, tasks, config.seed + 59, d.episode_steps, d.epsilon)
  task, t = np.nonzero(out["live"])
  pick = rng.permutation(len(task))[: j.states]
  context = {c: headers(config, tasks, c, config.seed + 59) for c in ("none", "retrieved")}
  drop = rng.random(len(pick)) < d.tutorial_dropout
  examples = judge_examples(config, imagine_fn, tasks, out, (task[pick], t[pick]), context, drop)
  return {"tokens": examples["tokens"], "target": examples["target"]}


def judge_data(config, imagine_fn):
  return batching.from_arrays(
    training_examples(config, imagine_fn), config.judge.batch_size, config.seed
  )


def optimizer(config) -> optax.GradientTransformation:
  j = config.judge
  schedule = optim.warmup_cosine(j.learning_rate, j.warmup_steps, j.steps)
  return optim.clipped_adam(schedule, config.optim.grad_clip, config.optim.weight_decay)


def judge_init(config, rng, inputs=None) -> dict:
  del inputs
  length = int(positions(config)[-1]) + 1
  params = judge_model(config).init(rng, jnp.zeros((1, length), jnp.int32))
  return {"params": params, "opt_state": optimizer(config).init(params)}


def judge_step(config, state, batch, rng):
  del rng
  model, ids, where = judge_model(config), world_of(config).ids, jnp.asarray(positions(config))

  def loss_fn(params):
    scores = rwom.judge_scores(model, params, ids, batch["tokens"], where)
    return rwom.listwise_loss(scores, batch["target"]), scores

  (loss, scores), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
  top1 = jnp.mean(jnp.take_along_axis(batch["target"], jnp.argmax(scores, -1)[:, None], 1) > 0)
  params = optax.apply_updates(state["params"], updates)
  return {"params": params, "opt_state": opt_state}, {"loss": loss, "judge_top1": top1}


@functools.lru_cache(maxsize=4)
def _scorer(model, ids, where: tuple):
  return jax.jit(
    lambda params, tokens: rwom.judge_scores(model, params, ids, tokens, jnp.asarray(where))
  )


def judge_score(config, params, tokens) -> np.ndarray:
  """The judge's scores `[N, m]` of judge sequences `tokens [N, L]`."""
  run = _scorer(judge_model(config), world_of(config).ids, tuple(int(p) for p in positions(config)))
  return np.asarray(run(params, jnp.asarray(tokens)))
