"""DLM revision: "Diffusion Language Models are Provably Optimal Parallel Samplers" (Haozhe Jiang,
Nika Haghtalab, Lijie Chen; ICLR 2026, arXiv 2512.25014).

Claim (theory): a diffusion LM (DLM) with chain-of-thought simulates any depth-d circuit in d rounds
(Thm 3.1); with remasking or revision it also needs only O(width) memory (Thm 3.2); and with
remasking or revision it samples the uniform even-parity distribution D_n^xor exactly in O(1) rounds
with local predictors (Thms 4.1, 4.2), which no monotone DLM with an AC0 predictor can do in O(1)
rounds (Thm 4.5). The paper has no experiments; the three below test the theorems, and the last one
asks whether the mechanism carries over to a learned masked-diffusion LM.

Experiments (`config.experiments`), each a phase of the shared loop (`phases.py`; E1 and E2 in
`theory.py`, E3 in `learned.py`):
  separation  E1, num_steps = 0: the exact programs of `core/dlm_programs.py` (revision, 2 rounds;
              remasking, 6 rounds; the monotone chain, n/2 + 1 rounds; the naive monotone sampler
              with a window predictor, and with the global exact conditional, for each T) sampled
              `separation.num_samples` times at each n: parity-violation rate, TV distance to D_n^xor
              by enumeration (n <= `separation.tv_max_length`, with the TV of as many exact draws as
              noise floor), rounds, footprint, remask and revision counts.
  space       E2: XOR trees over n inputs as monotone CoT (one position per gate) and in place with
              revision or remasking (a scratch of n/2 positions): peak footprint, rounds, validity.
              The phase also trains, for each n of `space.learn_lengths`, a tiny bidirectional
              transformer per program on the program's trace transitions (teacher forcing, the
              active positions given by the circuit topology) and runs the learned programs.
  train       E3: a masked-diffusion LM (`core/masked_diffusion.py`, MDLM loss; self-correction
              corruption when `model.correction_rate > 0`) on the parity-code language
              (`core/data/parity.py`: L = 32 positions split at random into even-parity checks of
              `data.group_size` bits), `num_seeds` seeds as one vmapped axis. Evaluation:
              validation NELBO vs the exact entropy rate, and the model's confidence in the tokens
              of a corrupted check.
  sampling    E3, num_steps = 0: every sampler of `sampling.samplers` (ancestral, top-k confidence,
              ReMDM remasking, confidence remasking, revision, revision capped per check group) for
              every T of `sampling.rounds`, on the trained denoisers and on the exact Bayes
              denoiser: validity, NFE, fidelity (TV of each check's pattern law), diversity. The
              headline: `validity_vanilla` (ancestral, T = `sampling.reference_rounds`),
              `validity_revision` (revision at the same T, `nfe_revision` forward passes) and
              `nfe_ratio_at_equal_validity` = NFE ancestral needs for `sampling.target_validity` /
              NFE revision needs (a lower bound, flagged, when ancestral never gets there).

`study.py`: the study's arms ("programs", "mdlm", "self_correction", "self_correction_4bit"),
tables, summary and figure.

Checks of 2 bits by default: a check of g bits asks the denoiser for the XOR of g - 1 others, a
sparse parity that SGD finds slowly; with g = 4 (the setting we designed first) the CPU model stayed
at the uniform marginal (NELBO 1 bit/token) for 3000 steps, so only the gpu variant uses g = 4.

Choices where the paper is open: the programs are time-conditioned (they see the round index, as a
DLM sees t); the remasking and chain constructions are ours (module docstring of
`core/dlm_programs.py`); for the learned model, see `core/masked_diffusion.py` (suspect threshold,
per-block caps, revision draws excluding the current token).
"""

from __future__ import annotations

import ml_collections

from methods.base import Method, require, require_choice, require_positive_int
from methods.dlm_revision import study
from methods.dlm_revision.learned import SAMPLER_SPECS
from methods.dlm_revision.phases import phases

EXPERIMENTS = ("separation", "space", "learned")
POSITIVE_FIELDS = (
  "num_seeds",
  "separation.num_samples",
  "separation.tv_max_length",
  "separation.window",
  "space.num_samples",
  "space.batch_size",
  "space.width",
  "space.depth",
  "space.num_heads",
  "data.length",
  "data.group_size",
  "model.width",
  "model.depth",
  "model.num_heads",
  "sampling.extra_rounds",
  "sampling.cap",
  "sampling.num_samples",
  "sampling.max_corrective_rounds",
)


