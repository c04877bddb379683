"""The AR-buffer study: seeds of the GP and sawtooth experiments (joint log-likelihoods with
intervals over seeds, per task), the sampling benchmark (first arm only) and the report (tables,
summary, the figure)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from methods.base import (
  Report,
  figure_grid,
  interval_cell,
  markdown_table,
  mean_std_cell,
  with_changes,
)

GAP_TOLERANCE = 0.05  # nats/target: "buffer close to re-encoding"
# "well above independent marginals": the buffer recovers at least this share of the oracle's own
# joint-over-marginal gain (the most any model can gain from modelling dependence).
GAIN_SHARE = 0.5


ORACLES = {  # task -> (the oracle rows, the upper bound that "gap to oracle" is measured from)
  "gp": (
    (("oracle_marginal", "GP oracle, independent marginals"), ("oracle", "GP oracle, exact joint")),
    "oracle",
  ),
  "sawtooth": (
    (("oracle_known_parameters", "known parameters (noise only; upper bound)"),),
    "oracle_known_parameters",
  ),
}


def study_arms(config):
  """One arm `<task>_seed<s>` per task in `config.study.tasks` and seed in `config.study.seeds`;
  the benchmark runs in the first arm only."""
  arms = []
  for task in config.study.tasks:
    for seed in config.study.seeds:
      changes = {"seed": seed, "data__task": task}
      if arms:
        changes.update(benchmark__context_sizes=(), benchmark__buffer_sizes=())
      arms.append((f"{task}_seed{seed}", with_changes(config, **changes)))
  return arms


def task_results(results: Mapping[str, Mapping], task: str) -> dict[str, Mapping]:
  """The arms of one task (named `<task>_seed<s>`)."""
  return {name: r for name, r in results.items() if name.rsplit("_seed", 1)[0] == task}


def _methods(config, task: str = "gp") -> list[tuple[str, str]]:
  k = config.model.max_buffer
  ablation = [
    (f"buffer_k{s}", f"buffer, re-encode every K={s}")
    for s in sorted(set(config.eval.buffer_sizes) - {1, k})
  ]
  return [
    ("marginal", "independent marginals (TNP-D)"),
    ("reencode", "AR re-encoding (TNP-D-AR, K=1)"),
    *ablation,
    ("buffer", f"buffer, one pass (K={k})"),
    ("reencode_sorted", "AR re-encoding, sorted-x order"),
    ("buffer_sorted", f"buffer (K={k}), sorted-x order"),
    *ORACLES[task][0],
  ]


def _values(results, key) -> list[float]:
  return [r[key] for r in results.values() if key in r]


def _benchmark_arm(results) -> Mapping | None:
  return next((r for r in results.values() if "context_sizes" in r), None)


def t_interval(values) -> tuple[float, float]:
  """Mean and the half-width of a 95% Student-t interval over seeds (nan for one seed)."""
  from scipy import stats

  values = np.asarray(values, np.float64)
  if len(values) < 2:
    return float(values.mean()), float("nan")
  half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
  return float(values.mean()), float(half)


def _rows(config, results) -> list[dict]:
  rows = []
  for task in config.study.tasks:
    arms = task_results(results, task)
    if not arms:
      continue
    bound = np.mean(_values(arms, f"ll_{ORACLES[task][1]}"))
    for key, label in _methods(config, task):
      values = _values(arms, f"ll_{key}")
      rows.append(
        {
          "task": task,
          "method": label,
          "joint LL / target (nats)": mean_std_cell(values, digits=3),
          "95% t-interval": interval_cell(*t_interval(values), digits=3),
          "gap to bound": f"{bound - np.mean(values):.3f}",
          "seeds": len(values),
        }
      )
  return rows


def report(config, results: Mapping[str, Mapping]) -> Report:
  summary = _summary(config, results)
  bench = _benchmark_arm(results)
  notes = [
    f"Joint log-likelihood per target, mean ± std and 95% t-interval over {len(config.study.seeds)}"
    f" seeds per task, {config.eval.num_tasks} held-out tasks (N = {config.eval.num_context} "
    f"context, M = {config.eval.num_targets} targets, {config.eval.num_orders} random orders "
    "averaged); the same tasks for every seed. Bound: GP, the exact joint; sawtooth, the density "
    "of the noise alone with the true function known."
  ]
  if bench is not None:
    notes.append(_benchmark_table(config, bench))
  return Report(
    rows=_rows(config, results),
    summary=summary,
    figures={"ar_buffer_study": _figure(config, results, bench)},
    notes="\n\n".join(notes),
  )


def _task_summary(config, task: str, arms) -> dict:
  mean = lambda key: float(np.mean(_values(arms, key)))  # noqa: E731
  summary = {f"ll_{m}": mean(f"ll_{m}") for m in ("marginal", "reencode", "buffer")}
  summary[f"ll_{ORACLES[task][1]}"] = mean(f"ll_{ORACLES[task][1]}")
  gaps = _values(arms, "gap_reencode_minus_buffer")
  summary["gap_reencode_minus_buffer"] = interval_cell(*t_interval(gaps), digits=3)
  summary["gap_reencode_minus_buffer_std"] = float(np.std(gaps, ddof=1)) if len(gaps) > 1 else 0.0
  summary["buffer_close_to_reencode"] = bool(abs(np.mean(gaps)) <= GAP_TOLERANCE)
  gains = _values(arms, "gain_buffer_over_marginal")
  summary["gain_buffer_over_marginal"] = interval_cell(*t_interval(gains), digits=3)
  if task == "gp":
    oracle_gain = mean("ll_oracle") - mean("ll_oracle_marginal")
    summary["oracle_gain_joint_over_marginal"] = oracle_gain
    summary["buffer_share_of_oracle_gain"] = float(np.mean(gains)) / oracle_gain
    summary["buffer_well_above_marginal"] = bool(
      summary["buffer_share_of_oracle_gain"] >= GAIN_SHARE
    )
  return summary


def _summary(config, results) -> dict:
  summary = {}
  for task in config.study.tasks:
    arms = task_results(results, task)
    if arms:
      summary.update({f"{task}_{k}": v for k, v in _task_summary(config, task, arms).items()})
  bench = _benchmark_arm(results)
  if bench is not None:
    for i, n in enumerate(bench["context_sizes"]):
      summary[f"sampling_speedup_n{int(n)}"] = bench["sampling_speedup_by_context"][i]
      summary[f"sampling_speedup_unpadded_n{int(n)}"] = bench[
        "sampling_speedup_unpadded_by_context"
      ][i]
      summary[f"padded_over_unpadded_time_n{int(n)}"] = bench[
        "padded_over_unpadded_time_by_context"
      ][i]
      summary[f"memory_ratio_n{int(n)}"] = bench["memory_ratio_by_context"][i]
    summary["sampling_speedup"] = bench["sampling_speedup"]
    summary["sampling_speedup_unpadded"] = bench["sampling_speedup_unpadded"]
    summary["speedup_grows_with_n"] = bool(
      np.all(np.diff(bench["sampling_speedup_unpadded_by_context"]) > 0)
    )
  return summary


def _benchmark_table(config, bench) -> str:
  b = config.benchmark
  rows = [
    {
      "N": int(n),
      "buffer s": tb,
      "re-encode padded s": tr,
      "re-encode unpadded s": tu,
      "speedup vs padded": tr / tb,
      "speedup vs unpadded": tu / tb,
      "padded / unpadded time": tr / tu,
      "padded / unpadded tokens": kp / ku,
      "buffer peak MB": mb / 1e6,
      "padded peak MB": mr / 1e6,
      "unpadded peak MB": mu / 1e6,
      "memory ratio padded / unpadded": f"{mr / mb:.1f} / {mu / mb:.1f}",
      "linear model B(N+K)/(N+BK)": lin,
    }
    for n, tb, tr, tu, kp, ku, mb, mr, mu, lin in zip(
      bench["context_sizes"],
      bench["sampling_time_buffer_s"],
      bench["sampling_time_reencode_s"],
      bench["sampling_time_reencode_unpadded_s"],
      bench["reencode_tokens_padded"],
      bench["reencode_tokens_unpadded"],
      bench["peak_bytes_buffer"],
      bench["peak_bytes_reencode"],
      bench["peak_bytes_reencode_unpadded"],
      bench["memory_ratio_linear_model"],
      strict=True,
    )
  ]
  head = (
    f"Joint sampling of B = {b.num_samples} streams x M = {b.num_targets} targets (K = "
    f"{config.model.max_buffer}), compiled, median of {b.repeats} runs of every sampler timed in "
    "alternation; re-encoding padded: every step N + M tokens per stream (one scanned step); "
    "unpadded: step k has N + k tokens (steps unrolled, each compiled for its length); peak = XLA "
    "temp buffers."
  )
  return head + "\n\n" + markdown_table(rows)


def _figure(config, results, bench):
  fig, axes = figure_grid(3, 3, figsize=(13, 10.5))
  gp, saw = task_results(results, "gp"), task_results(results, "sawtooth")
  panels = (
    (axes[0, 0], "(a) joint LL of held-out GP tasks", gp and (lambda ax: _ll_bars(ax, config, gp))),
    (axes[0, 1], "(b) joint LL by GP lengthscale", gp and (lambda ax: _ll_by_lengthscale(ax, gp))),
    (
      axes[0, 2],
      "(c) GP K ablation: re-encode every K",
      gp and (lambda ax: _k_ablation(ax, config, gp, bench)),
    ),
    (
      axes[2, 0],
      "(g) joint LL of held-out sawtooth tasks",
      saw and (lambda ax: _ll_bars(ax, config, saw, "sawtooth")),
    ),
    (
      axes[2, 1],
      "(h) sawtooth K ablation: re-encode every K",
      saw and (lambda ax: _k_ablation(ax, config, saw, None)),
    ),
  )
  for ax, title, draw in panels:
    if draw:
      draw(ax)
      ax.set_title(title, fontsize=9)
    else:
      ax.set_axis_off()
  if bench is not None:
    _benchmark_panels(list(axes[1]) + [axes[2, 2]], bench)
  else:
    for ax in list(axes[1]) + [axes[2, 2]]:
      ax.set_axis_off()
  fig.tight_layout()
  return fig


def _ll_bars(ax, config, results, task: str = "gp"):
  bound_key = ORACLES[task][1]
  keys = [(k, label) for k, label in _methods(config, task) if k != bound_key]
  means = [np.mean(_values(results, f"ll_{k}")) for k, _ in keys]
  errors = [np.std(_values(results, f"ll_{k}")) for k, _ in keys]
  ax.barh(range(len(keys)), means, xerr=errors, color="C0")
  ax.set_yticks(range(len(keys)), [label for _, label in keys], fontsize=7)
  bound = np.mean(_values(results, f"ll_{bound_key}"))
  ax.axvline(bound, color="k", ls="--", label=dict(ORACLES[task][0])[bound_key])
  ax.set_xlim(min(means) - 0.2, max(bound, max(means)) + 0.1)
  ax.set_xlabel("joint log-likelihood / target (nats)")
  ax.legend(fontsize=7, loc="lower right")


def _ll_by_lengthscale(ax, results):
  arms = list(results.values())
  centers = np.asarray(arms[0]["lengthscale_bin_centers"])
  lines = (
    ("marginal", "C0o-"),
    ("reencode", "C1s-"),
    ("buffer", "C2^-"),
    ("oracle", "k--"),
    ("oracle_marginal", "k:"),
  )
  for name, style in lines:
    if f"ll_{name}_by_lengthscale" not in arms[0]:
      continue
    values = np.mean([np.asarray(r[f"ll_{name}_by_lengthscale"]) for r in arms], axis=0)
    ax.plot(centers, values, style, label=name)
  ax.set_xlabel("GP lengthscale")
  ax.set_ylabel("joint LL / target")
  ax.legend(fontsize=7)


def _k_ablation(ax, config, results, bench):
  k = config.model.max_buffer
  sizes = sorted({1, k, *config.eval.buffer_sizes})
  key = lambda s: "reencode" if s == 1 else ("buffer" if s == k else f"buffer_k{s}")  # noqa: E731
  ll = [np.mean(_values(results, f"ll_{key(s)}")) for s in sizes]
  ax.plot(sizes, ll, "C2o-", label="joint LL")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("buffer size K (re-encode every K targets)")
  ax.set_ylabel("joint LL / target", color="C2")
  if bench is not None and "ablation_buffer_sizes" in bench:
    twin = ax.twinx()
    twin.plot(bench["ablation_buffer_sizes"], bench["sampling_time_by_buffer_size_s"], "C3s--")
    twin.set_yscale("log")
    twin.set_ylabel(f"sampling time at N={config.benchmark.ablation_context} (s)", color="C3")


def _benchmark_panels(axes, bench):
  """(d) time, (e) memory, (f) re-encoding / buffer ratios, (i) padded / unpadded re-encoding."""
  n = np.asarray(bench["context_sizes"])
  series = (
    ("reencode", "C1s-", "re-encoding, padded"),
    ("reencode_unpadded", "C1s:", "re-encoding, unpadded"),
    ("buffer", "C2^-", "buffer"),
  )
  for key, style, label in series:
    axes[0].loglog(n, bench[f"sampling_time_{key}_s"], style, label=label)
    axes[1].loglog(n, np.asarray(bench[f"peak_bytes_{key}"]) / 1e6, style, label=label)
  axes[0].set(xlabel="context size N", ylabel="joint sampling time (s)")
  axes[1].set(xlabel="context size N", ylabel="peak activation memory (MB)")
  axes[2].loglog(n, bench["sampling_speedup_by_context"], "C3o-", label="time, padded")
  axes[2].loglog(n, bench["sampling_speedup_unpadded_by_context"], "C3o:", label="time, unpadded")
  axes[2].loglog(n, bench["memory_ratio_by_context"], "C4s-", label="memory, padded")
  axes[2].loglog(n, bench["memory_ratio_unpadded_by_context"], "C4s:", label="memory, unpadded")
  axes[2].loglog(n, bench["memory_ratio_linear_model"], "k:", label="B(N+K)/(N+BK)")
  axes[2].set(xlabel="context size N", ylabel="re-encoding / buffer")
  tokens = np.asarray(bench["reencode_tokens_padded"]) / np.asarray(
    bench["reencode_tokens_unpadded"]
  )
  axes[3].plot(n, bench["padded_over_unpadded_time_by_context"], "C1o-", label="time")
  axes[3].plot(n, tokens, "k:", label="tokens M(N+M) / sum_k (N+k)")
  axes[3].set(xscale="log", xlabel="context size N", ylabel="padded / unpadded re-encoding")
  titles = (
    "(d) joint sampling time",
    "(e) peak activation memory",
    "(f) re-encoding / buffer",
    "(i) re-encoding: padded / unpadded",
  )
  for ax, title in zip(axes, titles, strict=True):
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
