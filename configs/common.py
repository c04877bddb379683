"""Pieces every config shares."""

import ml_collections


def loop_config(
  log_every: int = 100, checkpoint_every: int = 500, max_to_keep: int = 2
) -> ml_collections.ConfigDict:
  """The shared loop's knobs: metrics/progress interval, checkpoint interval, checkpoints kept."""
  return ml_collections.ConfigDict(
    {"log_every": log_every, "checkpoint_every": checkpoint_every, "max_to_keep": max_to_keep}
  )


def add_parallelism(config: ml_collections.ConfigDict, sharding: str = "replicate") -> None:
  """`config.mesh`: `(axis, size)` pairs, one size -1 filling the devices; the batch is split over
  "data". `config.sharding`: "replicate" the state, or "fsdp" (leaves of >= `fsdp_min_size` elements
  split over "data")."""
  config.mesh = (("data", -1),)
  config.sharding = sharding
  config.fsdp_min_size = 2**14


def parse_variant(arg: str | None, known: tuple[str, ...]) -> str:
  """The variant named after `:` in `--config=configs/x.py:variant` (default "default")."""
  variant = arg or "default"
  if variant not in known:
    raise ValueError(f"unknown config variant {variant!r}; known variants: {', '.join(known)}")
  return variant
