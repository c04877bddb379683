"""MARC's evaluation: every arm (zero-shot arms on the teacher, trained students) greedy-decoded on
the same test questions; accuracy per question type, visual tokens, the retriever's quality, the
decoder's prefill FLOPs (XLA cost analysis) and measured answer latency, full input against MARC's.

Headline keys of results.json: `accuracy` (the main student: `marc` when trained), `teacher_accuracy`
(the teacher on all frames), `blind_accuracy` (the floor: each question type's majority answer in
the RL pool, never looking at the video; `above_floor_*` = (accuracy - floor) / (1 - floor)),
`token_ratio` (the main student's visual tokens over the teacher's),
`latency_ratio` (decoder answer latency, compressed over full input; `end_to_end_latency_ratio`
includes the frame encoder, the retriever and the merge).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import grpo, rl
from core import video_memory as retrieval
from core.data import eventworld
from core.nn import vlm as vlm_lib
from methods.base import cached_per_config, with_changes
from methods.marc import inputs as mi
from methods.marc.students import STUDENTS

ZERO_SHOT = {  # arm -> visual input, all on the teacher's weights
  "teacher_full": "full",
  "teacher_vmr": "vmr_full",
  "zero_shot": "vmr_merge",
  "uniform": "uniform",
  "merge_only": "merge",
  "teacher_oracle": "oracle_full",
}
EVAL_KEYS = ("frames", "question", "question_length", "answer", "relevant", "event_of_frame")


def arms_of(config) -> dict[str, str]:
  """Every evaluated arm and its visual input."""
  return {**ZERO_SHOT, **{name: STUDENTS[name].mode for name in config.students}}


def main_arm(config) -> str:
  if "marc" in config.students:
    return "marc"
  return config.students[-1] if config.students else "zero_shot"


def arm_params(inputs, name: str) -> dict:
  teacher = inputs["teacher"]
  if name in ZERO_SHOT:
    return teacher
  return {"encoder": teacher["encoder"], **inputs[name]}


@cached_per_config(maxsize=16)
def answer_fn(config, mode: str):
  """Jitted `(params, retriever params, batch) -> (correct, well formed, visual tokens)`."""
  ids = mi.special_ids()

  def run(params, retriever_params, batch):
    frames = mi.visual_input(config, params["encoder"], retriever_params, batch, mode)
    gen = mi.answer(config, params, frames, batch, jax.random.key(0))
    correct, formed = grpo.completion_checks(
      gen.tokens, gen.lengths, batch["answer"], ids["open"], ids["close"], ids["answers"]
    )
    tokens = jnp.sum(frames.valid, -1) * mi.tokens_per_frame(config)
    return correct, formed, tokens

  return jax.jit(run)


def chunks(config, test):
  size = config.eval.chunk
  for start in range(0, config.data.num_test, size):
    yield {k: jnp.asarray(test[k][start : start + size]) for k in EVAL_KEYS}


def evaluate_arm(config, params, retriever_params, mode: str) -> dict[str, np.ndarray]:
  test = mi.test_set(config)
  fn = answer_fn(config, mode)
  parts = [jax.device_get(fn(params, retriever_params, b)) for b in chunks(config, test)]
  correct, formed, tokens = (np.concatenate(p) for p in zip(*parts, strict=True))
  return {"correct": correct, "formed": formed, "tokens": tokens}


def arm_metrics(config, name: str, out, qtype) -> dict[str, float]:
  metrics = {
    f"accuracy_{name}": out["correct"].mean(),
    f"format_{name}": out["formed"].mean(),
    f"visual_tokens_{name}": out["tokens"].mean(),
  }
  for index, kind in enumerate(eventworld.QUESTION_TYPES):
    chosen = qtype == index
    if chosen.any():
      metrics[f"accuracy_{name}_{kind}"] = out["correct"][chosen].mean()
  return metrics


def blind_metrics(config) -> dict[str, float]:
  """The floor: each question type's majority answer among the RL pool's questions (a training
  stream), scored on the test set without looking at any video (`accuracy_blind*`)."""
  pool = [mi.pool_chunk(config, i) for i in range(config.rl.pool_chunks)]
  answers = np.concatenate([chunk["answer"] for chunk in pool])
  qtypes = np.concatenate([chunk["qtype"] for chunk in pool])
  test = mi.test_set(config)
  correct = np.zeros(len(test["answer"]), bool)
  for index in range(len(eventworld.QUESTION_TYPES)):
    values, counts = np.unique(answers[qtypes == index], return_counts=True)
    guess = values[np.argmax(counts)] if len(values) else -1
    chosen = test["qtype"] == index
    correct[chosen] = test["answer"][chosen] == guess
  out = {"correct": correct, "formed": np.ones_like(correct), "tokens": np.zeros(len(correct))}
  return arm_metrics(config, "blind", out, test["qtype"])


def retrieval_metrics(config, retriever_params, suffix: str = "") -> dict[str, float]:
  """The detector's cuts (share of videos cut exactly at the true events) and the retriever's
  recall (share of the relevant events' frames kept; `hit_local`: one-event questions whose whole
  event was kept), on the detected cuts and (`*_true_cuts`) on the true events."""
  test = mi.test_set(config)

  @jax.jit
  def kept(batch):
    segment = retrieval.segment_video(batch["frames"], config.retriever.cut_threshold)
    on_true = mi.retrieved_frames(config, retriever_params, batch, batch["event_of_frame"])
    return segment, mi.retrieved_frames(config, retriever_params, batch, segment), on_true

  parts = [jax.device_get(kept(part)) for part in chunks(config, test)]
  segment, mask, mask_true = (np.concatenate(p) for p in zip(*parts, strict=True))
  events = test["event_of_frame"]
  relevant = np.take_along_axis(test["relevant"], events, 1)  # [N, F]
  local = np.isin(test["qtype"], eventworld.LOCAL_TYPES)
  has = relevant.any(1)
  metrics = {
    "segmentation_exact": float(np.mean(np.all(segment == events, 1))),
    "retrieved_frames": float(mask.sum(1).mean()),
  }
  for name, chosen in (("", mask), ("_true_cuts", mask_true)):
    recall = (relevant & chosen).sum(1) / np.maximum(relevant.sum(1), 1)
    metrics[f"retrieval_recall{name}"] = float(recall[has].mean())
    metrics[f"retrieval_hit_local{name}"] = float(np.mean(recall[local] == 1.0))
  return {f"{k}{suffix}": v for k, v in metrics.items()}


def training_segmentation_exact(config) -> float:
  """Share of the retriever's first training batch cut exactly at the true events: the detector's
  cuts on the data the retriever trains on (it trains on the true events)."""
  batch = mi.stream(config, "retriever", config.retriever.batch_size).batch(0)
  segment = retrieval.segment_video(jnp.asarray(batch["frames"]), config.retriever.cut_threshold)
  return float(np.mean(np.all(np.asarray(segment) == batch["event_of_frame"], 1)))


def top_k_sweep(config, inputs, qtype) -> dict[str, float]:
  """The teacher on the retrieved clips' frames and the retriever's recall at each k of
  `eval.top_k_sweep` (k >= the number of events keeps every frame)."""
  results = {}
  for k in config.eval.top_k_sweep:
    at_k = with_changes(config, retriever__top_k=k)
    out = evaluate_arm(at_k, inputs["teacher"], inputs["retriever"], "vmr_full")
    results.update(arm_metrics(at_k, f"teacher_vmr_k{k}", out, qtype))
    results.update(retrieval_metrics(at_k, inputs["retriever"], f"_k{k}"))
  return results


def _flops(compiled) -> float:
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("flops", float("nan"))) if cost else float("nan")


def efficiency(config, inputs, mode: str) -> dict[str, float]:
  """Decoder prefill FLOPs per question and the fastest answer latency of `eval.latency_batch`
  questions on the full input against `mode` (decoder only, and end to end from the frames)."""
  test, e = mi.test_set(config), config.eval
  batch = {k: jnp.asarray(test[k][: e.latency_batch]) for k in EVAL_KEYS}
  teacher, retriever_params = inputs["teacher"], inputs["retriever"]
  vlm = mi.vlm_of(config)
  frames = {
    m: mi.visual_input(config, teacher["encoder"], retriever_params, batch, m)
    for m in ("full", mode)
  }

  def prefill(params, f, b):
    return vlm_lib.prefill(vlm, params, f, b["question"], b["question_length"], 3)[0]

  one = jax.tree.map(lambda x: x[:1], (frames, batch))
  flops = {m: _flops(jax.jit(prefill).lower(teacher, one[0][m], one[1]).compile()) for m in frames}

  def decode_only(params, f, b):
    return mi.answer(config, params, f, b, jax.random.key(0)).tokens

  def end_to_end(m, params, r, b):
    f = mi.visual_input(config, params["encoder"], r, b, m)
    return mi.answer(config, params, f, b, jax.random.key(0)).tokens

  seconds = rl.best_seconds(
    [
      (decode_only, (teacher, frames["full"], batch)),
      (decode_only, (teacher, frames[mode], batch)),
      (functools.partial(end_to_end, "full"), (teacher, retriever_params, batch)),
      (functools.partial(end_to_end, mode), (teacher, retriever_params, batch)),
    ],
    e.latency_repeats,
  )
  return {
    "prefill_flops_full": flops["full"],
    "prefill_flops_compressed": flops[mode],
    "flops_ratio": flops[mode] / flops["full"],
    "answer_seconds_full": seconds[0],
    "answer_seconds_compressed": seconds[1],
    "latency_ratio": seconds[1] / seconds[0],
    "end_to_end_latency_ratio": seconds[3] / seconds[2],
  }


def evaluate(config, inputs, rng) -> dict[str, float]:
  del rng  # greedy decoding
  qtype = mi.test_set(config)["qtype"]
  results = {}
  for name, mode in arms_of(config).items():
    out = evaluate_arm(config, arm_params(inputs, name), inputs["retriever"], mode)
    results.update(arm_metrics(config, name, out, qtype))
  main = main_arm(config)
  full_tokens = config.data.num_frames * mi.tokens_per_frame(config)
  results["accuracy"] = results[f"accuracy_{main}"]
  results["teacher_accuracy"] = results["accuracy_teacher_full"]
  results["token_ratio"] = results[f"visual_tokens_{main}"] / full_tokens
  results.update(retrieval_metrics(config, inputs["retriever"]))
  results["segmentation_exact_train"] = training_segmentation_exact(config)
  results.update(top_k_sweep(config, inputs, qtype))
  results.update(blind_metrics(config))
  results["blind_accuracy"] = results["accuracy_blind"]
  results.update(efficiency(config, inputs, arms_of(config)[main]))
  return {k: float(v) for k, v in results.items()}
