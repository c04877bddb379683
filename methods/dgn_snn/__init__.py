"""DGN: "A Brain-Inspired Gating Mechanism Unlocks Robust Computation in Spiking Neural Networks"
(Bai, Wang, Yu; ICLR 2026, arXiv 2509.03281), the Dynamic Gated Neuron.

Claim: giving every synapse a second, conductance pathway (`C_i`, Eq. 4) turns the leak into an
input-dependent forget gate `rho^t = phi(1 - g_l dt - dt sum_i C_i D_i^t)` (Eq. 6); such networks match
LIF on clean spike data and lose far less accuracy under unseen spike noise and attacks (the
robustness tables), which the stationary-variance analysis explains (Eq. 13-14).

Map to the paper:
  `core/nn/spiking.py`        neurons (Eq. 3-8: continuous model, discrete update, LIF / DGN / s-DGN),
                              surrogate-gradient spike, feed-forward and recurrent layers, leaky readout.
  `core/spiking_stability.py` Eq. 13-14, the exact variances of the SDE and of the neuron's update,
                              and the network's neuron driven by the noisy inputs of Eq. 13-14.
  `core/attacks.py`           FGSM, BIM and PGD (L-inf, inputs relaxed to [0, 1]).
  `core/data/spikes.py`       temporal-order spike digits, MNIST-1D-style population-coded spikes, the
                              test-time perturbations, SHD / TIDIGITS event readers.
  `phases.py`                 phases: `train` (the configured neuron), `train_lif` (LIF baseline, results
                              `*_lif`), `stability` (variance check); seeds as a vmapped axis.
  `study.py`                  the study: LIF, DGN, s-DGN, parameter-matched LIF; accuracy against
                              perturbation strength; spike counts; the variance check; the figure.

Results (`results.json`): `clean_accuracy`, `robust_accuracy` (mean accuracy over the random spike
perturbations, insertion, deletion and mixed: the paper's "overall robustness"), `jitter_accuracy`
(apart), `accuracy_<family>` curves `[seed, strength]`, `fgsm_accuracy`, `bim_accuracy`,
`pgd_accuracy` and their mean `adversarial_accuracy` (`core/attacks.py`), `spikes_per_inference`
and `synaptic_ops_per_inference` (the energy proxy), the same with `_lif` for the baseline, and
`variance_*` of the Eq. 13-14 check.

Choices where the paper is open are listed in `core/nn/spiking.py`; here: cross-entropy on the
time-averaged readout potential, Adam with warmup-cosine decay and global-norm clipping, and a LIF
baseline of the same width trained on the same batches.
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

from core import attacks
from core.data import spikes as spike_data
from core.nn import spiking
from methods.base import Method, require, require_choice, require_positive_int
from methods.dgn_snn import phases as phases_lib
from methods.dgn_snn import study as study_lib


def _require_probabilities(config, field: str, values) -> None:
  flat = [v for item in values for v in (item if isinstance(item, tuple | list) else (item,))]
  require(
    all(0.0 <= v <= 1.0 for v in flat), field, f"probabilities must lie in [0, 1], got {values}"
  )


def _validate_data(config: ml_collections.ConfigDict) -> None:
  data = config.data
  require_choice(config, "data.name", phases_lib.DATASETS)
  for field in ("data.num_steps", "data.channels", "data.num_classes"):
    require_positive_int(config, field)
  if data.name in phases_lib.SYNTHETIC:
    for field in ("data.train_per_class", "data.test_per_class"):
      require_positive_int(config, field)
    require(
      config.batch_size <= data.train_per_class * data.num_classes,
      "batch_size",
      f"{config.batch_size} exceeds the {data.train_per_class * data.num_classes} training examples",
    )
  if data.name == "temporal_digits":
    require(data.num_classes % 2 == 0, "data.num_classes", "must be even (time-reversed pairs)")
  if data.name == "mnist1d":
    require(data.num_classes == 10, "data.num_classes", "MNIST-1D has 10 classes")
  if data.name in phases_lib.EVENT_DATA:
    files = [spike_data.event_file(data.data_dir, data.name, s) for s in ("train", "test")]
    require(
      bool(data.data_dir) and all(os.path.exists(f) for f in files),
      "data.data_dir",
      f"{data.name} needs {' and '.join(os.path.basename(f) for f in files)} in this folder, "
      f"got {data.data_dir!r}",
    )
    require(
      importlib.util.find_spec("h5py") is not None, "data.name", f"{data.name} files need h5py"
    )
    require(data.max_time > 0, "data.max_time", "must be positive")


def _validate_model(config: ml_collections.ConfigDict) -> None:
  m = config.model
  require_choice(config, "model.kind", spiking.KINDS)
  require_choice(config, "model.phi", spiking.PHIS)
  require_choice(config, "model.surrogate", spiking.SURROGATES)
  require_choice(config, "model.scan_implementation", spiking.SCAN_IMPLEMENTATIONS)
  sizes = tuple(m.hidden_sizes)
  require(
    len(sizes) > 0 and all(isinstance(n, int) and n > 0 for n in sizes),
    "model.hidden_sizes",
    f"must be positive ints, got {sizes}",
  )
  for field in (
    "dt",
    "tau_s",
    "threshold",
    "surrogate_width",
    "w_scale",
    "readout_scale",
    "reversal_init",
  ):
    require(m[field] > 0, f"model.{field}", f"must be positive, got {m[field]}")
  require(m.c_scale >= 0, "model.c_scale", f"must be >= 0, got {m.c_scale}")
  require(0 < m.g_l * m.dt < 1, "model.g_l", f"g_l * dt must lie in (0, 1), got {m.g_l * m.dt}")


def _validate_eval(config: ml_collections.ConfigDict) -> None:
  e = config.eval
  for field in ("additive_probs", "subtractive_probs", "mixed_probs"):
    _require_probabilities(config, f"eval.{field}", tuple(e[field]))
  require(
    all(len(pair) == 2 for pair in e.mixed_probs),
    "eval.mixed_probs",
    f"must be (p_add, p_delete) pairs, got {tuple(e.mixed_probs)}",
  )
  require(all(s >= 0 for s in e.jitter_sigmas), "eval.jitter_sigmas", "must be >= 0")
  require(all(v > 0 for v in e.attack_epsilons), "eval.attack_epsilons", "must be positive")
  unknown = sorted(set(e.attacks) - set(attacks.ATTACKS))
  require(not unknown, "eval.attacks", f"unknown {unknown}; choose from {attacks.ATTACKS}")
  conditions = sum(len(e[f]) for f in ("additive_probs", "subtractive_probs", "mixed_probs"))
  require(conditions > 0, "eval.additive_probs", "no random perturbation left for robust_accuracy")
  for field in (
    "eval.chunk",
    "eval.num_train_examples",
    "eval.attack_steps",
    "eval.attack_examples",
  ):
    require_positive_int(config, field)


def _validate_stability(config: ml_collections.ConfigDict) -> None:
  s = config.stability
  n = len(s.weights)
  for field in ("conductances", "means", "stds"):
    require(len(s[field]) == n, f"stability.{field}", f"needs {n} values (one per weight)")
  require(s.g_l > 0, "stability.g_l", "must be positive")
  require(
    len(s.dts) > 0 and all(0 < dt < 1 / s.g_l for dt in s.dts),
    "stability.dts",
    f"need steps in (0, 1 / g_l) so that the leak 1 - g_l dt is a decay, got {tuple(s.dts)}",
  )
  for field in ("stability.num_steps", "stability.num_chains"):
    require_positive_int(config, field)
  require(0 <= s.burn_in < s.num_steps, "stability.burn_in", "must lie in [0, stability.num_steps)")


def validate(config: ml_collections.ConfigDict) -> None:
  require_positive_int(config, "num_seeds")
  _validate_model(config)
  _validate_eval(config)
  _validate_stability(config)
  _validate_data(config)


METHOD = Method(
  name="dgn_snn",
  phases=phases_lib.phases,
  validate=validate,
  study_arms=study_lib.study_arms,
  report=study_lib.report,
)
