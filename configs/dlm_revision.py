r"""DLM revision: "Diffusion Language Models are Provably Optimal Parallel Samplers" (Jiang, Haghtalab,
Chen; ICLR 2026).

Claim: a diffusion LM with remasking or revision samples the uniform even-parity distribution exactly
in O(1) rounds, which no monotone DLM with a local (AC0) predictor can (Thms 4.1, 4.2 vs 4.5); with
CoT plus remasking/revision its memory footprint scales with the circuit's width, not its size
(Thm 3.2). On a learned masked-diffusion LM the same mechanism should show as validity: revision
repairs the parity checks that parallel decoding breaks, reaching >= 0.95 validity at several times
fewer forward passes (NFE) than vanilla ancestral decoding.

Experiments (`config.experiments`): "separation" (E1, exact programs on D_n^xor), "space" (E2, XOR
trees; the predictor also learned from traces), "learned" (E3, an MDLM on the parity-code language
and six samplers, with the trained and with the exact denoiser).

Variants:
  default   all three experiments at CPU size: n <= 16 (E1), n <= 32 (E2, learned at n = 8), a
            code of 16 two-bit checks over 32 positions, an MDLM of width 64 / 2 blocks trained for
            1500 steps; a few minutes on 2 idle CPU cores.
  study     experiments/study.py: arms "programs" (E1 n in {8, 10, 12, 16, 32} with 10^5 draws, E2
            n in {8, 16, 32, 64}, learned at n in {8, 16}), "mdlm" (E3, plain MDLM loss),
            "self_correction" (E3, pi = 0.1) and "self_correction_4bit" (E3 at the paper's 4-bit
            checks, curriculum over 1500 of 3000 steps), two seeds each: about an hour on one
            core (67 minutes measured on a shared machine).
  gpu       paper scale on one GPU: E1/E2 up to n = 1024, the code of four-bit checks over 256
            positions, an 8-block width-512 denoiser for 50k steps, round budgets up to 1024. Every
            dataset is generated in code and the paper (pure theory) has no released weights, so
            nothing is read from disk and the variant validates and runs as it is.

  python experiments/train.py --config=configs/dlm_revision.py --workdir=runs/dlm_revision
  python experiments/study.py --config=configs/dlm_revision.py:study --workdir=runs/dlm_revision_study
  python experiments/train.py --config=configs/dlm_revision.py:gpu --workdir=runs/dlm_revision_gpu
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "gpu")
EXPERIMENTS = ("separation", "space", "learned")
SAMPLERS = (
  "ancestral",
  "topk",
  "remask_random",
  "remask_confidence",
  "revision",
  "revision_blocks",
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "dlm_revision"
  config.variant = variant
  config.seed = 0
  config.experiments = EXPERIMENTS  # which of E1 ("separation"), E2 ("space"), E3 ("learned") run

  config.separation = ml_collections.ConfigDict()
  config.separation.lengths = (8, 12, 16)  # n of D_n^xor (even)
  config.separation.num_samples = 20_000  # draws per program and n
  config.separation.tv_max_length = 12  # TV to D_n^xor by enumerating all 2^n strings for n <= this
  config.separation.window = 3  # positions the naive monotone predictor sees (centred, cyclic)
  config.separation.naive_rounds = (2, 8, 32)  # round budgets T of the naive monotone sampler

  config.space = ml_collections.ConfigDict()
  config.space.lengths = (8, 16, 32)  # n inputs of the XOR tree (powers of 2)
  config.space.num_samples = 4096  # runs per program and n
  config.space.learn_lengths = (8,)  # n at which the predictor is also learned from traces
  config.space.train_steps = 1200  # steps of the trace-learning phase (0 = exact programs only)
  config.space.batch_size = 128  # trace transitions per step and program
  config.space.width = 32  # transition model: width, blocks, heads
  config.space.depth = 2
  config.space.num_heads = 2
  config.space.learning_rate = 3e-3

  config.data = ml_collections.ConfigDict()
  config.data.length = 32  # L of the parity-code language
  # Positions per even-parity check. 2 (a check = two equal bits) is learned in a few hundred
  # steps; checks of 3 or 4 bits need the XOR of 2 or 3 others, a sparse parity that SGD did not
  # find in 3000 CPU steps from uniform codewords (NELBO flat at 1 bit/token); with the curriculum
  # below (tied_fraction 1 over 1500 of 3000 steps) 4 bits reach 0.76 bits/token (results doc).
  config.data.group_size = 2
  config.data.code_seed = 0  # the fixed random permutation that forms the groups
  # curriculum (methods/dlm_revision/learned.py `tied_codewords`): the share of training codewords
  # whose checks are tied (positions of a check pairwise correlated), decaying linearly from
  # tied_fraction to 0 over curriculum_steps (0: off, uniform codewords throughout)
  config.data.tied_fraction = 0.0
  config.data.curriculum_steps = 0

  config.model = ml_collections.ConfigDict()
  config.model.width = 64
  config.model.depth = 2
  config.model.num_heads = 4
  config.model.mlp = "swiglu"
  config.model.correction_rate = 0.1  # pi: fraction pi * t of unmasked tokens replaced at random
  config.model.correction_weight = 1.0  # weight of the loss on unmasked positions (when pi > 0)
  config.model.t_min = 1e-3  # smallest diffusion time of the loss

  config.num_seeds = 1  # independent models (data, init, sampling), one vmapped axis
  config.batch_size = 128
  config.steps = 1500
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 3e-3
  config.optim.warmup_steps = 100
  config.optim.weight_decay = 0.0
  config.optim.grad_clip = 1.0

  config.sampling = ml_collections.ConfigDict()
  config.sampling.samplers = SAMPLERS  # revision_blocks: revision capped per check group
  config.sampling.rounds = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # base round budgets T swept
  config.sampling.max_corrective_rounds = 32  # corrective samplers skip larger T (NaN there)
  config.sampling.extra_rounds = 8  # most corrective rounds after the T base rounds
  config.sampling.threshold = 0.9  # confidence below which a revealed token is suspect
  config.sampling.cap = 1  # most corrections per block and round (one block = whole sequence)
  config.sampling.eta = 0.05  # ReMDM sigma_max for remask_random
  config.sampling.num_samples = 500  # samples per (sampler, T) and seed
  config.sampling.target_validity = 0.95  # NFE ratio read at this validity
  config.sampling.reference_rounds = 8  # T of the headline validity_vanilla / validity_revision
  config.sampling.oracle = True  # also run every sampler with the exact Bayes denoiser

  config.loop = common.loop_config(log_every=100, checkpoint_every=500)
  common.add_parallelism(config)

  config.study = ml_collections.ConfigDict()
  config.study.correction_rates = (0.0, 0.1)  # pi of the E3 arms ("mdlm", "self_correction")
  # the E3 arm of the paper's wider checks, "self_correction_<g>bit" (group_size 0: no such arm):
  # g-bit checks at the largest pi, learnable on CPU with the tied curriculum (results doc)
  config.study.wide_checks = ml_collections.ConfigDict()
  config.study.wide_checks.group_size = 4
  config.study.wide_checks.tied_fraction = 1.0
  config.study.wide_checks.curriculum_steps = 1500
  config.study.wide_checks.steps = 3000

  if variant == "study":
    config.separation.lengths = (8, 10, 12, 16, 32)
    config.separation.num_samples = 100_000
    config.space.lengths = (8, 16, 32, 64)
    config.space.learn_lengths = (8, 16)
    config.space.train_steps = 2000
    config.steps = 2000
    config.num_seeds = 2
    config.sampling.num_samples = 500

  if variant == "gpu":
    config.separation.lengths = (8, 12, 16, 32, 64, 128, 256, 512, 1024)
    config.separation.num_samples = 200_000  # n = 1024: ~40 GB of transition tensors at once
    config.separation.tv_max_length = 16
    config.separation.naive_rounds = (2, 8, 32, 128, 1024)
    config.space.lengths = (8, 16, 32, 64, 128, 256, 512, 1024)
    config.space.num_samples = 100_000
    config.space.learn_lengths = (8, 16, 32, 64, 128)
    config.space.train_steps = 5000
    config.space.batch_size = 256
    config.space.width, config.space.depth, config.space.num_heads = 128, 3, 4
    config.data.length = 256
    config.data.group_size = 4
    config.model.width, config.model.depth, config.model.num_heads = 512, 8, 8
    config.num_seeds = 3
    config.batch_size = 256
    config.steps = 50_000
    config.optim.learning_rate = 3e-4
    config.optim.warmup_steps = 2000
    config.sampling.rounds = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    config.sampling.max_corrective_rounds = 256
    config.sampling.extra_rounds = 64
    config.sampling.num_samples = (
      1000  # per seed: one pass is 1000 x 256 tokens of an 8-block model
    )
    config.loop = common.loop_config(log_every=500, checkpoint_every=5000)
  return config
