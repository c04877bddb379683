"""Token-Guard: the scores' invariants, the checker, the decoders, the converter and a loop smoke run."""

import json
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import token_guard as tg_config
from core import decoding
from core import token_guard as tg
from core.data import factual_world as fw
from core.data import halu_benchmarks as hb
from core.data import tokenizers
from core.nn import attention, hf_convert
from core.nn.transformer import Transformer
from experiments import loop
from methods import token_guard
from methods.base import ConfigError
from methods.token_guard.phases import output_words

GUARD = tg.Guard()


# ---------------------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------------------


def test_cosine_of_orthogonal_and_identical_vectors():
  a, b = jnp.array([1.0, 0.0, 0.0]), jnp.array([0.0, 2.0, 0.0])
  assert float(tg.cosine(a, b)) == pytest.approx(0.0)
  assert float(tg.cosine(a, 3 * a)) == pytest.approx(1.0)


def test_token_score_mixes_cosine_and_probability_and_gates_the_running_mean():
  anchor = jnp.array([1.0, 0.0])
  hidden = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
  probs = jnp.array([1.0, 0.0, 0.5])
  starts = jnp.array([True, False, False])
  valid = jnp.ones(3, bool)
  scores, cosines = tg.token_scores(hidden, probs, anchor, starts, valid, 0.6, 0.4)
  # token 0: identical to the anchor, p = 1 -> 1; token 1: orthogonal, p = 0 -> 0 (below the gate)
  np.testing.assert_allclose(scores[:2], [1.0, 0.0], atol=1e-6)
  # the gate kept token 1 out of the mean: token 2 compares with mean(anchor, token 0) = [1, 0]
  np.testing.assert_allclose(cosines[2], 1 / math.sqrt(2), atol=1e-6)
  ungated, ungated_cos = tg.token_scores(hidden, probs, anchor, starts, valid, 0.6, -1.0)
  assert float(ungated_cos[2]) != pytest.approx(float(cosines[2]))


def test_segment_scores_of_a_constant_segment_are_fully_consistent_and_aligned():
  hidden = jnp.ones((4, 3))
  token = jnp.array([0.9, 0.8, 0.7, 0.0])
  members = jnp.array([[True, True, True, False], [False, False, False, True]])
  f_seg, big_h, _, norms, valid = tg.segment_scores(
    GUARD, token, hidden, hidden, hidden[0], members
  )
  weights = jax.nn.softmax(token[:3])
  expected = 0.5 * float(jnp.sum(weights * token[:3])) + 0.3 * 1.0 + 0.2 * 1.0
  assert float(f_seg[0]) == pytest.approx(expected, abs=1e-5)
  np.testing.assert_allclose(big_h[0], np.ones(3), atol=1e-6)
  assert list(np.asarray(valid)) == [True, True]
  assert float(norms[0]) == pytest.approx(float(jnp.linalg.norm(token[:3])), abs=1e-5)


@pytest.mark.parametrize("fact, logic", [(0.2, 0.9), (0.7, 0.7), (1.0, 0.0), (0.55, 0.3)])
def test_fusions_stay_in_unit_interval_and_softmin_is_below_the_minimum(fact, logic):
  harmonic = float(tg.fuse(GUARD, jnp.float32(fact), jnp.float32(logic)))
  softmin = float(tg.fuse(GUARD._replace(fusion="softmin"), jnp.float32(fact), jnp.float32(logic)))
  assert 0.0 <= harmonic <= 1.0 and harmonic <= min(fact, logic) + 1e-6
  assert 0.0 <= softmin <= min(fact, logic) + 1e-6


def test_global_score_of_one_segment_has_full_logic_and_fact_equal_to_its_score():
  f_seg = jnp.array([0.6, 0.0])
  vectors = jnp.ones((2, 3))
  fact, logic, glob = tg.global_scores(
    GUARD, f_seg, vectors, vectors, jnp.ones(2), jnp.array([True, False])
  )
  assert float(fact) == pytest.approx(0.6, abs=1e-6) and float(logic) == 1.0
  assert float(glob) == pytest.approx(0.6 / (0.6 + 1 - 0.6), abs=1e-6)


def test_threshold_adjustment_follows_eq_15():
  fact = jnp.array([0.4, 0.7, 0.7, 0.4])
  logic = jnp.array([0.7, 0.4, 0.7, 0.4])
  np.testing.assert_allclose(tg.threshold_adjustment(GUARD, fact, logic), [0.1, -0.1, 0.0, 0.0])


def test_segment_ids_split_at_stop_tokens():
  chain = jnp.array([[5, 6, 1, 7, 2, 0]])
  ids, starts = tg.segment_ids(chain, jnp.array([5]), (1, 2))
  assert ids.tolist() == [[0, 0, 0, 1, 1, -1]]
  assert starts.tolist() == [[True, False, False, True, False, False]]


# ---------------------------------------------------------------------------------------------------
# World and checker
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world():
  return fw.make_world(num_persons=40, num_cities=6, num_companies=5, num_ages=10, seed=3)


