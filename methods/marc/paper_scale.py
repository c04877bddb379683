"""MARC at the paper's scale: Qwen2.5-VL-3B-Instruct read from `model.checkpoint` (a folder with its
config.json and safetensors) as the full-input teacher and the compressed-input student of "MARC:
Memory-Augmented RL Token Compression for Efficient Video Understanding" (ICLR 2026; official code
github.com/Gimlettt/MARC, whose merge sits inside a patched Qwen2.5-VL forward).

What runs, through the same decoder class and KV-cache decoding loop as the tiny VLM
(`core/nn/vlm.py`):
  * `model_of`: config.json -> `QwenVL` (the Qwen2 decoder with q/k/v biases and M-RoPE, the
    windowed vision tower) and the converted weights (`core/nn/qwen_vl_convert.py`), in
    `model.dtype`.
  * `encode`: video files -> `data.num_frames` uniformly sampled frames, resized as the processor
    does within `data.min_pixels` / `data.max_pixels` per frame (`core/data/video_files.py`)
    -> the vision tower's tokens, one `[t, P, d]` block per video
    (t temporal patches of 2 frames, P merged tokens each).
  * `visual_input`: the teacher's input (`full`: every temporal patch) or the student's (`merge`:
    MARC's two-stage merge, `core/token_merge.compress`, over temporal patches down to
    `compress.budget` of them; a merged slice keeps the mean time of its sources, which becomes its
    M-RoPE temporal id), and the M-RoPE ids of the prompt `[prefix, video, question]`. With
    `retriever.clip_checkpoint` set, the student's video is first cut by the Visual Memory Retriever
    (`paper_vmr.py`: CLIP frame embeddings, cuts, top-k clips by CLIP similarity to the question)
    and only the retrieved clips' temporal patches are encoded and merged; without it the merge runs
    over the whole video.
  * `answer`: prefill + `core.decoding.decode_loop` (`vlm.qwen_generate`), and `score`: the
    teacher-forced log-probs of given completions (`vlm.qwen_completion_log_probs`).
  * `cgrpo_init` / `cgrpo_step`: one C-GRPO update of the student's language model (the vision
    tower frozen, as in the tiny students) on a batch of merged inputs: `rl.group` rollouts per
    prompt, `core.grpo`'s accuracy / format / compression rewards against given answer ids and the
    teacher's a_full, group advantages, the clipped loss with the k3 KL to the initial student, and
    Adam, all in one jitted call. The answer format is `<open> X <close>` with token ids given by
    the caller (the phases of `paper_phases.py` reward decoded text instead).

The training and evaluation phases around these pieces (Video-R1's QA json and prompts, Qwen's
tokenizer, a_full, the SFT / GRPO / C-GRPO students, evaluation) are in `paper_phases.py`; they pad
each batch to shapes fixed by the config and reward decoded text. Not built at this scale: the six
video benchmarks, and the paper's own VMR models (TransNet V2 shot boundaries and Perception Encoder
are replaced by training-free cuts on CLIP embeddings and a released CLIP, `paper_vmr.py`).
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import decoding, grpo, token_merge
from core.data import video_files
from core.nn import qwen_vision
from core.nn import qwen_vl_convert as qc
from core.nn import vlm as vlm_lib
from methods.base import cached_per_config
from methods.marc import paper_vmr
from methods.marc.students import adam

MODES = ("full", "merge")  # teacher, student (VMR clips when retriever.clip_checkpoint is set)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def checkpoint_folder(path: str) -> str:
  """The checkpoint folder of `model.checkpoint` (the folder, or a file inside it)."""
  return os.path.dirname(path) if os.path.isfile(path) else path


def checkpoint_problem(path: str) -> str | None:
  """Why `path` is not a readable Qwen2.5-VL checkpoint folder, or None (reads config.json only)."""
  if not path:
    return "not set"
  folder = checkpoint_folder(path)
  if not os.path.isdir(folder):
    return f"{path!r} is not a folder"
  if not glob.glob(os.path.join(folder, "*.safetensors")):
    return f"{folder!r} holds no *.safetensors"
  try:
    hf_config = qc.read_config(folder)
    qc.text_settings(hf_config)
    qc.vision_settings(hf_config)
  except (qc.CheckpointError, KeyError, TypeError, ValueError) as error:
    return f"{folder}/config.json: {type(error).__name__}: {error}"
  return None


@cached_per_config(maxsize=1)
def model_of(config) -> tuple[vlm_lib.QwenVL, dict]:
  """The checkpoint's `QwenVL` and its converted parameters (read once per config)."""
  dtype = DTYPES[config.model.dtype]
  return vlm_lib.load_qwen_vl(checkpoint_folder(config.model.checkpoint), dtype)


