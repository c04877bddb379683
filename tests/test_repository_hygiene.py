"""The repository cites only what its readers have: papers, official code and its own files.

Docstrings, comments and docs must not point at design notes that are not in the repository (a
"spec" file, a `shared/specs/` folder, "spec Sec. 4") nor at a path of one machine (`/work/...`,
`/home/<user>/...`). The patterns below are narrow on purpose: the word "spec" in its ordinary
senses (JAX's `PartitionSpec`, a Pallas `BlockSpec`, an `EnvSpec`, `fsdp_spec`, `find_spec`,
a variable named `spec`) does not trip them.
"""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A reference to a specification document that is not part of the repository.
_SPEC = r"\bspecs?\b"
SPEC_REFERENCES = {
  "a specs folder": re.compile(r"\bspecs/"),
  "a shared note outside the repository": re.compile(
    r"\.\./shared/|\bshared/(?:specs|seeds)\b|\bSTYLE_ANCHORS\b|\bSTYLE\.md\b"
  ),
  "a spec file (.md) named next to 'spec'": re.compile(
    _SPEC + r"[^\n]{0,30}?[\w-]+\.md\b|\b[\w-]+\.md\b[^\n]{0,12}?" + _SPEC, re.IGNORECASE
  ),
  "a section of a spec": re.compile(
    _SPEC + r"(?:'s)?,?\s*\(?\s*(?:Sec\b|§|sections?\b|E\d\b)"
    r"|(?:\bSec\.|§|\bsection)\s*[\d.]+,?\s+of\s+the\s+spec\b",
    re.IGNORECASE,
  ),
  # `(spec: SamplerSpec, ...)` is a typed parameter, not a citation.
  "'Spec:' as a citation": re.compile(
    r"\bSpec:(?!\s*[A-Za-z_][\w.]*(?:\[[^\]]*\])?\s*(?:[,)=]|$))"
    r"|(?i:(?:\(|#)\s*spec:(?!\s*[A-Za-z_][\w.]*(?:\[[^\]]*\])?\s*(?:[,)=]|$)))"
  ),
  "a spec as the source of a claim": re.compile(
    r"(?i:\b(?:the|this|our)\s+spec(?:'s\b|\s+(?:says|predicts|grid|DGP|expectations?|formula|table)\b))"
    r"|\b[A-Z]{2,}\w*\s+spec\b|\s\(spec\)",
  ),
}
# An absolute path of one machine.
MACHINE_PATHS = {
  "an absolute path of a machine": re.compile(
    r"(?<![\w.~-])/(?:work|root)/|(?<![\w.~-])/home/[\w.-]+/|(?<![\w.~-])/Users/"
  ),
}
PATTERNS = {**SPEC_REFERENCES, **MACHINE_PATHS}
# Every pattern needs one of these words (none holds a space, so none spans two joined lines): a
# line without one is skipped before the slow patterns run.
_TRIGGER = re.compile(r"spec|shared/|STYLE|/work/|/root/|/home/|/Users/", re.IGNORECASE)
# This file spells the patterns out.
EXEMPT = {pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()}


