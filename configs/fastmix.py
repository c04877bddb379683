r"""FastMix: "Fast Data Mixture Optimization via Gradient Descent" (ICLR 2026; official code
hrtan/fastmix).

Claim: searching the data mixture as a bilevel problem, with the mixture ratio recast as per-source
loss weights and updated by a one-step hypergradient alongside a single proxy model, finds a
mixture as good as regression-based searches (RegMix, CLIMB) at a small fraction of their cost
(paper: x550 cheaper than RegMix, x55 than CLIMB at 1B scale).

Variants:
  default  CPU, a few minutes on 2 cores: six Markov sources over 32 symbols (three relevant, noise,
           adversarial, irrelevant), target `w* = (0.5, 0.3, 0.2, 0, 0, 0)` (the provably best
           mixture); the proxy is the shared transformer at depth 0 (a context-1 model, width 32).
           FastMix searches for 3000 proxy steps (150 outer steps of n1 = 20); RegMix's 16 proxies
           run beside it for `cost_ratio_vs_regmix`; fresh models are retrained on the found
           mixture and on w*. results.json: mixture_l1_error, target_loss, oracle_loss,
           cost_ratio_vs_regmix.
  study    experiments/study.py: FastMix (full and LM-head-only hypergradients, beta = 0.1; 3
           replicates each), uniform, RegMix (64 proxies), CLIMB (3 x 16), DoReMi, the brute-force
           lattice sweep (66 proxies) on the Markov task, and FastMix on the digits post-training
           analogue; about 15 minutes on 2 idle cores.
  gpu      paper scale, one GPU: the 17 Pile domains tokenised with the GPT-NeoX tokenizer (vocab
           50432), read from --config.data.data_dir as `train/<domain>.npy` and
           `validation/pile_cc.npy`; the official proxy (LlamaForCausalLM: hidden 256, intermediate
           512, 2 layers, 8 heads, context 2048) as the shared transformer, trained from scratch
           (`model.checkpoint` empty; the SFT search would load its 1.5B proxy there), 1000 steps.

  python experiments/train.py --config=configs/fastmix.py --workdir=runs/fastmix
  python experiments/study.py --config=configs/fastmix.py:study --workdir=runs/fastmix_study
  python experiments/train.py --config=configs/fastmix.py:gpu --config.data.data_dir=/data/pile_tokens
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "gpu")

PILE_DOMAINS = (
  "arxiv",
  "freelaw",
  "nih_exporter",
  "pubmed_central",
  "wikipedia_en",
  "dm_mathematics",
  "github",
  "philpapers",
  "stackexchange",
  "enron_emails",
  "gutenberg_pg_19",
  "pile_cc",
  "ubuntu_irc",
  "europarl",
  "hackernews",
  "pubmed_abstracts",
  "uspto_backgrounds",
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "fastmix"
  config.variant = variant
  config.seed = 0
  config.mixer = "fastmix"  # fastmix | regmix | climb | doremi | sweep | uniform | oracle
  config.compare_regmix = True  # fastmix: also train RegMix's proxies, for cost_ratio_vs_regmix

  config.data = ml_collections.ConfigDict()
  config.data.name = "markov"  # markov (generated) | digits (scikit-learn) | pile (token files)
  config.data.rows_per_source = 16  # examples of every source per training step (uniform sampling)
  config.data.seq_len = 32  # markov, pile: tokens predicted per sequence
  config.data.vocab_size = 32  # markov: chain symbols (+5 special tokens); pile: the tokenizer's
  config.data.relevant_entropy = (0.3, 0.4, 0.5)  # markov: relevant chains' entropy / log V
  config.data.irrelevant_entropy = 0.5  # markov: the irrelevant chain's entropy / log V
  config.data.target_weights = (0.5, 0.3, 0.2, 0.0, 0.0, 0.0)  # markov: w*, the known optimum
  config.data.source_seed = 0  # markov: the chains; digits: the pool split
  config.data.data_dir = ""  # pile: folder with train/<domain>.npy and validation/<target>.npy
  config.data.domains = ()  # pile: the training domains
  config.data.target_domain = ""  # pile: the validation domain the search targets

  config.model = ml_collections.ConfigDict()
  config.model.width = 32
  config.model.depth = 0  # 0 = context-1 (bigram) proxy: embed -> RMSNorm -> head
  config.model.num_heads = 2
  config.model.mlp_hidden = 0  # 0 = 8D/3 (SwiGLU)
  config.model.dtype = "float32"
  config.model.checkpoint = ""  # initial proxy weights (.npz of the parameter tree); "" = scratch

  config.steps = 3000  # proxy steps of one training run: FastMix's search, each proxy, retraining
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 1e-2
  config.optim.schedule = "cosine"  # warmup, then "cosine" (to final_fraction) or "constant"
  config.optim.warmup_steps = 100
  config.optim.final_fraction = 0.1
  config.optim.weight_decay = 0.0
  config.optim.b2 = 0.95
  config.optim.grad_clip = 1.0

  config.fastmix = ml_collections.ConfigDict()
  config.fastmix.inner_steps = 20  # n1: proxy steps per outer (mixture) step
  config.fastmix.hypergradient = "full"  # "full" (all parameters) | "head" (LM head, official code)
  config.fastmix.beta = 0.0  # weight of the training loss in the search target (paper: 0.1-0.3)
  config.fastmix.entropy_weight = 1e-5  # lambda of sum alpha log alpha
  config.fastmix.entropy_sign = "paper"  # "paper" (penalise sum alpha log alpha) | "code" (flipped)
  config.fastmix.outer_optimizer = "adam"  # "adam" | "adamw" (weight decay 0)
  config.fastmix.outer_lr = 0.05
  config.fastmix.outer_b1 = 0.9
  config.fastmix.outer_b2 = 0.95
  config.fastmix.init = "uniform"  # "uniform" (z = 1) | "random" (z = init_scale N(0, 1))
  config.fastmix.init_scale = 1e-7
  config.fastmix.num_seeds = 1  # independent searches, one vmapped axis

  config.regmix = ml_collections.ConfigDict()
  config.regmix.num_proxies = 16
  config.regmix.proxy_counts = (4, 8, 16)  # the quality-cost curve: fits on the first n
  config.regmix.num_candidates = 100_000  # simulated mixtures ranked by the regressor
  config.regmix.top_k = 100  # the answer averages the top_k best-predicted
  # mixture -> loss: "smoother" (Nadaraya-Watson: bounded, no extrapolation, like RegMix's trees),
  # "kernel" (RBF kernel ridge) or "quadratic" (extrapolates); the others' curves are reported too
  config.regmix.regressor = "smoother"
  config.regmix.temperature = 0.5  # prior^T
  config.regmix.min_strength = 0.1
  config.regmix.max_strength = 5.0
  config.regmix.num_strengths = 15
  config.regmix.minimum = 2e-4  # weights below are zeroed; grid of the rounding
  config.regmix.max_usage = 15.0  # weights above max_usage * prior are rejected
  config.regmix.quality_slack = 0.0  # "similar quality": L1 error <= FastMix's + slack

  config.climb = ml_collections.ConfigDict()
  config.climb.proxies_per_round = (16, 16, 16)
  config.climb.num_candidates = 20_000
  config.climb.concentration = 20.0  # Dirichlet concentration around the best proxy, round 1
  config.climb.concentration_growth = 3.0  # per round (the search region narrows)
  config.climb.floor = 0.0  # weight added to every source of the centre (CLIMB draws: none)
  config.climb.top_k = 10

  config.doremi = ml_collections.ConfigDict()
  config.doremi.step_size = 1.0
  config.doremi.smoothing = 1e-3

  config.sweep = ml_collections.ConfigDict()
  config.sweep.active_sources = (0, 1, 2)  # () = all sources
  config.sweep.resolution = 10  # lattice step 1/resolution (66 points on 3 sources)

  config.retrain = ml_collections.ConfigDict()
  config.retrain.num_seeds = 2  # fresh models per mixture (paired across mixtures)
  config.retrain.steps = 0  # 0 = config.steps

  config.eval = ml_collections.ConfigDict()
  config.eval.num_examples = 2048  # markov, pile: held-out target set (and the validation set)
  config.eval.batch_size = 512
  config.eval.timing_repeats = 5  # compiled steps timed for the wall-clock

  # Stacked models (proxies, replicates, retrained models) run vmapped in groups of this many, the
  # groups in a compiled loop; 0 = all at once. XLA:CPU runs batched matmuls slower than a loop.
  config.stack_chunk = 1
  config.loop = common.loop_config(log_every=50, checkpoint_every=1000)
  common.add_parallelism(config)

  config.study = ml_collections.ConfigDict()
  config.study.fastmix_seeds = 3
  config.study.regmix_proxies = 64
  config.study.regmix_proxy_counts = (4, 8, 16, 32, 64)
  config.study.digits = True  # include the post-training analogue
  config.study.digits_depth = 1  # digits: a one-block transformer over the 8 image rows
  config.study.digits_rows_per_source = 16
  config.study.digits_steps = 1000  # small pools: longer runs memorise the noisy labels
  config.study.digits_learning_rate = 3e-3
  config.study.digits_weight_decay = 0.1

  if variant == "study":
    config.compare_regmix = False
  if variant == "gpu":
    config.data.name = "pile"
    config.data.domains = PILE_DOMAINS
    config.data.target_domain = "pile_cc"
    config.data.vocab_size = 50432
    config.data.seq_len = 2048
    config.data.rows_per_source = 2
    config.model.width = 256
    config.model.depth = 2
    config.model.num_heads = 8
    config.model.mlp_hidden = 512
    config.model.dtype = "bfloat16"
    config.steps = 1000
    config.optim.learning_rate = 4e-4
    config.optim.schedule = "constant"
    config.optim.weight_decay = 0.1
    config.regmix.num_proxies = 8
    config.regmix.proxy_counts = (8,)
    config.retrain.num_seeds = 1
    config.eval.num_examples = 256
    config.eval.batch_size = 16
    config.stack_chunk = 1  # one proxy's logits (34 x 2048 x 50432) at a time
    config.loop = common.loop_config(log_every=20, checkpoint_every=200)
  return config
