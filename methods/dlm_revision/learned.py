"""E3 of the DLM-revision method: a masked-diffusion LM on the parity-code language, and its samplers.

Seeds are a vmapped axis: the `train` state holds `config.num_seeds` independent denoisers (their own
init, data and sampling randomness), trained by one jitted step and sampled by one vmapped program.
Every sampler of a sweep shares one compiled sampling loop (the sampler is an argument).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import masked_diffusion as md
from core import optim
from core.data import batching, parity
from methods.base import cached_per_config, config_key

MASK_ID = 2  # the bits are 0 and 1; the mask is token 2
SAMPLER_SPECS = {
  "ancestral": ("ancestral", "none"),
  "topk": ("topk", "none"),
  "remask_random": ("ancestral", "remask_random"),
  "remask_confidence": ("ancestral", "remask_confidence"),
  "revision": ("ancestral", "revision"),
  "revision_blocks": ("ancestral", "revision"),  # capped per check group of the code
}
_FIGURE_CACHE: dict = {}  # config key -> the sampling results, for the phase's figure


@cached_per_config(maxsize=4)
def load_code(config) -> parity.ParityCode:
  return parity.parity_code(config.data.length, config.data.group_size, config.data.code_seed)


def make_model(config) -> md.Denoiser:
  m = config.model
  return md.Denoiser(
    num_tokens=2,
    num_outputs=2,
    length=config.data.length,
    width=m.width,
    depth=m.depth,
    num_heads=m.num_heads,
    mlp=m.mlp,
  )


def optimizer(config) -> optax.GradientTransformation:
  """AdamW on a warmup-cosine schedule (warmup capped at half the run), global-norm clipping."""
  o = config.optim
  schedule = optim.warmup_cosine(o.learning_rate, o.warmup_steps, config.steps)
  return optim.clipped_adam(schedule, o.grad_clip, o.weight_decay)


def tied_share(config, step: int) -> float:
  """The share of step `step`'s codewords drawn with tied checks (`tied_codewords`): from
  `data.tied_fraction` at step 0 down linearly to 0 at `data.curriculum_steps` (0: never)."""
  d = config.data
  if d.curriculum_steps <= 0:
    return 0.0
  return d.tied_fraction * max(0.0, 1.0 - step / d.curriculum_steps)


def tied_codewords(code: parity.ParityCode, rng: np.random.Generator, num: int) -> np.ndarray:
  """Codewords whose every check's first g - 1 members share one fair bit b (the last is their
  parity, (g - 1) b mod 2): still codewords, but positions of one check are now pairwise
  correlated, so a denoiser learns which positions form a check by copying before it has to learn
  the (g - 1)-bit XOR that the uniform code asks for (whose lower-order correlations are all 0)."""
  tied = rng.integers(0, 2, (num, code.num_groups, 1), dtype=np.int32)
  free = np.repeat(tied, code.group_size - 1, axis=-1)
  blocks = np.concatenate([free, free.sum(-1, keepdims=True) % 2], axis=-1)
  out = np.empty((num, code.length), np.int32)
  out[:, code.groups.reshape(-1)] = blocks.reshape(num, code.groups.size)  # num may be 0
  return out


def train_data(config):
  """`{"tokens": int32 [B, num_seeds, L]}`: independent codewords for every seed, a share
  `tied_share(step)` of them with tied checks (the curriculum)."""
  code, batch, seeds = load_code(config), config.batch_size, config.num_seeds

  def generate(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([config.seed, step])
    tokens = code.sample(rng, batch * seeds)
    share = tied_share(config, step)
    if share > 0:
      tie = rng.random(len(tokens)) < share
      tokens[tie] = tied_codewords(code, rng, int(tie.sum()))
    return {"tokens": tokens.reshape(batch, seeds, -1)}

  return batching.GeneratedBatches(generate, batch)


def train_init(config, rng, inputs=None) -> dict:
  del inputs
  model, opt = make_model(config), optimizer(config)
  tokens = jnp.zeros((1, config.data.length), jnp.int32)
  keys = jax.vmap(lambda s: jax.random.fold_in(rng, s))(jnp.arange(config.num_seeds))
  params = jax.vmap(lambda key: model.init(key, tokens))(keys)
  return {"params": params, "opt_state": jax.vmap(opt.init)(params)}


def _losses(config, params, x0, rng, correction_rate=None):
  """`(loss, nelbo)` per example for one seed (MDLM loss; self-correction when pi > 0). The
  corruption rate defaults to the model's pi; evaluation passes 0 (the plain masking process)."""
  m = config.model
  rate = m.correction_rate if correction_rate is None else correction_rate
  time_rng, noise_rng = jax.random.split(rng)
  t = md.stratified_times(time_rng, x0.shape[0], m.t_min)
  noisy = md.corrupt(noise_rng, x0, t, 2, rate)
  logits = make_model(config).apply(params, noisy.tokens)
  weight = m.correction_weight if rate > 0 else 0.0
  return md.masked_diffusion_loss(logits, x0, noisy.masked, t, weight)