def tracked_text_files() -> list[str]:
  try:
    listing = subprocess.run(
      ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout: no list of tracked files")
  return [name for name in listing.split("\0") if name and name not in EXEMPT]


def _match(text: str) -> str | None:
  if not _TRIGGER.search(text):
    return None
  return next((what for what, pattern in PATTERNS.items() if pattern.search(text)), None)


def offending_lines(names) -> list[str]:
  """`path:line: what: text` for every line of `names` that matches a pattern, alone or joined with
  the next line (a reference wrapped across two lines is reported at its first)."""
  found = []
  for name in names:
    path = ROOT / name
    if not path.is_file():
      continue
    try:
      lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
      continue  # binary
    for index, line in enumerate(lines):
      what = _match(line)
      if what is None and index + 1 < len(lines) and _match(lines[index + 1]) is None:
        what = _match(line.rstrip() + " " + lines[index + 1].strip())
      if what is not None:
        found.append(f"{name}:{index + 1}: {what}: {line.strip()[:120]}")
  return found


CAUGHT = [
  "Spec `w2s_spurious.md`; method `methods/w2s.py`.",
  "graphs and matches them on homophilous ones (spec ../shared/specs/fgl_forest.md).",
  "  gpu      paper scale (spec Sec. 10): d_model 128",
  "  study     the spec's §6 at CPU scale",
  "  # (kind, layers) columns: the spec's E2 models",
  "Empirically (Sec. 5 of the spec) training finds",
  "Paper (spec: `/work/shared/specs/quant_diffusion.md`).",
  "  config.data.avg_degree = 8.0  # m = avg_degree * n / 2 (spec: m ~ 4n)",
  "Forward process `x_t = x_0 + t * eps` (QDPM spec, Sec. 1).",
  "Rectified flow (BWCache spec Sec. 3): `x_t = (1 - t) x_0 + t eps`",
  "delta 5). The spec's delta grid stops at 1",
  '  """The spec\'s expectations, as measured (not asserted)."""',
  "  config.head_batch_size = 0  # 0: full batch (spec); else minibatches",
  "computed by two sweeps over the tree (FGL, spec\nSec. 2.4, Theorem 1 / Eq. 7-8 with W_A = I)",
  "see /home/alice/notes.txt",
  "    # on CPU, STYLE_ANCHORS 4.1), and a larger step",
  "cache at /Users/bob/cache",
]


@pytest.mark.parametrize("line", CAUGHT)
def test_the_patterns_catch_references_to_absent_notes(line, tmp_path, monkeypatch):
  (tmp_path / "notes.py").write_text(line + "\n", encoding="utf-8")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
  assert [found.split(":")[1] for found in offending_lines(["notes.py"])] == ["1"], line


def test_every_pattern_has_a_caught_example():
  """The caught lines pass `_TRIGGER`'s shortcut: a pattern with one of them is not hidden by it."""
  for what, pattern in PATTERNS.items():
    assert any(pattern.search(line) for line in CAUGHT), what


@pytest.mark.parametrize(
  "line",
  [
    "from jax.sharding import PartitionSpec as P",
    "  feature_spec = pl.BlockSpec((1, layout.tile, layout.width), lambda n, r: (n, r, 0))",
    "    in_specs=[feature_spec, feature_spec],",
    "  spec: rl.EnvSpec",
    "  env, params, spec = rl.make_env(name)",
    "  specs = [s.spec for s in jax.tree.leaves(shardings)]",
    '  assert any("data" in spec for spec in specs), "FSDP must shard some leaves"',
    "  assert sharding.fsdp_spec((64, 512), 4, 1024) == P(None, 'data')",
    '  importlib.util.find_spec(m) is not None for m in ("econml", "doubleml")',
    "  self.phase, self.spec = phase, None",
    "the logistic nuisances are correctly specified for this DGP",
    "a special case of the spectral norm, as specified",
    "  env_params: Any\n  spec: rl.EnvSpec",
    "def _round(spec: SamplerSpec, logits_fn, blocks, num_rounds):",
    "def sample(spec: Spec = DEFAULT) -> None:",
    "  python experiments/train.py --workdir=/runs/qdpm_gpu --config.data.data_dir=/data/tfds",
    "see https://example.org/work/paper.pdf and runs/work/x",
    "The method page is docs/methods/w2s.md; results in docs/results.md.",
  ],
)
def test_the_patterns_leave_ordinary_words_alone(line, tmp_path, monkeypatch):
  (tmp_path / "code.py").write_text(line + "\n", encoding="utf-8")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
  assert offending_lines(["code.py"]) == [], line


def test_no_tracked_file_cites_absent_notes_or_machine_paths():
  found = offending_lines(tracked_text_files())
  assert not found, (
    f"{len(found)} line(s) cite notes outside the repository or a machine path; cite the paper "
    "(title, arXiv/OpenReview id, section, equation), the official code (repository and file) or "
    "a file of this repository instead:\n" + "\n".join(found)
  )


# ---------------------------------------------------------------------------------------------------
# Layers: core and kernels at the bottom, methods above them, experiments (the launchers) on top
# ---------------------------------------------------------------------------------------------------

LAYERS = ("core", "kernels", "methods", "experiments")
# What each layer may not import, anywhere in a file (lazy imports inside functions included).
FORBIDDEN = {
  "core": {"methods", "experiments", "configs"},
  "kernels": {"methods", "experiments", "configs"},
  "methods": {"experiments"},
}


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: pathlib.Path, known: set[str]) -> set[str]:
  """The project's modules `path` imports: `import a.b`, `from a.b import c` (the submodule `a.b.c` when
  it is a file, else `a.b`), relative imports resolved, lazy imports inside functions included."""
  import ast

  package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)
  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, *([base] if base else [])])
      for alias in node.names:
        found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
  return {name for name in found if name.split(".")[0] in LAYERS}


