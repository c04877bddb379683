"""R-WoM's phases: `train` (the world model on transitions of train apps, with retrieved tutorials or
none) and `evaluate` (retrieval recall, the three probes, simulation accuracy by horizon and the
planning agents on seen, novel and updated apps)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from core import optim, rwom
from core.data import batching
from core.data import menuworld as mw
from core.nn import attention
from core.nn.transformer import Transformer
from methods.base import Phase, cached_per_config
from methods.rwom import agents, judge
from methods.rwom.world import (
  QUERIES,
  env_of,
  gold_document,
  headers,
  pending_index,
  ranking,
  vocab_size,
  world_of,
)

SPLITS = ("seen", "novel", "updated")


def model_of(config) -> Transformer:
  m = config.model
  return Transformer(
    vocab_size=vocab_size(config),
    width=m.width,
    depth=m.depth,
    num_heads=m.num_heads,
    mlp_hidden=m.mlp_hidden or None,
  )


# ---------------------------------------------------------------------------------------------------
# Tasks and training data
# ---------------------------------------------------------------------------------------------------


def split_tasks(config, split: str, count: int, sizes, seed: int) -> mw.Tasks:
  """Tasks on `seen` (train apps, version 1), `novel` (held-out apps, version 1) or `updated` (train
  apps, version 2, the first target a moved setting)."""
  w = config.world
  rng = np.random.default_rng([config.seed, seed, SPLITS.index(split)])
  train_apps, test_apps = range(w.train_apps), range(w.train_apps, w.num_apps)
  if split == "updated":
    moved = world_of(config).moved
    return mw.sample_tasks(rng, count, train_apps, 2, sizes, moved, w.name_prob)
  apps = train_apps if split == "seen" else test_apps
  return mw.sample_tasks(rng, count, apps, 1, sizes, None, w.name_prob)


def transition_sequences(
  config, tasks, out, rows, context_headers, context="retrieved", dropout_rng=None
) -> dict:
  """Token sequences and loss masks of the transitions `rows` (task, step) of rollouts `out`."""
  world, env = world_of(config), env_of(config)
  task, t = rows
  state, nxt = out["state"][task, t], out["next_state"][task, t]
  layout = tasks.layout[task]
  pend = pending_index(state, tasks.goal[task])
  head = context_headers[context][task, pend]
  if dropout_rng is not None:
    drop = dropout_rng.random(len(task)) < config.data.tutorial_dropout
    head = np.where(drop[:, None], context_headers["none"][task, pend], head)
  body = rwom.transition_tokens(
    world.ids,
    env.tokens(layout, state),
    out["action"][task, t],
    env.tokens(layout, nxt),
    out["reward"][task, t],
  )
  tokens = np.concatenate([head, np.asarray(body)], 1)
  return {
    "tokens": tokens,
    "mask": rwom.loss_mask(
      world.layout, out["is_expert"][task, t], config.milestone_weight, config.data.objective
    ),
    "reward": out["reward"][task, t],
  }


@cached_per_config(maxsize=2)
def train_arrays(config) -> dict:
  d = config.data
  rng = np.random.default_rng([config.seed, 1])
  tasks = mw.sample_tasks(
    rng,
    d.train_episodes,
    range(config.world.train_apps),
    1,
    d.task_sizes,
    None,
    config.world.name_prob,
  )
  out = mw.rollouts(world_of(config).layouts, tasks, config.seed, d.episode_steps, d.epsilon)
  rows = np.nonzero(out["live"])
  context = {c: headers(config, tasks, c, config.seed) for c in ("none", "retrieved")}
  dropout_rng = np.random.default_rng([config.seed, 2])
  arrays = transition_sequences(config, tasks, out, rows, context, dropout_rng=dropout_rng)
  parts = [arrays]
  if d.get("counterfactual_fraction", 0.0) > 0:
    parts.append(counterfactual_sequences(config, tasks, out, context, dropout_rng))
  arrays = {k: np.concatenate([p[k] for p in parts]) for k in ("tokens", "mask", "reward")}
  logging.info(
    "rwom: %d training transitions (%d counterfactual), %.3f milestones, objective %s",
    len(arrays["tokens"]),
    len(arrays["tokens"]) - len(parts[0]["tokens"]),
    arrays["reward"].mean(),
    d.objective,
  )
  return {"tokens": arrays["tokens"], "mask": arrays["mask"]}


def counterfactual_transitions(config, tasks, out) -> tuple[np.ndarray, dict]:
  """Exploration data on the expert's path: each state where the noisy expert took the expert's
  action gets, with probability `data.counterfactual_fraction`, a twin transition from the same state
  that takes a wrong state-changing valid action (`mw.counterfactual_action`), with the environment's
  true next state and milestone flag (0: a wrong click is never progress from a state on the expert's
  path). The world model learns from the environment's transitions, so this is data the paper's
  setting has too (exploration trajectories); here it gives the flag the negatives where the tutorial
  decides it (right against wrong top menu at the home screen), which the noisy expert alone supplies
  rarely (~4% of its transitions are wrong top-menu clicks at home). The twin's action is not a loss
  target (it is not the expert's). Returns the twins' task indices and rollout-shaped arrays
  `[n, 1]`."""
  env = env_of(config)
  rng = np.random.default_rng([config.seed, 3])
  on_path = out["live"] & out["is_expert"]
  on_path &= rng.random(on_path.shape) < config.data.counterfactual_fraction
  task, t = np.nonzero(on_path)
  state, layout, goal = out["state"][task, t], tasks.layout[task], tasks.goal[task]
  keys = jax.random.split(jax.random.key(config.seed + 41), len(task))
  action = np.asarray(_counterfactual_action(world_of(config).layouts)(layout, state, goal, keys))
  keep = action >= 0
  task, state, layout, goal, action = (a[keep] for a in (task, state, layout, goal, action))
  nxt = np.asarray(env.step(layout, state, action))
  twin = {
    "state": state[:, None],
    "action": action[:, None],
    "next_state": nxt[:, None],
    "reward": np.asarray(env.reward(layout, state, nxt, goal))[:, None],
    "is_expert": np.zeros((len(task), 1), bool),
  }
  return task, twin


def _counterfactual_action(layouts):
  fn = functools.partial(mw.counterfactual_action, jax.tree.map(jnp.asarray, layouts))
  return jax.jit(jax.vmap(fn))


def single_transition_sequences(
  config, tasks, task, arrays, context_headers, context="retrieved", dropout_rng=None
) -> dict:
  """`transition_sequences` of one transition per row: `arrays` rollout-shaped `[n, 1]`, row i a
  transition of task `task[i]`."""
  sub = mw.Tasks(*(np.asarray(a)[task] for a in tasks))
  heads = {c: h[task] for c, h in context_headers.items()}
  rows = (np.arange(len(task)), np.zeros(len(task), int))
  return transition_sequences(config, sub, arrays, rows, heads, context, dropout_rng)


def counterfactual_sequences(config, tasks, out, context, dropout_rng) -> dict:
  """`counterfactual_transitions` as token sequences (tutorial dropout as for the others)."""
  task, twin = counterfactual_transitions(config, tasks, out)
  return single_transition_sequences(config, tasks, task, twin, context, dropout_rng=dropout_rng)


def train_data(config):
  return batching.from_arrays(train_arrays(config), config.batch_size, config.seed)


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


def optimizer(config) -> optax.GradientTransformation:
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip, o.weight_decay)


def init_state(config, rng, inputs=None) -> dict:
  del inputs
  length = world_of(config).layout.length
  params = model_of(config).init(
    rng, jnp.zeros((1, length), jnp.int32), mask=attention.causal_mask()
  )
  return {"params": params, "opt_state": optimizer(config).init(params)}


def train_step(config, model, state, batch, rng):
  del rng
  loss, grads = jax.value_and_grad(rwom.loss, 1)(
    model, state["params"], batch["tokens"], batch["mask"]
  )
  updates, opt_state = optimizer(config).update(grads, state["opt_state"], state["params"])
  return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, {
    "loss": loss
  }


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------


class Evaluator:
  """The trained world model (and listwise judge) and what every evaluation needs."""

  def __init__(self, config, params, judge_params=None):
    self.config, self.params, self.judge_params = config, params, judge_params
    self.world, self.env, self.model = world_of(config), env_of(config), model_of(config)
    self.allowed = jnp.asarray(rwom.slot_vocabulary(self.world.ids, self.model.vocab_size))

  def imagine(self, heads, goals, state_tokens, actions) -> rwom.Imagined:
    return rwom.imagine(
      self.model,
      self.params,
      self.world.ids,
      self.world.layout,
      self.allowed,
      jnp.asarray(heads),
      jnp.asarray(goals),
      jnp.asarray(state_tokens),
      jnp.asarray(actions),
    )


def simulation(ev: Evaluator, tasks, context_headers) -> dict:
  """Probe 2 and simulation accuracy: the expert's actions fed open loop from the start state; exact
  match of every predicted state by horizon, full-procedure match, and alignment of the model's own
  k-step plan with the expert's."""
  e = ev.config.eval
  out = mw.rollouts(ev.world.layouts, tasks, ev.config.seed + 17, e.horizon, 0.0)
  true = np.asarray(
    ev.env.tokens(np.repeat(tasks.layout, e.horizon), out["next_state"].reshape(-1, mw.STATE_SIZE))
  ).reshape(len(tasks.layout), e.horizon, -1)
  start = np.asarray(ev.env.tokens(tasks.layout, tasks.start))
  live = out["live"]
  results = {}
  for context, heads in context_headers.items():
    pred = ev.imagine(heads, tasks.goal, start, out["action"])
    match = np.all(np.asarray(pred.states) == true, -1)
    by_k = (match & live).sum(0) / np.maximum(live.sum(0), 1)
    results[f"sim_accuracy_{context}"] = by_k
    results[f"full_procedure_{context}"] = float(np.mean(np.all(match | ~live, 1)))
    own = ev.imagine(heads, tasks.goal, start, np.full_like(out["action"], -1))
    aligned = np.all((np.asarray(own.actions) == out["action"]) | ~live, 1)
    results[f"plan_alignment_{context}"] = float(np.mean(aligned))
  return results


def next_state_identification(ev: Evaluator, tasks, context_headers, rng) -> dict:
  """Probe 1: the true next state against 3 next states of other valid actions, by likelihood."""
  out = mw.rollouts(ev.world.layouts, tasks, ev.config.seed + 23, 4, 0.0)
  task, t = np.nonzero(out["live"])
  layout, state = tasks.layout[task], out["state"][task, t]
  action, nxt = out["action"][task, t], out["next_state"][task, t]
  actions = np.arange(mw.NUM_ACTIONS)
  rows, count = len(task), mw.NUM_ACTIONS
  alt = np.asarray(
    ev.env.step(np.repeat(layout, count), np.repeat(state, count, 0), np.tile(actions, rows))
  )
  alt = alt.reshape(rows, count, -1)
  valid = np.asarray(ev.env.valid(layout, state))
  candidates = np.zeros((rows, 4, mw.STATE_SIZE), np.int32)
  for r in range(rows):
    options = {
      tuple(s) for s, ok in zip(alt[r], valid[r], strict=True) if ok and tuple(s) != tuple(nxt[r])
    }
    options = sorted(options)
    picks = [options[i] for i in rng.permutation(len(options))[:3]] if options else []
    picks = (picks * 3)[:3] if picks else [tuple(nxt[r])] * 3
    candidates[r] = [tuple(nxt[r])] + picks
  cand_tokens = np.asarray(
    ev.env.tokens(np.repeat(layout, 4), candidates.reshape(-1, mw.STATE_SIZE))
  ).reshape(rows, 4, -1)
  state_tokens = np.asarray(ev.env.tokens(layout, state))
  pend = pending_index(state, tasks.goal[task])
  results = {}
  for context in ("none", "retrieved"):
    head = context_headers[context][task, pend]
    act = np.stack([np.full(rows, ev.world.ids.word("act")), ev.world.ids.action(action)], 1)
    prompts = np.concatenate([head, state_tokens, act], 1)
    logp = np.asarray(
      rwom.next_state_logprob(ev.model, ev.params, ev.world.ids, prompts, cand_tokens)
    )
    results[f"next_state_id_{context}"] = float(np.mean(np.argmax(logp, 1) == 0))
  return results


def milestone_recognition(ev: Evaluator, tasks, context_headers) -> dict:
  """Probe 3: the milestone flag of transitions of a noisy expert, and the choice between an expert
  segment and a random one from the same start (by summed predicted milestones)."""
  e = ev.config.eval
  results = {}
  noisy = mw.rollouts(ev.world.layouts, tasks, ev.config.seed + 29, e.segment_steps * 2, 0.3)
  rows = np.nonzero(noisy["live"])
  expert = mw.rollouts(ev.world.layouts, tasks, ev.config.seed + 31, e.segment_steps, 0.0)
  random = mw.rollouts(ev.world.layouts, tasks, ev.config.seed + 37, e.segment_steps, 1.0)
  n = len(tasks.layout)
  grid = np.nonzero(np.ones((n, e.segment_steps), bool))
  for context in ("none", "retrieved"):
    seqs = transition_sequences(ev.config, tasks, noisy, rows, context_headers, context)
    p = np.asarray(rwom.milestone_probability(ev.model, ev.params, ev.world.ids, seqs["tokens"]))
    r = seqs["reward"].astype(bool)
    results[f"milestone_accuracy_{context}"] = float(np.mean((p > 0.5) == r))
    results[f"milestone_balanced_accuracy_{context}"] = float(
      0.5 * (np.mean(p[r] > 0.5) if r.any() else 1.0)
      + 0.5 * (np.mean(p[~r] <= 0.5) if (~r).any() else 1.0)
    )
    scores, truth = [], []
    for segment in (expert, random):
      seqs = transition_sequences(ev.config, tasks, segment, grid, context_headers, context)
      p = np.asarray(rwom.milestone_probability(ev.model, ev.params, ev.world.ids, seqs["tokens"]))
      weight = segment["live"][grid]
      scores.append((p * weight).reshape(n, -1).sum(1))
      truth.append((seqs["reward"] * weight).reshape(n, -1).sum(1))
    decided = truth[0] != truth[1]
    chose_first = scores[0] > scores[1]
    correct = chose_first == (truth[0] > truth[1])
    results[f"segment_choice_{context}"] = (
      float(np.mean(correct[decided])) if decided.any() else float("nan")
    )
  return results


DIAGNOSTIC_CONTEXTS = {"none": "none", "retrieved": "retrieved", "gold": "oracle"}


def home_clicks(config, tasks, out) -> tuple[np.ndarray, dict, np.ndarray]:
  """The home-screen click set of rollouts `out` of `tasks`: every live state at the home screen
  with no dialog, and from each the app's four top-menu clicks with their true next state and
  milestone flag. Returns the clicks' task indices `[n]`, rollout-shaped arrays `[n, 1]` (every
  click a loss target, `is_expert` true) and `right [n]`: the click is the rollout's own action (the
  expert's, for a noise-free rollout)."""
  env = env_of(config)
  home = out["live"] & (out["state"][..., 0] == 0) & (out["state"][..., 1] < 0)
  task, t = np.nonzero(home)
  menus = mw.TOP_MENUS  # the home screen's slots hold exactly the top menus
  clicks = np.asarray(world_of(config).layouts.labels)[tasks.layout[task], 0, :menus]
  task_rows = np.repeat(task, menus)
  state = np.repeat(out["state"][task, t], menus, 0)
  layout, goal = tasks.layout[task_rows], tasks.goal[task_rows]
  action = clicks.reshape(-1).astype(np.int32)
  nxt = np.asarray(env.step(layout, state, action))
  arrays = {
    "state": state[:, None],
    "action": action[:, None],
    "next_state": nxt[:, None],
    "reward": np.asarray(env.reward(layout, state, nxt, goal))[:, None],
    "is_expert": np.ones((len(action), 1), bool),
  }
  right = action == np.repeat(out["action"][task, t], menus)
  return task_rows, arrays, right


def home_flag_diagnostics(ev: Evaluator, tasks, context_headers) -> dict:
  """Does the milestone flag read the tutorial where only the tutorial decides it?

  States: every state of the expert's (noise-free) rollout of `tasks` at the home screen with no
  dialog and the task not done (the start, and the home screen between targets). Clicks: each of the
  app's four top menus there (`home_clicks`); the expert's is right (its flag is 1), the other three
  are wrong (flag 0); a click on a wrong top menu is a valid action that changes the state, and which
  menu is right is written only in the tutorial (or in a memorised layout). Each click is fed
  teacher-forced with its true next state, under three tutorial contexts: `none`, `retrieved` (the
  agent's top-2) and `gold` (the gold tutorial first, the `oracle` context).

    flag_auc_<ctx>          ROC AUC of P(r = 1) for right against wrong clicks, pooled over the
                            states (0.5: the flag cannot tell them apart).
    action_accuracy_<ctx>   share of the states where the model's own action (argmax at the `act`
                            position, as in a rollout) is the expert's click."""
  out = mw.rollouts(ev.world.layouts, tasks, ev.config.seed + 43, 5 * mw.MAX_TARGETS, 0.0)
  task_rows, arrays, right = home_clicks(ev.config, tasks, out)
  action = arrays["action"][:, 0]
  results = {}
  for name, context in DIAGNOSTIC_CONTEXTS.items():
    seqs = single_transition_sequences(
      ev.config, tasks, task_rows, arrays, context_headers, context
    )
    own, p = rwom.teacher_forced_readout(
      ev.model, ev.params, ev.world.ids, ev.world.layout, jnp.asarray(seqs["tokens"])
    )
    results[f"flag_auc_{name}"] = rwom.pairwise_auc(np.asarray(p), seqs["reward"] == 1)
    results[f"action_accuracy_{name}"] = float(np.mean(np.asarray(own)[right] == action[right]))
  return results


def judge_accuracy(ev: Evaluator, tasks, context_headers) -> dict:
  """Eq. 11 measured on its own: from states of a noisy expert (epsilon `data.epsilon`) on `tasks`,
  `eval.candidates` uniform proposals each imagined by the world model; the share of states where
  the choice is one of the candidates whose first action brings the task closest, for the listwise
  judge (`judge_accuracy_<ctx>`), for each rollout's value alone (`value_accuracy_<ctx>`) and for a
  uniform pick (`chance_accuracy`), with no and with retrieved tutorials, on `eval.judge_states`
  states per split."""
  d = ev.config.data
  out = mw.rollouts(ev.world.layouts, tasks, ev.config.seed + 47, d.episode_steps, d.epsilon)
  task, t = np.nonzero(out["live"])
  pick = np.random.default_rng([ev.config.seed, 47]).permutation(len(task))[
    : ev.config.eval.judge_states
  ]
  rows = (task[pick], t[pick])
  results = {}
  for context in ("none", "retrieved"):
    drop = np.full(len(pick), context == "none")
    ex = judge.judge_examples(ev.config, ev.imagine, tasks, out, rows, context_headers, drop)
    if ev.judge_params is not None:
      scores = judge.judge_score(ev.config, ev.judge_params, ex["tokens"])
      results[f"judge_accuracy_{context}"] = _hit(ex["best"], np.argmax(scores, -1))
    results[f"value_accuracy_{context}"] = _hit(ex["best"], np.argmax(ex["value"], -1))
    results["chance_accuracy"] = float(np.mean(ex["best"].mean(1)))
  return results


def _hit(best, choice) -> float:
  return float(np.mean(best[np.arange(len(choice)), choice]))


def retrieval_recall(config, tasks_list) -> dict:
  """Recall@1 and @5 of the gold tutorial for every target, per query pipeline (paper Fig. 3), and
  the share of targets whose world-model context the key-match reranker changes."""
  world = world_of(config)
  targets = [
    (int(lay), int(g), int(w))
    for tasks in tasks_list
    for lay, goal, wording in zip(tasks.layout, tasks.goal, tasks.wording, strict=True)
    for g, w in zip(goal, wording, strict=True)
    if g >= 0
  ]
  gold = np.array([gold_document(lay, g) for lay, g, _ in targets])
  results, top = {}, {}
  for query in QUERIES:
    ranks = np.stack([ranking(world, lay, g, w, query, 5)[:5] for lay, g, w in targets])
    results[f"recall1_{query}"] = float(np.mean(ranks[:, 0] == gold))
    results[f"recall5_{query}"] = float(np.mean(np.any(ranks == gold[:, None], 1)))
    top[query] = ranks[:, : config.retrieval.num_chunks]
  # the reranker's ablation: the share of targets whose context (top num_chunks) it changes
  results["rerank_changes_context"] = float(
    np.mean(np.any(top["rewrite"] != top["rewrite_rerank"], 1))
  )
  return results


def evaluate(config, params, rng, judge_params=None) -> dict:
  e = config.eval
  ev = Evaluator(config, params, judge_params)
  results, agent_tasks, probe_tasks = {}, [], []
  np_rng = np.random.default_rng([config.seed, 5])
  for split in e.splits:
    tasks = split_tasks(config, split, e.num_tasks, e.sim_sizes, 101)
    probe_tasks.append(tasks)
    context = {c: headers(config, tasks, c, config.seed + 3) for c in e.contexts}
    part = simulation(ev, tasks, context)
    part.update(next_state_identification(ev, tasks, context, np_rng))
    part.update(milestone_recognition(ev, tasks, context))
    diagnostic = {c: context.get(c) for c in DIAGNOSTIC_CONTEXTS.values()}
    diagnostic = {
      c: h if h is not None else headers(config, tasks, c, config.seed + 3)
      for c, h in diagnostic.items()
    }
    part.update(home_flag_diagnostics(ev, tasks, diagnostic))
    if split != "seen":
      part.update(judge_accuracy(ev, tasks, context))
    if split in e.agent_splits:
      agent_set = split_tasks(config, split, e.num_agent_tasks, e.agent_sizes, 202)
      agent_tasks.append(agent_set)
      part.update(agents.run_all(ev, agent_set, jax.random.fold_in(rng, SPLITS.index(split))))
    logging.info("rwom %s: %s", split, {k: np.round(v, 3) for k, v in part.items()})
    results.update({f"{k}_{split}": v for k, v in part.items()})
  results.update(retrieval_recall(config, agent_tasks or probe_tasks))
  return results | headline(config, results)


def headline(config, results) -> dict:
  """The summary keys: agent success averaged over the agent splits; R-WoM's simulation gain
  (retrieved minus none exact-match accuracy, averaged over the novel and updated splits) averaged
  over every horizon k = 1..`eval.horizon` (`long_horizon_accuracy_gain`), at the last horizon
  alone (`accuracy_gain_at_last_horizon`) and for the full procedure (`full_procedure_gain`); the
  home-screen flag AUC and action accuracy and the judge's accuracy per tutorial context, averaged
  over the same splits."""
  e = config.eval
  out = {}
  for agent in e.agents:
    values = [results[f"success_{agent}_{s}"] for s in e.agent_splits]
    if values:
      out[f"success_{agent}"] = float(np.mean(values))
  test = [s for s in e.splits if s != "seen"] or list(e.splits)
  gains = np.asarray(
    [results[f"sim_accuracy_retrieved_{s}"] - results[f"sim_accuracy_none_{s}"] for s in test]
  ).mean(0)
  out["long_horizon_accuracy_gain"] = float(np.mean(gains))
  out["accuracy_gain_at_last_horizon"] = float(gains[-1])
  out["full_procedure_gain"] = float(
    np.mean(
      [results[f"full_procedure_retrieved_{s}"] - results[f"full_procedure_none_{s}"] for s in test]
    )
  )
  keys = [
    f"{key}_{name}" for key in ("flag_auc", "action_accuracy") for name in DIAGNOSTIC_CONTEXTS
  ]
  keys += [
    f"{key}_{c}" for key in ("judge_accuracy", "value_accuracy") for c in ("none", "retrieved")
  ]
  for key in keys + ["chance_accuracy"]:
    values = [results[f"{key}_{s}"] for s in test if f"{key}_{s}" in results]
    if values:
      out[key] = float(np.mean(values))
  return out


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  model = model_of(config)
  train = Phase(
    name="train",
    num_steps=config.steps,
    init=functools.partial(init_state, config),
    step=functools.partial(train_step, config, model),
    data=lambda inputs: train_data(config),
    outputs=lambda state, inputs: state["params"],
  )
  out = [train]
  if judge.uses_judge(config):
    out.append(
      Phase(
        name="judge",
        num_steps=config.judge.steps,
        init=functools.partial(judge.judge_init, config),
        step=functools.partial(judge.judge_step, config),
        data=lambda inputs: judge.judge_data(config, Evaluator(config, inputs["train"]).imagine),
        outputs=lambda state, inputs: state["params"],
      )
    )
  evaluation = Phase(
    name="evaluate",
    num_steps=0,
    init=lambda rng, inputs: (
      {"params": inputs["train"]} | ({"judge": inputs["judge"]} if "judge" in inputs else {})
    ),
    evaluate=lambda state, rng, inputs: evaluate(config, state["params"], rng, state.get("judge")),
  )
  return out + [evaluation]
