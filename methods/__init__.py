"""The registry: `config.method` -> the paper's `Method` (see `methods/base.py` for the protocol).

Each entry names a module of this package that defines `METHOD`; modules are imported on first use
so one method's dependencies never slow down another's launch.
"""

import importlib

from methods.base import ConfigError, Method

_MODULES = {
  "quant_diffusion": "methods.quant_diffusion",
  "bwcache": "methods.bwcache",
  "fgl": "methods.fgl",
  "dcd_ssm": "methods.dcd_ssm",
  "kernel_ppo": "methods.kernel_ppo",
  "w2s": "methods.w2s",
  "frontdoor": "methods.frontdoor",
  "lm": "methods.lm",
  "sgd_porous": "methods.sgd_porous",
  "dgn_snn": "methods.dgn_snn",
  "if_mml": "methods.if_mml",
  "dlm_revision": "methods.dlm_revision",
  "ar_buffer": "methods.ar_buffer",
  "fastmix": "methods.fastmix",
  "token_guard": "methods.token_guard",
  "causal_delta": "methods.causal_delta",
  "flow2gan": "methods.flow2gan",
  "lightctrl": "methods.lightctrl",
  "marc": "methods.marc",
  "rwom": "methods.rwom",
}


def register(name: str, module: str) -> None:
  """Adds `module` (which defines `METHOD`) under `name`; for methods that live outside this package."""
  _MODULES[name] = module


def known_methods() -> list[str]:
  return sorted(_MODULES)


def get_method(name: str) -> Method:
  """The registered method called `name`; an unknown name fails listing the known ones."""
  if name not in _MODULES:
    raise ConfigError(
      f"config.method: unknown method {name!r}; known methods: {', '.join(known_methods())}"
    )
  method = importlib.import_module(_MODULES[name]).METHOD
  if method.name != name:
    raise RuntimeError(f"{_MODULES[name]}.METHOD is named {method.name!r}, registered as {name!r}")
  return method
