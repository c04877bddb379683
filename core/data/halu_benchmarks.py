"""The hallucination benchmarks of "Token-Guard" (ICLR 2026) in the official repository's format.

The official code (github.com/rhq945/Token-Guard) evaluates on `data/<name>.json`, each a JSON array
of records `{"id", "passage", "question", "answer", "source_ds"}` (RAGTruth, FinanceBench and
PubmedQA also carry `"label"`, "PASS" in every record); `guard/run_guard.py` reads `question`,
`passage` and `answer` (the gold, compared by `eval/eval.py`). JSON Lines files (one record a line)
with the same fields are read too. Files and the prompt family each uses (`guard/run_all_eval.sh`):

  Halueval.json  halueval      DROP_History.json  history      FinanceBench.json  financebench
  RAGTruth.json  ragtruth      DROP_Nfl.json      nfl          PubmedQA.json      pubmedqa
  CovidQA.json   covidQA

Prompts follow `guard/prompt_builder.py` (zero-shot system prompts; CovidQA passages cut to 12,000
characters with its question-aware paragraph selection) and `guard/beam_search.py`: the chat
template of the model, with the empty assistant turn's end stripped, then "The reasoning steps
are:\\n\\n". `chat_prompt` writes Llama 3's template. Answers are read back as
`eval/processed_answer/process.py` does (the last "Answer: ..." line) and scored with
`eval/eval.py`'s DROP-style EM and F1 (`answer_metrics`; its BLEU-1 and ROUGE-L are not ported).
"""

from __future__ import annotations

import json
import os
import re
import string
from typing import NamedTuple

import numpy as np

# name -> (file in the official data/ folder, prompt family of prompt_builder.py)
BENCHMARKS = {
  "halueval": ("Halueval.json", "halueval"),
  "ragtruth": ("RAGTruth.json", "ragtruth"),
  "financebench": ("FinanceBench.json", "financebench"),
  "drop_history": ("DROP_History.json", "history"),
  "drop_nfl": ("DROP_Nfl.json", "nfl"),
  "pubmedqa": ("PubmedQA.json", "pubmedqa"),
  "covidqa": ("CovidQA.json", "covidQA"),
}
REQUIRED_FIELDS = ("passage", "question", "answer")
REASONING_PREFIX = "The reasoning steps are:\n\n"  # beam_search.py's previous_steps at step 0


class BenchmarkError(ValueError):
  """A benchmark file that cannot be read; the message names the file, record and field."""


class Record(NamedTuple):
  id: str
  passage: str
  question: str
  answer: str  # the gold answer
  source: str  # `source_ds`
  label: str  # `label` where the file has one, else ""


# ---------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------


def benchmark_path(data_dir: str, name: str) -> str:
  if name not in BENCHMARKS:
    raise BenchmarkError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
  filename = BENCHMARKS[name][0]
  for candidate in (filename, filename.removesuffix(".json") + ".jsonl"):
    path = os.path.join(data_dir, candidate)
    if os.path.isfile(path):
      return path
  return os.path.join(data_dir, filename)


def read_benchmark(path: str) -> list[Record]:
  """The records of one file: a JSON array, or JSON Lines (`.jsonl`, or any file whose text does
  not start with "[")."""
  try:
    with open(path, encoding="utf-8") as file:
      text = file.read()
  except OSError as error:
    raise BenchmarkError(f"cannot read {path!r}: {error.strerror or error}") from None
  try:
    if text.lstrip().startswith("["):
      rows = json.loads(text)
    else:
      rows = [json.loads(line) for line in text.splitlines() if line.strip()]
  except json.JSONDecodeError as error:
    raise BenchmarkError(f"{path}: not JSON or JSON Lines ({error})") from None
  if not rows:
    raise BenchmarkError(f"{path}: holds no records")
  return [_record(path, index, row) for index, row in enumerate(rows)]


def _record(path: str, index: int, row) -> Record:
  if not isinstance(row, dict):
    raise BenchmarkError(f"{path}: record {index} is a {type(row).__name__}, not an object")
  for field in REQUIRED_FIELDS:
    if not isinstance(row.get(field), str):
      found = "missing" if field not in row else f"a {type(row[field]).__name__}"
      raise BenchmarkError(f"{path}: record {index} field {field!r} is {found}, not a string")
  return Record(
    id=str(row.get("id", index)),
    passage=row["passage"],
    question=row["question"],
    answer=row["answer"],
    source=str(row.get("source_ds", "")),
    label=str(row.get("label", "")),
  )


def benchmark_problem(data_dir: str, names) -> str | None:
  """Why `data_dir` cannot serve the benchmarks `names` (None when every file reads)."""
  if not data_dir:
    return "not set"
  if not os.path.isdir(data_dir):
    return f"no folder {data_dir!r}"
  for name in names:
    try:
      read_benchmark(benchmark_path(data_dir, name))
    except BenchmarkError as error:
      return str(error)
  return None


