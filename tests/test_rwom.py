"""R-WoM (ICLR 2026): MenuWorld's dynamics and tutorials, BM25 retrieval, the world model's sequences,
one-call rollouts against a cache-free reference, listwise choice, the loop, validation."""

import functools
import importlib
import math
import types

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import rwom as rwom_config
from core import rwom
from core import tutorial_retrieval as retrieval
from core.data import menuworld as mw
from core.data import tokenizers
from core.nn import attention
from core.nn.transformer import Transformer
from experiments import loop
from methods import rwom as rwom_method
from methods.base import ConfigError


@pytest.fixture(scope="module")
def world():
  layouts, moved = mw.make_layouts(6, 3)
  return layouts, moved, jax.tree.map(jnp.asarray, layouts)


# ---------------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------------


def test_every_tutorial_replays_to_its_result_and_expert_distance_matches(world):
  layouts, _, jl = world
  step = jax.jit(functools.partial(mw.step, jl))
  distance = jax.jit(functools.partial(mw.distance, jl))
  start = mw.initial_state(np.zeros(mw.NUM_SETTINGS, int))
  for layout in range(len(layouts.labels)):
    for setting in range(mw.NUM_SETTINGS):
      state = start
      clicks = mw.tutorial_clicks(layouts, layout, setting)
      for action in clicks:
        state = step(layout, state, action)
      expected = np.zeros(mw.NUM_SETTINGS, int)
      expected[setting] = 1
      np.testing.assert_array_equal(np.asarray(state[2:]), expected)
      goal = jnp.array([setting, -1, -1])
      assert int(distance(layout, start, goal)) == len(clicks)


def test_invalid_actions_are_no_ops(world):
  layouts, _, jl = world
  start = mw.initial_state(np.zeros(mw.NUM_SETTINGS, int))
  shown = set(np.asarray(layouts.labels[0, 0]).tolist())
  hidden = next(a for a in range(mw.NUM_LABELS) if a not in shown)
  for action in (hidden, mw.OK, mw.BACK):  # back at home stays home
    chex.assert_trees_all_equal(mw.step(jl, 0, start, action), start)
  # with a dialog open only ok / back act
  setting = int(np.flatnonzero(layouts.confirm[0])[0])
  state = start
  for action in mw.tutorial_clicks(layouts, 0, setting)[:-1]:
    state = mw.step(jl, 0, state, action)
  assert int(state[1]) == setting
  chex.assert_trees_all_equal(mw.step(jl, 0, state, mw.HOME), state)
  assert int(mw.step(jl, 0, state, mw.BACK)[1]) == -1


def test_version_two_moves_exactly_three_settings_to_other_screens(world):
  layouts, moved, _ = world
  for app in range(len(moved)):
    v1, v2 = layouts.location[2 * app], layouts.location[2 * app + 1]
    changed = np.any(v1 != v2, 1)
    np.testing.assert_array_equal(changed, moved[app])
    assert changed.sum() == mw.MOVED_PER_UPDATE
    assert np.all(v1[changed, 0] != v2[changed, 0])


def test_noisy_expert_rollouts_finish_and_expert_steps_are_milestones(world):
  layouts, moved, _ = world
  tasks = mw.sample_tasks(np.random.default_rng(0), 40, range(6), 2, (1, 2, 3), moved)
  out = mw.rollouts(layouts, tasks, 0, 24, 0.0)
  assert not out["live"][:, -1].any()  # the expert finishes every task
  live = out["live"]
  assert np.all(out["reward"][live] == 1)
  noisy = mw.rollouts(layouts, tasks, 1, 24, 0.5)
  off = noisy["live"] & ~noisy["is_expert"]
  assert 0 < noisy["reward"][off].mean() < 0.5


def test_padded_batched_rollouts_equal_each_rows_own_episode(world):
  """`rollouts` pads rows and steps to powers of two; each row still equals `rollout` with its key."""
  layouts, moved, _ = world
  tasks = mw.sample_tasks(np.random.default_rng(1), 5, range(6), 2, (1, 2, 3), moved)
  out = mw.rollouts(layouts, tasks, 3, 5, 0.4)
  keys = jax.random.split(jax.random.key(3), 5)
  lay = jax.tree.map(jnp.asarray, layouts)
  for i in range(5):
    task = [jnp.asarray(a[i]) for a in (tasks.layout, tasks.start, tasks.goal)]
    row = mw.rollout(lay, *task, keys[i], 5, 0.4)
    for name, value in row.items():
      chex.assert_shape(out[name][i], value.shape)
      np.testing.assert_array_equal(out[name][i], np.asarray(value), err_msg=name)


# ---------------------------------------------------------------------------------------------------
# Retrieval
# ---------------------------------------------------------------------------------------------------


