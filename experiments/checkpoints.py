"""Orbax checkpoints of one phase: the state pytree plus a small JSON record (phase, step, data position).

Orbax writes each step to a temporary folder and renames it when complete, so a crash while saving
never leaves a step that `latest_step` would offer for restoring.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint that exists but cannot be restored into the configured state."""


class PhaseCheckpoints:
  """Save and restore `(state, record)` of one phase under `directory`."""

  def __init__(self, directory: str, max_to_keep: int):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state, record: dict) -> None:
    self._manager.save(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardSave(state), record=ocp.args.JsonSave(record)),
      force=True,
    )

  def restore(self, step: int, abstract_state):
    """Restores step `step` into the shapes, dtypes and shardings of `abstract_state`."""
    self._check_stored_shapes(step, abstract_state)
    try:
      restored = self._manager.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), record=ocp.args.JsonRestore()
        ),
      )
    except Exception as error:  # orbax raises many types; all mean the same thing here
      raise CheckpointError(
        f"cannot restore step {step} from {self.directory}: {type(error).__name__}: {error}"
      ) from error
    return restored.state, dict(restored.record)

  def _check_stored_shapes(self, step: int, abstract_state) -> None:
    """Names the first field whose stored shape or dtype differs from the configured state."""
    try:
      stored = ocp.StandardCheckpointer().metadata(os.path.join(self.directory, str(step), "state"))
      stored = _leaves_by_path(stored.item_metadata.tree)
    except Exception as error:
      raise CheckpointError(
        f"checkpoint step {step} in {self.directory} is unreadable: {error}"
      ) from error
    wanted = _leaves_by_path(abstract_state)
    for path in sorted(set(stored) | set(wanted)):
      if path not in stored or path not in wanted:
        where = "checkpoint" if path not in wanted else "configured state"
        raise CheckpointError(
          f"checkpoint step {step} in {self.directory}: field {'/'.join(path)} exists only in the {where}"
        )
      have, want = stored[path], wanted[path]
      if tuple(have.shape) != tuple(want.shape) or jax.numpy.dtype(have.dtype) != want.dtype:
        raise CheckpointError(
          f"checkpoint step {step} in {self.directory}: field {'/'.join(path)} is stored as "
          f"{have.dtype}{list(have.shape)}, the configured state wants {want.dtype}{list(want.shape)}"
        )

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


def _leaves_by_path(tree) -> dict[tuple[str, ...], object]:
  """Leaves keyed by their path as strings, so dicts, dataclasses and tuples of either side match."""
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
  return {tuple(_key_name(k) for k in path): leaf for path, leaf in leaves}


def _key_name(key) -> str:
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  return str(key)
