"""Video-R1's QA data, prompts and rule rewards, as MARC trains on them ("MARC: Memory-Augmented RL
Token Compression for Efficient Video Understanding", ICLR 2026; official code github.com/Gimlettt/MARC,
built on Video-R1, github.com/tulerfeng/Video-R1: `src/r1-v/src/open_r1/grpo.py` holds the prompt
templates and the accuracy / format rewards).

A Video-R1 QA json is a list of entries with `problem_type` (multiple choice, numerical, OCR,
free-form, regression), `problem`, `options` (multiple choice), `solution` (`<answer>X</answer>`),
optionally `process` (`<think>...</think>`, the chain of thought of the COT release), `path` (relative
to the data folder) and `data_type` (video or image).

  read_records     the json -> `Record`s: video entries whose type has an exact-match reward
                   (multiple choice, numerical); image entries and the OCR / free-form / regression
                   types (WER, ROUGE and relative-accuracy rewards) are counted and left out.
  split            a seeded permutation: the first `num_test` records are the test questions, the
                   rest the RL pool (pure in its arguments, so a resumed run reads the same split).
  user_text        Video-R1's question text, think/answer instruction and per-type answer hint.
  chat_prefix / chat_suffix
                   Qwen2.5-VL's chat template around one video: the default system turn, then
                   `<|im_start|>user\\n<|vision_start|>[video]<|vision_end|>{text}<|im_end|>\\n
                   <|im_start|>assistant\\n`.
  accuracy_reward / format_reward
                   the rule rewards on a decoded completion.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

TYPES = ("multiple choice", "numerical")  # the types kept (exact-match rewards)
TYPE_IDS = {name: i for i, name in enumerate(TYPES)}

THINK_INSTRUCTION = (
  "{question}\n"
  "Please think about this question as if you were a human pondering deeply. "
  "Engage in an internal dialogue using expressions such as 'let me think', 'wait', 'Hmm', "
  "'oh, I see', 'let's break it down', etc, or other natural language thought expressions "
  "It's encouraged to include self-reflection or verification in the reasoning process. "
  "Provide your detailed reasoning between the <think> </think> tags, and then give your final "
  "answer between the <answer> </answer> tags."
)
TYPE_HINTS = {
  "multiple choice": " Please provide only the single option letter (e.g., A, B, C, D, etc.) "
  "within the <answer> </answer> tags.",
  "numerical": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> "
  "</answer> tags.",
}
SYSTEM = "You are a helpful assistant."  # Qwen2.5-VL's default system turn


class Record(NamedTuple):
  path: str  # the video file
  question: str  # the user text (question, options, instruction)
  solution: str  # `<answer>X</answer>`
  problem_type: str
  process: str  # the `<think>...</think>` of the COT release, or ""


class VideoR1Error(ValueError):
  """A QA json this reader cannot use; the message names the file and entry."""


def read_records(json_path: str, data_dir: str | None = None) -> tuple[list[Record], dict]:
  """`(records, skipped)`: the json's video entries of `TYPES` in file order, their paths joined to
  `data_dir` (default: the json's folder); `skipped` counts what was left out by reason."""
  with open(json_path, encoding="utf-8") as f:
    entries = json.load(f)
  if not isinstance(entries, list):
    raise VideoR1Error(f"{json_path}: expected a list of QA entries, got {type(entries).__name__}")
  root = os.path.dirname(json_path) if data_dir is None else data_dir
  records, skipped = [], {"image": 0, "other_type": 0}
  for index, entry in enumerate(entries):
    missing = [k for k in ("problem_type", "problem", "solution", "path") if k not in entry]
    if missing:
      raise VideoR1Error(f"{json_path}: entry {index} has no {missing}")
    if entry.get("data_type", "video") != "video":
      skipped["image"] += 1
    elif entry["problem_type"] not in TYPES:
      skipped["other_type"] += 1
    else:
      records.append(
        Record(
          os.path.normpath(os.path.join(root, entry["path"])),
          user_text(entry),
          entry["solution"],
          entry["problem_type"],
          entry.get("process", "") or "",
        )
      )
  return records, skipped


def user_text(entry: dict) -> str:
  """The user turn's text: the problem (with one option per line for multiple choice), the
  think/answer instruction and the answer-type hint."""
  question = entry["problem"]
  if entry["problem_type"] == "multiple choice":
    question = question + "Options:\n" + "".join(f"{o}\n" for o in entry.get("options") or [])
  return THINK_INSTRUCTION.format(question=question) + TYPE_HINTS[entry["problem_type"]]


def split(records: Sequence[Record], num_test: int, seed: int) -> tuple[list[Record], list[Record]]:
  """`(pool, test)`: a permutation by `seed`; the first `num_test` records test, the rest the pool."""
  if not 0 < num_test < len(records):
    raise VideoR1Error(f"num_test {num_test} must be in (0, {len(records)}) (the usable records)")
  order = np.random.default_rng(seed).permutation(len(records))
  test = [records[i] for i in order[:num_test]]
  pool = [records[i] for i in order[num_test:]]
  return pool, test


def missing_videos(records: Sequence[Record]) -> list[str]:
  return sorted({r.path for r in records if not os.path.isfile(r.path)})


def chat_prefix() -> str:
  return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"


def chat_suffix(text: str) -> str:
  return f"{text}<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------------------------------------------
# Rewards (Video-R1's rule rewards)
# ---------------------------------------------------------------------------------------------------

_ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def extract_answer(text: str) -> str:
  """The first `<answer>...</answer>`'s content, stripped; "" when there is none."""
  match = _ANSWER.search(text)
  return match.group(1).strip() if match else ""


def normalize_number(text: str) -> float | None:
  try:
    return float(text.replace(",", ""))
  except ValueError:
    return None


def accuracy_reward(completion: str, solution: str, problem_type: str) -> float:
  """1 when the completion's answer matches the solution's: the same option letter, or the same
  number to two decimals (with a decimal point in both or in neither)."""
  out, truth = extract_answer(completion), extract_answer(solution)
  if problem_type == "multiple choice":
    return float(out.strip() == truth.strip())
  if problem_type == "numerical":
    if (("." in out) or ("," in out)) != (("." in truth) or ("," in truth)):
      return 0.0
    a, b = normalize_number(out), normalize_number(truth)
    return float(a is not None and b is not None and round(a, 2) == round(b, 2))
  raise VideoR1Error(f"no accuracy reward for problem_type {problem_type!r}; known {TYPES}")


def format_reward(completion: str) -> float:
  """1 when the whole completion is `<think>...</think> <answer>...</answer>`."""
  return float(_FORMAT.fullmatch(completion) is not None)
