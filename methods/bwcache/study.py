"""BWCache's study: one arm (the cache phase sweeps every caching arm); the report compares the BWCache
frontier with uniform step reduction's (PSNR / SSIM against computed steps and against measured wall
time, 95% intervals over noise seeds), per region of computed steps, and tabulates the rule's readings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from methods.base import Report, figure_grid
from methods.bwcache.phases import READINGS, grid_key, validation_key

COLUMNS = (
  "arm",
  "delta",
  "R",
  "W",
  "computed_steps",
  "psnr_db",
  "psnr_lo",
  "psnr_hi",
  "ssim",
  "ssim_lo",
  "ssim_hi",
  "reuse_rate",
  "wall_ratio",
  "speedup_flops",
  "uniform_envelope_db",
  "verdict",
)

# Regions of the frontier by computed steps (of 30): light reuse, medium, heavy.
REGIONS = (("light", 25.0, math.inf), ("medium", 20.0, 25.0), ("heavy", 0.0, 20.0))


def study_arms(config):
  return [("bwcache", config)]


def _arm(r: Mapping[str, float], prefix: str) -> dict:
  return {k[len(prefix) + 1 :]: v for k, v in r.items() if k.startswith(prefix + "/")}


def uniform_frontier(config, r: Mapping[str, float]) -> dict[int, dict]:
  """Uniform step reduction per step count, the uncached sampler itself at `cache.num_steps`."""
  frontier = {n: _arm(r, f"uniform/steps_{n}") for n in config.cache.frontier_steps}
  if frontier:  # the reference itself: exact, so no reusing arm at its cost can beat it
    exact = {"psnr": math.inf, "psnr_lo": math.inf, "psnr_hi": math.inf}
    frontier[config.cache.num_steps] = {**exact, "computed_steps": config.cache.num_steps}
    frontier[config.cache.num_steps]["wall_ratio"] = 1.0
  return frontier


def envelope(frontier: Mapping[int, dict], budget: float, axis: str = "computed_steps") -> dict:
  """The best uniform arm (highest mean PSNR) costing at most `budget` on `axis` (computed steps:
  at most ceil(budget), so a fractional mean over seeds is compared with the next step count up)."""
  limit = math.ceil(budget - 1e-9) if axis == "computed_steps" else budget
  within = [v for v in frontier.values() if v[axis] <= limit]
  return max(within, key=lambda v: v["psnr"]) if within else {}


def verdict(arm: Mapping[str, float], best: Mapping[str, float]) -> str:
  """Verdict "above" / "below" when the 95% intervals of the arm and the uniform envelope do not overlap."""
  if not best:
    return "no uniform arm"
  if arm["psnr_lo"] > best["psnr_hi"]:
    return "above"
  if arm["psnr_hi"] < best["psnr_lo"]:
    return "below"
  return "overlap"


def bwcache_arms(config, r: Mapping[str, float]) -> list[dict]:
  """Every grid arm with its (delta, R, W) and metrics."""
  arms = []
  for warmup in config.cache.warmups:
    for delta in config.cache.deltas:
      for reuse in config.cache.reuse_steps:
        arm = _arm(r, grid_key(delta, reuse, warmup))
        arms.append({**arm, "delta": delta, "R": reuse, "W": warmup})
  return arms


def region_summary(config, r: Mapping[str, float]) -> dict[str, float]:
  """Per region of computed steps: how many reusing BWCache arms lie above, inside or below the
  uniform envelope's interval, the best BWCache PSNR there and the envelope's at the same cost."""
  frontier = uniform_frontier(config, r)
  summary = {}
  for region, low, high in REGIONS:
    arms = [
      a
      for a in bwcache_arms(config, r)
      if a["reuse_rate"] > 0 and low <= a["computed_steps"] < high
    ]
    verdicts = [verdict(a, envelope(frontier, a["computed_steps"])) for a in arms]
    for name in ("above", "overlap", "below"):
      summary[f"{region}/arms_{name}"] = verdicts.count(name)
    if arms:
      best = max(arms, key=lambda a: a["psnr"])
      summary[f"{region}/best_bwcache_psnr"] = best["psnr"]
      summary[f"{region}/best_bwcache_steps"] = best["computed_steps"]
      summary[f"{region}/uniform_envelope_psnr"] = envelope(frontier, best["computed_steps"]).get(
        "psnr", math.nan
      )
  return summary


def _rows(config, r: Mapping[str, float]) -> list[dict]:
  frontier = uniform_frontier(config, r)
  rows = []
  for n in config.cache.frontier_steps:
    rows.append({"arm": f"uniform {n} steps", **_metric_cells(frontier[n])})
  for a in bwcache_arms(config, r):
    best = envelope(frontier, a["computed_steps"]) if a["reuse_rate"] > 0 else {}
    rows.append(
      {
        "arm": "BWCache",
        "delta": a["delta"],
        "R": a["R"],
        "W": a["W"],
        **_metric_cells(a),
        "uniform_envelope_db": best.get("psnr"),
        "verdict": verdict(a, best) if best else None,
      }
    )
  if config.cache.compare_readings:
    for name in READINGS:
      a = _arm(r, f"reading/{name}")
      rows.append(
        {
          "arm": f"reading {name}",
          "delta": config.cache.reading_delta,
          "R": config.cache.reading_reuse,
          **_metric_cells(a),
        }
      )
  rows += _baseline_rows(r)
  return [{k: row.get(k) for k in COLUMNS} for row in rows]


def _metric_cells(a: Mapping[str, float]) -> dict:
  return {
    "computed_steps": a["computed_steps"],
    "psnr_db": a["psnr"],
    "psnr_lo": a["psnr_lo"],
    "psnr_hi": a["psnr_hi"],
    "ssim": a["ssim"],
    "ssim_lo": a["ssim_lo"],
    "ssim_hi": a["ssim_hi"],
    "reuse_rate": a.get("reuse_rate"),
    "wall_ratio": a.get("wall_ratio"),
    "speedup_flops": a.get("speedup_flops"),
  }


def _baseline_rows(r: Mapping[str, float]) -> list[dict]:
  return [
    {
      "arm": f"step reduction to the headline's {r['step_reduction_steps']:.0f} steps",
      "psnr_db": r["step_reduction_psnr"],
      "ssim": r["step_reduction_ssim"],
      "computed_steps": r["step_reduction_steps"],
    },
    {
      "arm": "fixed-interval reuse",
      "psnr_db": r["fixed_interval_psnr"],
      "reuse_rate": r["fixed_interval_reuse_rate"],
    },
    {
      "arm": "TeaCache-style",
      "psnr_db": r["teacache_psnr"],
      "reuse_rate": r["teacache_reuse_rate"],
      "wall_ratio": 1.0 / r["teacache_speedup_wall"],
    },
  ]


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  """Rows: uniform step reduction per step count, BWCache over delta x R x W (with the uniform
  envelope at its cost and the verdict), the readings, then the other baselines; summary: the
  headline arm, the per-region comparison and the readings' reuse at the paper's delta 0.25;
  figures: the frontiers and PSNR / reuse rate against delta."""
  r = results["bwcache"]
  summary = {
    k: r[k]
    for k in (
      "psnr_vs_uncached",
      "reuse_rate",
      "speedup_wall",
      "speedup_flops",
      "step_reduction_psnr",
      "reuse_in_protected_tail",
      "indicator_overhead",
      validation_key(config),
    )
  }
  figures = {"psnr_and_reuse_vs_delta": _delta_figure(config, r)}
  if config.cache.frontier_steps:
    summary.update(region_summary(config, r))
    figures["frontier"] = frontier_figure(config, r)
  if config.cache.compare_readings:
    for name in READINGS:
      summary[f"reading/{name}/reuse_rate"] = r[f"reading/{name}/reuse_rate"]
  notes = (
    "Intervals: 95% Student-t over noise seeds. uniform_envelope_db: the best uniform step "
    "reduction at no more computed steps (ceil of the arm's mean); verdict: above / below when the "
    "two intervals do not overlap."
  )
  return Report(rows=_rows(config, r), summary=summary, figures=figures, notes=notes)


def frontier_figure(config, r: Mapping[str, float]):
  """PSNR and SSIM against computed steps and PSNR against measured wall time (relative to the
  uncached sampler): uniform step reduction as a line with its 95% band, BWCache arms as points with
  95% error bars (colour: R, marker: warm-up W); arms that reuse nothing are left out (exact)."""
  fig, (axes,) = figure_grid(1, 3, figsize=(15, 4.2))
  frontier = uniform_frontier(config, r)
  uniform = [frontier[n] for n in config.cache.frontier_steps]
  panels = (("computed_steps", "psnr"), ("computed_steps", "ssim"), ("wall_ratio", "psnr"))
  for ax, (x, y) in zip(axes, panels, strict=True):
    xs = [u[x] for u in uniform]
    if x == "computed_steps":
      ax.plot(xs, [u[y] for u in uniform], color="gray", marker=".", label="uniform step reduction")
      lo, hi = [u[f"{y}_lo"] for u in uniform], [u[f"{y}_hi"] for u in uniform]
      ax.fill_between(xs, lo, hi, color="gray", alpha=0.25)
    else:  # measured times need not be ordered like the step counts: points, not a line
      ax.plot(xs, [u[y] for u in uniform], color="gray", marker="x", ls="none")
    for a in bwcache_arms(config, r):
      if a["reuse_rate"] <= 0:
        continue
      color = f"C{list(config.cache.reuse_steps).index(a['R'])}"
      marker = "osD^v"[list(config.cache.warmups).index(a["W"]) % 5]
      error = [[a[y] - a[f"{y}_lo"]], [a[f"{y}_hi"] - a[y]]]
      ax.errorbar(a[x], a[y], yerr=error, color=color, marker=marker, ms=4, lw=0.8, ls="none")
    ax.set_xlabel("computed steps" if x == "computed_steps" else "wall time / uncached")
    ax.set_ylabel("PSNR vs uncached (dB)" if y == "psnr" else "SSIM vs uncached")
  for reuse_index, reuse in enumerate(config.cache.reuse_steps):
    axes[0].plot([], [], color=f"C{reuse_index}", marker="o", ls="none", label=f"BWCache R={reuse}")
  for w_index, warmup in enumerate(config.cache.warmups):
    axes[0].plot([], [], color="k", marker="osD^v"[w_index % 5], ls="none", label=f"W={warmup}")
  axes[0].legend(fontsize=7)
  axes[0].set_title("fidelity against computed steps")
  axes[1].set_title("SSIM against computed steps")
  axes[2].set_title("fidelity against measured wall time")
  fig.tight_layout()
  return fig


def _delta_figure(config, r: Mapping[str, float]):
  """PSNR and reuse rate against delta for each R (warm-up 0)."""
  fig, (axes,) = figure_grid(1, 2, figsize=(9, 3.5))
  warmup = config.cache.warmups[0]
  for reuse in config.cache.reuse_steps:
    arms = [_arm(r, grid_key(d, reuse, warmup)) for d in config.cache.deltas]
    axes[0].plot(config.cache.deltas, [a["psnr"] for a in arms], marker="o", label=f"R={reuse}")
    axes[1].plot(
      config.cache.deltas, [a["reuse_rate"] for a in arms], marker="o", label=f"R={reuse}"
    )
  axes[0].axhline(r["step_reduction_psnr"], color="gray", ls="--", label="step reduction")
  finite = [a["psnr"] for a in bwcache_arms(config, r) if a["reuse_rate"] > 0]
  if finite:  # a run that reuses nothing matches the uncached output exactly (PSNR at its cap)
    axes[0].set_ylim(min(finite) - 5, max(finite) + 10)
  axes[0].set_xlabel("delta")
  axes[0].set_ylabel("PSNR vs uncached (dB; no reuse: off the top)")
  axes[1].set_xlabel("delta")
  axes[1].set_ylabel("reuse rate")
  axes[0].legend()
  axes[1].legend()
  fig.tight_layout()
  return fig
