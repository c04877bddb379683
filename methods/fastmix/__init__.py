"""FastMix: "Fast Data Mixture Optimization via Gradient Descent" (Tan et al., ICLR 2026; official
code hrtan/fastmix).

Claim: the data mixture of K sources can be searched as a bilevel problem with a single proxy
model: recast the mixture ratio as per-source loss weights under uniform per-source sampling
(Sec. 3.1), update the weights `alpha = softmax(z)` by the one-step hypergradient
`-eta <grad l_val(w^{t+1}), grad L_i(w^t)>` alternately with the proxy's training (Alg. 1, Eq. 5),
and the found mixture matches regression-based searches (RegMix, CLIMB) at a fraction of their cost.

Map to the paper:
  `core/mixture.py`          softmax weights, the reparametrised loss, the hypergradient (Eq. 5) and
                             its autodiff reference, the outer gradient with the entropy term (Eq. 6,
                             the code's sign as a flag), and the baselines' maths (RegMix's Dirichlet
                             sampler and regressor, CLIMB's shrinking region, DoReMi's update, the
                             brute-force lattice).
  `core/data/text.py`        the Markov domains with a provably best mixture `w*` (exact ideal losses).
  `core/data/mixture_sources.py`  the post-training analogue on digits.
  `tasks.py`                 data and proxy (the shared `Transformer`) per task.
  `search.py`                Alg. 1 as one jitted step per outer iteration (n1 inner steps + 1 outer).
  `baselines.py`             RegMix-lite, CLIMB-lite, DoReMi-lite and the sweep, proxies vmapped.
  `phases.py`                the phases of a run; retraining fresh models on the found mixture.
  `study.py`                 the study: every method side by side, the cost-quality figure.

Choices where the paper is open (each a config field): stratified batches (`rows_per_source` of
every source each step, so no source is ever absent from the per-source gradients, unlike the
official micro-batches); per-source gradients of the last inner step of each outer step reused as
that step's update; one fresh validation batch of the training batch's size per outer step; the
LM-head-only form dots the untied `unembed` head's gradients (`fastmix.hypergradient = "head"`);
the beta term `beta * L_train(w^{t+1})` (absent from the released code) is differentiated through
w only, on the last training batch; `eta_t` is the inner schedule's learning rate at the last inner
step (the code's `lr_w`), although the inner optimiser is AdamW; `z_0 = 1`, Adam(0.05) on z; the
final mixture is `softmax(z)` at the end (the trajectory's second-half average is reported too).
RegMix's LightGBM is replaced by a Nadaraya-Watson smoother (bounded, no extrapolation, as trees;
RBF kernel ridge and a quadratic surface are reported beside it), hyperparameters by leave-one-out;
CLIMB is a three-round bootstrap on the same regressor (its clustering of raw data into domains is
not needed: the domains are given); DoReMi's excess loss is per token. All proxies train on the
reparametrised loss over the same batches as FastMix's proxy, so a proxy costs one FastMix run.
Stacks of models (proxies, replicates, retrained models) are vmapped in groups of `stack_chunk`
inside a compiled loop (`lax.map`): one at a time on CPU, where XLA ran 32 vmapped proxies 4x
slower than the same mapped one by one.
"""

from __future__ import annotations

import ml_collections

from core import mixture
from methods.base import (
  Method,
  require,
  require_choice,
  require_file,
  require_positive_int,
)
from methods.fastmix import search
from methods.fastmix.phases import MIXERS, phases
from methods.fastmix.study import report, study_arms
from methods.fastmix.tasks import DTYPES, TASKS, missing_token_files

POSITIVE_FIELDS = (
  "data.rows_per_source",
  "model.width",
  "model.num_heads",
  "fastmix.inner_steps",
  "fastmix.num_seeds",
  "regmix.num_proxies",
  "regmix.num_candidates",
  "regmix.top_k",
  "regmix.num_strengths",
  "climb.num_candidates",
  "climb.top_k",
  "sweep.resolution",
  "retrain.num_seeds",
  "eval.num_examples",
  "eval.batch_size",
  "eval.timing_repeats",
)


def validate(config: ml_collections.ConfigDict) -> None:
  for field in POSITIVE_FIELDS:
    require_positive_int(config, field)
  require_choice(config, "mixer", MIXERS)
  require_choice(config, "data.name", tuple(TASKS))
  require_choice(config, "model.dtype", tuple(DTYPES))
  _validate_model(config.model)
  _validate_search(config)
  if config.data.name in ("markov", "pile"):
    require_positive_int(config, "data.seq_len")
    require_positive_int(config, "data.vocab_size")
  if config.data.name == "markov":
    _validate_markov(config)
  elif config.data.name == "digits":
    require(
      config.mixer not in ("oracle",), "mixer", "digits have no known optimum; use another mixer"
    )
  else:
    _validate_token_files(config)
  if config.model.checkpoint:
    require_file(
      config,
      "model.checkpoint",
      "an .npz of the proxy's parameter tree ('/'-joined paths)",
      "save one with methods.fastmix.tasks.save_checkpoint",
    )