def _okapi_reference(docs, query, k1=1.5, b=0.75):
  """Lucene BM25 written out term by term (idf ln(1 + (N - df + 0.5) / (df + 0.5)))."""
  words = [d.split() for d in docs]
  avg = sum(map(len, words)) / len(words)
  scores = []
  for doc in words:
    total = 0.0
    for term in query.split():
      df = sum(term in d for d in words)
      if not df:
        continue
      idf = math.log(1 + (len(words) - df + 0.5) / (df + 0.5))
      tf = doc.count(term)
      total += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avg))
    scores.append(total)
  return np.asarray(scores)


def test_lexical_index_matches_okapi_bm25_and_ranks_a_duplicate_first(world):
  docs = ["menu bold on", "bold bold font size", "size of the page"]
  index = retrieval.LexicalIndex(docs)
  for query in ("bold", "size page", "font bold unknown", "of"):
    reference = _okapi_reference(docs, query)
    np.testing.assert_allclose(index.scores(query), reference, rtol=1e-5, atol=1e-7)
    ranked, _ = index.top_k(query, 3)
    np.testing.assert_array_equal(ranked, np.argsort(-reference, kind="stable"))
  documents, _ = mw.corpus(world[0])
  index = retrieval.LexicalIndex(documents)
  for i in (0, 17, len(documents) - 1):
    assert index.top_k(documents[i], 1)[0][0] == i


def test_rewriting_and_reranking_raise_recall():
  config = tiny_config()
  phases = importlib.import_module("methods.rwom.phases")
  tasks = phases.split_tasks(config, "novel", 40, (1, 2, 3), 5)
  recall = phases.retrieval_recall(config, [tasks])
  assert recall["recall1_raw"] < recall["recall1_rewrite_rerank"]
  assert recall["recall1_rewrite"] <= recall["recall1_rewrite_rerank"]
  assert recall["recall5_rewrite_rerank"] >= recall["recall1_rewrite_rerank"]


def test_tokenizer_covers_tutorials_and_round_trips(world):
  tokenizer = tokenizers.WordTokenizer(mw.vocabulary())
  documents, _ = mw.corpus(world[0])
  for text in documents[:20]:
    ids = tokenizer.encode(text)
    assert tokenizers.UNK_ID not in ids
    assert tokenizer.decode(ids) == text
  ids = mw.TokenIds()
  assert tokenizer.tokens[ids.action(mw.OK)] == "ok"
  assert " ".join(tokenizer.tokens[i] for i in ids.app(37)) == mw.app_name(37) == "vega fig"


# ---------------------------------------------------------------------------------------------------
# World model
# ---------------------------------------------------------------------------------------------------


def _small_model(vocab, seed=0):
  model = Transformer(vocab_size=vocab, width=32, depth=2, num_heads=2)
  params = model.init(
    jax.random.key(seed), jnp.zeros((1, 8), jnp.int32), mask=attention.causal_mask()
  )
  return model, params


def _sequences(world, count=6):
  layouts, _, jl = world
  ids, layout = mw.TokenIds(), rwom.Layout(42)
  tokenizer = tokenizers.WordTokenizer(mw.vocabulary())
  tasks = mw.sample_tasks(np.random.default_rng(1), count, range(6), 1)
  out = mw.rollouts(layouts, tasks, 0, 1, 0.0)
  heads, seqs = [], []
  for row in range(count):
    lay, goal = int(tasks.layout[row]), tasks.goal[row]
    tutorial = tokenizer.encode(mw.tutorial_text(layouts, lay, int(goal[0])))
    head = rwom.header(ids, layout, lay, goal, tutorial)
    body = rwom.transition_tokens(
      ids,
      mw.state_tokens(jl, lay, out["state"][row, 0], ids),
      out["action"][row, 0],
      mw.state_tokens(jl, lay, out["next_state"][row, 0], ids),
      out["reward"][row, 0],
    )
    heads.append(head)
    seqs.append(np.concatenate([head, np.asarray(body)]))
  return tasks, np.stack(heads), np.stack(seqs), ids, layout, tokenizer.vocab_size


def test_sequence_layout_and_loss_mask(world):
  _, heads, seqs, ids, layout, _ = _sequences(world)
  assert heads.shape[1] == layout.header and seqs.shape[1] == layout.length
  assert np.all(seqs[:, layout.prompt - 1] == ids.word("act"))
  assert np.all(seqs[:, layout.prompt + 1] == ids.word("out"))
  assert np.all(seqs[:, layout.reward - 1] == ids.word("rwd"))
  mask = rwom.loss_mask(layout, np.array([1.0, 0.0]))
  assert mask.shape == (2, layout.length - 1)
  assert mask[0].sum() == mw.STATE_TOKENS + 2 and mask[1].sum() == mw.STATE_TOKENS + 1
  assert mask[1, layout.prompt - 1] == 0  # a random action is not a target
  weighted = rwom.loss_mask(layout, np.array([1.0, 0.0]), milestone_weight=10.0)
  assert weighted[0, layout.reward - 1] == 10.0
  np.testing.assert_array_equal(
    np.delete(weighted, layout.reward - 1, 1), np.delete(mask, layout.reward - 1, 1)
  )


