"""MARC's Visual Memory Retriever on real videos, with a CLIP dual encoder ("MARC: Memory-Augmented RL
Token Compression for Efficient Video Understanding", ICLR 2026, Sec. 3.1; the retriever's code is
not part of github.com/Gimlettt/MARC).

The paper cuts a video into events with a shot-boundary detector (TransNet V2, inferred), maps the
question and every event clip into one space with a contrastive embedding model (Perception Encoder,
a CLIP-style model, inferred), and keeps the top-k = 3 clips by similarity in temporal order; their
frames go to the vision tower and the two-stage merge. Here:

  frame_embeddings    CLIP image embeddings of the frames, unit norm (`core.nn.clip_vision`).
  segment             training-free event segmentation: a cut before frame i where the cosine
                      distance 1 - <e_i, e_{i-1}> of consecutive frame embeddings exceeds a threshold,
                      taken only when both the clip it closes and the rest of the video keep at least
                      `min_length` frames. TransNet V2 is not ported; this stands in for it.
  clip_embeddings     a clip's embedding: the mean of its frames' unit embeddings, renormalised.
  question_embedding  CLIP's text embedding of the question (CLIP's tokenizer, 77 tokens, truncated).
  top_k_clips         the k clips of highest cosine similarity to the question, in temporal order.
  retrieve            all of the above for one video: the indices of the frames to keep.
  retrieval_text      a Video-R1 user text without its think/answer instruction (the query).
  select_frames       the gpu variant's use: a video's frames (uint8) and its Video-R1 question ->
                      the frames of the retrieved clips in whole temporal patches of the vision
                      tower, and those patches' positions in the full video (their M-RoPE times).
  retriever_of        the CLIP model of `retriever.clip_checkpoint` (a transformers `CLIPModel`
                      folder: config.json, model.safetensors or its index, vocab.json,
                      merges.txt), read once.
"""

from __future__ import annotations

import functools
import json
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.data import video_r1 as vr
from core.data.clip_tokenizer import CLIPTokenizer
from core.nn import clip_text, clip_vision, hf_convert
from methods.base import ConfigError, cached_per_config


class Retriever(NamedTuple):
  vision: clip_vision.CLIPVisionModelWithProjection
  vision_params: dict
  text: clip_vision.CLIPTextWithProjection
  text_params: dict
  tokenizer: CLIPTokenizer


@functools.partial(jax.jit, static_argnums=0)
def _apply(model, params, inputs):
  return model.apply(params, inputs)


def _unit(x: jax.Array) -> jax.Array:
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def frame_embeddings(retriever: Retriever, frames, batch: int = 16) -> jax.Array:
  """`frames [F, H, W, C]` in [0, 1] -> unit CLIP image embeddings `[F, d]` (`batch` frames at a
  time)."""
  frames = jnp.asarray(frames, jnp.float32)
  if frames.ndim != 4 or frames.shape[0] < 1:
    raise ValueError(f"paper_vmr.frame_embeddings: frames must be [F, H, W, C], got {frames.shape}")
  config = retriever.vision.config
  out = [
    _apply(
      retriever.vision,
      retriever.vision_params,
      clip_vision.preprocess(frames[i : i + batch], config),
    )
    for i in range(0, frames.shape[0], batch)
  ]
  return _unit(jnp.concatenate(out))


def cut_distances(embeddings) -> np.ndarray:
  """`[F]`: the cosine distance of each frame's embedding to the previous one's (0 for frame 0)."""
  e = np.asarray(_unit(jnp.asarray(embeddings, jnp.float32)))
  dist = 1.0 - np.sum(e[1:] * e[:-1], -1)
  return np.concatenate([[0.0], dist]).astype(np.float32)


def segment(embeddings, threshold: float, min_length: int = 1) -> np.ndarray:
  """Clip id per frame `[F]` (0, 1, ...): a new clip at frame i where `cut_distances > threshold`,
  if the clip it closes and the frames after it both number at least `min_length`."""
  if min_length < 1:
    raise ValueError(f"paper_vmr.segment: min_length must be >= 1, got {min_length}")
  dist = cut_distances(embeddings)
  ids, start, clip = np.zeros(len(dist), np.int32), 0, 0
  for i in range(1, len(dist)):
    if dist[i] > threshold and i - start >= min_length and len(dist) - i >= min_length:
      clip, start = clip + 1, i
    ids[i] = clip
  return ids


def clip_embeddings(embeddings, segment_ids) -> jax.Array:
  """`[S, d]`: the renormalised mean of each clip's unit frame embeddings (S = max id + 1)."""
  e = _unit(jnp.asarray(embeddings, jnp.float32))
  one_hot = jax.nn.one_hot(jnp.asarray(segment_ids), int(np.max(segment_ids)) + 1)  # [F, S]
  means = one_hot.T @ e / jnp.maximum(one_hot.sum(0), 1.0)[:, None]
  return _unit(means)


def question_embedding(retriever: Retriever, questions: list[str]) -> jax.Array:
  """Unit CLIP text embeddings `[Q, d]` of the questions (77 tokens, truncated)."""
  ids = jnp.asarray(retriever.tokenizer.encode(list(questions)))
  return _unit(_apply(retriever.text, retriever.text_params, ids))