def _validate_model(m) -> None:
  require(isinstance(m.depth, int) and m.depth >= 0, "model.depth", f"must be >= 0, got {m.depth}")
  require(m.width % m.num_heads == 0, "model.num_heads", f"must divide width {m.width}")
  require(
    (m.width // m.num_heads) % 2 == 0, "model.num_heads", "head dim width/num_heads must be even"
  )
  require(m.mlp_hidden >= 0, "model.mlp_hidden", f"must be >= 0, got {m.mlp_hidden}")


def _validate_search(config) -> None:
  f, o = config.fastmix, config.optim
  require(
    config.steps >= f.inner_steps and config.steps % f.inner_steps == 0,
    "fastmix.inner_steps",
    f"must divide steps ({config.steps})",
  )
  require(f.inner_steps >= 1, "fastmix.inner_steps", "must be >= 1")
  require_choice(config, "fastmix.hypergradient", ("full", "head"))
  require_choice(config, "fastmix.entropy_sign", tuple(search.ENTROPY_SIGNS))
  require_choice(config, "fastmix.outer_optimizer", ("adam", "adamw"))
  require_choice(config, "fastmix.init", ("uniform", "random"))
  require(f.beta >= 0, "fastmix.beta", f"must be >= 0, got {f.beta}")
  require(f.entropy_weight >= 0, "fastmix.entropy_weight", f"must be >= 0, got {f.entropy_weight}")
  require(f.outer_lr > 0, "fastmix.outer_lr", f"must be positive, got {f.outer_lr}")
  require_choice(config, "optim.schedule", ("cosine", "constant"))
  require_choice(config, "regmix.regressor", mixture.REGRESSORS)
  require(
    isinstance(config.stack_chunk, int) and config.stack_chunk >= 0,
    "stack_chunk",
    f"must be an int >= 0 (0 = vmap every model at once), got {config.stack_chunk!r}",
  )
  require(o.learning_rate > 0, "optim.learning_rate", f"must be positive, got {o.learning_rate}")
  require(0 <= o.final_fraction <= 1, "optim.final_fraction", "must be in [0, 1]")
  r = config.regmix
  counts = tuple(r.proxy_counts)
  require(
    bool(counts) and all(0 < n <= r.num_proxies for n in counts) and list(counts) == sorted(counts),
    "regmix.proxy_counts",
    f"must be increasing counts in 1..num_proxies ({r.num_proxies}), got {counts}",
  )
  require(r.top_k <= r.num_candidates, "regmix.top_k", "exceeds regmix.num_candidates")
  require(0 < r.minimum < 1, "regmix.minimum", f"must be in (0, 1), got {r.minimum}")
  rounds = tuple(config.climb.proxies_per_round)
  require(
    bool(rounds) and all(isinstance(n, int) and n >= 2 for n in rounds),
    "climb.proxies_per_round",
    f"needs rounds of >= 2 proxies, got {rounds}",
  )
  require(config.climb.concentration > 0, "climb.concentration", "must be positive")
  require(config.climb.floor >= 0, "climb.floor", f"must be >= 0, got {config.climb.floor}")
  require(0 <= config.doremi.smoothing <= 1, "doremi.smoothing", "must be in [0, 1]")
  require(config.retrain.steps >= 0, "retrain.steps", "must be >= 0 (0 = steps)")


def _validate_markov(config) -> None:
  d = config.data
  k = len(d.relevant_entropy) + 3
  require(
    all(0 < f < 1 for f in d.relevant_entropy) and len(d.relevant_entropy) >= 1,
    "data.relevant_entropy",
    f"needs fractions in (0, 1), got {tuple(d.relevant_entropy)}",
  )
  require(0 < d.irrelevant_entropy < 1, "data.irrelevant_entropy", "must be in (0, 1)")
  weights = tuple(d.target_weights)
  require(
    len(weights) == k and all(w >= 0 for w in weights) and abs(sum(weights) - 1) < 1e-6,
    "data.target_weights",
    f"must be {k} non-negative weights summing to 1 (relevant sources, then noise, adversarial, "
    f"irrelevant), got {weights}",
  )
  require(d.vocab_size >= 2, "data.vocab_size", f"must be >= 2, got {d.vocab_size}")
  active = tuple(config.sweep.active_sources)
  require(
    all(0 <= a < k for a in active) and len(set(active)) == len(active),
    "sweep.active_sources",
    f"must be distinct source indices < {k}, got {active}",
  )


def _validate_token_files(config) -> None:
  d = config.data
  require(bool(d.domains), "data.domains", "name the training domains")
  require(bool(d.target_domain), "data.target_domain", "name the validation (target) domain")
  missing = missing_token_files(config)
  require(
    not missing,
    "data.data_dir",
    f"missing token files {missing[:3]}{' ...' if len(missing) > 3 else ''}: prepare "
    "<data_dir>/train/<domain>.npy (1-D token ids, GPT-NeoX tokenizer) for every data.domains "
    "and <data_dir>/validation/<data.target_domain>.npy, then pass --config.data.data_dir=DIR",
  )
  require(config.mixer != "oracle", "mixer", "tokenised domains have no known optimum")


METHOD = Method(
  name="fastmix", phases=phases, validate=validate, study_arms=study_arms, report=report
)