def test_examples_are_consistent_with_their_passages(world):
  for e in fw.make_examples(world, 200, 0, counterfactual_fraction=0.5, unanswerable_fraction=0.3):
    assert all(step in e.passage for step in e.steps)
    if e.unanswerable:
      assert e.answer == fw.NO_ANSWER and len(e.steps) < len(e.path)
    else:
      assert e.steps[-1][2] == e.answer and len(e.steps) == len(e.path)
    if e.counterfactual:
      assert e.answer != e.kb_answer or len(e.path) == 2
    assert len(set((s, r) for s, r, _ in e.passage)) == len(e.passage)
    assert fw.label_output(e, world, e.target.split()).answer_label == "correct"


def test_checker_labels_hand_written_outputs(world):
  example = fw.Example(
    passage=(("P01", "spouse", "P02"), ("P02", "born_in", "C01"), ("P03", "born_in", "C02")),
    subject="P01",
    path=("spouse", "born_in"),
    steps=(("P01", "spouse", "P02"), ("P02", "born_in", "C01")),
    answer="C01",
    kb_answer="C03",
    unanswerable=False,
    counterfactual=True,
  )
  world = fw.World(world.entities, {("P02", "born_in"): "C03", ("P01", "spouse"): "P02"})
  ok = fw.label_output(
    example, world, "Step: P01 spouse P02 . Step: P02 born_in C01 . Answer: C01".split()
  )
  assert ok.answer_label == "correct" and ok.step_labels == (None, None)
  bad = fw.label_output(
    example, world, "Step: P01 spouse P02 . Step: P02 born_in C03 . Answer: C03".split()
  )
  assert bad.answer_label == "override" and bad.step_labels == (None, "override")
  assert bad.token_labels.tolist() == [-1, -1, -1, 0, -1, -1, -1, -1, 1, -1, -1, 1]
  assert fw.label_output(example, world, "Answer: C02".split()).answer_label == "misread"
  assert fw.label_output(example, world, "Answer: C09".split()).answer_label == "fabrication"
  assert fw.label_output(example, world, "Answer: No answer".split()).answer_label == "abstained"
  assert fw.label_output(example, world, "Step: P01".split()).answer_label == "malformed"
  unanswerable = example.__class__(
    **{**example.__dict__, "answer": fw.NO_ANSWER, "unanswerable": True}
  )
  assert fw.label_output(unanswerable, world, "Answer: C01".split()).answer_label == "unanswerable"


def test_em_and_f1_follow_drop_normalisation():
  assert fw.exact_match("No answer.", "no answer") == 1.0
  assert fw.f1_score("No C01", "No answer") == pytest.approx(0.5)
  assert fw.f1_score(None, "C01") == 0.0


# ---------------------------------------------------------------------------------------------------
# Decoders on a random model
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_decoder():
  model = Transformer(vocab_size=16, width=16, depth=2, num_heads=2)
  params = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32), mask=attention.causal_mask())
  return tg.Decoder(model, params, chain_width=10, stop_tokens=(3, 2), eos_id=2, max_segments=6)


@pytest.mark.parametrize("tie", [pytest.param(True, marks=pytest.mark.slow), False])
def test_head_at_chain_gives_the_scores_of_the_full_head(tie):
  model = Transformer(vocab_size=16, width=16, depth=2, num_heads=2, tie_embeddings=tie)
  params = model.init(jax.random.key(1), jnp.zeros((1, 4), jnp.int32), mask=attention.causal_mask())
  prompts, plens = jnp.array([[1, 5, 6, 0], [1, 7, 8, 9]]), jnp.array([3, 4])
  chain, clens = jnp.array([[4, 3, 5, 2, 0], [6, 7, 3, 9, 2]]), jnp.array([4, 5])
  scores = [
    tg.Decoder(
      model, params, chain_width=5, stop_tokens=(3, 2), eos_id=2, max_segments=4, head_at_chain=h
    ).score(prompts, plens, chain, clens, tg.Thresholds(), GUARD)
    for h in (False, True)
  ]
  chex.assert_trees_all_close(scores[0], scores[1], atol=1e-5)


@pytest.mark.slow
def test_greedy_extension_matches_argmax_of_full_forwards(random_decoder):
  prompts = jnp.array([[1, 5, 6, 0], [1, 7, 8, 9]])
  lengths = jnp.array([3, 4])
  out = tg.greedy_decode(random_decoder, prompts, lengths, jax.random.key(0))
  sequence = decoding.concatenate(
    prompts, lengths, jnp.asarray(out.chain), jnp.asarray(out.lengths)
  )
  logits = random_decoder.model.apply(
    random_decoder.params, sequence, mask=attention.causal_mask()
  ).logits
  for row in range(2):
    start = int(lengths[row])
    predicted = jnp.argmax(logits[row, start - 1 : start - 1 + out.lengths[row]], axis=-1)
    assert predicted.tolist() == out.chain[row, : out.lengths[row]].tolist()
    assert out.forward_passes[row] == 1 + out.lengths[row]