def test_causal_mask_hides_the_next_state(world):
  _, _, seqs, _, layout, vocab = _sequences(world)
  model, params = _small_model(vocab)
  changed = seqs.copy()
  changed[:, layout.next_state] = tokenizers.PAD_ID
  fwd = lambda s: model.apply(params, jnp.asarray(s), mask=attention.causal_mask()).logits  # noqa: E731
  chex.assert_trees_all_close(
    fwd(seqs)[:, : layout.next_state.start], fwd(changed)[:, : layout.next_state.start], atol=1e-5
  )


def _reference_step(model, params, allowed, prompt, action, ids):
  """The same transition decoded without a cache: a full causal forward per generated token (over a
  fixed-length buffer, so one compiled forward serves every length)."""
  forward = jax.jit(lambda p, s: model.apply(p, s, mask=attention.causal_mask()).logits[0])
  length = len(prompt) + rwom.TEMPLATE
  tokens = list(prompt) + [ids.action(action), ids.word("out")]

  def logits_after(tokens):
    buffer = np.zeros((1, length), np.int32)
    buffer[0, : len(tokens)] = tokens
    return forward(params, jnp.asarray(buffer))[len(tokens) - 1]

  for t in range(2, rwom.TEMPLATE - 2):
    tokens.append(int(jnp.argmax(jnp.where(allowed[t], logits_after(tokens), -jnp.inf))))
  tokens.append(ids.word("rwd"))
  logits = logits_after(tokens)
  pair = jax.nn.softmax(jnp.stack([logits[ids.word("0")], logits[ids.word("1")]]))
  return tokens[len(prompt) + 2 :], float(pair[1])


def test_imagine_matches_a_cache_free_reference(world):
  tasks, heads, seqs, ids, layout, vocab = _sequences(world, count=3)
  model, params = _small_model(vocab, seed=4)
  allowed = jnp.asarray(rwom.slot_vocabulary(ids, vocab))
  state = seqs[:, layout.header : layout.header + mw.STATE_TOKENS]
  actions = np.stack([seqs[:, layout.prompt] - ids.action_base, np.full(3, -1)], 1)
  stacked = np.repeat(heads[:, None], 3, 1)
  out = rwom.imagine(model, params, ids, layout, allowed, stacked, tasks.goal, state, actions)
  chex.assert_shape(out.states, (3, 2, mw.STATE_TOKENS))
  for row in range(3):
    prompt = list(seqs[row, : layout.prompt])
    tokens, p = _reference_step(model, params, allowed, prompt, int(actions[row, 0]), ids)
    np.testing.assert_array_equal(np.asarray(out.states[row, 0]), tokens[: mw.STATE_TOKENS])
    assert float(out.milestone[row, 0]) == pytest.approx(p, abs=1e-4)
    assert 0 <= int(out.actions[row, 1]) < mw.NUM_ACTIONS  # the model's own action


@pytest.mark.slow
def test_world_model_memorises_transitions(world):
  """A few hundred steps on six transitions: greedy one-call rollouts reproduce them."""
  tasks, heads, seqs, ids, layout, vocab = _sequences(world)
  model, params = _small_model(vocab, seed=1)
  mask = jnp.asarray(rwom.loss_mask(layout, np.ones(len(seqs))))
  opt = optax.adam(3e-3)

  @jax.jit
  def update(params, opt_state):
    loss, grads = jax.value_and_grad(rwom.loss, 1)(model, params, jnp.asarray(seqs), mask)
    updates, opt_state = opt.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = opt.init(params)
  for _ in range(300):
    params, opt_state, loss = update(params, opt_state)
  assert float(loss) < 0.05
  allowed = jnp.asarray(rwom.slot_vocabulary(ids, vocab))
  state = seqs[:, layout.header : layout.header + mw.STATE_TOKENS]
  actions = (seqs[:, layout.prompt] - ids.action_base)[:, None]
  out = rwom.imagine(
    model, params, ids, layout, allowed, heads[:, None], tasks.goal, state, actions
  )
  np.testing.assert_array_equal(np.asarray(out.states[:, 0]), seqs[:, layout.next_state])
  assert np.all(np.asarray(out.milestone[:, 0]) > 0.9)  # expert steps are milestones