def project_import_graph() -> dict[str, set[str]]:
  files = [p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))]
  known = {_module_name(p) for p in files}
  return {_module_name(p): _imported_modules(p, known) & known for p in files}


def test_no_layer_imports_a_layer_above_it():
  graph = project_import_graph()
  found = [
    f"{module} imports {target}"
    for module, targets in graph.items()
    for target in sorted(targets)
    if target.split(".")[0] in FORBIDDEN.get(module.split(".")[0], ())
  ]
  assert not found, (
    "core/ and kernels/ import neither methods/ nor experiments/, and methods/ never imports "
    "experiments/ (study tables and figures: methods/base.py):\n" + "\n".join(found)
  )


def _circles_within_packages(graph: dict[str, set[str]]) -> list[list[str]]:
  """Every cycle of imports between files of one package (a folder), each once."""
  circles, seen = [], set()

  def package(module: str) -> str:
    return module if (ROOT / module.replace(".", "/")).is_dir() else module.rpartition(".")[0]

  def visit(path: list[str]) -> None:
    for target in sorted(graph.get(path[-1], ())):
      if package(target) != package(path[0]) or target.endswith(".__init__"):
        continue
      if target == path[0]:
        key = frozenset(path)
        if key not in seen:
          seen.add(key)
          circles.append([*path, target])
      elif target not in path and target > path[0]:
        visit([*path, target])

  for module in sorted(graph):
    visit([module])
  return circles


def test_no_file_of_a_package_imports_itself_through_a_circle():
  graph = project_import_graph()
  circles = _circles_within_packages(graph)
  assert not circles, (
    "files of one package import each other in a circle; move what both need to a module below "
    "both:\n" + "\n".join(" -> ".join(c) for c in circles)
  )


def test_the_layer_checks_see_lazy_imports_and_circles(tmp_path, monkeypatch):
  """The two checks above on a tree made to break both rules with imports inside functions."""
  for layer in LAYERS:
    (tmp_path / layer).mkdir()
    (tmp_path / layer / "__init__.py").write_text("")
  (tmp_path / "methods" / "pkg").mkdir()
  (tmp_path / "methods" / "pkg" / "__init__.py").write_text("from methods.pkg.a import f\n")
  (tmp_path / "methods" / "pkg" / "a.py").write_text("def f():\n  from methods.pkg import b\n")
  (tmp_path / "methods" / "pkg" / "b.py").write_text("from . import a\n")
  (tmp_path / "core" / "x.py").write_text("def g():\n  import experiments.loop\n")
  (tmp_path / "experiments" / "loop.py").write_text("")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
  graph = project_import_graph()
  assert graph["core.x"] == {"experiments.loop"}
  assert _circles_within_packages(graph) == [["methods.pkg.a", "methods.pkg.b", "methods.pkg.a"]]