def test_local_refinement_never_lowers_the_kept_segment_score(random_decoder):
  prompts = jnp.tile(jnp.array([[1, 5, 6, 9]]), (6, 1))
  lengths = jnp.full((6,), 4)
  chain, chain_lengths = random_decoder.empty(6)
  ext = random_decoder.extend(
    prompts, lengths, chain, chain_lengths, jax.random.key(1), 4, decoding.Sampling(1.0)
  )
  everything = tg.Thresholds(tau_low=-10.0, tau_high=10.0)
  scores = random_decoder.score(prompts, lengths, ext.chain, ext.lengths, everything, GUARD)
  before = tg._last(scores.segment, scores.num_segments)
  passes = np.zeros(6)
  _, refined = tg._refine_segments(
    random_decoder,
    GUARD,
    everything,
    prompts,
    lengths,
    (ext.chain, ext.lengths),
    scores,
    jnp.ones(6, bool),
    jnp.zeros(6),
    jax.random.key(2),
    passes,
  )
  after = tg._last(refined.segment, refined.num_segments)
  assert np.all(np.asarray(after) >= np.asarray(before) - 1e-6)
  assert passes.min() > 0


def _picked_first(keep, advantage, keys, draws=200):
  """How often each of the `[1, M]` candidates is the first beam drawn, over `draws` keys."""
  counts = np.zeros(keep.shape[1])
  for i in range(draws):
    picks, _ = tg.select_beams(keep, keep, advantage, keys, jax.random.key(i), beams=1)
    counts[int(picks[0, 0])] += 1
  return counts / draws


def test_beam_selection_follows_the_advantage_and_the_cluster_share():
  keep = jnp.ones((1, 4), bool)
  distinct = jnp.arange(4).reshape(1, 4, 1)
  flat = _picked_first(keep, jnp.zeros((1, 4)), distinct)
  boosted = _picked_first(keep, jnp.array([[0.0, 0.0, 5.0, 0.0]]), distinct)
  assert flat.max() < 0.45  # no score: every candidate has its chance
  assert boosted[2] > 0.5 and boosted[2] > flat[2] + 0.2  # the advantage decides
  clustered = jnp.array([0, 1, 1, 1]).reshape(1, 4, 1)  # three candidates agree
  shared = _picked_first(keep, jnp.zeros((1, 4)), clustered)
  assert shared[0] < flat[0]


def test_semantic_clusters_merge_near_duplicate_segments_that_exact_identity_splits():
  keys = np.array([[[5, 7, 9, 3], [5, 7, 8, 3], [11, 12, 13, 3], [5, 7, 9, 3], [11, 12, 14, 3]]])
  labels = tg.semantic_clusters(keys, num_clusters=2)[0, :, 0]
  assert labels[0] == labels[1] == labels[3] and labels[2] == labels[4] != labels[0]
  exact = tg.cluster_shares(jnp.asarray(keys), jnp.ones((1, 5), bool))[0]
  semantic = tg.cluster_shares(jnp.asarray(labels)[None, :, None], jnp.ones((1, 5), bool))[0]
  np.testing.assert_allclose(exact, [0.4, 0.2, 0.2, 0.4, 0.2])
  np.testing.assert_allclose(semantic, [0.6, 0.6, 0.4, 0.6, 0.4])


def test_discarding_removes_a_low_scoring_segment_from_the_draw(random_decoder):
  prompts, plens = jnp.tile(jnp.array([[1, 5, 6, 9]]), (4, 1)), jnp.full((4,), 4)
  segments = jnp.array([[4, 5, 3], [6, 7, 3], [8, 9, 3], [10, 11, 3]])
  chain = jnp.pad(segments, ((0, 0), (0, 7)))
  lengths = jnp.full((4,), 3)
  scores = random_decoder.score(prompts, plens, chain, lengths, tg.Thresholds(), GUARD)
  f_seg = np.asarray(tg._last(scores.segment, scores.num_segments))
  low = int(np.argmin(f_seg))
  tau_low = float(np.sort(f_seg)[1])  # only the lowest segment falls below
  active = jnp.ones(4, bool)
  args = (scores, jnp.zeros(4), active, active, jnp.zeros(4), 1, 4)
  kept = tg.kept_candidates(GUARD, tg.Thresholds(tau_low=tau_low), *args)
  assert kept.tolist() == [i != low for i in range(4)]
  everything = tg.kept_candidates(GUARD, tg.Thresholds(tau_low=-1.0), *args)
  assert bool(everything.all())
  advantage = jnp.zeros((1, 4)).at[0, low].set(5.0)  # even the best advantage cannot save it
  distinct = jnp.arange(4).reshape(1, 4, 1)
  assert _picked_first(kept[None], advantage, distinct, 50)[low] == 0.0
  assert _picked_first(everything[None], advantage, distinct, 50)[low] > 0.5