def test_value_and_absolute_choice():
  milestones = jnp.array([[[0.1, 0.2, 0.1], [0.9, 0.6, 0.7], [0.4, 0.4, 0.4]]])
  assert int(rwom.value_choice(milestones)[0]) == 1
  # a detour (no milestone now, two later) is worth less than steady progress
  detour = jnp.array([[[0.0, 1.0, 1.0], [0.9, 0.5, 0.0]]])
  chex.assert_trees_all_close(rwom.on_track(detour[0]), jnp.array([0.0, 1.35]), atol=1e-6)
  assert int(rwom.value_choice(detour)[0]) == 1
  # absolute scores round to {0, .5, 1}: on-track 1.95 and 1.76 of 3 both round to 0.5, a tie
  close = jnp.array([[[0.8, 0.8, 0.8], [0.9, 0.6, 0.6], [0.0, 0.1, 0.0]]])
  picks = {int(rwom.absolute_choice(close, jax.random.key(s))[0]) for s in range(20)}
  assert picks == {0, 1}
  assert int(rwom.value_choice(close)[0]) == 0
  # nothing on track: a predicted no-op outranks a click that must be undone, not a milestone
  stuck = jnp.array([[[0.05, 0.9, 0.9], [0.02, 0.9, 0.9], [0.9, 0.9, 0.9]]])
  unchanged = jnp.array([[False, True, False]])
  assert int(rwom.value_choice(stuck[:, :2], unchanged[:, :2], 0.5)[0]) == 1
  assert int(rwom.value_choice(stuck[:, :2])[0]) == 0
  assert int(rwom.value_choice(stuck, unchanged, 0.5)[0]) == 2


def _judge_inputs(rng, batch, m, k, header_len=6):
  ids = mw.TokenIds()
  words = rng.integers(ids.word("0"), ids.word("1") + 1, (batch, header_len + mw.STATE_TOKENS))
  actions = rng.integers(0, mw.NUM_ACTIONS, (batch, m, k))
  states = rng.integers(ids.word("0"), ids.word("1") + 1, (batch, m, k, mw.STATE_TOKENS))
  return ids, words[:, :header_len], words[:, header_len:], actions, states


def test_judge_sequence_closes_each_candidate_where_it_is_scored():
  rng = np.random.default_rng(0)
  ids, header, state, actions, states = _judge_inputs(rng, 2, 3, 2)
  tokens = np.asarray(rwom.judge_sequence(ids, header, state, actions, states))
  where = rwom.judge_positions(header.shape[1], 3, 2)
  assert tokens.shape == (2, where[-1] + 1)
  assert np.all(tokens[:, where] == ids.word("rwd"))
  # candidate 1's second imagined step: act a out s, right after candidate 0's block
  start = where[0] + 1 + (3 + mw.STATE_TOKENS)
  assert tokens[0, start + 1] == ids.action(actions[0, 1, 1])
  np.testing.assert_array_equal(tokens[0, start + 3 : start + 3 + mw.STATE_TOKENS], states[0, 1, 1])


def test_listwise_judge_compares_candidates_jointly():
  """One pass over all rollouts: a candidate's score moves when another candidate's rollout
  changes, and the judge's choice differs from the best of each rollout scored alone (every slot
  of the sequence holding that one rollout) in some of 64 random cases."""
  m, k, cases = 3, 2, 64
  rng = np.random.default_rng(1)
  ids, header, state, actions, states = _judge_inputs(rng, cases, m, k)
  vocab = mw.TokenIds().action(mw.NUM_ACTIONS)
  model = Transformer(vocab_size=vocab, width=16, depth=1, num_heads=2)
  where = rwom.judge_positions(header.shape[1], m, k)
  joint_tokens = rwom.judge_sequence(ids, header, state, actions, states)
  params = model.init(jax.random.key(0), joint_tokens[:1])
  joint = np.asarray(rwom.judge_scores(model, params, ids, joint_tokens, where))
  # candidate 0's rollout fixed, the others' varied: its score varies
  fixed = np.broadcast_to(actions[:1, :1], (cases, 1, k))
  fixed_states = np.broadcast_to(states[:1, :1], (cases, 1, k, mw.STATE_TOKENS))
  varied = rwom.judge_sequence(
    ids,
    np.repeat(header[:1], cases, 0),
    np.repeat(state[:1], cases, 0),
    np.concatenate([fixed, actions[:, 1:]], 1),
    np.concatenate([fixed_states, states[:, 1:]], 1),
  )
  first = np.asarray(rwom.judge_scores(model, params, ids, varied, where))[:, 0]
  assert np.ptp(first) > 1e-4
  alone = np.zeros((cases, m))
  for j in range(m):
    tokens = rwom.judge_sequence(
      ids,
      header,
      state,
      np.repeat(actions[:, j : j + 1], m, 1),
      np.repeat(states[:, j : j + 1], m, 1),
    )
    alone[:, j] = np.asarray(rwom.judge_scores(model, params, ids, tokens, where))[:, j]
  differs = np.argmax(joint, -1) != np.argmax(alone, -1)
  assert 0 < differs.sum() < cases


def test_listwise_loss_is_the_cross_entropy_with_the_softmax():
  scores = jnp.array([[0.0, math.log(3.0)], [2.0, 2.0]])
  target = jnp.array([[0.5, 0.5], [1.0, 0.0]])
  expected = 0.5 * (-0.5 * math.log(0.25) - 0.5 * math.log(0.75)) + 0.5 * math.log(2.0)
  assert float(rwom.listwise_loss(scores, target)) == pytest.approx(expected, rel=1e-6)