def top_k_clips(question, clips, k: int) -> np.ndarray:
  """Indices of the `k` clips (all, if fewer) of highest cosine similarity to `question [d]`,
  ascending (temporal order); ties go to the earlier clip."""
  if k < 1:
    raise ValueError(f"paper_vmr.top_k_clips: k must be >= 1, got {k}")
  scores = np.asarray(_unit(jnp.asarray(clips)) @ _unit(jnp.asarray(question)))
  order = np.argsort(-scores, kind="stable")[:k]
  return np.sort(order)


def retrieve(
  retriever: Retriever, frames, question: str, *, k: int, threshold: float, min_length: int
) -> np.ndarray:
  """The Visual Memory Retriever on one video: indices (ascending) of the frames of the `k` event
  clips closest to the question."""
  embeddings = frame_embeddings(retriever, frames)
  ids = segment(embeddings, threshold, min_length)
  chosen = top_k_clips(
    question_embedding(retriever, [question])[0], clip_embeddings(embeddings, ids), k
  )
  return np.flatnonzero(np.isin(ids, chosen))


def patches_of(frame_indices, num_frames: int, temporal_patch_size: int) -> np.ndarray:
  """The temporal patches (`temporal_patch_size` consecutive frames each) that hold any of the
  frames, ascending."""
  frame_indices = np.asarray(frame_indices)
  if frame_indices.size and (frame_indices.min() < 0 or frame_indices.max() >= num_frames):
    raise ValueError(f"paper_vmr.patches_of: frame indices outside 0..{num_frames - 1}")
  return np.unique(frame_indices // temporal_patch_size)


# Video-R1's user text is the problem (and options), then the think/answer instruction: the retriever
# reads what comes before the instruction
_INSTRUCTION = vr.THINK_INSTRUCTION.split("{question}")[1].split(".")[0]


def retrieval_text(user_text: str) -> str:
  """The question (and options) of a Video-R1 user text, without the think/answer instruction."""
  return user_text.split(_INSTRUCTION)[0].strip()


def select_frames(config, frames: np.ndarray, user_text: str, temporal_patch_size: int):
  """`(frames of the retrieved clips, rounded out to whole temporal patches [F', H, W, C],
  float32 positions of those patches in the full video [t'])` with the retriever of
  `config.retriever.clip_checkpoint` (`top_k`, `cut_threshold`, `min_clip_frames`)."""
  r = config.retriever
  keep = retrieve(
    retriever_of(config),
    np.asarray(frames, np.float32) / 255.0,
    retrieval_text(user_text),
    k=r.top_k,
    threshold=r.cut_threshold,
    min_length=r.min_clip_frames,
  )
  patches = patches_of(keep, len(frames), temporal_patch_size)
  rows = (patches[:, None] * temporal_patch_size + np.arange(temporal_patch_size)).reshape(-1)
  return frames[rows[rows < len(frames)]], patches.astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# The checkpoint
# ---------------------------------------------------------------------------------------------------


def checkpoint_problem(path: str) -> str | None:
  """Why `path` is not a readable CLIP checkpoint folder, or None (reads config.json only)."""
  if not os.path.isdir(path):
    return f"{path!r} is not a folder"
  for name in ("config.json", "vocab.json", "merges.txt"):
    if not os.path.isfile(os.path.join(path, name)):
      return f"{path!r} holds no {name}"
  if _weights_file(path) is None:
    return f"{path!r} holds no model.safetensors (or its index)"
  try:
    with open(os.path.join(path, "config.json")) as file:
      config = json.load(file)
    clip_vision.CLIPVisionConfig.from_transformers(config)
    clip_text.CLIPTextConfig.from_transformers(config)
  except (OSError, ValueError, TypeError) as error:
    return f"{path}/config.json: {type(error).__name__}: {error}"
  return None


def _weights_file(folder: str) -> str | None:
  for name in ("model.safetensors", "model.safetensors.index.json"):
    if os.path.isfile(os.path.join(folder, name)):
      return os.path.join(folder, name)
  return None


def load_retriever(folder: str) -> Retriever:
  """A transformers `CLIPModel` folder (e.g. openai/clip-vit-large-patch14) as a `Retriever`."""
  problem = checkpoint_problem(folder)
  if problem:
    raise ConfigError(f"config.retriever.clip_checkpoint: {problem}")
  with open(os.path.join(folder, "config.json")) as file:
    hf_config = json.load(file)
  vision_config = clip_vision.CLIPVisionConfig.from_transformers(hf_config)
  text_config = clip_text.CLIPTextConfig.from_transformers(hf_config)
  state = hf_convert.read_safetensors(_weights_file(folder))
  state = {
    k: np.asarray(v, np.float32 if v.dtype.kind in "fV" else v.dtype) for k, v in state.items()
  }
  vision_params, text_params = clip_vision.convert_clip_model(state, text_config, vision_config)
  return Retriever(
    clip_vision.CLIPVisionModelWithProjection(vision_config),
    vision_params,
    clip_vision.CLIPTextWithProjection(text_config, vision_config.projection_dim),
    text_params,
    CLIPTokenizer.from_files(folder),
  )


@cached_per_config(maxsize=1)
def retriever_of(config) -> Retriever:
  """The retriever of `config.retriever.clip_checkpoint` (read once per config)."""
  return load_retriever(config.retriever.clip_checkpoint)