def train_step(config, state, batch, rng):
  opt = optimizer(config)

  def one_seed(params, opt_state, x0, key):
    def loss_fn(p):
      loss, nelbo = _losses(config, p, x0, key)
      return loss.mean(), nelbo.mean()

    (loss, nelbo), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, (loss, nelbo, optax.tree.norm(grads))

  x0 = jnp.swapaxes(batch["tokens"], 0, 1)  # [S, B, L]
  keys = jax.vmap(lambda s: jax.random.fold_in(rng, s))(jnp.arange(config.num_seeds))
  params, opt_state, (loss, nelbo, norm) = jax.vmap(one_seed)(
    state["params"], state["opt_state"], x0, keys
  )
  metrics = {
    "loss": loss.mean(),
    "nelbo_bits_per_token": nelbo.mean() / math.log(2),
    "grad_norm": norm.mean(),
  }
  return {"params": params, "opt_state": opt_state}, metrics


@cached_per_config(maxsize=4)
def _train_evaluator(config):
  """Jitted `(params [S, ...], x0, flipped, rng) -> per-seed NELBO (bits/token) under the plain
  masking process (comparable across pi), and the confidence p(current token) on revealed codewords
  with one flipped bit: inside the flipped group, elsewhere."""
  model, code = make_model(config), load_code(config)
  group_of = jnp.asarray(code.group_ids())

  def one_seed(params, x0, flipped, rng):
    keys = jax.random.split(rng, 8)
    nelbos = jax.vmap(lambda k: _losses(config, params, x0, k, correction_rate=0.0)[1])(keys)
    nelbo = jnp.mean(nelbos) / math.log(2)
    probs = jax.nn.softmax(model.apply(params, flipped))
    score = jnp.take_along_axis(probs, flipped[..., None], -1)[..., 0]
    changed = jnp.argmax(flipped != x0, axis=-1)
    in_group = group_of[None, :] == group_of[changed][:, None]
    return (
      nelbo,
      jnp.sum(score * in_group) / jnp.sum(in_group),
      jnp.sum(score * ~in_group) / jnp.sum(~in_group),
    )

  return jax.jit(jax.vmap(one_seed, in_axes=(0, None, None, 0)))


def train_evaluate(config, state, rng) -> dict:
  """Validation NELBO against the language's exact entropy rate, and the revision signal."""
  code = load_code(config)
  data_rng = np.random.default_rng([config.seed, 10**6])
  x0 = code.sample(data_rng, 512)
  flip = data_rng.integers(0, code.length, len(x0))
  flipped = x0.copy()
  flipped[np.arange(len(x0)), flip] ^= 1
  keys = jax.random.split(rng, config.num_seeds)
  nelbo, bad, good = _train_evaluator(config)(state["params"], x0, flipped, keys)
  return {
    "val_nelbo_bits_per_token": float(np.mean(nelbo)),
    "val_nelbo_bits_per_token/seeds": np.asarray(nelbo),
    "entropy_bits_per_token": code.entropy_bits_per_token,
    "confidence_in_violated_group": float(np.mean(bad)),
    "confidence_in_valid_group": float(np.mean(good)),
  }


