r"""RegMix (FastMix's baseline) three ways: our RegMix beside sail-sg/regmix's own mixture synthesis and
LightGBM regression, on the same proxies of FastMix's Markov task (known optimum w*).

  pip install -e ".[peers]"
  python experiments/peers/regmix.py --official_repo=PATH/TO/regmix [--seeds=0,1,2] \
      [--num_proxies=64] [--steps=1000] [--json=runs/peers_regmix.json]

Run against sail-sg/regmix at commit b004d3a3f39846dcec6b3740da22bcd1ba95a5d0. What is taken from the
checkout, unchanged, at run time:
  * `mixture_config/synthesize_mixture.py:generate_weights_dirichlet` draws the proxies' mixtures
    (its module constants as released: temperature 0.5, strengths 0.1..5 on 15 log steps, 100x
    oversampling with rejection at 15x the prior, weights below 2e-4 zeroed and rounded). The module
    seeds Python's and NumPy's global generators at import; the driver reseeds NumPy and `random`
    with each seed before each call, so seeds give different proxies. Its prints go to the log.
  * `regression_fitting/regression.ipynb`: the cell that defines `hyper_params` (LightGBM's
    settings) is read from the notebook and executed, so the regression uses the released settings;
    as in the notebook, each target is fitted with `LGBMRegressor(**hyper_params)` and early stopping
    (3 rounds) on a held-out set of proxies, and the chosen mixture is the mean of the 128 best of
    100,000 draws from Dirichlet(prior) (the notebook's simulation cell; its constants are restated
    here because a notebook cell cannot be imported: `SIMULATION_DRAWS`, `SIMULATION_TOP_K`).
Nothing else of the checkout is used (its proxy training is lit-gpt on The Pile, replaced here by
FastMix's proxies: `methods/fastmix/baselines.py`).

Per seed, `--num_proxies` proxies are trained on the official mixtures (one vmapped stack, the FastMix
proxy and optimiser, `--steps` steps); their target losses are fitted by
  official  LightGBM on the first `1 - --holdout` of the proxies, early-stopped on the rest;
  ours     `core.mixture.fit_regressor(config.regmix.regressor)` (the kernel smoother) on all of them;
and each picks a mixture two ways: its own selection (official: the notebook's simulation; ours:
`core.mixture.regmix_select` over `regmix_mixtures` candidates) and the other side's, so that a gap
can be traced to the regressor or to the selection. Reported per cell: the L1 distance of the chosen
mixture to w* and the ideal target loss of that mixture (`text.bigram_cross_entropy`, exact), mean and
95% t-interval over seeds; the held-out Spearman correlation of each regressor's predictions; and how
our synthesis (`regmix_mixtures`, the same settings) compares with the official one (share of draws
above the usage bound, mean entropy, mean L1 to the prior).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import random
import sys

from absl import app, flags, logging

SIMULATION_DRAWS = 100_000  # regression.ipynb: np.random.dirichlet(prior_dist * 1, 100000)
SIMULATION_TOP_K = 128  # regression.ipynb: "take the average of top-k ... k = 128"


def define_flags() -> None:
  flags.DEFINE_string("official_repo", None, "A checkout of sail-sg/regmix.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds: proxies, data stream and candidates.")
  flags.DEFINE_integer("num_proxies", 64, "Proxies trained per seed (RegMix's n).")
  flags.DEFINE_integer("steps", 1000, "Training steps of each proxy.")
  flags.DEFINE_float("holdout", 0.25, "Share of the proxies LightGBM early-stops on.")
  flags.DEFINE_string("json", "runs/peers_regmix.json", "Where the table is written as JSON.")
  flags.mark_flags_as_required(["official_repo"])


# ---------------------------------------------------------------------------------------------------
# The official code, from the checkout
# ---------------------------------------------------------------------------------------------------


def _import_file(name: str, path: str):
  if not os.path.exists(path):
    raise SystemExit(f"error: --official_repo: {path} not found (is it a sail-sg/regmix checkout?)")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  with contextlib.redirect_stdout(io.StringIO()):
    spec.loader.exec_module(module)
  return module


def official_synthesis(repo: str):
  return _import_file(
    "regmix_synthesize", os.path.join(repo, "mixture_config", "synthesize_mixture.py")
  )


def official_hyper_params(repo: str) -> dict:
  """LightGBM's settings: the notebook cell that assigns `hyper_params`, executed as released."""
  path = os.path.join(repo, "regression_fitting", "regression.ipynb")
  if not os.path.exists(path):
    raise SystemExit(f"error: --official_repo: {path} not found")
  with open(path) as f:
    cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
  source = next(
    ("".join(c["source"]) for c in cells if "hyper_params = {" in "".join(c["source"])), None
  )
  if source is None:
    raise SystemExit(f"error: {path} has no cell defining hyper_params")
  namespace: dict = {}
  exec(
    source.split("np.random.seed")[0], {}, namespace
  )  # the dict literal, before the fitting loop
  return dict(namespace["hyper_params"])


