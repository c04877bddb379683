"""Checks that a paper-scale dataset or weight file was prepared where a config says it is.

Nothing is downloaded at run time: paper-scale variants read tfds datasets from a prepared `data_dir`
and weights from files. These functions say, before anything compiles, what is missing and how to
prepare it; they return a message (None when all is in place) and raise nothing.
"""

from __future__ import annotations


def tfds_build_command(name: str) -> str:
  """The command that prepares `name` for random access (`tfds.data_source` needs array_record)."""
  return f"tfds build {name} --file_format=array_record --data_dir=DIR"


def tfds_dataset_problem(name: str, data_dir: str) -> str | None:
  """Why the tfds dataset `name` (`"celeb_a"`, `"cifar10:3.0.2"`, `"so2sat/all"`) cannot be read from
  `data_dir` without downloading, or None. Local and remote (gs://) folders both work."""
  import tensorflow_datasets as tfds

  if not data_dir:
    return "not set"
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    return f"tfds knows no dataset {name!r}"
  info = builder.data_path / "dataset_info.json"
  if not info.exists():
    return f"no prepared tfds dataset {name!r} in {data_dir!r} (looked for {info})"
  file_format = str(getattr(builder.info.file_format, "value", builder.info.file_format))
  if file_format != "array_record":
    return f"{name!r} in {data_dir!r} is stored as {file_format}; random access needs array_record"
  return None


def file_problem(path: str) -> str | None:
  """Why `path` cannot be read as a file, or None."""
  from etils import epath

  if not path:
    return "not set"
  if not epath.Path(path).is_file():
    return f"no file at {path!r}"
  return None