@cached_per_config(maxsize=4)
def _sampler_fn(config):
  """Jitted `(params [S, ...], spec, rng [S], T, R, blocks, use_oracle) -> per-seed metrics and
  tokens`: one compiled program for every sampler, round budget and the exact (oracle) denoiser."""
  model, code = make_model(config), load_code(config)
  groups, length = code.groups, code.length
  num = config.sampling.num_samples

  def one_seed(params, spec, rng, num_rounds, extra_rounds, blocks, use_oracle):
    def logits_fn(tokens):
      oracle = lambda x: jnp.log(jnp.clip(parity.bayes_denoiser_probs(x, groups), 1e-6, 1.0))
      return jax.lax.cond(use_oracle, oracle, lambda x: model.apply(params, x), tokens)

    out = md.sample(logits_fn, spec, rng, num, length, MASK_ID, num_rounds, extra_rounds, blocks)
    metrics = {
      "validity": jnp.mean(parity.validity(out.tokens, groups)),
      "nfe": jnp.mean(out.nfe.astype(jnp.float32)),
      "fidelity_tv": parity.pattern_tv(out.tokens, groups),
      "changed": jnp.mean(out.changed.astype(jnp.float32)),
      "footprint": jnp.max(out.footprint).astype(jnp.float32),
      "rounds": out.rounds.astype(jnp.float32),
    }
    return metrics, out.tokens

  return jax.jit(jax.vmap(one_seed, in_axes=(0, None, 0, None, None, None, None)))


def sampler_spec(config, name: str) -> md.SamplerSpec:
  reveal, correction = SAMPLER_SPECS[name]
  s = config.sampling
  return md.sampler_spec(reveal, correction, s.threshold, s.cap, s.eta)


def sampler_curves(config, params, rng, use_oracle: bool) -> dict[str, dict[str, np.ndarray]]:
  """For every sampler of `sampling.samplers`: metrics over the `sampling.rounds` sweep, each
  `[S, len(rounds)]` (seeds first); `unique` is the diversity (distinct samples / samples). The
  corrective samplers skip budgets above `sampling.max_corrective_rounds` (NaN there)."""
  code, s = load_code(config), config.sampling
  run = _sampler_fn(config)
  curves = {}
  for i, name in enumerate(s.samplers):
    spec = jax.tree.map(jnp.asarray, sampler_spec(config, name))
    blocks = code.group_ids() if name == "revision_blocks" else np.zeros(code.length, np.int32)
    rows = []
    corrective = SAMPLER_SPECS[name][1] != "none"
    for j, rounds in enumerate(s.rounds):
      if corrective and rounds > s.max_corrective_rounds:
        rows.append({k: np.full_like(v, np.nan, dtype=np.float64) for k, v in rows[-1].items()})
        continue
      key = jax.random.fold_in(jax.random.fold_in(rng, i), j)
      keys = jax.random.split(key, config.num_seeds)
      metrics, tokens = run(
        params, spec, keys, rounds, s.extra_rounds, jnp.asarray(blocks), use_oracle
      )
      metrics = {k: np.asarray(v) for k, v in metrics.items()}
      metrics["unique"] = np.asarray([parity.unique_fraction(t) for t in np.asarray(tokens)])
      rows.append(metrics)
    curves[name] = {k: np.stack([r[k] for r in rows], axis=1) for k in rows[0]}
  return curves