class VideoTokens(NamedTuple):
  tokens: jax.Array  # [t, P, d]: the tower's output, one row of P merged tokens per temporal patch
  grid: tuple[int, int, int]  # the processor's (t, h, w) patches
  seconds_per_grid: float


def encode(config, paths: Sequence[str]) -> list[VideoTokens]:
  """Each video file -> `data.num_frames` frames -> the vision tower's tokens."""
  return [tokens for tokens, _ in _encode(config, paths, None)]


def encode_retrieved(
  config, paths: Sequence[str], questions: Sequence[str]
) -> list[tuple[VideoTokens, np.ndarray]]:
  """Each video file and its Video-R1 user text -> `(the tower's tokens of the temporal patches of
  the Visual Memory Retriever's clips, those patches' positions in the whole video [t] float32)`
  (`paper_vmr.select_frames`, `retriever.clip_checkpoint`). Only those patches go to the tower: its
  full attention stays within a temporal patch, so they get the tokens they have in the whole
  video."""
  return _encode(config, paths, questions)


def _encode(config, paths, questions):
  qvl, params = model_of(config)
  c = qvl.tower.config
  tower = jax.jit(qvl.visual_tokens, static_argnums=2)  # compiled once per grid
  out = []
  for i, path in enumerate(paths):
    clip = video_files.read_video(
      path,
      config.data.num_frames,
      min_pixels=config.data.min_pixels,
      max_pixels=config.data.max_pixels,
    )
    frames, times = clip.frames, None
    if questions is not None:
      frames, times = paper_vmr.select_frames(config, frames, questions[i], c.temporal_patch_size)
    pixels, grid = qwen_vision.pixel_values(frames, c)
    tokens = tower(params, pixels, (grid,))
    per_slice = grid[1] * grid[2] // c.spatial_merge_size**2
    video = VideoTokens(
      tokens.reshape(grid[0], per_slice, -1), grid, clip.seconds_per_grid(c.temporal_patch_size)
    )
    out.append((video, times))
  return out


class VisualInput(NamedTuple):
  tokens: np.ndarray  # [B, L] right-padded prompts
  lengths: np.ndarray  # [B]
  visual: jax.Array  # [n, d]: every row's visual tokens, row after row
  rope: np.ndarray  # [3, B, L] M-RoPE ids
  deltas: np.ndarray  # [B] rope deltas for decoding
  visual_counts: np.ndarray  # [B] visual tokens per row


