"""Drivers that run a paper's official code from a checkout beside ours (`--official_repo`)."""


def interval(values, digits: int = 3) -> str:
  """`"mean ± half-width"` of a 95% Student-t interval over seeds; one value is printed alone, and
  non-finite values are left out and counted."""
  import numpy as np
  from scipy import stats

  values = np.asarray(values, np.float64)
  undefined = int(np.sum(~np.isfinite(values)))
  values = values[np.isfinite(values)]
  if not len(values):
    cell = "-"
  elif len(values) < 2:
    cell = f"{values.mean():.{digits}f}"
  else:
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    cell = f"{values.mean():.{digits}f} ± {half:.{digits}f}"
  return cell + (f" ({undefined} undefined)" if undefined else "")