def test_pairwise_auc_counts_ties_half():
  assert rwom.pairwise_auc([0.9, 0.8, 0.1, 0.2], [1, 1, 0, 0]) == 1.0
  assert rwom.pairwise_auc([0.1, 0.9], [1, 0]) == 0.0
  assert rwom.pairwise_auc([0.5, 0.5, 0.5], [1, 0, 0]) == 0.5
  assert rwom.pairwise_auc([0.7, 0.5, 0.9], [1, 0, 0]) == 0.5
  assert math.isnan(rwom.pairwise_auc([0.3], [1]))


@pytest.mark.slow
def test_counterfactual_twins_take_a_wrong_state_changing_action():
  config = tiny_config()
  config.data.counterfactual_fraction = 1.0
  phases = importlib.import_module("methods.rwom.phases")
  world = importlib.import_module("methods.rwom.world")
  env = world.env_of(config)
  tasks = mw.sample_tasks(np.random.default_rng(0), 30, range(6), 1)
  out = mw.rollouts(world.world_of(config).layouts, tasks, 0, 16, 0.3)
  task, twin = phases.counterfactual_transitions(config, tasks, out)
  assert len(task) == (out["live"] & out["is_expert"]).sum()  # fraction 1: every expert step
  layout, state = tasks.layout[task], twin["state"][:, 0]
  action, nxt = twin["action"][:, 0], twin["next_state"][:, 0]
  expert = np.asarray(env.expert(layout, state, tasks.goal[task]))
  assert np.all(action != expert)
  assert np.all(np.asarray(env.valid(layout, state))[np.arange(len(task)), action])
  assert np.all(np.any(nxt != state, 1))
  home = (state[:, 0] == 0) & (state[:, 1] < 0)
  assert home.any() and np.all(twin["reward"][home, 0] == 0)  # a wrong top menu is no milestone
  assert np.all(np.isin(action[home], np.asarray(world.world_of(config).layouts.labels)[:, 0]))
  assert not twin["is_expert"].any()
  plain = len(phases.train_arrays(tiny_config())["tokens"])
  assert len(phases.train_arrays(config)["tokens"]) > 1.5 * plain


def test_planner_with_the_true_environment_prefers_progress_then_a_no_op():
  config = tiny_config()
  world = importlib.import_module("methods.rwom.world")
  agents = importlib.import_module("methods.rwom.agents")
  env = world.env_of(config)
  tasks = importlib.import_module("methods.rwom.phases").split_tasks(config, "seen", 2, (1,), 3)
  expert = np.asarray(env.expert(tasks.layout, tasks.start, tasks.goal))
  shown = np.asarray(world.world_of(config).layouts.labels)[tasks.layout, 0]  # home screen menus
  wrong = np.array(
    [next(a for a in row if a >= 0 and a != e) for row, e in zip(shown, expert, strict=True)]
  )
  candidates = np.stack([wrong, np.full(2, mw.OK), expert], 1).astype(np.int32)
  candidates[1, 2] = next(a for a in shown[1] if a >= 0 and a not in (expert[1], wrong[1]))
  ev = type("Ev", (), {"env": env, "config": config})()
  choice = agents.true_world_model_choice(ev, tasks, np.asarray(tasks.start), candidates)
  np.testing.assert_array_equal(choice, [expert[0], mw.OK])  # `ok` at home changes nothing
  config.eval.no_op_value = 0.0  # the flags alone: the no-op ties the wrong clicks
  ties = agents.true_world_model_choice(ev, tasks, np.asarray(tasks.start), candidates)
  assert ties[0] == expert[0] and ties[1] == wrong[1]  # argmax takes the first of the tied


# ---------------------------------------------------------------------------------------------------
# Through the loop
# ---------------------------------------------------------------------------------------------------


def config_splits():
  return tiny_config().eval.splits


def tiny_config():
  config = rwom_config.get_config()
  config.world.update(num_apps=8, train_apps=6)
  # 32 episodes of 8 steps: one compiled rollout program with the judge's 20 episodes (rows pad to
  # 32); judge_accuracy's 8 steps share the noisy probe's program (6 steps pad to 8)
  config.data.update(train_episodes=32, episode_steps=8)
  config.model.update(width=32, depth=1, num_heads=2)
  config.steps = 4
  config.batch_size = 16
  config.eval.update(num_tasks=4, num_agent_tasks=4, horizon=3, contexts=("none", "retrieved"))
  config.eval.update(imagine_steps=2, budget_factor=2)  # shorter imagined and real agent episodes
  config.eval.splits = ("novel", "updated")  # `seen` runs the same code on other apps
  # one split; every agent but true_wm, whose choice has a test of its own (the planner on the true
  # environment)
  config.eval.agent_splits = ("novel",)
  config.eval.agents = ("none", "rag", "wm", "rwom", "rwom_absolute", "oracle")
  config.eval.judge_states = 16
  # 16 states x 3 candidates: the same `imagine` chunk (64 rows) as judge_accuracy's 16 states
  config.judge.update(episodes=20, states=16, steps=3, batch_size=8, width=32, depth=1, num_heads=2)
  config.loop.update(log_every=2, checkpoint_every=4)
  return config


