"""The artifacts a run or study writes: GIF clips (core/data/gif.py) through `reports.write_artifact`."""

import numpy as np
import pytest
from PIL import Image

from core.data import gif
from experiments import reports
from methods.base import Report


def _frames_of(path: str) -> list[np.ndarray]:
  frames = []
  with Image.open(path) as image:
    for i in range(image.n_frames):
      image.seek(i)
      frames.append(np.asarray(image.convert("RGB")))
  return frames


def test_video_clips_are_written_as_one_gif_per_clip(tmp_path):
  rng = np.random.default_rng(0)
  levels = np.linspace(0.0, 1.0, 5)  # GIF palettes hold these greys exactly
  clips = {
    "rgb": levels[rng.integers(0, 5, size=(4, 6, 5, 3))],
    "grey": levels[rng.integers(0, 5, size=(3, 6, 5))],
  }
  reports.write_artifact(str(tmp_path), "clips", gif.VideoClips(clips, fps=10.0, scale=2))
  rgb = _frames_of(str(tmp_path / "clips" / "rgb.gif"))
  grey = _frames_of(str(tmp_path / "clips" / "grey.gif"))
  assert len(rgb) == 4 and len(grey) == 3
  assert rgb[0].shape == (12, 10, 3)
  expected = gif.to_uint8_frames(clips["grey"])[1].repeat(2, 0).repeat(2, 1)
  np.testing.assert_array_equal(grey[1], expected)
  with Image.open(tmp_path / "clips" / "rgb.gif") as image:
    assert image.info["duration"] == 100 and image.info["loop"] == 0


def test_study_reports_write_clips_among_their_figures(tmp_path):
  clip = np.zeros((2, 4, 4, 3))
  report = Report(rows=[{"arm": "a", "x": 1.0}], figures={"frames": gif.VideoClips({"a": clip})})
  reports.write_report(str(tmp_path), report, {"a": {"x": 1.0}})
  assert (tmp_path / "frames" / "a.gif").exists() and (tmp_path / "results.md").exists()


@pytest.mark.parametrize(
  "frames, message",
  [
    (np.zeros((4, 4)), "frames, H, W"),
    (np.zeros((2, 4, 4, 2)), "frames, H, W"),
    (np.full((2, 4, 4, 3), np.nan), "non-finite"),
  ],
)
def test_bad_clips_are_named(tmp_path, frames, message):
  with pytest.raises(ValueError, match=message):
    gif.write_gif(str(tmp_path / "x.gif"), frames, fps=8.0)