def visual_input(
  config,
  videos: Sequence[VideoTokens],
  questions: Sequence[Sequence[int]],
  mode: str,
  before: Sequence[int] = (),
  times: Sequence[np.ndarray | None] | None = None,
) -> VisualInput:
  """Prompts `[*before, <|vision_start|>, video, <|vision_end|>, question]` with the teacher's
  (`full`) or the student's (`merge`, `compress.budget` temporal patches) visual tokens. `times`:
  per video, its rows' temporal patches in the whole video (`encode_retrieved`; None: 0..t-1)."""
  if mode not in MODES:
    raise ValueError(f"visual_input: mode must be one of {MODES}, got {mode!r}")
  qvl, _ = model_of(config)
  merge = qvl.tower.config.spatial_merge_size
  blocks, grids, temporal, prompts = [], [], [], []
  times = [None] * len(videos) if times is None else times
  for video, question, at in zip(videos, questions, times, strict=True):
    t, h, w = video.grid
    tokens = video.tokens
    at = np.arange(t, dtype=np.float32) if at is None else np.asarray(at, np.float32)
    if mode == "merge":
      tokens, at = merged(config, tokens, at)
    blocks.append(tokens.reshape(-1, tokens.shape[-1]))
    grids.append((tokens.shape[0], h, w))
    temporal.append(at)
    prompts.append(qvl.video_prompt(tokens.shape[0] * h * w // merge**2, before, question))
  lengths = np.array([len(p) for p in prompts], np.int32)
  padded = np.full((len(prompts), lengths.max()), qvl.pad_id, np.int32)
  for row, prompt in enumerate(prompts):
    padded[row, : len(prompt)] = prompt
  seconds = [video.seconds_per_grid for video in videos]
  rope, deltas = qvl.positions(padded, lengths, tuple(grids), seconds, temporal)
  counts = np.array([block.shape[0] for block in blocks], np.int32)
  return VisualInput(padded, lengths, jnp.concatenate(blocks), rope, deltas, counts)


def merged(config, tokens: jax.Array, times=None) -> tuple[jax.Array, np.ndarray]:
  """MARC's two-stage merge over the temporal patches of one video (at `times [t]`, default
  0..t-1): `([budget, P, d] tokens, their mean temporal-patch times)`. Fewer patches than the whole
  video has (the retriever's clips) are padded with invalid ones, so the merge compiles once."""
  t = tokens.shape[0]
  times = np.arange(t, dtype=np.float32) if times is None else np.asarray(times, np.float32)
  slices = max(
    t, -(-config.data.num_frames // model_of(config)[0].tower.config.temporal_patch_size)
  )
  features = jnp.pad(tokens.astype(jnp.float32), ((0, slices - t), (0, 0), (0, 0)))
  padded_times = np.concatenate([times, times[-1] + 2.0 + np.arange(slices - t, dtype=np.float32)])
  out = _merge_fn(config, slices)(features, jnp.asarray(padded_times), jnp.arange(slices) < t)
  keep = int(np.sum(np.asarray(out.valid)))
  return out.features[:keep].astype(tokens.dtype), np.asarray(out.times[:keep])


@cached_per_config(maxsize=4)
def _merge_fn(config, slices: int):
  c = config.compress

  def merge(features, times, valid):
    frames = token_merge.Frames(features, times, valid)
    # stage 1's groups: runs of consecutive temporal patches (one per retrieved clip; one for the
    # whole video without the retriever)
    gaps = jnp.concatenate([jnp.zeros((1,), bool), jnp.diff(times) > 1.5])
    segment = jnp.cumsum(gaps).astype(jnp.int32)
    return token_merge.compress(
      frames, segment, budget=min(c.budget, slices), window=c.window, rho=c.rho
    )

  return jax.jit(merge)


@cached_per_config(maxsize=4)
def _answer_fn(config, max_new_tokens: int, temperature: float):
  qvl, _ = model_of(config)
  sampling = decoding.Sampling(temperature=temperature)
  return jax.jit(
    functools.partial(vlm_lib.qwen_generate, qvl, max_new_tokens=max_new_tokens, sampling=sampling)
  )


def answer(
  config, inputs: VisualInput, rng, *, max_new_tokens: int, temperature: float = 0.0
) -> decoding.Generation:
  """Sampled (greedy at temperature 0) completions, stopping at the checkpoint's eos token."""
  _, params = model_of(config)
  fn = _answer_fn(config, max_new_tokens, temperature)
  return fn(params, *_arrays(inputs), rng)


def _arrays(inputs: VisualInput) -> tuple:
  tokens, lengths, rope, deltas = (
    jnp.asarray(x) for x in (inputs.tokens, inputs.lengths, inputs.rope, inputs.deltas)
  )
  return tokens, lengths, inputs.visual, rope, deltas


@cached_per_config(maxsize=1)
def _score_fn(config):
  qvl, _ = model_of(config)
  return jax.jit(functools.partial(vlm_lib.qwen_completion_log_probs, qvl))


def score(config, inputs: VisualInput, completion) -> jax.Array:
  """`log pi(completion_t | prompt, completion_<t)` `[B, C]` under the checkpoint's weights."""
  _, params = model_of(config)
  return _score_fn(config)(params, *_arrays(inputs), jnp.asarray(completion))


# ---------------------------------------------------------------------------------------------------
# C-GRPO on the checkpoint's student
# ---------------------------------------------------------------------------------------------------


class AnswerFormat(NamedTuple):
  """Token ids of the completion format `<open> X <close>` (`core.grpo.completion_checks`)."""

  open_id: int
  close_id: int
  answer_ids: tuple[int, ...]


def cgrpo_init(config) -> dict:
  """The student's trainable language model, its frozen copy (the KL reference) and Adam's state."""
  _, params = model_of(config)
  decoder = params["decoder"]
  opt = adam(config.rl.learning_rate, config.rl.steps)
  return {"params": decoder, "ref": jax.tree.map(jnp.copy, decoder), "opt_state": opt.init(decoder)}


def repeat_rows(inputs: VisualInput, group: int) -> VisualInput:
  """Every prompt `group` times in a row (rollouts of one prompt are adjacent)."""
  starts = np.concatenate([[0], np.cumsum(inputs.visual_counts)])
  index = np.concatenate(
    [np.arange(starts[b], starts[b + 1]) for b in range(len(starts) - 1) for _ in range(group)]
  )
  return VisualInput(
    np.repeat(inputs.tokens, group, 0),
    np.repeat(inputs.lengths, group),
    inputs.visual[index],
    np.repeat(inputs.rope, group, 1),
    np.repeat(inputs.deltas, group),
    np.repeat(inputs.visual_counts, group),
  )


@cached_per_config(maxsize=2)
def _cgrpo_fn(config, form: AnswerFormat, max_new_tokens: int):
  qvl, params = model_of(config)
  r = config.rl
  opt = adam(r.learning_rate, r.steps)
  sampling = decoding.Sampling(temperature=r.temperature)

  def step(state, tokens, lengths, visual, rope, deltas, answers, a_full, rng):
    policy = {"vision": params["vision"], "decoder": state["params"]}
    gen = vlm_lib.qwen_generate(
      qvl, policy, tokens, lengths, visual, rope, deltas, rng,
      max_new_tokens=max_new_tokens, sampling=sampling,
    )  # fmt: skip
    correct, formed = grpo.completion_checks(
      gen.tokens, gen.lengths, jnp.repeat(answers, r.group), *form
    )
    rewards = grpo.c_grpo_rewards(
      correct.reshape(-1, r.group),
      formed.reshape(-1, r.group),
      a_full,
      alpha=r.alpha,
      tau=r.tau,
      format_weight=r.format_weight,
    )
    advantages = grpo.group_advantages(rewards.total).reshape(-1)
    mask = jnp.arange(max_new_tokens)[None] < gen.lengths[:, None]

    def score(decoder):
      return vlm_lib.qwen_completion_log_probs(
        qvl, {"vision": params["vision"], "decoder": decoder}, tokens, lengths, visual, rope,
        deltas, gen.tokens,
      )  # fmt: skip

    ref = jax.lax.stop_gradient(score(state["ref"]))

    def loss_fn(decoder):
      return grpo.grpo_loss(
        score(decoder), gen.log_probs, ref, advantages, mask, clip=r.clip, beta=r.beta
      )

    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
    new = {**state, "params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}
    metrics = {
      "loss": loss,
      "reward": jnp.mean(rewards.total),
      "reward_accuracy": jnp.mean(rewards.accuracy),
      "reward_compression": jnp.mean(rewards.compression),
      "eta": jnp.mean(rewards.eta),
      **stats,
    }
    return new, metrics, gen

  return jax.jit(step)


def cgrpo_step(
  config,
  state: dict,
  inputs: VisualInput,
  answers,
  a_full,
  form: AnswerFormat,
  rng,
  *,
  max_new_tokens: int,
):
  """One C-GRPO update of the student on its (merged) `inputs`: `(state, metrics, rollouts)`.
  `answers [B]`: the correct answer token of each prompt; `a_full [B]`: the teacher's accuracy on
  it with the full input."""
  rows = repeat_rows(inputs, config.rl.group)
  fn = _cgrpo_fn(config, form, max_new_tokens)
  return fn(
    state,
    *_arrays(rows),
    jnp.asarray(answers, jnp.int32),
    jnp.asarray(a_full, jnp.float32),
    rng,
  )