def test_run_writes_the_issue_keys_and_report(tmp_path):
  summary = loop.run(tiny_config(), str(tmp_path))
  results = summary.results
  for key in ("success_rwom", "success_wm", "success_none", "long_horizon_accuracy_gain"):
    assert math.isfinite(results[key]), key
  assert 0.0 <= results["success_rwom"] <= 1.0
  assert len(results["sim_accuracy_retrieved_novel"]) == 3
  assert results["recall1_rewrite_rerank"] >= results["recall1_raw"]
  for context in ("none", "retrieved", "gold"):
    for split in config_splits():
      assert 0.0 <= results[f"flag_auc_{context}_{split}"] <= 1.0
      assert 0.0 <= results[f"action_accuracy_{context}_{split}"] <= 1.0
    assert results[f"flag_auc_{context}"] == pytest.approx(
      np.mean([results[f"flag_auc_{context}_{s}"] for s in ("novel", "updated")])
    )
  for key in ("judge_accuracy_retrieved", "value_accuracy_retrieved", "chance_accuracy"):
    assert 0.0 <= results[key] <= 1.0, key
  assert summary.step_traces == {"train": 1, "judge": 1, "evaluate": 0}
  config = tiny_config()
  report = rwom_method.report(config, {"seed0": results, "seed1": results})
  assert [row["split"] for row in report.rows] == list(config.eval.splits)
  assert report.summary["success_rwom"] == pytest.approx(results["success_rwom"])
  assert "rwom_study" in report.figures
  arms = rwom_method.study_arms(rwom_config.get_config("study"))
  assert [name for name, _ in arms] == ["seed0", "seed1", "seed2", "seed3"]
  assert [arm.world.world_seed for _, arm in arms] == [0, 1, 2, 3]
  weighted = rwom_config.get_config("reward_weighted")
  arms = rwom_method.study_arms(weighted)
  assert [name for name, _ in arms] == ["w1_seed0", "w1_seed1", "w10_seed0", "w10_seed1"]
  assert [arm.milestone_weight for _, arm in arms] == [1.0, 1.0, 10.0, 10.0]
  config.study.milestone_weights = (1.0, 10.0)
  arm_results = {"w1_seed0": results, "w1_seed1": results, "w10_seed0": results}
  report = rwom_method.report(config, arm_results)
  splits = len(config.eval.splits)
  assert [row["milestone weight"] for row in report.rows] == ["1"] * splits + ["10"] * splits
  assert report.summary["success_rwom_w10"] == pytest.approx(results["success_rwom"])
  assert "rwom_reward" in report.figures
  counterfactual = rwom_config.get_config("counterfactual")
  arms = dict(rwom_method.study_arms(counterfactual))
  assert list(arms) == ["cf0_small_seed0", "cf1_small_seed0", "cf1_large_seed0"]
  assert arms["cf1_small_seed0"].data.counterfactual_fraction == 1.0
  assert rwom_method.explicit_arm(counterfactual, "cf0_small_seed1").world.world_seed == 1
  assert (arms["cf1_large_seed0"].model.depth, arms["cf1_large_seed0"].model.width) == (4, 128)
  assert arms["cf0_small_seed0"].model == rwom_config.get_config("study").model
  config = tiny_config()
  config.study.arms = ("cf0_small_seed0", "cf1_small_seed0", "cf1_small_seed1")
  arm_results = {name: results for name in config.study.arms}
  report = rwom_method.report(config, arm_results)
  assert [row["arms"] for row in report.rows] == ["cf0_small"] * splits + ["cf1_small"] * splits
  assert report.summary["flag_auc_retrieved_cf1_small"] == pytest.approx(
    results["flag_auc_retrieved"]
  )
  assert "rwom_counterfactual" in report.figures


# ---------------------------------------------------------------------------------------------------
# The training mix of the milestone flag (configs/rwom.py:flag_mix)
# ---------------------------------------------------------------------------------------------------


