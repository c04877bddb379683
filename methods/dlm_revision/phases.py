"""The phases of the DLM-revision method: E1 (separation), E2 (space), E3 (train, sampling).

The experiments live in `theory.py` (E1, E2: exact programs and learned transition models) and
`learned.py` (E3: the masked-diffusion LM and its samplers); this module lists the phases that
`config.experiments` asks for.
"""

from __future__ import annotations

import functools

import jax
import ml_collections

from methods.base import Phase
from methods.dlm_revision import learned, theory


def _stateless(rng, inputs):
  del inputs
  return {"rng": jax.random.key_data(rng)}


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  out = []
  if "separation" in config.experiments:
    out.append(
      Phase(
        name="separation",
        num_steps=0,
        init=_stateless,
        evaluate=lambda state, rng, inputs: theory.separation_evaluate(config, rng),
      )
    )
  if "space" in config.experiments:
    out.append(
      Phase(
        name="space",
        num_steps=config.space.train_steps if theory.space_learned_keys(config) else 0,
        init=functools.partial(theory.space_init, config),
        step=functools.partial(theory.space_step, config),
        evaluate=lambda state, rng, inputs: theory.space_evaluate(config, state, rng),
      )
    )
  if "learned" in config.experiments:
    out += [
      Phase(
        name="train",
        num_steps=config.steps,
        init=functools.partial(learned.train_init, config),
        step=functools.partial(learned.train_step, config),
        data=lambda inputs: learned.train_data(config),
        evaluate=lambda state, rng, inputs: learned.train_evaluate(config, state, rng),
        outputs=lambda state, inputs: state["params"],
      ),
      Phase(
        name="sampling",
        num_steps=0,
        init=_stateless,
        evaluate=lambda state, rng, inputs: learned.sampling_evaluate(config, inputs["train"], rng),
        artifacts=lambda state, rng, inputs: learned.sampling_figure(config),
      ),
    ]
  return out