def validate(config: ml_collections.ConfigDict) -> None:
  experiments = tuple(config.experiments)
  require(
    bool(experiments) and set(experiments) <= set(EXPERIMENTS),
    "experiments",
    f"must be a non-empty subset of {EXPERIMENTS}, got {experiments}",
  )
  for field in POSITIVE_FIELDS:
    require_positive_int(config, field)
  _validate_separation(config.separation)
  _validate_space(config.space)
  _validate_learned(config)


def _validate_separation(sep) -> None:
  lengths = tuple(sep.lengths)
  require(
    bool(lengths) and all(isinstance(n, int) and n >= 2 and n % 2 == 0 for n in lengths),
    "separation.lengths",
    f"must be even ints >= 2 (the remasking and chain programs pair positions), got {lengths}",
  )
  require(
    sep.tv_max_length <= 20,
    "separation.tv_max_length",
    f"TV enumerates 2^n strings; at most 20, got {sep.tv_max_length}",
  )
  rounds = tuple(sep.naive_rounds)
  require(
    bool(rounds) and all(isinstance(t, int) and t > 0 for t in rounds),
    "separation.naive_rounds",
    f"must be positive ints, got {rounds}",
  )


def _is_power_of_two(n) -> bool:
  return isinstance(n, int) and n >= 2 and n & (n - 1) == 0


def _validate_space(space) -> None:
  lengths = tuple(space.lengths)
  require(
    bool(lengths) and all(_is_power_of_two(n) for n in lengths),
    "space.lengths",
    f"XOR trees need powers of 2 >= 2, got {lengths}",
  )
  learn = tuple(space.learn_lengths)
  require(
    set(learn) <= set(lengths),
    "space.learn_lengths",
    f"{learn} must be a subset of space.lengths {lengths}",
  )
  require(
    isinstance(space.train_steps, int) and space.train_steps >= 0,
    "space.train_steps",
    f"must be an int >= 0, got {space.train_steps!r}",
  )
  require(
    space.width % space.num_heads == 0 and (space.width // space.num_heads) % 2 == 0,
    "space.num_heads",
    f"must divide width {space.width} into even head dims (RoPE)",
  )
  require(space.learning_rate > 0, "space.learning_rate", "must be positive")


def _validate_learned(config) -> None:
  m, s, data = config.model, config.sampling, config.data
  require(
    data.length % data.group_size == 0 and data.group_size >= 2,
    "data.group_size",
    f"{data.group_size} must be >= 2 and divide data.length {data.length}",
  )
  require(
    m.width % m.num_heads == 0 and (m.width // m.num_heads) % 2 == 0,
    "model.num_heads",
    f"must divide width {m.width} into even head dims (RoPE)",
  )
  require_choice(config, "model.mlp", ("swiglu", "gelu"))
  require(0.0 <= data.tied_fraction <= 1.0, "data.tied_fraction", "must be in [0, 1]")
  require(
    isinstance(data.curriculum_steps, int) and 0 <= data.curriculum_steps <= config.steps,
    "data.curriculum_steps",
    f"must be an int in [0, steps = {config.steps}], got {data.curriculum_steps!r}",
  )
  require(0.0 <= m.correction_rate <= 1.0, "model.correction_rate", "must be in [0, 1]")
  require(m.correction_weight >= 0.0, "model.correction_weight", "must be >= 0")
  require(0.0 < m.t_min < 1.0, "model.t_min", f"must be in (0, 1), got {m.t_min}")
  unknown = sorted(set(s.samplers) - set(SAMPLER_SPECS))
  require(
    bool(tuple(s.samplers)) and not unknown,
    "sampling.samplers",
    f"unknown {unknown}; choose from {tuple(SAMPLER_SPECS)}",
  )
  rounds = tuple(s.rounds)
  require(
    bool(rounds)
    and all(isinstance(t, int) and t > 0 for t in rounds)
    and list(rounds) == sorted(rounds),
    "sampling.rounds",
    f"must be increasing positive ints, got {rounds}",
  )
  require(
    s.reference_rounds in rounds,
    "sampling.reference_rounds",
    f"{s.reference_rounds} must be one of sampling.rounds {rounds}",
  )
  require(
    s.max_corrective_rounds >= s.reference_rounds,
    "sampling.max_corrective_rounds",
    f"must be >= sampling.reference_rounds {s.reference_rounds}, got {s.max_corrective_rounds}",
  )
  require(0.0 < s.threshold <= 1.0, "sampling.threshold", f"must be in (0, 1], got {s.threshold}")
  require(0.0 <= s.eta <= 1.0, "sampling.eta", f"must be in [0, 1], got {s.eta}")
  require(0.0 < s.target_validity <= 1.0, "sampling.target_validity", "must be in (0, 1]")


METHOD = Method(
  name="dlm_revision",
  phases=phases,
  validate=validate,
  study_arms=study.study_arms,
  report=study.report,
)
