"""BWCache's study: one arm (the cache phase already sweeps delta x R); the report's table of every
caching arm against the uncached sampler, its summary and the PSNR / reuse-rate figure."""

from __future__ import annotations

from collections.abc import Mapping

from experiments.reports import figure_grid
from methods.base import Report
from methods.bwcache.phases import validation_key

COLUMNS = (
  "arm",
  "delta",
  "R",
  "psnr_db",
  "ssim",
  "reuse_rate",
  "computed_steps",
  "speedup_flops",
  "speedup_wall",
)


def study_arms(config):
  return [("bwcache", config)]


def _grid_rows(config, r: Mapping[str, float]) -> list[dict]:
  rows = []
  for delta in config.cache.deltas:
    for reuse in config.cache.reuse_steps:
      key = f"grid/delta_{delta:g}/R_{reuse}"
      rows.append(
        {
          "arm": "BWCache",
          "delta": delta,
          "R": reuse,
          "psnr_db": r[f"{key}/psnr"],
          "ssim": r[f"{key}/ssim"],
          "reuse_rate": r[f"{key}/reuse_rate"],
          "computed_steps": r[f"{key}/computed_steps"],
          "speedup_flops": r[f"{key}/speedup_flops"],
          "speedup_wall": r[f"{key}/speedup_wall"],
        }
      )
  return rows


def _baseline_rows(r: Mapping[str, float]) -> list[dict]:
  return [
    {
      "arm": f"step reduction ({r['step_reduction_steps']:.0f} steps)",
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
      "speedup_wall": r["teacache_speedup_wall"],
    },
  ]


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  """Rows: BWCache over delta x R, then fewer steps, fixed-interval reuse and TeaCache-style; summary:
  the headline arm and the validation loss; figure: PSNR and reuse rate against delta."""
  r = results["bwcache"]
  rows = _grid_rows(config, r) + _baseline_rows(r)
  rows = [{k: row.get(k) for k in COLUMNS} for row in rows]
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
  return Report(rows=rows, summary=summary, figures={"psnr_and_reuse_vs_delta": _figure(config, r)})


def _figure(config, r: Mapping[str, float]):
  fig, (axes,) = figure_grid(1, 2, figsize=(9, 3.5))
  for reuse in config.cache.reuse_steps:
    keys = [f"grid/delta_{d:g}/R_{reuse}" for d in config.cache.deltas]
    axes[0].plot(
      config.cache.deltas, [r[f"{k}/psnr"] for k in keys], marker="o", label=f"R={reuse}"
    )
    axes[1].plot(
      config.cache.deltas, [r[f"{k}/reuse_rate"] for k in keys], marker="o", label=f"R={reuse}"
    )
  axes[0].axhline(r["step_reduction_psnr"], color="gray", ls="--", label="step reduction")
  finite = [
    r[f"grid/delta_{d:g}/R_{reuse}/psnr"]
    for d in config.cache.deltas
    for reuse in config.cache.reuse_steps
    if r[f"grid/delta_{d:g}/R_{reuse}/reuse_rate"] > 0
  ]
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
