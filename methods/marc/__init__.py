"""MARC: "MARC: Memory-Augmented RL Token Compression for Efficient Video Understanding" (Wu, Yu, Liu,
Wu, Zhou, Shen; ICLR 2026, arXiv 2510.07915; official code github.com/Gimlettt/MARC, whose README
describes the release: training and inference scripts, the merge inside a patched Qwen2.5-VL forward;
the retriever's code is not released).

Claim: retrieve-then-compress with RL distillation keeps a video LLM near its full-input accuracy on
about one frame of visual tokens: a Visual Memory Retriever keeps the question's event clips, a
two-stage similarity merge compresses them, and C-GRPO (GRPO with a correctness-gated compression
reward alpha max(0, eta - tau), eta = student accuracy / full-input teacher accuracy) trains the
student on the compressed input, beating SFT and vanilla GRPO; global questions suffer.

Map to the paper:
  `core/data/eventworld.py`  videos of scene-cut events and five question templates (local,
                             two-event, global counting): the stand-in for Video-R1 data and the
                             six video benchmarks.
  `core/nn/vlm.py`           frame encoder + the shared transformer, KV-cache decoding.
  `core/video_memory.py`     Sec. 3.1, the VMR: event cuts, dual encoder, InfoNCE, top-k clips.
  `core/token_merge.py`      Sec. 3.2, the two-stage merge (masked `while_loop`), uniform baseline.
  `core/grpo.py`             Sec. 3.3, C-GRPO rewards, group advantages, clipped loss with k3 KL.
  `inputs.py`                the config's models, data streams and each arm's visual input.
  `phases.py`                retriever, teacher, teacher answers (a_full), students, evaluate.
  `evaluation.py`            accuracy per arm and question type, token ratio, FLOPs, latency.
  `study.py`                 arms (seeds), the table, the summary, the figure.
  `paper_scale.py`           the gpu variant's model: Qwen2.5-VL-3B from `model.checkpoint` as
                             teacher (all visual tokens) and student (merged), on video files.
  `paper_phases.py`          the gpu variant's phases on Video-R1 (`core/data/video_r1.py`):
                             a_full, SFT / GRPO / C-GRPO students on the merged input (the VMR's
                             clips with `retriever.clip_checkpoint`, else the whole video),
                             evaluation.
  `paper_vmr.py`             the gpu variant's Visual Memory Retriever: cuts on CLIP frame
                             embeddings, top-k clips by CLIP similarity to the question.
"""

from __future__ import annotations

import os

import ml_collections

from methods.base import Method, require, require_positive_int
from methods.marc import paper_scale, paper_vmr
from methods.marc.phases import phases
from methods.marc.students import REWARD_TARGETS, STUDENTS
from methods.marc.study import report, study_arms

POSITIVE_FIELDS = (
  "data.num_frames",
  "data.min_events",
  "data.max_events",
  "data.question_len",
  "data.num_test",
  "model.width",
  "model.depth",
  "model.num_heads",
  "model.patch",
  "model.pool",
  "teacher.steps",
  "teacher.batch_size",
  "retriever.steps",
  "retriever.batch_size",
  "retriever.dim",
  "retriever.top_k",
  "compress.budget",
  "compress.window",
  "rl.prompts",
  "rl.group",
  "rl.pool_chunks",
  "rl.teacher_rollouts",
  "rl.steps",
  "sft.steps",
  "sft.batch_size",
  "eval.chunk",
  "eval.latency_batch",
  "eval.latency_repeats",
)


CHAT_TOKENS = {  # token -> its config.json id (None: not named there)
  "<|im_start|>": None,
  "<|im_end|>": "eos_token_id",
  "<|vision_start|>": "vision_start_token_id",
  "<|vision_end|>": "vision_end_token_id",
  "<|video_pad|>": "video_token_id",
}


def validate(config: ml_collections.ConfigDict) -> None:
  for field in POSITIVE_FIELDS:
    require_positive_int(config, field)
  paper_scale_run = config.variant == "gpu" or config.model.checkpoint or config.data.data_dir
  if not paper_scale_run:  # EventWorld's frames, events and tiny VLM
    _validate_data(config)
    _validate_model(config)
  _validate_compression(config)
  _validate_rl(config)
  unknown = [name for name in config.students if name not in STUDENTS]
  require(not unknown, "students", f"unknown {unknown}; known: {list(STUDENTS)}")
  require(len(config.study.seeds) > 0, "study.seeds", "needs at least one seed")
  if paper_scale_run:
    _validate_paper_scale(config)


