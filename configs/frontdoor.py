r"""Front-door HTE: "Debiased Front-Door Learners for Heterogeneous Effects" (ICLR 2026, arXiv 2509.22531;
method page docs/methods/frontdoor.md).

Claim: FD-DR and FD-R estimate tau(C) with lower RMSE than the plug-in, the gap widening as nuisances
converge slowly; FD-R is the most stable under weak overlap.

Variants:
  default   the main DGP of the author's FDCATE.py (d = 10) at n = 4000, 3 replications, linear final
            stage (the author's parity setting); about a minute on 2 CPU cores.
  rff       the same with the random-Fourier-feature final stage.
  weak      the weak-overlap DGP at kappa = 6.
  study     the paper's simulations at CPU scale, RFF final stage, 10 replications per point: n in
            {1k, 2k, 4k, 8k} at delta = 0 and at delta = 1 (nuisances at the n^-1/4 rate), delta in
            {0, .25, .5, 1, 2, 5}, weak-overlap kappa in {2, 6, 10} (at delta = 0 and 1) and front-door
            violation alpha_u in {0, .5, 1} at n = 4000, plus the optional econml / doubleml /
            fd-cate arm when installed (pip install -e ".[frontdoor]"); about 8 minutes on 2 CPU
            cores. --config.nuisance_learner=mlp swaps the logistic/RFF nuisances for small MLPs.
  gpu       the paper's grid: n up to 50k, delta in {0, .15, ..., 1, 2, 5, 10} at n = 5000,
            kappa in {2, 4, 6, 8, 10}; one vmap over replications per point. Not run here.

  python experiments/train.py --config=configs/frontdoor.py
  python experiments/study.py --config=configs/frontdoor.py:study --workdir=runs/frontdoor_study
"""

import ml_collections

from configs import common

VARIANTS = ("default", "rff", "weak", "study", "gpu")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "frontdoor"
  config.variant = variant
  config.seed = 0
  config.data = ml_collections.ConfigDict()
  config.data.dgp = "weak_overlap" if variant == "weak" else "main"  # "main" | "weak_overlap"
  config.data.n = 4000
  config.data.dim = 10
  config.data.alpha_u = 0.0  # mediator confounding (> 0 breaks the front-door criterion)
  config.data.kappa = 6.0  # weak-overlap strength (kappa_e = kappa_q)
  config.replications = 3
  config.final_stage = "rff" if variant in ("rff", "study", "gpu") else "linear"
  config.nuisance_learner = "parametric"  # "parametric" (logistic + RFF ridge) | "mlp"
  config.floor = 0.05  # denominators floored to [floor, 1 - floor]
  config.delta = 0.0  # the author's numerator-nuisance perturbation delta * N(n^-1/4, n^-1/4)
  config.external = ()  # optional baselines: "econml", "doubleml", "fdcate" (pip extra "frontdoor")
  config.study = ml_collections.ConfigDict()
  config.study.n = 4000  # n of the delta, kappa and alpha_u sweeps
  config.study.sizes = (1000, 2000, 4000, 8000)
  config.study.slow_delta = 1.0  # the second n sweep: nuisances perturbed at the n^-1/4 rate
  # FDCATE.py's grid reaches 1; fd-cate 0.1.1's own simulation script sweeps delta in {0, 2, 5, 10}.
  config.study.deltas = (0.0, 0.25, 0.5, 1.0, 2.0, 5.0)
  config.study.kappas = (2.0, 6.0, 10.0)
  config.study.alpha_us = (0.0, 0.5, 1.0)
  config.study.external = ("econml", "doubleml", "fdcate")  # run where installed
  if variant in ("study", "gpu"):
    config.replications = 10
  if variant == "gpu":
    config.study.n = 5000
    config.study.sizes = (1000, 2500, 5000, 10_000, 20_000, 50_000)
    config.study.deltas = (0.0, 0.15, 0.3, 0.45, 0.6, 0.85, 1.0, 2.0, 5.0, 10.0)
    config.study.kappas = (2.0, 4.0, 6.0, 8.0, 10.0)
  config.loop = common.loop_config()
  common.add_parallelism(config)
  return config
