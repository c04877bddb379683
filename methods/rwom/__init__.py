"""R-WoM: "R-WoM: Retrieval-augmented World Model for Computer-use Agents" (Mei et al., ICLR 2026,
arXiv 2510.11892, OpenReview 5ZaoXB3MdP; no official code released).

Claim: a world model grounded in retrieved tutorials (Eq. 9) that simulates each candidate's future in
one rollout (Eq. 10) and ranks the rollouts jointly (Eq. 11) simulates long horizons on unfamiliar or
updated environments better than the same model without retrieval, and its agent succeeds more often.

Map to the paper:
  `core/data/menuworld.py`      the environment (menu apps, version updates, tutorials, tasks with
                                synonyms), pure jnp dynamics, milestones and the canonical expert.
  `core/tutorial_retrieval.py`  BM25 (bm25s), query rewriting, reranking, Recall@k (Eq. 9, Fig. 3).
  `core/rwom.py`                the world model's sequences and loss, one-call k-step rollouts with a KV
                                cache (Eq. 10), the probes' likelihoods, listwise and absolute choice.
  `world.py`                    the world, index and tokenizer per config; tutorial headers.
  `phases.py`                   `train` and `evaluate` (probes, simulation by horizon, recall).
  `judge.py`                    the listwise reward of Eq. 11: a judge over all candidates' rollouts.
  `agents.py`                   no world model, RAG, WoM, R-WoM (listwise judge / absolute / per-
                                candidate value), the planner on true rollouts, oracle.
  `study.py`                    one arm per seed (or weight, explicit arm, named config changes);
                                table, summary, figure.
"""

from __future__ import annotations

import ml_collections

from core.rwom import OBJECTIVES
from methods.base import Method, require, require_choice, require_file, require_positive_int
from methods.rwom.agents import WORLD_MODEL_AGENTS
from methods.rwom.phases import SPLITS, phases
from methods.rwom.study import explicit_arm, mix_arm, report, study_arms
from methods.rwom.world import CONTEXTS, QUERIES

POSITIVE_FIELDS = (
  "world.num_apps",
  "world.train_apps",
  "retrieval.first_stage_k",
  "retrieval.num_chunks",
  "retrieval.tutorial_len",
  "data.train_episodes",
  "data.episode_steps",
  "model.width",
  "model.depth",
  "model.num_heads",
  "eval.num_tasks",
  "eval.horizon",
  "eval.segment_steps",
  "eval.num_agent_tasks",
  "eval.candidates",
  "eval.imagine_steps",
  "eval.budget_factor",
  "eval.judge_states",
  "judge.width",
  "judge.depth",
  "judge.num_heads",
  "judge.episodes",
  "judge.states",
  "judge.steps",
  "judge.batch_size",
)
AGENTS = ("none", "rag", "true_wm", "oracle") + tuple(WORLD_MODEL_AGENTS)