def test_window_refinement_rewrites_only_the_window_and_only_in_the_band(random_decoder):
  rows = 8
  prompts, plens = jnp.tile(jnp.array([[1, 5, 6, 9]]), (rows, 1)), jnp.full((rows,), 4)
  chain = jnp.tile(jnp.array([[4, 5, 6, 7, 8, 9, 3, 0, 0, 0]]), (rows, 1))
  lengths = jnp.full((rows,), 7)
  band = tg.Thresholds(tau_low=-10.0, tau_high=10.0)  # every segment is refined
  accept = tg.Thresholds(tau_low=-10.0, tau_high=-5.0)  # every segment is accepted as it is
  scores = random_decoder.score(prompts, plens, chain, lengths, band, GUARD)
  once = GUARD._replace(max_refine=1)  # one draw: one window
  lowest = int(jnp.argmin(jnp.where(jnp.arange(10) < 7, scores.token[0], jnp.inf)))
  window = set(range(max(lowest - 1, 0), max(lowest - 1, 0) + 3)) & set(range(6))
  out = {}
  for name, thresholds in (("band", band), ("accept", accept)):
    (new_chain, new_lengths), refined = tg._refine_segments(
      random_decoder,
      once,
      thresholds,
      prompts,
      plens,
      (chain, lengths),
      scores,
      jnp.ones(rows, bool),
      jnp.zeros(rows),
      jax.random.key(4),
      np.zeros(rows),
    )
    out[name] = np.asarray(new_chain)
    np.testing.assert_array_equal(new_lengths, lengths)
  np.testing.assert_array_equal(out["accept"], chain)  # accepted: left alone
  changed = np.flatnonzero((out["band"] != np.asarray(chain)).any(0))
  assert changed.size and set(changed.tolist()) <= window  # refined: only the window moved


@pytest.mark.parametrize(
  "guard",
  [
    pytest.param(GUARD, marks=pytest.mark.slow),
    tg.ROLLOUT_PRUNE,
    pytest.param(GUARD._replace(use_token=False), marks=pytest.mark.slow),
  ],
)
def test_token_guard_decode_shapes_and_costs(random_decoder, guard):
  prompts = jnp.array([[1, 5, 6, 0], [1, 7, 8, 9], [1, 4, 0, 0]])
  lengths = jnp.array([3, 4, 2])
  out = tg.token_guard_decode(random_decoder, prompts, lengths, jax.random.key(0), guard)
  chex.assert_shape(out.chain, (3, 10))
  assert out.lengths.dtype == np.int32 and out.abstain.dtype == bool
  assert np.all(out.lengths <= 10) and np.all(out.forward_passes > 0)
  greedy = tg.greedy_decode(random_decoder, prompts, lengths, jax.random.key(0))
  assert np.all(out.forward_passes >= greedy.forward_passes)


# ---------------------------------------------------------------------------------------------------
# Converter
# ---------------------------------------------------------------------------------------------------