# ---------------------------------------------------------------------------------------------------
# Prompts (guard/prompt_builder.py, zero-shot)
# ---------------------------------------------------------------------------------------------------

_DEFAULT_SYSTEM = (
  "You will be presented with a question.\n"
  "Answer the user's question strictly based on the given information.\n"
  "Do not make up information.\n"
  "At the end, output: Answer:[your answer here]."
)
SYSTEM_PROMPTS = {
  "pubmedqa": (
    "You will be given a PubMed-style passage and a Yes/No/Maybe question.\n"
    "Answer rules:\n"
    '1. Begin with exactly one of: "Yes." / "No." / "Maybe."\n'
    "2. Summarize the main conclusion from the passage in exactly ONE short sentence (≤25 words).\n"
    "3. Preserve key phrases and medical terms from the passage; do not replace them with "
    "synonyms.\n"
    "4. Always include explicitly stated conditions, subgroups, or limitations if they appear in "
    "the conclusion.\n"
    "5. Do NOT add recommendations, explanations, or new information.\n"
    "6. The final output must be exactly ONE LINE:\n"
    "Answer:[Yes./No./Maybe. + short sentence]"
  ),
  "financebench": (
    "You are an equity research analyst. Answer the question using **only the data provided**. "
    "Follow these instructions carefully:\n\n"
    "1. Always produce a single-line final answer.\n"
    "2. Do not show calculations, reasoning, or commentary.\n"
    "3. Match the exact format of the ground truth:\n"
    '   - "$360000.00" for USD thousands\n'
    '   - "$7223.00" for USD millions\n'
    '   - "$4.90" for USD billions\n'
    '   - "34.7%" for percentages\n'
    '   - "1.08" for ratios\n'
    "4. If the answer is not directly available from the statements, output:\n"
    '   "Unable to answer based on given data."\n\n'
    "**Example:**\n"
    "Q: How much was Boeing's FY2017 interest expense (USD thousands)?\n"
    "A: Answer: $360000.00\n"
    "At the end, output: Answer:[your answer here]."
  ),
  "halueval": _DEFAULT_SYSTEM,
  "history": _DEFAULT_SYSTEM,
  "ragtruth": (
    "You are given passages and a question. Follow these steps:\n"
    "Answer the question using only the information from the given passages.\n"
    " - Include specific examples, numbers, or comparisons if mentioned.\n"
    " - Include all details that support the answer.\n"
    " - Do not add external information.\n"
    ' - If the passages do not contain sufficient information, answer: "Unable to answer based on '
    'given passages."\n'
    "At the end, output: Answer:[your answer here]"
  ),
  "covidQA": (
    "You are a biomedical QA assistant. Answer using ONLY the provided passage.\n"
    "Rules:\n"
    "1. Copy the EXACT PHRASE or SENTENCE from the passage that answers the question.\n"
    "2. NEVER answer yes/no questions with just 'Yes.' or 'No.' — always include the specific "
    "text.\n"
    "   Wrong: 'No.'  Correct: 'the current strategy... is not sufficient because...'\n"
    "3. For list questions (viruses, methods, etc.): include ALL items from the passage.\n"
    "4. Use the FULL NAME as written (e.g., 'Human metapneumovirus (HMPV)' not 'HMPV').\n"
    "5. Do NOT paraphrase or summarize — copy exact wording.\n"
    "6. Your FINAL output line must be EXACTLY: Answer:[copied text]"
  ),
}


def system_prompt(family: str) -> str:
  return SYSTEM_PROMPTS.get(family, _DEFAULT_SYSTEM)


def covid_passage(passage: str, question: str, max_chars: int = 12_000) -> str:
  """`PromptBuilder.preprocess_passage` for CovidQA: the whole abstract, then the first 600
  characters of the text and the paragraphs sharing most 4+-letter words with the question, in
  their order, within `max_chars`."""
  abstract = ""
  abs_idx, text_idx = passage.find("Abstract:"), passage.find("Text:")
  if abs_idx >= 0:
    end = text_idx if text_idx > abs_idx else abs_idx + 1500
    abstract = passage[abs_idx:end].strip()
  body = passage[text_idx:] if text_idx >= 0 else passage
  if len(abstract) + len(body) + 2 <= max_chars:
    return (abstract + "\n\n" + body if abstract else body).strip()
  budget = max_chars - len(abstract) - 10
  if question:
    anchor, rest = body[:600], body[600:]
    remaining = budget - len(anchor) - 2
    words = set(re.findall(r"\b\w{4,}\b", question.lower()))
    paragraphs = [
      p.strip() for p in re.split(r"\n{2,}|\n(?=[A-Z\-\d])", rest) if len(p.strip()) > 40
    ]
    if not paragraphs:
      paragraphs = [s.strip() for s in re.split(r"(?<=[.!?])\s+", rest) if len(s.strip()) > 30]
    order = sorted(
      range(len(paragraphs)),
      key=lambda i: len(words & set(re.findall(r"\b\w{4,}\b", paragraphs[i].lower()))),
      reverse=True,
    )
    chosen, used = [], 0
    for i in order:
      if used + len(paragraphs[i]) + 2 <= remaining:
        chosen.append(i)
        used += len(paragraphs[i]) + 2
      if used >= remaining:
        break
    relevant = anchor + "\n\n" + "\n\n".join(paragraphs[i] for i in sorted(chosen))
  else:
    relevant = body[:budget]
  return (abstract + "\n\n" + relevant if abstract else relevant).strip()


