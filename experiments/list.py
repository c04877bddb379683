r"""Lists every registered method: its config variants and the claim its config states.

python -m experiments.list
"""

from __future__ import annotations

import importlib
import textwrap


def claim(module) -> str:
  """The first paragraph after "Claim" in a config's docstring, as one line."""
  doc = module.__doc__ or ""
  start = doc.find("Claim")
  if start < 0:
    return doc.strip().splitlines()[0] if doc.strip() else ""
  paragraph = doc[start:].split("\n\n")[0]
  return " ".join(paragraph.split()).removeprefix("Claim checked:").removeprefix("Claim:").strip()


def title(module) -> str:
  """The first paragraph of a config's docstring (the paper), as one line."""
  return " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())


def rows() -> list[tuple[str, str, tuple[str, ...], str]]:
  """(method, title, variants, claim) for every method of the registry with a config file."""
  import methods

  out = []
  for name in methods.known_methods():
    try:
      config = importlib.import_module(f"configs.{name}")
    except ModuleNotFoundError:
      continue
    out.append((name, title(config), tuple(getattr(config, "VARIANTS", ())), claim(config)))
  return out


def main() -> None:
  for name, heading, variants, text in rows():
    print(f"{name}  [{', '.join(variants)}]")
    print(textwrap.fill(heading, 100, initial_indent="  ", subsequent_indent="  "))
    print(textwrap.fill(text, 100, initial_indent="  claim: ", subsequent_indent="    "))
    print(f"  python experiments/train.py --config=configs/{name}.py\n")


if __name__ == "__main__":
  main()