def _flat(config, prefix=""):
  """`{dotted field: value}` of every leaf of `config`."""
  out = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def test_flag_mix_arms_differ_from_the_default_arm_in_their_listed_fields():
  config = rwom_config.get_config("flag_mix")
  arms = dict(rwom_method.study_arms(config))
  names = ["default", "flag_only", "low_dropout", "flag_weighted_cf", "combined"]
  assert list(arms) == [f"{name}_seed0" for name in names]
  default = _flat(arms["default_seed0"])
  cf = {"milestone_weight": 10.0, "data.counterfactual_fraction": 1.0}
  expected = {
    "flag_only": {"data.objective": "flag_only"},
    "low_dropout": {"data.tutorial_dropout": 0.1},
    "flag_weighted_cf": cf,
    "combined": cf | {"data.tutorial_dropout": 0.1},
  }
  for name, changes in expected.items():
    arm = _flat(arms[f"{name}_seed0"])
    assert set(arm) == set(default), name
    assert {k: v for k, v in arm.items() if v != default[k]} == changes, name
  # the default arm trains as the study's seed-0 arm
  study = dict(rwom_method.study_arms(rwom_config.get_config("study")))["seed0"]
  for field in ("seed", "world", "retrieval", "data", "model", "optim"):
    assert arms["default_seed0"][field] == study[field], field
  for field in ("steps", "batch_size", "milestone_weight"):
    assert arms["default_seed0"][field] == study[field], field
  # an arm's config does not depend on its siblings: a finished arm stays finished
  alone = rwom_config.get_config("flag_mix")
  alone.study.mix_arms = ("low_dropout",)
  del alone.study.mix["combined"]
  (name, arm), *rest = rwom_method.study_arms(alone)
  assert name == "low_dropout_seed0" and not rest
  assert arm.to_json() == arms["low_dropout_seed0"].to_json()


class _FixedLogits:
  """A stand-in model that returns its `params` as the logits, so `rwom.loss` sees only targets."""

  def apply(self, params, tokens, mask=None):
    del tokens, mask
    return types.SimpleNamespace(logits=params)


def test_flag_only_loss_reads_only_the_milestone_flag_target():
  phases = importlib.import_module("methods.rwom.phases")
  config = tiny_config()
  config.data.objective = "flag_only"
  arrays = phases.train_arrays(config)
  tokens, mask = jnp.asarray(arrays["tokens"][:32]), jnp.asarray(arrays["mask"][:32])
  plain = jnp.asarray(phases.train_arrays(tiny_config())["mask"][:32])
  vocab = int(tokens.max()) + 1
  logits = jax.random.normal(jax.random.key(0), tokens[:, :-1].shape + (vocab,))
  loss = lambda t, m: float(rwom.loss(_FixedLogits(), logits, t, m))
  # every target but the flag (the last token) replaced: the flag-only loss does not move
  others = tokens.at[:, 1:-1].set(
    jax.random.randint(jax.random.key(1), tokens[:, 1:-1].shape, 0, vocab)
  )
  assert loss(others, mask) == pytest.approx(loss(tokens, mask), rel=1e-6)
  assert loss(others, plain) != pytest.approx(
    loss(tokens, plain), rel=1e-3
  )  # the world model's does
  zero, one = mw.TokenIds().word("0"), mw.TokenIds().word("1")
  flipped = tokens.at[:, -1].set(jnp.where(tokens[:, -1] == one, zero, one))
  assert loss(flipped, mask) != pytest.approx(loss(tokens, mask), rel=1e-3)
  grads = jax.grad(lambda x: rwom.loss(_FixedLogits(), x, tokens, mask))(logits)
  by_position = np.asarray(jnp.abs(grads).sum((0, 2)))
  assert by_position[-1] > 0 and np.all(by_position[:-1] == 0)


def test_home_clicks_are_the_four_top_menus_with_one_right_click_per_state():
  phases = importlib.import_module("methods.rwom.phases")
  world = importlib.import_module("methods.rwom.world")
  config = tiny_config()
  tasks = phases.split_tasks(config, "novel", 6, (1, 2), 7)
  out = mw.rollouts(world.world_of(config).layouts, tasks, 0, 5 * mw.MAX_TARGETS, 0.0)
  task, arrays, right = phases.home_clicks(config, tasks, out)
  states = len(task) // mw.TOP_MENUS
  assert states >= len(tasks.layout)  # at least every start
  np.testing.assert_array_equal(right.reshape(states, -1).sum(1), 1)
  np.testing.assert_array_equal(arrays["reward"][:, 0], right)  # only the expert's is progress
  state, nxt = arrays["state"][:, 0], arrays["next_state"][:, 0]
  assert np.all((state[:, 0] == 0) & (state[:, 1] < 0)) and np.all(np.any(nxt != state, 1))
  menus = arrays["action"][:, 0].reshape(states, -1)
  assert all(len(set(row)) == mw.TOP_MENUS for row in menus.tolist())


def _synthetic_results(config, auc: float) -> dict:
  """An arm's evaluate() keys the flag_mix report reads, with home flag AUC `auc` (+0.02 on the
  updated split) and every other value derived from it."""
  phases = importlib.import_module("methods.rwom.phases")
  e, out = config.eval, {}
  for i, split in enumerate(e.splits):
    for context in ("none", "retrieved", "gold"):
      out[f"flag_auc_{context}_{split}"] = auc + 0.02 * i
      out[f"action_accuracy_{context}_{split}"] = auc / 2
    for agent in e.agents:
      out[f"success_{agent}_{split}"] = auc / 4 + 0.1 * i
    for context in e.contexts:
      out[f"sim_accuracy_{context}_{split}"] = np.linspace(1.0, auc, e.horizon)
      out[f"full_procedure_{context}_{split}"] = auc / 3
  out |= {"judge_accuracy_retrieved": auc, "value_accuracy_retrieved": auc / 2}
  return out | {"chance_accuracy": 0.25} | phases.headline(config, out)