def validate(config: ml_collections.ConfigDict) -> None:
  for field in POSITIVE_FIELDS:
    require_positive_int(config, field)
  require(
    config.milestone_weight > 0, "milestone_weight", f"must be > 0, got {config.milestone_weight}"
  )
  require(
    0.0 <= config.eval.no_op_value < 1.0,
    "eval.no_op_value",
    f"must be in [0, 1) (below one milestone), got {config.eval.no_op_value}",
  )
  w, d, e, m = config.world, config.data, config.eval, config.model
  require(
    w.num_apps <= 256, "world.num_apps", f"at most 256 (two-word app names), got {w.num_apps}"
  )
  require(
    w.train_apps < w.num_apps,
    "world.train_apps",
    f"{w.train_apps} leaves no novel app of {w.num_apps}",
  )
  require(
    0 <= w.rewrite_known <= 3, "world.rewrite_known", f"must be in 0..3, got {w.rewrite_known}"
  )
  for field, value in (
    ("world.submenu_prob", w.submenu_prob),
    ("world.name_prob", w.name_prob),
    ("data.epsilon", d.epsilon),
    ("data.tutorial_dropout", d.tutorial_dropout),
    ("data.counterfactual_fraction", d.get("counterfactual_fraction", 0.0)),
  ):
    require(0.0 <= value <= 1.0, field, f"must be in [0, 1], got {value}")
  require(w.submenu_prob <= 0.8, "world.submenu_prob", "above 0.8 the apps have too few leaves")
  require_choice(config, "retrieval.query", QUERIES)
  require_choice(config, "data.objective", OBJECTIVES)
  require(
    config.retrieval.first_stage_k >= config.retrieval.num_chunks,
    "retrieval.first_stage_k",
    f"{config.retrieval.first_stage_k} is fewer than num_chunks {config.retrieval.num_chunks}",
  )
  require(
    config.retrieval.tutorial_len >= 20, "retrieval.tutorial_len", "must hold one tutorial (20)"
  )
  require(
    all(s in (1, 2, 3) for s in d.task_sizes) and d.task_sizes, "data.task_sizes", "sizes in 1..3"
  )
  require(
    m.width % m.num_heads == 0, "model.num_heads", f"{m.num_heads} must divide width {m.width}"
  )
  require((m.width // m.num_heads) % 2 == 0, "model.num_heads", "head dim must be even (RoPE)")
  j = config.judge
  require(
    j.width % j.num_heads == 0 and (j.width // j.num_heads) % 2 == 0,
    "judge.num_heads",
    f"{j.num_heads} must divide width {j.width} into even head dims (RoPE)",
  )
  require(j.learning_rate > 0, "judge.learning_rate", f"must be > 0, got {j.learning_rate}")
  for field, values, known in (
    ("eval.splits", e.splits, SPLITS),
    ("eval.agent_splits", e.agent_splits, SPLITS),
    ("eval.contexts", e.contexts, CONTEXTS),
    ("eval.agents", e.agents, AGENTS),
  ):
    unknown = [v for v in values if v not in known]
    empty_ok = field == "eval.agent_splits"  # () runs no agents (the simulation study)
    require(
      not unknown and (len(values) > 0 or empty_ok),
      field,
      f"unknown {unknown}; known: {list(known)}",
    )
  require(set(e.agent_splits) <= set(e.splits), "eval.agent_splits", "must be among eval.splits")
  require({"none", "retrieved"} <= set(e.contexts), "eval.contexts", "needs 'none' and 'retrieved'")
  require({"none", "wm", "rwom"} <= set(e.agents), "eval.agents", "needs 'none', 'wm' and 'rwom'")
  require(
    all(s in (1, 2, 3) for s in e.sim_sizes + e.agent_sizes), "eval.sim_sizes", "sizes in 1..3"
  )
  require(
    e.candidates <= 8,
    "eval.candidates",
    f"at most 8 (the fewest valid actions), got {e.candidates}",
  )
  require(len(config.study.seeds) > 0, "study.seeds", "needs at least one seed")
  weights = tuple(config.study.milestone_weights)
  require(all(w > 0 for w in weights), "study.milestone_weights", f"must be > 0, got {weights}")
  arms = tuple(config.study.get("arms", ()))
  require(not (arms and weights), "study.arms", "set either study.arms or study.milestone_weights")
  for name in arms:
    explicit_arm(config, name)  # names the field for a malformed arm
  mix = tuple(config.study.get("mix_arms", ()))
  require(
    not (mix and (arms or weights)),
    "study.mix_arms",
    "set at most one of study.mix_arms, study.arms and study.milestone_weights",
  )
  for name in mix:
    mix_arm(config, name, config.seed)  # names the field for an unknown arm or change
  if config.variant == "gpu" or config.model.checkpoint or config.data.data_dir:
    _validate_paper_scale(config)


def _validate_paper_scale(config) -> None:
  require_file(
    config,
    "model.checkpoint",
    "a Llama-layout LLM checkpoint (model.safetensors.index.json) for the world model and policy",
    "download it on a machine with network access and pass --config.model.checkpoint=PATH",
  )
  require(
    bool(config.data.data_dir),
    "data.data_dir",
    "not set; expected the OSWorld / WebArena task subsets and their tutorial corpus; pass "
    "--config.data.data_dir=DIR",
  )
  require(
    False,
    "data.data_dir",
    "running OSWorld / WebArena tasks (virtual machines, browsers) is not implemented here; the "
    "method runs on MenuWorld only",
  )


METHOD = Method(name="rwom", phases=phases, validate=validate, study_arms=study_arms, report=report)