def _numpy_llama(sd, tokens, depth, heads, kv_heads, eps, theta):
  """An independent numpy forward of the Hugging Face Llama layout (the reference)."""

  def norm(x, w):
    return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps) * w

  x = sd["model.embed_tokens.weight"][tokens]
  length, width = x.shape
  hd = width // heads
  inv = theta ** (-np.arange(0, hd, 2) / hd)
  angles = np.arange(length)[:, None] * inv[None]
  cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
  rotate = lambda t: np.concatenate([-t[..., hd // 2 :], t[..., : hd // 2]], -1)  # noqa: E731
  for n in range(depth):
    p = f"model.layers.{n}."
    h = norm(x, sd[p + "input_layernorm.weight"])
    q = (h @ sd[p + "self_attn.q_proj.weight"].T).reshape(length, heads, hd).transpose(1, 0, 2)
    k = (h @ sd[p + "self_attn.k_proj.weight"].T).reshape(length, kv_heads, hd).transpose(1, 0, 2)
    v = (h @ sd[p + "self_attn.v_proj.weight"].T).reshape(length, kv_heads, hd).transpose(1, 0, 2)
    q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
    logits = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + np.triu(np.full((length, length), -1e9), 1)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    attn = (weights @ v).transpose(1, 0, 2).reshape(length, width)
    x = x + attn @ sd[p + "self_attn.o_proj.weight"].T
    h = norm(x, sd[p + "post_attention_layernorm.weight"])
    gate, up = h @ sd[p + "mlp.gate_proj.weight"].T, h @ sd[p + "mlp.up_proj.weight"].T
    x = x + (gate / (1 + np.exp(-gate)) * up) @ sd[p + "mlp.down_proj.weight"].T
  return norm(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T


def _random_llama(hf_config, seed=0):
  rng = np.random.default_rng(seed)
  d, f, v = hf_config["hidden_size"], hf_config["intermediate_size"], hf_config["vocab_size"]
  hd = d // hf_config["num_attention_heads"]
  kv = hf_config["num_key_value_heads"] * hd
  shapes = {
    "model.embed_tokens.weight": (v, d),
    "model.norm.weight": (d,),
    "lm_head.weight": (v, d),
  }
  for n in range(hf_config["num_hidden_layers"]):
    p = f"model.layers.{n}."
    shapes |= {
      p + "input_layernorm.weight": (d,),
      p + "post_attention_layernorm.weight": (d,),
      p + "self_attn.q_proj.weight": (d, d),
      p + "self_attn.k_proj.weight": (kv, d),
      p + "self_attn.v_proj.weight": (kv, d),
      p + "self_attn.o_proj.weight": (d, d),
      p + "mlp.gate_proj.weight": (f, d),
      p + "mlp.up_proj.weight": (f, d),
      p + "mlp.down_proj.weight": (d, f),
    }
  return {
    k: (rng.normal(size=s) * 0.3 + (1.0 if "norm" in k else 0.0)).astype(np.float32)
    for k, s in shapes.items()
  }


HF_CONFIG = {
  "model_type": "llama",
  "vocab_size": 23,
  "hidden_size": 16,
  "intermediate_size": 24,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "rope_theta": 500000.0,
  "rms_norm_eps": 1e-5,
  "tie_word_embeddings": False,
}


def test_llama_conversion_matches_a_numpy_reference_forward(tmp_path):
  from safetensors.numpy import save_file

  state_dict = _random_llama(HF_CONFIG)
  save_file(state_dict, str(tmp_path / "model.safetensors"))
  model = Transformer(**hf_convert.transformer_settings(HF_CONFIG))
  params = hf_convert.llama_to_flax(
    hf_convert.read_safetensors(str(tmp_path / "model.safetensors")), model
  )
  tokens = np.array([1, 5, 7, 2, 22, 9])
  ours = model.apply(params, jnp.asarray(tokens)[None], mask=attention.causal_mask()).logits[0]
  reference = _numpy_llama(state_dict, tokens, 2, 4, 2, 1e-5, 500000.0)
  np.testing.assert_allclose(np.asarray(ours), reference, rtol=2e-3, atol=2e-3)


def test_llama_conversion_names_bad_keys():
  model = Transformer(**hf_convert.transformer_settings(HF_CONFIG))
  state_dict = _random_llama(HF_CONFIG)
  del state_dict["model.layers.1.mlp.up_proj.weight"]
  with pytest.raises(
    hf_convert.CheckpointError, match=r"missing keys \[.model.layers.1.mlp.up_proj.weight.\]"
  ):
    hf_convert.llama_to_flax(state_dict, model)
  state_dict = _random_llama(HF_CONFIG)
  state_dict["model.norm.weight"] = np.ones(3, np.float32)
  with pytest.raises(hf_convert.CheckpointError, match="model.norm.weight: expected shape"):
    hf_convert.llama_to_flax(state_dict, model)
  with pytest.raises(hf_convert.CheckpointError, match="rope_scaling"):
    hf_convert.transformer_settings({**HF_CONFIG, "rope_scaling": {"rope_type": "llama3"}})


# ---------------------------------------------------------------------------------------------------
# Through the loop
# ---------------------------------------------------------------------------------------------------


def tiny_config():
  config = tg_config.get_config()
  config.data.update(
    num_persons=30, num_cities=5, num_companies=4, num_ages=8, num_test=4, num_dev=4
  )
  config.model.update(width=16, depth=2, num_heads=2)
  config.batch_size = 8
  config.steps = 4
  # one beam: the beams' rows are the questions' (fewer shapes to compile); the draw among beams
  # and the answer cluster over several beams run in test_token_guard_decode_shapes_and_costs
  config.guard.update(beams=1, rollouts=2, max_steps=2, max_refine=1, global_iterations=1)
  # the analysis draws' sampler (temperature 1, no top-k / top-p): one compiled `extend` with the
  # answer completion; top-k / top-p filtering is tested in tests/test_decoding.py
  config.guard.update(temperature=1.0, top_k=0, top_p=1.0, refine_top_p=1.0)
  config.eval.update(
    chunk=4,
    chain_width=14,
    num_samples=2,
    analysis_samples=1,
    decoders=("greedy", "token_guard", "token_guard_calibrated", "always_abstain"),
    auroc=True,
  )
  config.loop.update(log_every=2, checkpoint_every=2)
  return config


def test_run_writes_the_headline_keys(tmp_path):
  summary = loop.run(tiny_config(), str(tmp_path))
  results = summary.results
  for key in ("f1", "false_abstention_rate", "hallucination_rate_greedy", "em", "cost_ratio"):
    assert math.isfinite(results[key]), key
  assert "hallucination_rate" not in results  # abstaining would win it
  # the trivial policy: no hallucination by the old count, every answerable question abstained
  assert results["hallucination_rate_always_abstain"] == 0.0
  assert results["answered_rate_always_abstain"] == 0.0
  assert math.isnan(results["answered_hallucination_rate_always_abstain"])
  assert results["false_abstention_rate_always_abstain"] == pytest.approx(
    1.0 - results["abstention_accuracy_always_abstain"]
  )
  assert results["cost_ratio"] >= 1.0
  assert results["calibrated_tau_low"] <= results["calibrated_tau_high"]
  assert summary.step_traces == {"train": 1, "decode": 0}
  config = tiny_config()
  report = token_guard.report(config, {"seed0": results, "seed1": results})
  assert [row["decoder"] for row in report.rows] == list(config.eval.decoders)
  assert report.summary["em"] == pytest.approx(results["em"])
  assert "token_guard_study" in report.figures
  assert [name for name, _ in token_guard.study_arms(tg_config.get_config("study"))] == [
    "seed0",
    "seed1",
  ]


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("eval.decoders", ("greedy", "beam"), "config.eval.decoders: unknown \\['beam'\\]"),
    ("eval.main_decoder", "sampling", "config.eval.main_decoder: must be one of"),
    ("guard.tau_low", 0.9, "config.guard.tau_low: 0.9 exceeds tau_high"),
    ("guard.fusion", "max", "config.guard.fusion: must be one of"),
    ("model.depth", 1, "config.model.depth: the token scores read the penultimate block"),
    ("data.prompt_len", 20, "config.data.prompt_len: 20 is shorter than the longest prompt"),
    ("eval.chain_width", 8, "config.eval.chain_width: 8 cannot hold"),
    ("model.checkpoint", "/nonexistent/model.safetensors", "config.model.checkpoint:"),
  ],
)
def test_bad_fields_are_named(field, value, message):
  config = tiny_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ConfigError, match=message):
    loop.validate(config, data_devices=1)


def test_gpu_variant_names_its_checkpoint():
  with pytest.raises(ConfigError, match="^config.model.checkpoint: "):
    loop.validate(tg_config.get_config("gpu"), data_devices=1)


def test_tokenizer_covers_every_word(world):
  tokenizer = tokenizers.WordTokenizer(fw.vocabulary(world))
  example = fw.make_examples(world, 1, 5)[0]
  ids = tokenizer.encode(example.prompt + " " + example.target)
  assert tokenizers.UNK_ID not in ids
  assert (
    output_words(tokenizer, np.array(ids + [2, 7]), len(ids) + 2)
    == (example.prompt + " " + example.target).split()
  )


# ---------------------------------------------------------------------------------------------------
# The model's own tokenizer (byte-level BPE from tokenizer.json)
# ---------------------------------------------------------------------------------------------------

LLAMA3_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>")


def _tokenizer_json(path, merges=("Ġ t", "h e", "Ġt he"), extra_vocab=(), ignore_merges=False):
  """A Llama-3-layout tokenizer.json: the 256 byte symbols, `merges`, the special tokens."""
  symbols = list(tokenizers.bytes_to_unicode().values())
  merged = [a + b for a, b in (m.split(" ") for m in merges)]
  vocab = {token: i for i, token in enumerate(dict.fromkeys(symbols + merged + list(extra_vocab)))}
  added = [
    {"id": len(vocab) + i, "content": t, "special": True, "lstrip": False, "rstrip": False}
    for i, t in enumerate(SPECIALS)
  ]
  payload = {
    "added_tokens": added,
    "normalizer": None,
    "pre_tokenizer": {
      "type": "Sequence",
      "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated"},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
      ],
    },
    "post_processor": {
      "type": "TemplateProcessing",
      "single": [
        {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}},
      ],
    },
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges},
  }
  path.write_text(json.dumps(payload))
  return str(path)


