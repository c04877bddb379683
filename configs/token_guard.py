r"""Token-Guard: "Token-Guard: Towards Token-Level Hallucination Control via Self-Checking Decoding"
(Zhu, Rong, Luo; ICLR 2026, arXiv 2601.21969; official code github.com/rhq945/Token-Guard).

Claim: scoring every generated token by its probability and its latent consistency with the context,
every reasoning step by those token scores, and the whole chain by factual and logical consistency,
and pruning or regenerating what scores low, lowers hallucination (and raises EM/F1) against greedy,
sampling and rollout baselines, at a higher decoding cost; the token-level score matters most.

Variants:
  default  a 200-person factual world; a 3-block width-64 LM trained for 1500 steps; greedy, sampling
           and Token-Guard (paper thresholds) on 200 test questions; a few minutes on 2 CPU cores.
  study    the same model trained longer; every decoder side by side (greedy, sampling,
           self-consistency, rollout-and-prune, Token-Guard with the paper's and with dev-calibrated
           thresholds, the latest code's fusion, and the three ablations at both threshold sets) on
           300 test questions, plus the token-score AUROC; two arms (seeds), ~15 minutes idle on 2
           CPU cores.
  gpu      the paper's model: Meta-Llama-3-8B-Instruct converted from its Hugging Face safetensors
           (`model.checkpoint`, `core/nn/hf_convert.py`) and its own `tokenizer.json`
           (`model.tokenizer`, read by `core.data.tokenizers.ByteLevelBPETokenizer`), decoding
           the official repository's benchmark files (`data.data_dir` holds its `data/*.json`:
           HaluEval, RAGTruth, FinanceBench, DROP history / nfl; `core/data/halu_benchmarks.py`)
           with the code's beam 4 x rollout 10 and 8 steps; EM and F1 per benchmark and decoder
           (no hallucination labels there: the calibrated decoders and the AUROC need the
           factual world's). One GPU.

  python experiments/train.py --config=configs/token_guard.py --workdir=runs/token_guard/default
  python experiments/study.py --config=configs/token_guard.py:study --workdir=runs/token_guard/study
  python experiments/train.py --config=configs/token_guard.py:gpu \
    --config.model.checkpoint=/models/llama3-8b-instruct/model.safetensors.index.json \
    --config.model.tokenizer=/models/llama3-8b-instruct/tokenizer.json \
    --config.data.data_dir=/data/token_guard
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "gpu")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "token_guard"
  config.variant = variant
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.data_dir = ""  # gpu: folder of the official repository's data/*.json benchmarks
  config.data.benchmarks = ()  # names in halu_benchmarks.BENCHMARKS; () = the factual world
  config.data.num_persons = 200
  config.data.num_cities = 30
  config.data.num_companies = 20
  config.data.num_ages = 60
  config.data.married_fraction = 0.6  # persons in spouse pairs
  config.data.world_seed = 0
  config.data.two_hop_fraction = 0.5  # questions needing two steps
  config.data.unanswerable_fraction = 0.1  # passages missing a needed fact
  config.data.train_counterfactual = 0.25  # training passages contradicting the KB (passage wins)
  config.data.test_counterfactual = 0.5  # dev/test passages contradicting the KB
  config.data.fact_fraction = 0.2  # closed-book KB sequences in training (parametric memory)
  config.data.facts_per_sequence = 8
  config.data.min_facts = 3  # passage facts
  config.data.max_facts = 6
  config.data.seq_len = 48  # training tokens per sequence (every sequence fits)
  config.data.prompt_len = 40  # prompt buffer (passage + question) at decoding
  config.data.num_test = 200
  config.data.test_seed = 1001
  config.data.num_dev = 100  # for the threshold calibration
  config.data.dev_seed = 1002

  config.model = ml_collections.ConfigDict()
  config.model.checkpoint = ""  # Llama-layout safetensors (or its index.json); "" = train here
  config.model.tokenizer = ""  # the checkpoint's tokenizer.json; "" = the world's word tokenizer
  config.model.eos_token = "<|eot_id|>"  # ends the answer (Llama 3 Instruct's end of turn)
  config.model.vocab_size = 0  # 0 = the factual world's word vocabulary
  config.model.width = 64
  config.model.depth = 3  # the token scores read the penultimate block
  config.model.num_heads = 4
  config.model.num_kv_heads = 0  # 0 = num_heads
  config.model.mlp_hidden = 0  # 0 = 8D/3
  config.model.tie_embeddings = True
  config.model.rope_base = 10_000.0
  config.model.norm_eps = 1e-6
  config.model.dtype = "float32"

  config.batch_size = 32
  config.steps = 1500
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 3e-3
  config.optim.warmup_steps = 100
  config.optim.weight_decay = 0.01
  config.optim.grad_clip = 1.0

  config.guard = ml_collections.ConfigDict()  # the paper's / official code's settings
  config.guard.lam = 0.6  # Eq. 3
  config.guard.alpha = 0.5  # Eq. 9
  config.guard.beta = 0.3
  config.guard.gamma = 0.2
  config.guard.tau_token = 0.4  # Eq. 4 running-mean gate
  config.guard.tau_low = 0.55  # discard below
  config.guard.tau_high = 0.75  # accept at or above; refine in between
  config.guard.tau_global = 0.7  # global iteration below
  config.guard.tau_abstain = 0.5  # "No answer" when F_fact and F_logic are both below
  config.guard.delta_tau = 0.1  # Eq. 15
  config.guard.consistency = "cosine"  # "cosine" (latest code) | "distance" (first code)
  config.guard.fusion = "harmonic"  # "harmonic" (paper Eq. 13) | "softmin" (latest code)
  config.guard.beams = 2  # code default 4
  config.guard.rollouts = 4  # code default 10
  config.guard.max_steps = 3  # reasoning steps (code: <= 8)
  config.guard.min_steps = 1  # early stop allowed from this step on (code: 4 of 8)
  config.guard.segment_length = 6  # most tokens of one step
  config.guard.max_refine = 3  # N_max
  config.guard.global_iterations = 2  # M_max
  config.guard.sigma_rate = 0.8  # width pruning
  config.guard.advantage_weight = 2.0  # weight of F_global in the advantage
  config.guard.stop_share = 0.75  # early stop: largest cluster share
  config.guard.temperature = 0.7
  config.guard.top_p = 0.95
  config.guard.top_k = 50
  config.guard.refine_top_p = 0.9
  config.guard.refine = "window"  # "window" (Eq. 10: rewrite {i-1, i, i+1}) | "suffix" (code)
  config.guard.clustering = "tfidf_kmeans"  # "tfidf_kmeans" (code's TF-IDF + KMeans) | "exact"
  config.guard.num_clusters = 3  # k-means clusters per question (the code's CLI default is 2)

  config.eval = ml_collections.ConfigDict()
  # always_abstain: the trivial policy beside the headline; token_guard_no_abstain: tau_abstain = 0
  config.eval.decoders = (
    "greedy",
    "sampling",
    "token_guard",
    "token_guard_no_abstain",
    "always_abstain",
  )
  config.eval.main_decoder = "token_guard"  # the headline keys of results.json
  config.eval.chunk = 100  # questions per batched decoder call
  config.eval.chain_width = 24  # generated tokens per answer (steps and answer)
  config.eval.temperature = 0.7  # sampling / self-consistency draws
  config.eval.top_p = 0.95
  config.eval.top_k = 50
  config.eval.num_samples = 8  # self-consistency
  config.eval.auroc = False  # token-score AUROC on sampled test answers
  config.eval.analysis_samples = 4  # sampled answers per question for calibration and AUROC
  config.eval.analysis_temperature = 1.0

  config.study = ml_collections.ConfigDict()
  config.study.seeds = (0,)  # one arm per seed (world, data and model)

  config.loop = common.loop_config(log_every=250, checkpoint_every=500)
  common.add_parallelism(config)

  if variant == "study":
    config.steps = 2500
    config.data.num_test = 300
    config.eval.decoders = (
      "greedy",
      "sampling",
      "self_consistency",
      "rollout_prune",
      "token_guard",
      "token_guard_calibrated",
      "token_guard_code",
      "token_guard_no_abstain",
      "token_guard_suffix",
      "token_guard_exact",
      "always_abstain",
      "no_token",
      "no_segment",
      "no_global",
      "no_token_calibrated",
      "no_segment_calibrated",
      "no_global_calibrated",
    )
    config.eval.auroc = True
    config.study.seeds = (0, 1)
  if variant == "gpu":
    config.data.data_dir = ""
    config.data.benchmarks = ("halueval", "ragtruth", "financebench", "drop_history", "drop_nfl")
    config.data.num_test = 500  # first questions of each benchmark (DROP history has 438)
    config.data.prompt_len = 4096  # the code's max_length; longer passages are cut
    config.model.checkpoint = ""
    config.model.tokenizer = ""
    config.model.vocab_size = 128_256  # Meta-Llama-3-8B-Instruct
    config.model.width = 4096
    config.model.depth = 32
    config.model.num_heads = 32
    config.model.num_kv_heads = 8
    config.model.mlp_hidden = 14_336
    config.model.tie_embeddings = False
    config.model.rope_base = 500_000.0
    config.model.norm_eps = 1e-5
    config.model.dtype = "bfloat16"
    config.guard.beams = 4
    config.guard.rollouts = 10
    config.guard.max_steps = 8
    config.guard.min_steps = 4
    config.guard.segment_length = 128  # one reasoning line
    config.eval.chain_width = 768
    config.eval.chunk = 2  # questions per call: 2 x 40 rollouts of up to 4.9k tokens
    config.eval.decoders = (
      "greedy",
      "sampling",
      "self_consistency",
      "rollout_prune",
      "token_guard",
      "token_guard_code",
      "no_token",
      "no_segment",
      "no_global",
      "no_prompt",
    )
  return config
