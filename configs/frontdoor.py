r"""Front-door HTE: "Debiased Front-Door Learners for Heterogeneous Effects" (ICLR 2026).

Claim: FD-DR and FD-R estimate tau(C) with lower RMSE than the plug-in, the gap widening as nuisances
converge slowly; FD-R is the most stable under weak overlap.

Variants:
  default   the spec's main DGP (d = 10) at n = 4000, 3 replications, linear final stage (the
            author's parity setting); about a minute on 2 CPU cores.
  rff       the same with the random-Fourier-feature final stage.
  weak      the weak-overlap DGP at kappa = 6.

  python experiments/train.py --config=configs/frontdoor.py
"""

import ml_collections

from configs import common

VARIANTS = ("default", "rff", "weak")


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
  config.final_stage = "rff" if variant == "rff" else "linear"
  config.floor = 0.05  # denominators floored to [floor, 1 - floor]
  config.loop = common.loop_config()
  common.add_parallelism(config)
  return config