def test_flag_mix_report_has_one_row_per_arm_and_its_figure():
  config = rwom_config.get_config("flag_mix")
  aucs = dict(zip(config.study.mix_arms, (0.5, 0.9, 0.6, 0.7, 0.8), strict=True))
  results = {f"{name}_seed0": _synthetic_results(config, auc) for name, auc in aucs.items()}
  report = rwom_method.report(config, results)
  assert [row["arm"] for row in report.rows] == list(config.study.mix_arms)
  for row, auc in zip(report.rows, aucs.values(), strict=True):
    assert row["home flag AUC x100 gold"] == f"{100 * (auc + 0.01):.1f} ± 0.0"
    assert row["home action acc % retrieved"] == f"{50 * auc:.1f} ± 0.0"
    assert row["success true_wm %"] == f"{100 * (auc / 4 + 0.05):.1f} ± 0.0"
    assert row[f"sim@{config.eval.horizon} retrieved %"] == f"{100 * auc:.1f} ± 0.0"
    assert (row["judge acc. %"], row["value acc. %"]) == (
      f"{100 * auc:.1f} ± 0.0",
      f"{50 * auc:.1f} ± 0.0",
    )
    assert row["chance acc. %"] == "25.0 ± 0.0"
  assert report.summary["flag_auc_none_flag_only"] == pytest.approx(0.91)
  assert "flag_only" in report.notes
  axes = report.figures["rwom_flag_mix"].axes
  heights = sorted(round(p.get_height(), 6) for p in axes[0].patches)
  assert heights == sorted([round(a + 0.01, 6) for a in aucs.values()] * 3)
  assert len(axes[1].patches) == len(aucs) * len(config.eval.agents)


def test_flag_mix_fields_are_named_when_wrong():
  config = tiny_config()
  config.study.mix = ml_collections.ConfigDict({"low": {"data__tutorial_dropout": 0.1}})
  config.study.mix_arms = ("low",)
  loop.validate(config, data_devices=1)
  config.study.arms = ("cf1_small_seed0",)
  with pytest.raises(ConfigError, match="^config.study.mix_arms: set at most one of"):
    loop.validate(config, data_devices=1)
  config.study.arms = ()
  config.study.mix_arms = ("low", "high")
  with pytest.raises(ConfigError, match="^config.study.mix_arms: 'high' has no changes"):
    loop.validate(config, data_devices=1)
  config.study.mix_arms = ("low",)
  config.study.mix.low.data__tutorial_dropuot = 0.1
  with pytest.raises(ConfigError, match="^config.study.mix.low: 'data__tutorial_dropuot' names"):
    loop.validate(config, data_devices=1)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("world.train_apps", 8, "config.world.train_apps: 8 leaves no novel app"),
    ("retrieval.query", "dense", "config.retrieval.query: must be one of"),
    ("retrieval.first_stage_k", 1, "config.retrieval.first_stage_k: 1 is fewer than num_chunks"),
    ("eval.agents", ("none", "wm", "rwom", "mcts"), r"config.eval.agents: unknown \['mcts'\]"),
    ("eval.contexts", ("none",), "config.eval.contexts: needs 'none' and 'retrieved'"),
    ("data.epsilon", 1.5, r"config.data.epsilon: must be in \[0, 1\]"),
    ("model.num_heads", 3, "config.model.num_heads: 3 must divide width"),
    ("eval.no_op_value", 1.0, r"config.eval.no_op_value: must be in \[0, 1\)"),
    ("milestone_weight", 0.0, "config.milestone_weight: must be > 0"),
    ("data.counterfactual_fraction", -0.1, r"config.data.counterfactual_fraction: must be in"),
    ("study.arms", ("cf1_medium_seed0",), "config.study.arms: 'cf1_medium_seed0' is not"),
    ("data.objective", "flag", "config.data.objective: must be one of"),
  ],
)
def test_bad_fields_are_named(field, value, message):
  config = tiny_config()
  *section, name = field.split(".")
  (config[section[0]] if section else config)[name] = value
  with pytest.raises(ConfigError, match=message):
    loop.validate(config, data_devices=1)


def test_gpu_variant_names_its_checkpoint():
  with pytest.raises(ConfigError, match="^config.model.checkpoint: "):
    loop.validate(rwom_config.get_config("gpu"), data_devices=1)


@pytest.mark.slow
def test_resume_gives_the_same_results(tmp_path):
  config = tiny_config()
  whole = loop.run(config, str(tmp_path / "whole")).results
  with pytest.raises(loop.Interrupted):
    loop.run(config, str(tmp_path / "split"), should_stop=lambda phase, step: step == 2)
  resumed = loop.run(config, str(tmp_path / "split")).results
  for key in ("success_rwom", "next_state_id_retrieved_novel", "milestone_accuracy_none_novel"):
    assert resumed[key] == pytest.approx(whole[key])
