r"""R-WoM: "R-WoM: Retrieval-augmented World Model for Computer-use Agents" (Mei, Guo, Chang, Dong, Lee,
Niu, Jiang; ICLR 2026, arXiv 2510.11892; no official code released).

Claim: grounding an LLM world model in tutorials retrieved for the task (query rewriting, reranking,
Eq. 9), simulating each candidate action's future in one rollout (Eq. 10) and ranking the rollouts
jointly (Eq. 11) keeps long-horizon simulation accurate on environments the model could not have
memorised, and lifts agent success over the same world model without retrieval and over no world model
(OSWorld / WebArena subsets, up to +23.4% / +16.3% relative).

Here: MenuWorld (`core/data/menuworld.py`), menu apps with tutorials; a small transformer world model
trained on version 1 of the train apps, tested on held-out apps (novel) and on version 2 of the train
apps (three settings moved: stale knowledge); BM25 retrieval (`core/tutorial_retrieval.py`).

Variants:
  default  192 apps (160 train), a 2-block width-64 world model, 1200 steps; probes, simulation by
           horizon and the agents on 48 tasks per split: ~4 CPU-minutes.
  study    four arms (seeds 0-3: world, data and model) of the default on novel and updated apps,
           64 tasks per split, no agents: the simulation gain over every horizon and the
           per-candidate value's accuracy against chance (the judge trains only with agents, so
           its accuracy is the `agents` variant's); ~35 CPU-minutes.
  agents   two seeds with the agents: the listwise judge (wm, rwom) against the absolute reward
           (rwom_absolute) and the per-candidate value (rwom_value), 48 tasks per split.
  reward_weighted
           the decisive experiment for the agent result: the study's two seeds with the milestone
           flag's loss weighted 1 (the default) and 10, milestone recognition with and without
           tutorials, and agent success of no world model, the world model without and with
           retrieval, and the same planner fed the true environment (`true_wm`); novel and updated
           apps only. The weight-1 arms train exactly as the study's arms.
  counterfactual
           the experiment that separates budget and setup from the paper: training data with
           counterfactual clicks (`data.counterfactual_fraction` 1: every expert step also gets a
           wrong-click twin with the true next state and flag) against today's data, with the
           default model and with a 4-block width-128 model trained 1600 steps, seed 0 (the second
           seed's arms, `cf0_small_seed1` and `cf1_small_seed1`, did not fit the CPU budget); the
           home-screen flag AUC and action accuracy and the agents on novel and updated apps. The
           `cf0_small` arm trains exactly as the study's seed-0 arm. ~33 CPU-minutes fresh (the large
           arm alone 22).
  flag_mix the experiment that separates the training mix from the model: why is the flag blind to
           the tutorial at the home screen (AUC ~0.5) when a model of the same size trained only on
           "does the click match the tutorial" reaches 0.98? Five arms on seed 0, each a named set of
           config changes (`study.mix_arms`, `study.mix`): `default` (the study's seed-0 training),
           `flag_only` (`data.objective` "flag_only": the same sequences and model, the loss on the
           flag alone; the capacity check), `low_dropout` (`data.tutorial_dropout` 0.1),
           `flag_weighted_cf` (`milestone_weight` 10 and `data.counterfactual_fraction` 1) and
           `combined` (all three); the home-screen flag AUC and action accuracy per context, the
           agents and simulation at the last horizon on novel and updated apps, 48 tasks per split.
  gpu      the paper's scale is an LLM world model (Claude-3.7 / Qwen-2.5-VL-72B) on OSWorld and
           WebArena with their tutorial corpora; this variant names a Llama-layout checkpoint
           (`model.checkpoint`) and the folder of the benchmark tasks and tutorials (`data.data_dir`)
           and a larger MenuWorld (6 blocks, width 384, 256 apps); it stops at validation naming the
           first missing path.

  python experiments/train.py --config=configs/rwom.py --workdir=runs/rwom
  python experiments/study.py --config=configs/rwom.py:study --workdir=runs/rwom_study
  python experiments/study.py --config=configs/rwom.py:agents --workdir=runs/rwom_agents
  python experiments/study.py --config=configs/rwom.py:reward_weighted --workdir=runs/rwom_reward
  python experiments/study.py --config=configs/rwom.py:counterfactual --workdir=runs/rwom_cf
  python experiments/study.py --config=configs/rwom.py:flag_mix --workdir=runs/rwom_flag_mix
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "agents", "reward_weighted", "counterfactual", "flag_mix", "gpu")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "rwom"
  config.variant = variant
  config.seed = 0

  config.world = ml_collections.ConfigDict()
  config.world.num_apps = 192  # apps, each in versions 1 and 2 (at most 256)
  # apps 0..159 (version 1) train the world model, ~15 episodes each: too few to memorise every
  # layout, so the tutorials are the reliable source of app knowledge; apps 160..191 are novel
  config.world.train_apps = 160
  config.world.submenu_prob = 0.5  # a menu item opens a submenu (else it is a leaf)
  config.world.world_seed = 0
  config.world.name_prob = 0.25  # a request names the setting (else one of its 3 synonyms)
  config.world.rewrite_known = 2  # synonyms of each setting the query rewriter knows (of 3)

  config.retrieval = ml_collections.ConfigDict()
  config.retrieval.query = "rewrite_rerank"  # "raw" | "rewrite" | "rewrite_rerank" (Eq. 9)
  config.retrieval.first_stage_k = 5  # BM25 candidates handed to the reranker
  config.retrieval.num_chunks = 2  # tutorials in the world model's context
  config.retrieval.tutorial_len = 42  # tokens of the context slot (two 21-word tutorials)
  config.retrieval.k1 = 1.5  # BM25 (bm25s, Lucene variant)
  config.retrieval.b = 0.75

  config.data = ml_collections.ConfigDict()
  config.data.train_episodes = 2500  # noisy-expert episodes on the train apps
  config.data.episode_steps = 16  # steps per episode (transitions after success are dropped)
  config.data.epsilon = 0.3  # random valid actions among the expert's
  config.data.task_sizes = (1, 2, 3)  # settings per task
  config.data.tutorial_dropout = 0.5  # transitions trained without tutorials (the WoM context)
  # share of the expert's steps that also get a twin taking a wrong state-changing action, with the
  # environment's next state and flag (exploration data; methods/rwom/phases.py
  # `counterfactual_transitions`); 0 (off) keeps the study's training as measured
  config.data.counterfactual_fraction = 0.0
  # what the loss trains: "world_model" (the next state, the expert's action and the milestone flag)
  # or "flag_only" (the same sequences, the flag alone: core/rwom.py `loss_mask`)
  config.data.objective = "world_model"

  config.model = ml_collections.ConfigDict()
  config.model.checkpoint = ""  # gpu: a Llama-layout checkpoint of the LLM world model
  config.model.width = 64
  config.model.depth = 2
  config.model.num_heads = 4
  config.model.mlp_hidden = 0  # 0 = 8D/3

  config.batch_size = 64
  config.steps = 1200
  # weight of the milestone flag's cross-entropy against the 11 next-state tokens and the action;
  # 1: weighting it 10x (the `reward_weighted` variant) leaves the flag as blind to the tutorial as
  # before (see docs/results.md), so its share of the loss is not what limits it
  config.milestone_weight = 1.0
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 2e-3
  config.optim.warmup_steps = 100
  config.optim.weight_decay = 0.01
  config.optim.grad_clip = 1.0

  # the listwise judge of Eq. 11 (methods/rwom/judge.py): a bidirectional transformer over all
  # candidates' imagined rollouts, trained after the world model on its own rollouts (ListNet loss
  # against the candidates whose first action brings the task closest)
  config.judge = ml_collections.ConfigDict()
  config.judge.width = 64
  config.judge.depth = 2
  config.judge.num_heads = 4
  config.judge.episodes = 800  # fresh noisy-expert episodes on the train apps
  config.judge.states = 4096  # their states, each with eval.candidates imagined rollouts
  config.judge.steps = 600
  config.judge.batch_size = 64
  config.judge.learning_rate = 2e-3
  config.judge.warmup_steps = 50

  config.eval = ml_collections.ConfigDict()
  config.eval.splits = ("seen", "novel", "updated")
  config.eval.agent_splits = ("novel", "updated")
  config.eval.contexts = (
    "none",
    "retrieved",
    "oracle",
    "random",
  )  # the world model's tutorial slot
  config.eval.num_tasks = 48  # tasks per split for the probes and simulation
  config.eval.sim_sizes = (2, 3)  # composite tasks: expert trajectories of 6-15 steps
  config.eval.horizon = 8  # open-loop simulation steps
  config.eval.segment_steps = 3  # probe 3's segments
  config.eval.num_agent_tasks = 48  # tasks per split for the agents
  config.eval.agent_sizes = (1, 2, 3)
  # wm / rwom pick by the listwise judge; rwom_absolute (the baseline) by {0, .5, 1} scores of the
  # milestone flags, rwom_value by each rollout's flag value alone
  config.eval.agents = (
    "none",
    "rag",
    "wm",
    "rwom",
    "rwom_absolute",
    "rwom_value",
    "true_wm",
    "oracle",
  )
  config.eval.candidates = 3  # m: proposals per real step (the paper's best m)
  config.eval.imagine_steps = 3  # k: imagined steps per candidate (the paper's best k)
  # value of a proposal the world model predicts to change nothing (core.rwom.rollout_value): with
  # 0, the planner fed the true environment reaches ~60% where the oracle reaches ~90%, since a
  # milestone flag ties a harmless no-op with a wrong click that costs a step to undo
  config.eval.no_op_value = 0.5
  config.eval.budget_factor = 3  # real steps allowed per expert step
  config.eval.judge_states = 256  # noisy-expert states per split scored by `judge_accuracy`

  config.data.data_dir = ""  # gpu: OSWorld / WebArena tasks and tutorial corpus

  config.study = ml_collections.ConfigDict()
  config.study.seeds = (0,)
  config.study.milestone_weights = ()  # arms per weight and seed (empty: the config's own weight)
  # explicit arms `cf<fraction>_<small|large>_seed<seed>` (counterfactual fraction, model, seed);
  # `small` is the config's own model, `large` the model below
  config.study.arms = ()
  config.study.large = ml_collections.ConfigDict(
    {"width": 128, "depth": 4, "num_heads": 4, "steps": 1600}
  )
  # named arms, one per seed of study.seeds (`<name>_seed<seed>`): `study.mix[name]` holds the arm's
  # config changes as `with_changes` keywords (`data__tutorial_dropout`: 0.1); exclusive with
  # study.arms and study.milestone_weights
  config.study.mix_arms = ()
  config.study.mix = ml_collections.ConfigDict()

  config.loop = common.loop_config(log_every=250, checkpoint_every=500)
  common.add_parallelism(config)

  if variant == "study":
    # the simulation gain and the listwise judge over four worlds x seeds; no agents (`agents`)
    config.eval.splits = ("novel", "updated")
    config.eval.agent_splits = ()
    config.eval.contexts = ("none", "retrieved")
    config.eval.num_tasks = 64
    config.study.seeds = (0, 1, 2, 3)
  if variant == "agents":
    # the planning agents: the listwise judge (rwom, wm) against the absolute reward and the
    # per-candidate value on two seeds
    config.eval.splits = ("novel", "updated")
    config.eval.contexts = ("none", "retrieved")
    config.eval.agents = ("none", "wm", "rwom", "rwom_absolute", "rwom_value", "true_wm", "oracle")
    config.eval.num_tasks = 32
    config.eval.num_agent_tasks = 48
    config.study.seeds = (0, 1)
  if variant == "reward_weighted":
    # is the agent's failure the milestone flag's share of the loss? the same two seeds as the
    # study with the flag weighted up, on the test splits and the agents that decide it
    config.study.milestone_weights = (1.0, 10.0)
    config.eval.splits = ("novel", "updated")
    config.eval.contexts = ("none", "retrieved")
    config.eval.agents = ("none", "wm", "rwom", "true_wm", "oracle")
    config.eval.num_tasks = 48
    config.eval.num_agent_tasks = 64
    config.study.seeds = (0, 1)
  if variant == "counterfactual":
    # does the flag learn the tutorial comparison once it sees the negatives, and does R-WoM's agent
    # then beat wm and none? today's data (the study's training, restorable from its checkpoints)
    # and counterfactual data with the default model, and the larger model on counterfactual data
    # (the subset the CPU budget allowed: seed 0 only); test splits only
    config.study.arms = ("cf0_small_seed0", "cf1_small_seed0", "cf1_large_seed0")
    config.eval.splits = ("novel", "updated")
    config.eval.contexts = ("none", "retrieved")
    config.eval.agents = ("none", "wm", "rwom", "true_wm", "oracle")
    config.eval.num_tasks = 64
    config.eval.num_agent_tasks = 64
  if variant == "flag_mix":
    # is the flag's blindness at the home screen the training mix (half the sequences without a
    # tutorial, ~4% wrong home-screen clicks, the flag 1 target of 13)? seed 0, test splits only
    dropout, weighted = {"data__tutorial_dropout": 0.1}, {"milestone_weight": 10.0}
    weighted["data__counterfactual_fraction"] = 1.0
    config.study.mix = ml_collections.ConfigDict(
      {
        "default": {},
        "flag_only": {"data__objective": "flag_only"},
        "low_dropout": dropout,
        "flag_weighted_cf": weighted,
        "combined": dropout | weighted,
      }
    )
    config.study.mix_arms = ("default", "flag_only", "low_dropout", "flag_weighted_cf", "combined")
    config.eval.splits = ("novel", "updated")
    config.eval.contexts = ("none", "retrieved")
    config.eval.agents = ("none", "wm", "rwom", "true_wm", "oracle")
    config.eval.num_tasks = 48
    config.eval.num_agent_tasks = 48
  if variant == "gpu":
    config.world.num_apps = 256
    config.world.train_apps = 224
    config.data.train_episodes = 40_000
    config.model.width = 384
    config.model.depth = 6
    config.model.num_heads = 6
    config.batch_size = 256
    config.steps = 20_000
    config.eval.num_tasks = 512
    config.eval.num_agent_tasks = 512
    config.study.seeds = (0, 1, 2)
  return config