def _validate_data(config) -> None:
  from core.data import eventworld

  d = config.data
  require(d.min_events <= d.max_events, "data.max_events", f"must be >= min_events {d.min_events}")
  require(
    eventworld.MIN_EVENT * d.min_events <= d.num_frames <= eventworld.MAX_EVENT * d.max_events,
    "data.num_frames",
    f"{d.num_frames} frames cannot hold {d.min_events}-{d.max_events} events of "
    f"{eventworld.MIN_EVENT}-{eventworld.MAX_EVENT} frames",
  )
  require(
    d.max_events <= len(eventworld.BACKGROUNDS) and d.max_events < len(eventworld.COUNTS),
    "data.max_events",
    f"at most {len(eventworld.BACKGROUNDS)} (one background per event)",
  )
  require(d.question_len >= 10, "data.question_len", "the longest question has 10 words")
  require(
    config.eval.chunk <= d.num_test and d.num_test % config.eval.chunk == 0,
    "eval.chunk",
    f"{config.eval.chunk} must divide data.num_test={d.num_test}",
  )
  require(config.eval.latency_batch <= d.num_test, "eval.latency_batch", "exceeds data.num_test")
  sweep = config.eval.top_k_sweep
  require(
    all(isinstance(k, int) and k > 0 for k in sweep), "eval.top_k_sweep", f"positive ints: {sweep}"
  )