def prompt_passage(record: Record, family: str) -> str:
  """The passage as the prompt shows it (CovidQA's cut by `covid_passage`)."""
  if family == "covidQA":
    return covid_passage(record.passage, record.question)
  return record.passage


def user_message(record: Record, family: str, passage: str | None = None) -> str:
  """`PromptBuilder.prepare_chat_template`'s user turn; `passage` overrides `prompt_passage`."""
  if passage is None:
    passage = prompt_passage(record, family)
  return (
    "Passage: "
    + passage
    + "\nQuestion: "
    + record.question
    + "\nPlease directly follow the previous reasoning steps (if provided) and generate the "
    "remaining ones.\n"
  )


def chat_prompt(system: str, user: str) -> str:
  """Llama 3's chat template (system and user turns, then the assistant header) as the official
  code leaves it: the empty assistant turn's `<|eot_id|>` and blank lines stripped, followed by the
  reasoning prefix."""
  turns = "".join(
    f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}<|eot_id|>"
    for role, content in (("system", system), ("user", user))
  )
  return (
    "<|begin_of_text|>"
    + turns
    + "<|start_header_id|>assistant<|end_header_id|>"
    + (REASONING_PREFIX)
  )


# ---------------------------------------------------------------------------------------------------
# Answers and metrics (eval/processed_answer/process.py, eval/eval.py)
# ---------------------------------------------------------------------------------------------------

_ANSWER = re.compile(r'(?:answer|Answer)\s*[:：]\s*"?([^"\]\}\n]+)"?')


def extract_answer(text: str) -> str:
  """process.py's `extract_simple_answer`: the last "Answer: ..." of `text` up to a quote, closing
  bracket or line end, without a final period ("" when there is none; an opening "[" stays and
  the normalisation drops it)."""
  matches = _ANSWER.findall(text)
  if not matches:
    return ""
  content = matches[-1].strip()
  return content[:-1].strip() if content.endswith(".") else content


def _is_number(text: str) -> bool:
  for candidate in (text, text[:-1] if text.endswith("%") else None):
    if candidate is None:
      continue
    try:
      float(candidate)
      return True
    except ValueError:
      pass
  return False


def _normalize_token(token: str) -> str:
  token = token.lower()
  if not _is_number(token):
    token = "".join(c for c in token if c not in set(string.punctuation))
  if _is_number(token):
    token = str(float(token[:-1] if token.endswith("%") else token))
  token = re.sub(r"\b(a|an|the)\b", " ", token)
  return " ".join(token.split())


def normalize_answer(text: str) -> str:
  """eval.py's `_normalize_answer`: split on spaces and hyphens; per token lower case, punctuation
  removed unless a number, numbers as floats, articles removed."""
  parts = [_normalize_token(token) for token in re.split(" |-", text)]
  return " ".join(part for part in parts if part.strip()).strip()


def _f1(predicted: set, gold: set) -> float:
  common = len(gold & predicted)
  precision = common / len(predicted) if predicted else 1.0
  recall = common / len(gold) if gold else 1.0
  if precision == 0.0 and recall == 0.0:
    return 0.0
  return 2 * precision * recall / (precision + recall) * 100


def answer_metrics(predicted: str, gold: str) -> tuple[float, float]:
  """eval.py's `get_metrics` for one answer and one gold string: (EM in {0, 1}, F1 in [0, 100]);
  F1 is 0 when the gold has numbers and the prediction none of them."""
  pred, ref = normalize_answer(predicted), normalize_answer(gold)
  pred_bag, gold_bag = set(pred.split()), set(ref.split())
  em = float(pred == ref)
  gold_numbers = {w for w in gold_bag if _is_number(w)}
  numbers_match = not gold_numbers or bool(gold_numbers & {w for w in pred_bag if _is_number(w)})
  return em, round(_f1(pred_bag, gold_bag), 4) if numbers_match else 0.0


def mean_metrics(predicted, gold) -> dict[str, float]:
  """Mean EM (fraction) and F1 (fraction, eval.py's value / 100) over paired answers."""
  scores = np.array([answer_metrics(p, g) for p, g in zip(predicted, gold, strict=True)])
  if not len(scores):
    return {"em": float("nan"), "f1": float("nan")}
  return {"em": float(scores[:, 0].mean()), "f1": float(scores[:, 1].mean() / 100)}