def test_bpe_merges_by_rank_and_splits_out_special_tokens(tmp_path):
  pytest.importorskip("regex")  # the Unicode classes of tokenizer.json regexes
  tok = tokenizers.ByteLevelBPETokenizer.from_file(_tokenizer_json(tmp_path / "t.json"))
  v = tok.vocab
  # "the": h+e (rank 1) only; " the": Ġ+t (rank 0), h+e (1), then Ġt+he (2)
  assert tok.encode("the the") == [v["t"], v["he"], v["Ġthe"]]
  eot, bos = tok.token_id("<|eot_id|>"), tok.token_id("<|begin_of_text|>")
  assert tok.encode("<|eot_id|>the", add_special=True) == [bos, eot, v["t"], v["he"]]
  text = "naïve 東京 it's 12345!\n\nok"
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok.decode([bos] + ids + [eot], skip_special=True, stop_at_eos=False) == text
  newline = tok.ids_containing("\n")
  assert v["Ċ"] in newline and v["t"] not in newline
  assert tok.with_eos("<|eot_id|>").decode(ids[:3] + [eot] + ids[3:]) == tok.decode(ids[:3])
  # ignore_merges: a word in the vocabulary is one token even without a merge path to it
  whole = tokenizers.ByteLevelBPETokenizer.from_file(
    _tokenizer_json(tmp_path / "w.json", extra_vocab=("abc",), ignore_merges=True)
  )
  assert whole.encode("abc") == [whole.vocab["abc"]]
  padded, lengths = whole.with_eos("<|eot_id|>").encode_batch(["abc", "the the"], 4)
  assert lengths.tolist() == [1, 3] and padded[0, 1] == whole.token_id("<|eot_id|>")


def test_bpe_reader_refuses_what_it_does_not_cover(tmp_path):
  pytest.importorskip("regex")  # the Unicode classes of tokenizer.json regexes
  path = tmp_path / "t.json"
  _tokenizer_json(path)
  payload = json.loads(path.read_text())
  payload["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁"}
  with pytest.raises(tokenizers.BPEFormatError, match="pre_tokenizer.type is 'Metaspace'"):
    tokenizers.ByteLevelBPETokenizer(payload)