def nfe_at_validity(nfe: np.ndarray, validity: np.ndarray, target: float) -> float:
  """The NFE at which a sampler's validity curve first reaches `target`, interpolated linearly in
  log NFE between the sweep's points; NaN if it never does."""
  above = np.flatnonzero(validity >= target)
  if not len(above):
    return math.nan
  k = above[0]
  if k == 0 or validity[k] == validity[k - 1]:
    return float(nfe[k])
  frac = (target - validity[k - 1]) / (validity[k] - validity[k - 1])
  return float(np.exp(np.log(nfe[k - 1]) + frac * (np.log(nfe[k]) - np.log(nfe[k - 1]))))


def _headline(config, curves, prefix: str) -> dict[str, float]:
  """validity_vanilla / validity_revision at T = reference_rounds, NFE to the target validity and
  their ratios (vanilla = ancestral MDLM decoding; also against top-k)."""
  s = config.sampling
  ref = list(s.rounds).index(s.reference_rounds)
  out = {}
  per_seed = {}
  for name, curve in curves.items():
    validity, nfe = curve["validity"].mean(0), curve["nfe"].mean(0)
    out[f"{prefix}nfe_at_target_{name}"] = nfe_at_validity(nfe, validity, s.target_validity)
    out[f"{prefix}validity_at_reference_{name}"] = float(validity[ref])
    out[f"{prefix}nfe_at_reference_{name}"] = float(nfe[ref])
    pairs = zip(curve["nfe"], curve["validity"], strict=True)
    per_seed[name] = np.asarray([nfe_at_validity(n, v, s.target_validity) for n, v in pairs])
    if len(per_seed[name]) > 1:
      out[f"{prefix}nfe_at_target_{name}/seeds"] = per_seed[name]
  if "ancestral" in curves:
    out[f"{prefix}validity_vanilla"] = out[f"{prefix}validity_at_reference_ancestral"]
  if "revision" in curves:
    out[f"{prefix}validity_revision"] = out[f"{prefix}validity_at_reference_revision"]
    out[f"{prefix}nfe_revision"] = out[f"{prefix}nfe_at_reference_revision"]
  for baseline, key in (
    ("ancestral", "nfe_ratio_at_equal_validity"),
    ("topk", "nfe_ratio_vs_topk"),
  ):
    if baseline in curves and "revision" in curves:
      nfe_base = out[f"{prefix}nfe_at_target_{baseline}"]
      lower = math.isnan(nfe_base)
      if lower:  # never reached in the sweep: its largest NFE bounds the ratio from below
        nfe_base = float(curves[baseline]["nfe"].mean(0)[-1])
      out[f"{prefix}{key}"] = nfe_base / out[f"{prefix}nfe_at_target_revision"]
      out[f"{prefix}{key}_is_lower_bound"] = float(lower)
      if len(per_seed[baseline]) > 1 and not lower:
        out[f"{prefix}{key}/seeds"] = per_seed[baseline] / per_seed["revision"]
  return out


def sampling_evaluate(config, params, rng) -> dict:
  """Every sampler over the round sweep on the trained denoisers (and the exact denoiser when
  `sampling.oracle`): curves `curve_<sampler>_<metric>` (mean over seeds) and
  `curve_<sampler>_validity/seeds`, then the headline numbers."""
  results: dict = {"curve_rounds": np.asarray(config.sampling.rounds, np.float64)}
  runs = [("", False)] + ([("oracle_", True)] if config.sampling.oracle else [])
  for prefix, use_oracle in runs:
    curves = sampler_curves(config, params, jax.random.fold_in(rng, int(use_oracle)), use_oracle)
    for name, curve in curves.items():
      for metric, values in curve.items():
        results[f"{prefix}curve_{name}_{metric}"] = values.mean(0)
      if config.num_seeds > 1:
        results[f"{prefix}curve_{name}_validity/seeds"] = curve["validity"]
    results.update(_headline(config, curves, prefix))
  _FIGURE_CACHE[config_key(config)] = results
  return results


def sampling_figure(config) -> dict:
  from methods.dlm_revision.study import validity_figure

  results = _FIGURE_CACHE.get(config_key(config))
  return {} if results is None else {"validity_vs_nfe": validity_figure(config, {"run": results})}