def official_mixtures(synthesis, prior, num: int, seed: int):
  import numpy as np

  np.random.seed(seed)
  random.seed(seed)
  names = [f"source_{i}" for i in range(len(prior))]
  with contextlib.redirect_stdout(io.StringIO()):
    return synthesis.generate_weights_dirichlet(
      np.asarray(prior, np.float64), names, synthesis.MINIMUM, num, temperature=synthesis.TEMP
    )


def lightgbm_fit(hyper_params: dict, mixtures, losses, holdout: float, seed: int):
  """The notebook's fit: one `LGBMRegressor(**hyper_params)` with early stopping on held-out proxies."""
  import lightgbm as lgb
  import numpy as np

  order = np.random.default_rng(seed).permutation(len(losses))
  cut = int(round(len(losses) * (1 - holdout)))
  train, test = order[:cut], order[cut:]
  model = lgb.LGBMRegressor(**hyper_params)
  model.fit(
    mixtures[train],
    losses[train],
    eval_X=mixtures[test],
    eval_y=losses[test],
    eval_metric="l2",
    callbacks=[lgb.early_stopping(stopping_rounds=3, verbose=False)],
  )
  return model, test


def notebook_selection(predict, prior, seed: int):
  """The mean of the SIMULATION_TOP_K best-predicted of SIMULATION_DRAWS Dirichlet(prior) draws."""
  import numpy as np

  samples = np.random.default_rng(seed).dirichlet(np.asarray(prior, np.float64), SIMULATION_DRAWS)
  return samples[np.argsort(predict(samples))[:SIMULATION_TOP_K]].mean(0)


# ---------------------------------------------------------------------------------------------------
# Ours
# ---------------------------------------------------------------------------------------------------


def fastmix_config(seed: int, steps: int):
  from configs import fastmix as fastmix_config_lib

  config = fastmix_config_lib.get_config()
  config.seed = seed
  config.steps = steps
  return config


