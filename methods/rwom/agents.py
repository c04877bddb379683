"""The planning agents of R-WoM's study (paper Sec. 3 and Fig. 2, Eqs. 9-11), batched over tasks.

At every real step the proposal policy offers `eval.candidates` distinct valid actions (uniform, the
stand-in for the paper's policy samples); then

  none           executes the first proposal (no world model: the "Vanilla" agent);
  rag            executes the clicks of the top-1 retrieved tutorial literally, from home ("RAG");
  wm             imagines `eval.imagine_steps` steps after each proposal with the world model and no
                 tutorials, and picks by the listwise judge over all rollouts (`judge.py`, Eq. 11;
                 the ungrounded world model);
  rwom           the same with the retrieved tutorials (R-WoM);
  rwom_absolute  R-WoM with absolute per-rollout scores in {0, .5, 1} from the milestone flags (the
                 baseline of Eq. 11);
  rwom_value     R-WoM with each rollout's milestone value alone, argmax (`core.rwom.value_choice`);
  true_wm        the planner of `rwom` with a perfect world model: each proposal's k-step rollout is
                 the true environment's (the expert continuing it) with its true milestone flags,
                 chosen by the same rule; the ceiling of the planner itself;
  oracle         picks the proposal that the true environment says brings the task closest.

`rwom_absolute`, `rwom_value` and `true_wm` add `eval.no_op_value` to the value of a proposal whose
imagined next state equals the current one (`core.rwom.rollout_value`).

A task succeeds when all its settings are on within `eval.budget_factor` times the expert's steps.
"""

from __future__ import annotations

import jax
import numpy as np

from core import rwom
from core.data import menuworld as mw
from methods.rwom import judge
from methods.rwom.world import headers, pending_index, propose, ranking

WORLD_MODEL_AGENTS = {
  "wm": "none",
  "rwom": "retrieved",
  "rwom_absolute": "retrieved",
  "rwom_value": "retrieved",
}


class TutorialFollower:
  """The RAG agent's state: which target it follows and how far along its tutorial it is."""

  def __init__(self, ev, tasks):
    world = ev.world
    self.clicks = []
    for lay, goal, wording in zip(tasks.layout, tasks.goal, tasks.wording, strict=True):
      row = []
      for g, w in zip(goal, wording, strict=True):
        if g < 0:
          row.append(row[-1])
          continue
        doc = int(ranking(world, int(lay), int(g), int(w), ev.config.retrieval.query, 5)[0])
        d_layout, d_setting = world.doc_keys[doc]
        row.append(mw.tutorial_clicks(world.layouts, int(d_layout), int(d_setting)))
      self.clicks.append(row)
    n = len(tasks.layout)
    self.target, self.pointer = np.full(n, -1), np.zeros(n, int)

  def act(self, state, pend) -> np.ndarray:
    """From home, the tutorial's clicks in order; home (or back out of a dialog) to restart when the
    target changes or the clicks run out without turning it on."""
    actions = np.zeros(len(state), np.int32)
    for row, (s, j) in enumerate(zip(state, pend, strict=True)):
      clicks = self.clicks[row][j]
      if j != self.target[row] or self.pointer[row] >= len(clicks):
        self.target[row], self.pointer[row] = j, -1
      if self.pointer[row] < 0 and (s[1] >= 0 or s[0] != 0):
        actions[row] = mw.BACK if s[1] >= 0 else mw.HOME
        continue
      self.pointer[row] = max(self.pointer[row], 0)
      actions[row] = clicks[self.pointer[row]]
      self.pointer[row] += 1
    return actions


def run_agent(ev, tasks, name: str, context_headers, rng) -> np.ndarray:
  """Success `[N]` of agent `name` on `tasks`."""
  e = ev.config.eval
  np_rng = np.random.default_rng(np.asarray(jax.random.key_data(rng)).ravel().tolist())
  state = np.asarray(tasks.start)
  budget = e.budget_factor * np.asarray(ev.env.distance(tasks.layout, state, tasks.goal))
  follower = TutorialFollower(ev, tasks) if name == "rag" else None
  heads = context_headers.get(WORLD_MODEL_AGENTS.get(name))
  for t in range(int(budget.max())):
    live = ~np.asarray(ev.env.done(state, tasks.goal)) & (t < budget)
    if not live.any():
      break
    valid = np.asarray(ev.env.valid(tasks.layout, state))
    candidates = propose(np_rng, valid, e.candidates)
    if name == "none":
      action = candidates[:, 0]
    elif name == "rag":
      action = follower.act(state, pending_index(state, tasks.goal))
    elif name == "oracle":
      action = oracle_choice(ev, tasks, state, candidates)
    elif name == "true_wm":
      action = true_world_model_choice(ev, tasks, state, candidates)
    else:
      action = world_model_choice(ev, tasks, state, candidates, heads, name, rng, t)
    stepped = np.asarray(ev.env.step(tasks.layout, state, action))
    state = np.where(live[:, None], stepped, state)
  return np.asarray(ev.env.done(state, tasks.goal))


