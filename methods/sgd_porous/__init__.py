"""SGD as diffusion on porous media: "Almost Bayesian: Dynamics of SGD Through Singular Learning Theory"
(Hennick & De Baerdemacker, ICLR 2026).

Claim: the late-stage dynamics of vanilla SGD are a sub-diffusive walk on the porous low-loss set,
shaped by its singularities (local learning coefficients), and the local steady state of SGD is a
tempered Bayesian posterior restricted to the region SGD can reach (Sec. 3).

Map to the paper:
  `core/slt.py`      toys with known learning coefficients, exact grid posteriors, many-chain SGD/SGLD,
                     divergences and tempering fits, Mandt's temperature, the localised-SGLD LLC
                     estimator, displacement-exponent fits, D_xi, function clusters and free energies.
  `core/data/slt.py` the toy regressions, scikit-learn digits and moons, a tfds reader.
  `toys.py`          D1 (toys against exact posteriors) and the LLC check on the toys.
  `nets.py`          D2 (late-stage SGD of a digits MLP with LLC tracking) and D3 (moons ensemble).
  `study.py`         the study's arms, table and figure.

`config.experiments` selects the experiments a run makes (each a group of phases, in the order toys,
llc, digits, moons).
"""

from __future__ import annotations

import ml_collections

from methods.base import Method, require, require_choice, require_positive_int
from methods.sgd_porous import nets, study, toys

EXPERIMENTS = ("toys", "llc", "digits", "moons")


def phases(config: ml_collections.ConfigDict):
  experiments = tuple(config.experiments)
  return toys.phases(config, experiments) + nets.phases(config, experiments)


def validate(config: ml_collections.ConfigDict) -> None:
  experiments = tuple(config.experiments)
  unknown = sorted(set(experiments) - set(EXPERIMENTS))
  require(
    bool(experiments) and not unknown,
    "experiments",
    f"need a non-empty subset of {EXPERIMENTS}, got unknown {unknown}",
  )
  unknown_arms = sorted(set(config.study.arms) - set(study.ARM_SETS))
  require(not unknown_arms, "study.arms", f"unknown {unknown_arms}; choose from {study.ARM_SETS}")
  toys.validate(config, require, require_positive_int)
  nets.validate(config, require, require_positive_int, require_choice)


METHOD = Method(
  name="sgd_porous",
  phases=phases,
  validate=validate,
  study_arms=study.study_arms,
  report=study.report,
)