def train_proxies(config, mixtures):
  """FastMix's proxies on `mixtures [M, K]` (`methods/fastmix/baselines.py`); their target losses."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from methods.fastmix import baselines, training
  from methods.fastmix.tasks import load_task

  count = len(mixtures)
  init = lambda rng: baselines.proxies_init(  # noqa: E731
    config, count, lambda key, inputs: jnp.asarray(mixtures, jnp.float32), rng, {}
  )
  state = jax.jit(init)(jax.random.key(config.seed))
  step = jax.jit(lambda s, b: baselines.proxies_step(config, s, b, None), donate_argnums=0)
  batches = training.stratified_batches(config, load_task(config))
  for n in range(config.steps):
    state, _ = step(state, batches.batch(n, 0, 1))
  return np.asarray(baselines.proxy_losses(config, state), np.float64)


def our_fit(config, mixtures, losses):
  import numpy as np

  from core import mixture

  model = mixture.fit_regressor(config.regmix.regressor, mixtures, losses)
  return lambda x: np.asarray(mixture.predict(model, np.asarray(x, np.float32)), np.float64)


def our_selection(config, predict):
  import jax
  import numpy as np

  from methods.fastmix import baselines

  candidates = np.asarray(
    baselines.regmix_sampler(config, jax.random.key(config.seed + 1), config.regmix.num_candidates)
  )
  return candidates[np.argsort(predict(candidates))[: config.regmix.top_k]].mean(0)


def synthesis_stats(mixtures, prior, max_usage: float) -> dict:
  import numpy as np

  prior = np.asarray(prior, np.float64) / np.sum(prior)
  safe = np.where(mixtures > 0, mixtures, 1.0)
  return {
    "above_usage_bound": float(np.mean(np.any(mixtures > np.minimum(max_usage * prior, 1.0), -1))),
    "mean_entropy": float(np.mean(-np.sum(mixtures * np.log(safe), -1))),
    "mean_l1_to_prior": float(np.mean(np.abs(mixtures - prior).sum(-1))),
  }


# ---------------------------------------------------------------------------------------------------
# One seed, all seeds, the table
# ---------------------------------------------------------------------------------------------------


def run_seed(values, seed: int, synthesis, hyper_params) -> dict:
  import jax
  import numpy as np
  from scipy import stats

  from methods.fastmix import baselines
  from methods.fastmix.tasks import load_task

  config = fastmix_config(seed, values.steps)
  task = load_task(config)
  prior = np.asarray(task.data_prior, np.float64)
  mixtures = np.asarray(official_mixtures(synthesis, prior, values.num_proxies, seed), np.float64)
  ours_drawn = np.asarray(
    baselines.regmix_sampler(config, jax.random.key(seed), values.num_proxies), np.float64
  )
  losses = train_proxies(config, mixtures)
  lgbm, test = lightgbm_fit(hyper_params, mixtures, losses, values.holdout, seed)
  predictors = {
    "official": lambda x: np.asarray(lgbm.predict(np.asarray(x, np.float64)), np.float64),
    "ours": our_fit(config, mixtures, losses),
  }
  held_out = {
    "ours": our_fit(config, np.delete(mixtures, test, 0), np.delete(losses, test)),
    "official": predictors["official"],
  }
  result = {
    "seed": seed,
    "synthesis_official": synthesis_stats(mixtures, prior, synthesis.MAXIMUM_USAGE),
    "synthesis_ours": synthesis_stats(ours_drawn, prior, config.regmix.max_usage),
    "best_proxy_l1": float(np.abs(mixtures[np.argmin(losses)] - task.optimum).sum()),
    "cells": {},
  }
  for regressor, predict in predictors.items():
    predicted = held_out[regressor](mixtures[test])
    # LightGBM's leaves need min_data_in_leaf (20) proxies: with fewer it predicts a constant
    constant = np.ptp(predicted) == 0
    result[f"spearman_{regressor}"] = (
      float("nan") if constant else float(stats.spearmanr(predicted, losses[test])[0])
    )
    for selection in ("official", "ours"):
      if selection == "official":
        chosen = notebook_selection(predict, prior, seed)
      else:
        chosen = our_selection(config, predict)
      result["cells"][f"{regressor}/{selection}"] = {
        "mixture": chosen.tolist(),
        "l1_error": float(np.abs(chosen - task.optimum).sum()),
        "ideal_target_loss": float(task.ideal_loss(chosen)),
      }
  result["oracle_target_loss"] = float(task.ideal_loss(task.optimum))
  return result


def markdown(seeds: list[dict]) -> str:
  from methods.base import t_interval_cell as interval

  names = {
    "official/official": "official: LightGBM + notebook selection",
    "ours/ours": "ours: smoother + our selection",
    "official/ours": "LightGBM + our selection",
    "ours/official": "smoother + notebook selection",
  }
  lines = [
    f"{len(seeds)} seeds; mean ± 95% t-interval over seeds",
    "",
    "| regressor + selection | L1 to w* | ideal target loss |",
    "|---|---|---|",
  ]
  for key, label in names.items():
    cells = [s["cells"][key] for s in seeds]
    lines.append(
      f"| {label} | {interval([c['l1_error'] for c in cells])} | "
      f"{interval([c['ideal_target_loss'] for c in cells])} |"
    )
  lines.append(
    f"| best single proxy | {interval([s['best_proxy_l1'] for s in seeds])} | |"
    f"\n| w* (oracle) | 0 | {seeds[0]['oracle_target_loss']:.4f} |"
  )
  lines += [
    "",
    "| held-out Spearman (predicted vs true proxy loss) | official LightGBM | ours |",
    "|---|---|---|",
    f"| | {interval([s['spearman_official'] for s in seeds])} | "
    f"{interval([s['spearman_ours'] for s in seeds])} |",
    "",
    "| synthesis | above usage bound | mean entropy | mean L1 to prior |",
    "|---|---|---|---|",
  ]
  for side in ("official", "ours"):
    rows = [s[f"synthesis_{side}"] for s in seeds]
    lines.append(
      f"| {side} | {interval([r['above_usage_bound'] for r in rows])} | "
      f"{interval([r['mean_entropy'] for r in rows])} | "
      f"{interval([r['mean_l1_to_prior'] for r in rows])} |"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  from experiments import runtime

  runtime.setup()
  values = flags.FLAGS
  repo = os.path.abspath(values.official_repo)
  synthesis = official_synthesis(repo)
  hyper_params = official_hyper_params(repo)
  logging.info("official LightGBM settings: %s", hyper_params)
  seeds = []
  for seed in (int(s) for s in values.seeds):
    seeds.append(run_seed(values, seed, synthesis, hyper_params))
    logging.info("seed %d: %s", seed, json.dumps(seeds[-1]["cells"]))
  table = markdown(seeds)
  print(table)
  if values.json:
    os.makedirs(os.path.dirname(values.json) or ".", exist_ok=True)
    with open(values.json, "w") as f:
      json.dump({"seeds": seeds, "markdown": table, "hyper_params": hyper_params}, f, indent=2)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  define_flags()
  app.run(main)