def oracle_choice(ev, tasks, state, candidates) -> np.ndarray:
  n, m = candidates.shape
  layout = np.repeat(tasks.layout, m)
  nxt = ev.env.step(layout, np.repeat(state, m, 0), candidates.reshape(-1))
  dist = np.asarray(ev.env.distance(layout, nxt, np.repeat(tasks.goal, m, 0))).reshape(n, m)
  return candidates[np.arange(n), np.argmin(dist, 1)]


def true_world_model_choice(ev, tasks, state, candidates) -> np.ndarray:
  """The per-candidate value rule on true rollouts: each candidate, then `imagine_steps - 1` expert
  steps, with the environment's milestone flags."""
  n, m = candidates.shape
  layout, goal = np.repeat(tasks.layout, m), np.repeat(tasks.goal, m, 0)
  current, action = np.repeat(state, m, 0), candidates.reshape(-1)
  flags, unchanged = [], None
  for _ in range(ev.config.eval.imagine_steps):
    nxt = np.asarray(ev.env.step(layout, current, action))
    flags.append(np.asarray(ev.env.reward(layout, current, nxt, goal)))
    if unchanged is None:
      unchanged = np.all(nxt == current, -1).reshape(n, m)
    current, action = nxt, np.asarray(ev.env.expert(layout, nxt, goal))
  milestones = np.stack(flags, -1).reshape(n, m, -1).astype(np.float32)
  choice = rwom.value_choice(milestones, unchanged, ev.config.eval.no_op_value)
  return candidates[np.arange(n), np.asarray(choice)]


def world_model_choice(ev, tasks, state, candidates, heads, name, rng, t) -> np.ndarray:
  """Eq. 10 for every candidate (one batched call), then Eq. 11: the listwise judge over all
  rollouts at once (`wm`, `rwom`), absolute per-rollout scores (`rwom_absolute`) or each rollout's
  value alone (`rwom_value`)."""
  n, m = candidates.shape
  k = ev.config.eval.imagine_steps
  state_tokens = np.asarray(ev.env.tokens(tasks.layout, state))
  tokens = np.repeat(state_tokens, m, 0)
  actions = np.full((n * m, k), -1, np.int32)
  actions[:, 0] = candidates.reshape(-1)
  imagined = ev.imagine(np.repeat(heads, m, 0), np.repeat(tasks.goal, m, 0), tokens, actions)
  if name in judge.JUDGE_AGENTS:
    imagined = rwom.Imagined(*(np.asarray(a) for a in imagined))
    head = heads[np.arange(n), pending_index(state, tasks.goal)]
    sequences = judge.judge_tokens(ev.world.ids, head, state_tokens, imagined, m)
    choice = np.argmax(judge.judge_score(ev.config, ev.judge_params, sequences), -1)
    return candidates[np.arange(n), choice]
  milestones = imagined.milestone.reshape(n, m, k)
  unchanged = np.all(np.asarray(imagined.states[:, 0]) == tokens, -1).reshape(n, m)
  no_op_value = ev.config.eval.no_op_value
  if name == "rwom_absolute":
    rng = jax.random.fold_in(rng, t)
    choice = rwom.absolute_choice(milestones, rng, unchanged, no_op_value)
  else:
    choice = rwom.value_choice(milestones, unchanged, no_op_value)
  return candidates[np.arange(n), np.asarray(choice)]


def run_all(ev, tasks, rng) -> dict:
  """Every agent of `eval.agents` on the same tasks; success rates and the tasks' mean expert steps."""
  e = ev.config.eval
  contexts = {c: headers(ev.config, tasks, c, ev.config.seed + 7) for c in ("none", "retrieved")}
  out = {}
  for index, name in enumerate(e.agents):
    success = run_agent(ev, tasks, name, contexts, jax.random.fold_in(rng, index))
    out[f"success_{name}"] = float(np.mean(success))
    sizes = (tasks.goal >= 0).sum(1)
    out[f"success_long_{name}"] = (
      float(np.mean(success[sizes >= 2])) if (sizes >= 2).any() else float("nan")
    )
  out["expert_steps"] = float(
    np.mean(np.asarray(ev.env.distance(tasks.layout, tasks.start, tasks.goal)))
  )
  return out
