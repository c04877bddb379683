"""MARC's Visual Memory Retriever on real videos (`methods.marc.paper_vmr`) with a tiny random CLIP:
the transformers layout of `fixtures/clip_vision.npz` and the tiny vocabulary of
`fixtures/clip_text.npz`, written to a checkpoint folder as a released `CLIPModel` is."""

import json

import fixture_files
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from methods.base import ConfigError
from methods.marc import paper_vmr


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  path = tmp_path_factory.mktemp("clip")
  vision, text = fixture_files.arrays("clip_vision"), fixture_files.arrays("clip_text")
  (path / "config.json").write_text(str(vision["config_json"]))
  (path / "vocab.json").write_text(str(text["vocab_json"]), encoding="utf-8")
  (path / "merges.txt").write_text(str(text["merges_txt"]), encoding="utf-8")
  save_file(fixture_files.state_dict(vision), str(path / "model.safetensors"))
  return path


@pytest.fixture(scope="module")
def retriever(folder):
  return paper_vmr.load_retriever(str(folder))


def _two_scene_video(seed=0, frames=8, cut=4):
  rng = np.random.default_rng(seed)
  a, b = rng.uniform(size=(2, 40, 48, 3)).astype(np.float32)
  return np.stack([a] * cut + [b] * (frames - cut))


@pytest.mark.slow
def test_loaded_checkpoint_matches_transformers(retriever):
  vision = fixture_files.arrays("clip_vision")
  pixels, want = vision["pixels"].transpose(0, 2, 3, 1), vision["image_features"]
  got = retriever.vision.apply(retriever.vision_params, jnp.asarray(pixels))
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
  q = paper_vmr.question_embedding(retriever, ["a photo of a cat", "lighting " * 90])
  assert q.shape == (2, 16)
  np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 1.0, rtol=1e-5)


def test_the_cut_between_two_scenes_is_found(retriever):
  embeddings = paper_vmr.frame_embeddings(retriever, _two_scene_video(), batch=3)
  assert embeddings.shape == (8, 16)
  dist = paper_vmr.cut_distances(embeddings)
  assert np.argmax(dist) == 4 and dist[4] > 0.05
  assert np.all(np.delete(dist, 4) < 1e-5)
  np.testing.assert_array_equal(paper_vmr.segment(embeddings, 0.01), [0, 0, 0, 0, 1, 1, 1, 1])
  # a threshold above the cut's distance, or a minimum length the halves do not reach: one clip
  np.testing.assert_array_equal(paper_vmr.segment(embeddings, float(dist[4]) + 0.01), [0] * 8)
  np.testing.assert_array_equal(paper_vmr.segment(embeddings, 0.01, min_length=5), [0] * 8)


def test_segment_keeps_the_minimum_clip_length():
  e = np.eye(4, dtype=np.float32)[[0, 0, 1, 2, 2, 2, 3, 3, 3]]  # cuts at 2, 3, 6
  np.testing.assert_array_equal(paper_vmr.segment(e, 0.5), [0, 0, 1, 2, 2, 2, 3, 3, 3])
  np.testing.assert_array_equal(
    paper_vmr.segment(e, 0.5, min_length=2), [0, 0, 1, 1, 1, 1, 2, 2, 2]
  )
  np.testing.assert_array_equal(
    paper_vmr.segment(e, 0.5, min_length=4), [0, 0, 0, 0, 0, 0, 0, 0, 0]
  )
  with pytest.raises(ValueError, match="min_length must be >= 1"):
    paper_vmr.segment(e, 0.5, min_length=0)


def test_clip_embeddings_and_top_k_in_temporal_order():
  e = np.eye(4, dtype=np.float32)[[0, 0, 1, 1, 2, 2, 3, 3]]
  ids = np.repeat(np.arange(4), 2)
  clips = paper_vmr.clip_embeddings(e, ids)
  np.testing.assert_allclose(clips, np.eye(4), atol=1e-6)
  assert paper_vmr.top_k_clips(clips[2], clips, 1).tolist() == [2]  # the clip equal to the question
  question = np.array([0.5, 0.0, 0.1, 0.9], np.float32)  # ranks clips 3, 0, 2, 1
  assert paper_vmr.top_k_clips(question, clips, 2).tolist() == [0, 3]
  assert paper_vmr.top_k_clips(question, clips, 3).tolist() == [0, 2, 3]
  assert paper_vmr.top_k_clips(question, clips, 9).tolist() == [0, 1, 2, 3]
  with pytest.raises(ValueError, match="k must be >= 1"):
    paper_vmr.top_k_clips(question, clips, 0)


@pytest.mark.slow
def test_retrieve_returns_the_frames_of_the_closest_clips(retriever):
  video = np.concatenate([_two_scene_video(1, 6, 3), _two_scene_video(2, 4, 2)])  # 4 scenes
  kwargs = dict(threshold=0.01, min_length=2)
  embeddings = paper_vmr.frame_embeddings(retriever, video)
  ids = paper_vmr.segment(embeddings, **kwargs)
  np.testing.assert_array_equal(ids, [0, 0, 0, 1, 1, 1, 2, 2, 3, 3])
  question = "a cat in the garden"
  scores = np.asarray(
    paper_vmr.clip_embeddings(embeddings, ids)
    @ paper_vmr.question_embedding(retriever, [question])[0]
  )
  best = np.sort(np.argsort(-scores)[:2])
  frames = paper_vmr.retrieve(retriever, video, question, k=2, **kwargs)
  np.testing.assert_array_equal(frames, np.flatnonzero(np.isin(ids, best)))
  assert np.all(np.diff(frames) > 0)
  assert paper_vmr.retrieve(retriever, video, question, k=4, **kwargs).tolist() == list(range(10))
  assert paper_vmr.patches_of(frames, 10, 2).tolist() == sorted(set((frames // 2).tolist()))
  assert paper_vmr.patches_of([2, 3, 7], 10, 2).tolist() == [1, 3]


def test_bad_checkpoint_folders_are_named(folder, tmp_path):
  with pytest.raises(ConfigError, match="config.retriever.clip_checkpoint: .* is not a folder"):
    paper_vmr.load_retriever(str(tmp_path / "missing"))
  (tmp_path / "config.json").write_text(json.dumps({"vision_config": {"hidden_act": "relu"}}))
  assert "holds no vocab.json" in paper_vmr.checkpoint_problem(str(tmp_path))
  for name in ("vocab.json", "merges.txt", "model.safetensors"):
    (tmp_path / name).write_bytes((folder / name).read_bytes())
  assert "CLIPVisionConfig.hidden_act" in paper_vmr.checkpoint_problem(str(tmp_path))
  assert paper_vmr.checkpoint_problem(str(folder)) is None
  with pytest.raises(ValueError, match=r"frames must be \[F, H, W, C\]"):
    paper_vmr.frame_embeddings(None, np.zeros((4, 4, 3)))