def _validate_model(config) -> None:
  from core.data import eventworld

  m = config.model
  require(m.width % m.num_heads == 0, "model.num_heads", f"{m.num_heads} must divide width")
  require((m.width // m.num_heads) % 2 == 0, "model.num_heads", "head dim must be even (RoPE)")
  require(
    eventworld.SIZE % (m.patch * m.pool) == 0,
    "model.patch",
    f"patch x pool = {m.patch * m.pool} must divide the frame side {eventworld.SIZE}",
  )
  r = config.retriever
  require(r.temperature > 0, "retriever.temperature", f"must be > 0, got {r.temperature}")
  require(0 < r.cut_threshold < 2, "retriever.cut_threshold", "a cosine distance in (0, 2)")


def _validate_compression(config) -> None:
  c = config.compress
  require(0.0 < c.rho <= 1.0, "compress.rho", f"must be in (0, 1], got {c.rho}")
  require(c.budget <= config.data.num_frames, "compress.budget", "exceeds data.num_frames")


def _validate_rl(config) -> None:
  r = config.rl
  require(r.group >= 2, "rl.group", "group-relative advantages need at least 2 rollouts")
  require(0.0 <= r.tau <= 1.0, "rl.tau", f"must be in [0, 1], got {r.tau}")
  require(r.alpha >= 0.0, "rl.alpha", f"must be >= 0, got {r.alpha}")
  require(r.beta >= 0.0, "rl.beta", f"must be >= 0, got {r.beta}")
  require(0.0 < r.clip < 1.0, "rl.clip", f"must be in (0, 1), got {r.clip}")
  require(
    r.reward_target in REWARD_TARGETS,
    "rl.reward_target",
    f"one of {REWARD_TARGETS}, got {r.reward_target!r}",
  )
  require(r.temperature > 0, "rl.temperature", f"must be > 0, got {r.temperature}")
  for field in ("rl.learning_rate", "sft.learning_rate", "teacher.learning_rate"):
    section, name = field.split(".")
    require(config[section][name] > 0, field, "must be > 0")


def _validate_paper_scale(config) -> None:
  problem = paper_scale.checkpoint_problem(config.model.checkpoint)
  require(
    problem is None,
    "model.checkpoint",
    f"{problem}; expected the Qwen2.5-VL-3B-Instruct folder (config.json and its *.safetensors); "
    "download Qwen/Qwen2.5-VL-3B-Instruct on a machine with network access and pass "
    "--config.model.checkpoint=DIR (docs/paper_scale.md)",
  )
  d = config.data
  require(
    28 * 28 <= d.min_pixels <= d.max_pixels,
    "data.min_pixels",
    f"need 784 <= min_pixels <= max_pixels, got {d.min_pixels}, {d.max_pixels}",
  )
  dtypes = tuple(paper_scale.DTYPES)
  require(
    config.model.dtype in dtypes, "model.dtype", f"one of {dtypes}, got {config.model.dtype!r}"
  )
  require(
    bool(config.data.data_dir),
    "data.data_dir",
    "not set; expected a folder with the Video-R1-260K subset (videos and its QA json); pass "
    "--config.data.data_dir=DIR",
  )
  for field in ("data.question_tokens", "rl.max_new_tokens", "sft.max_tokens"):
    require_positive_int(config, field)
  teacher_targets = [name for name in config.students if STUDENTS[name].target == "teacher"]
  require(
    config.rl.reward_target == "ground_truth" and not teacher_targets,
    "rl.reward_target",
    f"the gpu phases reward against the Video-R1 solution only ('ground_truth'; students "
    f"{teacher_targets} ask for the teacher's answers)",
  )
  tokenizer_json = os.path.join(
    paper_scale.checkpoint_folder(config.model.checkpoint), "tokenizer.json"
  )
  require(
    os.path.isfile(tokenizer_json),
    "model.checkpoint",
    f"{tokenizer_json} is missing (the checkpoint's tokenizer)",
  )
  _validate_tokenizer(config, tokenizer_json)
  _validate_video_r1(config)
  _validate_clip_retriever(config)


def _validate_clip_retriever(config) -> None:
  r = config.retriever
  if not r.clip_checkpoint:  # the students merge the whole video
    return
  problem = paper_vmr.checkpoint_problem(r.clip_checkpoint)
  require(
    problem is None,
    "retriever.clip_checkpoint",
    f"{problem}; expected a transformers CLIPModel folder (config.json, model.safetensors, "
    'vocab.json, merges.txt), e.g. openai/clip-vit-large-patch14, or "" for no retriever',
  )
  require(0 < r.cut_threshold < 2, "retriever.cut_threshold", "a cosine distance in (0, 2)")
  require_positive_int(config, "retriever.min_clip_frames")


def _validate_tokenizer(config, path: str) -> None:
  """The chat template's tokens exist and carry the ids config.json gives them."""
  from core.data import tokenizers
  from core.nn import qwen_vl_convert

  try:
    tokenizer = tokenizers.ByteLevelBPETokenizer.from_file(path)
    ids = {name: tokenizer.token_id(name) for name in CHAT_TOKENS}
  except (tokenizers.BPEFormatError, KeyError, ValueError) as error:
    require(False, "model.checkpoint", f"{path}: {error}")
  hf_config = qwen_vl_convert.read_config(paper_scale.checkpoint_folder(config.model.checkpoint))
  expected = qwen_vl_convert.special_ids(hf_config)
  for token, key in CHAT_TOKENS.items():
    if key is None:
      continue
    require(
      ids[token] == expected[key],
      "model.checkpoint",
      f"{path} gives {token} id {ids[token]}, config.json's {key} is {expected[key]}",
    )


def _validate_video_r1(config) -> None:
  from core.data import video_r1

  d = config.data
  qa_json = os.path.join(d.data_dir, d.qa_file)
  require(os.path.isfile(qa_json), "data.qa_file", f"{qa_json} is missing (Video-R1's QA json)")
  try:
    records, skipped = video_r1.read_records(qa_json, d.data_dir)
  except (video_r1.VideoR1Error, ValueError, KeyError, TypeError) as error:
    require(False, "data.qa_file", f"{qa_json}: {error}")
  require(
    0 < d.num_test < len(records),
    "data.num_test",
    f"{d.num_test} must be below the {len(records)} usable records of {qa_json} (video entries of "
    f"types {video_r1.TYPES}; left out: {skipped})",
  )
  missing = video_r1.missing_videos(records)
  require(
    not missing,
    "data.data_dir",
    f"{len(missing)} video files of {qa_json} are missing, e.g. {missing[:3]}",
  )
  require(
    len(records) - d.num_test >= config.rl.prompts,
    "rl.prompts",
    f"the RL pool of {len(records) - d.num_test} questions is smaller than one step's prompts",
  )


METHOD = Method(name="marc", phases=phases, validate=validate, study_arms=study_arms, report=report)
