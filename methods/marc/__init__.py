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
                             teacher (all visual tokens) and student (merged), on video files;
                             what it does not yet run is listed there.
"""

from __future__ import annotations

import ml_collections

from methods.base import Method, require, require_positive_int
from methods.marc import paper_scale
from methods.marc.phases import STUDENTS, phases
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


def validate(config: ml_collections.ConfigDict) -> None:
  for field in POSITIVE_FIELDS:
    require_positive_int(config, field)
  _validate_data(config)
  _validate_model(config)
  _validate_rl(config)
  unknown = [name for name in config.students if name not in STUDENTS]
  require(not unknown, "students", f"unknown {unknown}; known: {list(STUDENTS)}")
  require(len(config.study.seeds) > 0, "study.seeds", "needs at least one seed")
  if config.variant == "gpu" or config.model.checkpoint or config.data.data_dir:
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
  c = config.compress
  require(0.0 < c.rho <= 1.0, "compress.rho", f"must be in (0, 1], got {c.rho}")
  require(c.budget <= config.data.num_frames, "compress.budget", "exceeds data.num_frames")
  r = config.retriever
  require(r.temperature > 0, "retriever.temperature", f"must be > 0, got {r.temperature}")
  require(0 < r.cut_threshold < 2, "retriever.cut_threshold", "a cosine distance in (0, 2)")


def _validate_rl(config) -> None:
  r = config.rl
  require(r.group >= 2, "rl.group", "group-relative advantages need at least 2 rollouts")
  require(0.0 <= r.tau <= 1.0, "rl.tau", f"must be in [0, 1], got {r.tau}")
  require(r.alpha >= 0.0, "rl.alpha", f"must be >= 0, got {r.alpha}")
  require(r.beta >= 0.0, "rl.beta", f"must be >= 0, got {r.beta}")
  require(0.0 < r.clip < 1.0, "rl.clip", f"must be in (0, 1), got {r.clip}")
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
  require(
    False,
    "data.data_dir",
    "training on Video-R1 with Qwen2.5-VL is not implemented: the checkpoint loads and answers "
    "video files as teacher and merged-input student (methods/marc/paper_scale.py), but the "
    "Video-R1 reader, Qwen's tokenizer and the 3B C-GRPO loop are not written; the EventWorld "
    "variants run end to end",
  )


METHOD = Method(name="marc", phases=phases, validate=validate, study_arms=study_arms, report=report)
