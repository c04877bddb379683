"""E1: the paper's ridgeless-regression setting, theory against simulation, as three closed-form phases.

"Does Weak-to-Strong Generalization Happen under Spurious Correlations?" (Liu, Dong, Lei; ICLR 2026):
a teacher fit on n labelled draws of D(eta_l), a student fit to its pseudolabels on N unlabelled draws
of D(eta_u), both scored by the excess risk ER_{eta_t} (the regression steps 1-3 of the package
docstring; the model and the maths are in `core/w2s.py`, the designs in `core/data/spurious.py`).

One run covers the whole grid separation s x similarity ||Xi||_F^2 x eta_l x eta_u, each cell
replicated over `config.num_seeds` seeds (an array axis; the labelled and unlabelled draws of a seed
are shared across the grid: common random numbers). eta_t only changes evaluation and takes the values
`ETA_T_LABELS`. Results are exact population risks (`core.w2s.excess_risk`), with the exact-moment
prediction (`core.w2s.predicted_*`, the `*_pred` metrics) and Thm 1 / Thm 2
as relayed (`core.w2s.relayed_*`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections

from core import w2s
from core.data import spurious as spurious_data
from methods.base import Phase, cached_per_config
from methods.w2s.runtime import runtime_barrier

# the evaluation mixtures eta_t: eta_l itself, balanced, the majority (0) and the minority (1) alone
ETA_T_LABELS = ("eta_l", "0.5", "0", "1")


def limit_blas_threads() -> None:
  """One BLAS thread: LAPACK calls from XLA's CPU threads run 10-30x slower when OpenBLAS spawns its
  own threads on a loaded 2-core machine (measured: 320x320 Cholesky 68 ms vs 2 ms)."""
  import threadpoolctl

  threadpoolctl.threadpool_limits(1, user_api="blas")


# ---------------------------------------------------------------------------------------------------
# Designs and fits (steps 1-2)
# ---------------------------------------------------------------------------------------------------


def regression_designs(config: ml_collections.ConfigDict) -> spurious_data.RegressionDesign:
  """The designs of the grid, stacked with leading axes (separation, similarity); one Q and beta*."""
  r = config.regression
  key = jax.random.fold_in(jax.random.key(config.seed), 7)
  sizes = (r.d_z, r.group_dim, r.teacher_group_dim, r.student_group_dim)
  design = jax.jit(spurious_data.regression_design, static_argnums=(1, 2, 3, 4, 5, 6, 7, 8))
  designs = [
    [design(key, *sizes, xi2, s, r.sigma_y, r.sigma_xi) for xi2 in r.similarities]
    for s in r.separations
  ]
  return _stack([_stack(row) for row in designs])


def _stack(designs):
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *designs)


def _replicate_keys(config, stream: int) -> jax.Array:
  """One key per seed for the labelled (stream 0) or unlabelled (stream 1) draws; shared across the
  grid (common random numbers), independent across seeds."""
  return jax.random.split(jax.random.fold_in(jax.random.key(config.seed), stream), config.num_seeds)


def _design_at(designs, s: int | jax.Array, x: int | jax.Array = 0):
  return jax.tree.map(lambda leaf: leaf[s, x], designs)


def regression_teacher_init(config, designs, rng, inputs):
  """coef[s, l, r] of the ridgeless teacher on n draws of D(eta_l) (step 1)."""
  del inputs
  r = config.regression
  designs, keys = runtime_barrier((designs, _replicate_keys(config, 0)), rng)
  etas = jnp.asarray(r.eta_labelled, jnp.float32)

  def fit(design, eta, key):
    data = spurious_data.sample_regression(key, design, r.num_labelled, eta)
    return w2s.ridgeless_fit(
      w2s.teacher_features(data["z"], data["xi"], design.teacher_map), data["y"]
    )

  def per_separation(s):
    design = _design_at(designs, s)
    return jax.vmap(lambda eta: jax.vmap(lambda k: fit(design, eta, k))(keys))(etas)

  return {"coef": jax.lax.map(per_separation, jnp.arange(len(r.separations)))}


def _unlabelled(config, design, eta, key):
  return spurious_data.sample_regression(key, design, config.regression.num_unlabelled, eta)


def regression_pseudolabel_init(config, designs, rng, inputs):
  """targets[s, u, r, :, l] = f_T^{(s, l, r)}(x) on N unlabelled draws of D(eta_u) (step 2)."""
  r = config.regression
  designs, coef, keys = runtime_barrier(
    (designs, inputs["teacher"]["coef"], _replicate_keys(config, 1)), rng
  )
  etas = jnp.asarray(r.eta_unlabelled, jnp.float32)

  def per_separation(s):
    design = _design_at(designs, s)

    def one(eta, key, teacher_coef):
      data = _unlabelled(config, design, eta, key)
      return w2s.teacher_features(data["z"], data["xi"], design.teacher_map) @ teacher_coef.T

    per_eta = lambda eta: jax.vmap(one, in_axes=(None, 0, 1))(eta, keys, coef[s])
    return jax.lax.map(per_eta, etas)

  return {"targets": jax.lax.map(per_separation, jnp.arange(len(r.separations)))}


def regression_student_init(config, designs, rng, inputs):
  """coef[s, u, x, r, :, l] of the ridgeless student fit to the pseudolabels on phi_S (step 2)."""
  r = config.regression
  targets = inputs["pseudolabels"]["targets"]  # (S, U, R, N, L)
  designs, targets, keys = runtime_barrier((designs, targets, _replicate_keys(config, 1)), rng)
  etas = jnp.asarray(r.eta_unlabelled, jnp.float32)
  num_s, num_u, num_x = len(r.separations), len(r.eta_unlabelled), len(r.similarities)

  def one(design, eta, key, target):
    data = _unlabelled(config, design, eta, key)
    return w2s.ridgeless_fit(
      w2s.student_features(data["z"], data["xi"], design.student_map), target
    )

  def per_cell(index):
    s, u, x = index // (num_u * num_x), (index // num_x) % num_u, index % num_x
    design = _design_at(designs, s, x)
    return jax.vmap(one, in_axes=(None, None, 0, 0))(design, etas[u], keys, targets[s, u])

  coef = jax.lax.map(per_cell, jnp.arange(num_s * num_u * num_x))
  return {"coef": coef.reshape(num_s, num_u, num_x, *coef.shape[1:])}


# ---------------------------------------------------------------------------------------------------
# Risks (step 3): simulated, exact-moment prediction, relayed theorems
# ---------------------------------------------------------------------------------------------------


def _eta_tests(eta_l):
  return jnp.stack([eta_l, 0.5, 0.0, 1.0])


def regression_teacher_risks(config, designs, teacher_coef):
  """Simulated ER_T[s, l, r, t], the exact-moment prediction and the relayed Thm 1 [s, l, t]."""
  r = config.regression
  etas_l = jnp.asarray(r.eta_labelled, jnp.float32)

  def per_separation(s, coef):
    design = _design_at(designs, s)

    def sim(eta_l, coef_l):
      moments = jax.vmap(lambda t: w2s.teacher_moment(design, t))(_eta_tests(eta_l))
      return jax.vmap(lambda c: jax.vmap(lambda m: w2s.excess_risk(c, design.beta, m))(moments))(
        coef_l
      )

    def theory(fn, eta_l):
      return jax.vmap(lambda t: fn(design, eta_l, t, r.num_labelled))(_eta_tests(eta_l))

    return (
      jax.vmap(sim)(etas_l, coef),
      jax.vmap(lambda e: theory(w2s.predicted_teacher_risk, e))(etas_l),
      jax.vmap(lambda e: theory(w2s.relayed_teacher_risk, e))(etas_l),
    )

  return jax.vmap(per_separation)(jnp.arange(len(r.separations)), teacher_coef)


def regression_student_risks(config, designs, student_coef):
  """Simulated ER_S[s, u, x, r, l, t]; the exact-moment and relayed predictions [s, u, x, l, t]."""
  r = config.regression
  etas_l = jnp.asarray(r.eta_labelled, jnp.float32)
  etas_u = jnp.asarray(r.eta_unlabelled, jnp.float32)
  n, big_n = r.num_labelled, r.num_unlabelled

  def cell(s, x, eta_u, coef):  # coef (R, d_S, L)
    design = _design_at(designs, s, x)

    def sim(eta_l, coef_l):  # coef_l (R, d_S)
      moments = jax.vmap(lambda t: w2s.student_moment(design, t))(_eta_tests(eta_l))
      er = lambda c: jax.vmap(lambda m: w2s.excess_risk(c, design.beta, m))(moments)
      return jax.vmap(er)(coef_l)

    simulated = jax.vmap(sim, in_axes=(0, 2), out_axes=1)(etas_l, coef)  # (R, L, T)
    pred = lambda e_l: jax.vmap(
      lambda t: w2s.predicted_student_risk(design, e_l, eta_u, t, n, big_n)
    )(_eta_tests(e_l))
    relayed = lambda e_l: jax.vmap(lambda t: w2s.relayed_student_risk(design, e_l, eta_u, t, n))(
      _eta_tests(e_l)
    )
    return simulated, jax.vmap(pred)(etas_l), jax.vmap(relayed)(etas_l)

  over_x = jax.vmap(cell, in_axes=(None, 0, None, 0))
  over_u = jax.vmap(over_x, in_axes=(None, None, 0, 0))
  over_s = jax.vmap(over_u, in_axes=(0, None, None, 0))
  return over_s(
    jnp.arange(len(r.separations)), jnp.arange(len(r.similarities)), etas_u, student_coef
  )


@cached_per_config(maxsize=8)
def _risk_fn(config, which: str):
  """Jitted `(designs, coef) -> (simulated, exact-moment, relayed)` risks, built once per config."""
  fn = {"teacher": regression_teacher_risks, "student": regression_student_risks}[which]
  return jax.jit(functools.partial(fn, config))


def _key(**parts) -> str:
  """`e1/s_8/xi2_0/eta_l_0.1/...`: names TensorBoard accepts (no '=' or ',')."""
  return "e1/" + "/".join(f"{name}_{_fmt(value)}" for name, value in parts.items())


def _fmt(value) -> str:
  return value if isinstance(value, str) else f"{float(value):g}"


def regression_teacher_evaluate(config, designs, state) -> dict[str, float]:
  """`e1/s_../eta_l_../eta_t_../teacher_er{,_std,_pred,_relayed}` for the whole grid."""
  r = config.regression
  sim, pred, relayed = jax.device_get(_risk_fn(config, "teacher")(designs, state["coef"]))
  out = {}
  for i, s in enumerate(r.separations):
    for j, eta_l in enumerate(r.eta_labelled):
      for k, label in enumerate(ETA_T_LABELS):
        prefix = _key(s=s, eta_l=eta_l, eta_t=label)
        out[f"{prefix}/teacher_er"] = float(sim[i, j, :, k].mean())
        out[f"{prefix}/teacher_er_std"] = float(sim[i, j, :, k].std())
        out[f"{prefix}/teacher_er_pred"] = float(pred[i, j, k])
        out[f"{prefix}/teacher_er_relayed"] = float(relayed[i, j, k])
  out["e1/risk_unit"] = r.sigma_y**2 * r.d_z / (r.num_labelled - _teacher_dim(config) - 1)
  return out


def _teacher_dim(config) -> int:
  return config.regression.teacher_group_dim * config.regression.d_z


def regression_student_evaluate(config, designs, state, inputs) -> dict[str, float]:
  """Student risks and the W2S gain G = ER_T - ER_S, simulated (mean, std over seeds), by the
  exact-moment predictor and by the relayed Thm 1 - Thm 2, for every grid cell and eta_t."""
  r = config.regression
  t_sim, t_pred, t_rel = _risk_fn(config, "teacher")(designs, inputs["teacher"]["coef"])
  s_sim, s_pred, s_rel = _risk_fn(config, "student")(designs, state["coef"])
  t_sim, t_pred, t_rel, s_sim, s_pred, s_rel = jax.device_get(
    (t_sim, t_pred, t_rel, s_sim, s_pred, s_rel)
  )
  out = {}
  for i, s in enumerate(r.separations):
    for u, eta_u in enumerate(r.eta_unlabelled):
      for x, xi2 in enumerate(r.similarities):
        for j, eta_l in enumerate(r.eta_labelled):
          for k, label in enumerate(ETA_T_LABELS):
            prefix = _key(s=s, xi2=xi2, eta_l=eta_l, eta_u=eta_u, eta_t=label)
            gain = t_sim[i, j, :, k] - s_sim[i, u, x, :, j, k]
            out[f"{prefix}/student_er"] = float(s_sim[i, u, x, :, j, k].mean())
            out[f"{prefix}/student_er_pred"] = float(s_pred[i, u, x, j, k])
            out[f"{prefix}/gain"] = float(gain.mean())
            out[f"{prefix}/gain_std"] = float(gain.std())
            out[f"{prefix}/gain_pred"] = float(t_pred[i, j, k] - s_pred[i, u, x, j, k])
            out[f"{prefix}/gain_relayed"] = float(t_rel[i, j, k] - s_rel[i, u, x, j, k])
  return out


def regression_phases(config) -> list[Phase]:
  """teacher, pseudolabels, student: `num_steps = 0` each, the fit in `init`."""
  limit_blas_threads()
  designs = regression_designs(config)
  return [
    Phase(
      name="teacher",
      num_steps=0,
      init=functools.partial(regression_teacher_init, config, designs),
      evaluate=lambda state, rng, inputs: regression_teacher_evaluate(config, designs, state),
    ),
    Phase(
      name="pseudolabels",
      num_steps=0,
      init=functools.partial(regression_pseudolabel_init, config, designs),
    ),
    Phase(
      name="student",
      num_steps=0,
      init=functools.partial(regression_student_init, config, designs),
      evaluate=lambda state, rng, inputs: regression_student_evaluate(
        config, designs, state, inputs
      ),
    ),
  ]