def test_bpe_reader_matches_the_tokenizers_package():
  hf = pytest.importorskip("tokenizers")
  corpus = [
    "The Lions scored first in the first quarter with a 23-yard field goal by Jason Hanson.",
    "Net earnings were $8,197 million in FY2017; it's 13.60 per share.\n\nNo.",
    "Human metapneumovirus (HMPV) causes bronchiolitis — naïve café 東京 😀",
  ] * 20
  tok = hf.Tokenizer(hf.models.BPE(ignore_merges=True))
  tok.pre_tokenizer = hf.pre_tokenizers.Sequence(
    [
      hf.pre_tokenizers.Split(hf.Regex(LLAMA3_SPLIT), behavior="isolated"),
      hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
  )
  tok.decoder = hf.decoders.ByteLevel()
  trainer = hf.trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=list(SPECIALS),
    initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(corpus, trainer)
  ours = tokenizers.ByteLevelBPETokenizer(json.loads(tok.to_str()))
  for text in corpus[:3] + ["  two  spaces\n\n\nI'LL <|eot_id|> 1234567 x", "unseen wörds 42%"]:
    assert ours.encode(text) == tok.encode(text).ids, text
    assert ours.decode(tok.encode(text).ids) == tok.decode(tok.encode(text).ids)


# ---------------------------------------------------------------------------------------------------
# The official benchmark files
# ---------------------------------------------------------------------------------------------------

DROP_RECORD = {
  "id": "63",
  "passage": "Boris Savinkov was at the head of an army of 20,000 to 30,000 Russian POWs.",
  "question": "How many minimum amount of Russian POWs was Boris Savinkov head of?",
  "answer": "20000",
  "source_ds": "drop_history",
}
RAGTRUTH_RECORD = {
  "id": "11904",
  "passage": "passage 1:Technicians in Alaska earn about $23.70 per hour.",
  "question": "how much do automotive technicians make",
  "answer": "About $23.70 per hour in Alaska.",
  "source_ds": "RAGTruth",
  "label": "PASS",
}


def _benchmark_dir(tmp_path, count=2):
  """A data folder as in the official repository: JSON arrays, and one JSON Lines file."""
  (tmp_path / "DROP_History.json").write_text(json.dumps([DROP_RECORD] * count, indent=2))
  lines = [json.dumps({**RAGTRUTH_RECORD, "id": str(i)}) for i in range(count)]
  (tmp_path / "RAGTruth.jsonl").write_text("\n".join(lines) + "\n")
  return str(tmp_path)


def test_benchmark_files_read_in_both_layouts(tmp_path):
  data_dir = _benchmark_dir(tmp_path)
  drop = hb.read_benchmark(hb.benchmark_path(data_dir, "drop_history"))
  assert drop[0] == hb.Record("63", DROP_RECORD["passage"], DROP_RECORD["question"], "20000",
                              "drop_history", "")  # fmt: skip
  rag = hb.read_benchmark(hb.benchmark_path(data_dir, "ragtruth"))
  assert [r.id for r in rag] == ["0", "1"] and rag[0].label == "PASS"
  assert hb.benchmark_problem(data_dir, ("drop_history", "ragtruth")) is None
  assert "Halueval.json" in hb.benchmark_problem(data_dir, ("drop_history", "halueval"))
  bad = tmp_path / "FinanceBench.json"
  bad.write_text(json.dumps([DROP_RECORD, {"id": "x", "passage": "p", "question": "q"}]))
  with pytest.raises(hb.BenchmarkError, match="record 1 field 'answer' is missing"):
    hb.read_benchmark(str(bad))


def test_prompt_answer_extraction_and_eval_metrics(tmp_path):
  pytest.importorskip("regex")  # the Unicode classes of tokenizer.json regexes
  record = hb.read_benchmark(hb.benchmark_path(_benchmark_dir(tmp_path), "drop_history"))[0]
  prompt = hb.chat_prompt(hb.system_prompt("history"), hb.user_message(record, "history"))
  assert prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
  assert "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nPassage: Boris" in prompt
  assert prompt.endswith(
    "<|start_header_id|>assistant<|end_header_id|>The reasoning steps are:\n\n"
  )
  tok = tokenizers.ByteLevelBPETokenizer.from_file(_tokenizer_json(tmp_path / "t.json"))
  ids = tok.encode(prompt)
  assert ids[0] == tok.token_id("<|begin_of_text|>") and tok.decode(ids) == prompt.replace(
    "<|begin_of_text|>", ""
  ).replace("<|eot_id|>", "").replace("<|start_header_id|>", "").replace("<|end_header_id|>", "")
  text = "Step 1: the army had 20,000 to 30,000.\nAnswer: 20,000.\n"
  assert hb.extract_answer(text) == "20,000"
  assert hb.extract_answer("no final line") == ""
  assert hb.answer_metrics("20,000", "20000") == (1.0, 100.0)
  assert hb.answer_metrics(hb.extract_answer("Answer:[Jaime Meline]"), "Jaime Meline")[0] == 1.0
  assert hb.answer_metrics("the Lions won", "Lions") == (0.0, pytest.approx(66.6667, abs=1e-3))
  assert hb.answer_metrics("3 points", "7") == (0.0, 0.0)  # a gold number must be matched
  assert hb.mean_metrics(["20000", "x"], ["20000", "y"]) == {"em": 0.5, "f1": 0.5}


def test_covid_passages_keep_the_abstract_and_the_question_paragraphs():
  body = (
    "Text: "
    + "intro " * 100
    + "\n\n"
    + "\n\n".join(
      f"Paragraph {i} about {'vaccine efficacy' if i == 7 else 'other matters'} " + "x" * 60
      for i in range(40)
    )
  )
  passage = "Abstract: HMPV is common.\n" + body
  cut = hb.covid_passage(passage, "What was the vaccine efficacy?", max_chars=900)
  assert cut.startswith("Abstract: HMPV is common.") and "Paragraph 7 about vaccine" in cut
  assert len(cut) <= 900 and hb.covid_passage("Text: short", "q") == "Text: short"


# ---------------------------------------------------------------------------------------------------
# The paper-scale variant: validation and the benchmark path on a tiny random checkpoint
# ---------------------------------------------------------------------------------------------------


def _gpu_paths(tmp_path):
  from safetensors.numpy import save_file

  tokenizer_path = _tokenizer_json(tmp_path / "tokenizer.json")
  vocab = tokenizers.ByteLevelBPETokenizer.from_file(tokenizer_path).vocab_size
  hf_config = {**HF_CONFIG, "vocab_size": vocab}
  save_file(_random_llama(hf_config), str(tmp_path / "model.safetensors"))
  return str(tmp_path / "model.safetensors"), tokenizer_path, hf_config


def test_gpu_variant_names_each_missing_path_in_one_line(tmp_path):
  pytest.importorskip("regex")  # the Unicode classes of tokenizer.json regexes
  checkpoint, tokenizer_path, _ = _gpu_paths(tmp_path)
  config = tg_config.get_config("gpu")
  steps = [
    ("model.checkpoint", str(tmp_path / "none.safetensors"), "config.model.checkpoint: "),
    ("model.tokenizer", "", "config.model.tokenizer: "),
    ("model.tokenizer", str(tmp_path / "none.json"), "config.model.tokenizer: "),
    ("data.data_dir", "", "config.data.data_dir: not set; expected .*Halueval.json"),
    ("data.data_dir", str(tmp_path / "none"), "config.data.data_dir: no folder"),
  ]
  for field, value, message in steps:  # each field wrong in turn, the ones before it right
    section, name = field.split(".")
    config[section][name] = value
    with pytest.raises(ConfigError, match=message) as error:
      loop.validate(config, data_devices=1)
    assert "\n" not in str(error.value)
    config.model.update(checkpoint=checkpoint, tokenizer=tokenizer_path)
  config.data.data_dir = _benchmark_dir(tmp_path)
  with pytest.raises(ConfigError, match="config.data.data_dir: .*Halueval.json"):
    loop.validate(config, data_devices=1)
  config.data.benchmarks = ("drop_history", "ragtruth")
  config.model.eos_token = "</s>"
  with pytest.raises(ConfigError, match="config.model.eos_token: '</s>' is not a token"):
    loop.validate(config, data_devices=1)
  config.model.eos_token = "<|eot_id|>"
  loop.validate(config, data_devices=1)
  config.eval.decoders += ("token_guard_calibrated",)
  with pytest.raises(ConfigError, match="config.eval.decoders: \\['token_guard_calibrated'\\]"):
    loop.validate(config, data_devices=1)


@pytest.mark.slow
def test_benchmark_path_decodes_real_text_end_to_end(tmp_path):
  pytest.importorskip("regex")  # the Unicode classes of tokenizer.json regexes
  checkpoint, tokenizer_path, hf_config = _gpu_paths(tmp_path)
  config = tg_config.get_config("gpu")
  config.model.update(
    checkpoint=checkpoint,
    tokenizer=tokenizer_path,
    dtype="float32",
    **{k: v for k, v in hf_convert.transformer_settings(hf_config).items() if k != "mlp"},
  )
  config.model.mlp_hidden = hf_config["intermediate_size"]
  config.data.update(
    data_dir=_benchmark_dir(tmp_path), benchmarks=("drop_history", "ragtruth"), num_test=2
  )
  config.data.prompt_len = 660  # holds the DROP prompt (477 tokens), cuts RAGTruth's (681)
  config.guard.update(beams=2, rollouts=2, max_steps=2, segment_length=6, max_refine=1)
  config.guard.update(global_iterations=1, min_steps=1)
  config.guard.refine_top_p = config.guard.top_p
  config.eval.update(chunk=2, chain_width=14, num_samples=2)
  config.eval.decoders = ("greedy", "token_guard")
  results = loop.run(config, str(tmp_path / "run")).results
  for key in ("em", "f1", "cost_ratio", "f1_greedy_drop_history", "answered_rate_token_guard"):
    assert math.isfinite(results[key]), key
  assert results["truncated_rate_greedy_ragtruth"] == 1.0
  assert results["truncated_rate_greedy_drop_history"] == 0.0
  assert results["cost_ratio"] >= 1.0
