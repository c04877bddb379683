"""Pieces every config shares."""

import ml_collections


def loop_config(
  log_every: int = 100, checkpoint_every: int = 500, max_to_keep: int = 2
) -> ml_collections.ConfigDict:
  """The shared loop's knobs: metrics/progress interval, checkpoint interval, checkpoints kept."""
  return ml_collections.ConfigDict(
    {"log_every": log_every, "checkpoint_every": checkpoint_every, "max_to_keep": max_to_keep}
  )


def parse_variant(arg: str | None, known: tuple[str, ...]) -> str:
  """The variant named after `:` in `--config=configs/x.py:variant` (default "default")."""
  variant = arg or "default"
  if variant not in known:
    raise ValueError(f"unknown config variant {variant!r}; known variants: {', '.join(known)}")
  return variant
