"""A synthetic factual world with passage QA and programmatic hallucination labels.

The checkable testbed for "Token-Guard: Towards Token-Level Hallucination Control via Self-Checking
Decoding" (Zhu, Rong, Luo; ICLR 2026, arXiv 2601.21969), whose benchmarks (HaluEval, RAGTruth, DROP,
FinanceBench) ask a model to answer from a passage with chain-of-thought and count answers the passage
does not support. Here the passage, the question, the reasoning steps and the answer are short word
sequences over a seeded world, so every claim a model makes can be checked exactly.

World (`make_world`): persons `P000..`, cities `C00..`, companies `K00..`, ages `A20..`; relations
`born_in` (person -> city), `works_at` (person -> company), `age` (person -> age), `spouse` (person
<-> person, a fraction of the persons in symmetric pairs) and `ceo` (company -> person). These facts
are the knowledge base (KB) that closed-book `Fact:` sequences teach the model, so that it holds a
parametric memory that may conflict with a passage.

Example (`make_example`):

  Passage: P017 spouse P102 . P102 born_in C11 . P044 works_at K02 . Question: P017 spouse born_in ?
  Step: P017 spouse P102 . Step: P102 born_in C11 . Answer: C11 <eos>

1-hop questions (`born_in`, `works_at`, `age`, `spouse` of a person; `ceo` of a company) and 2-hop
questions (`spouse` then `born_in`/`works_at`/`age`; `works_at` then `ceo`); one `Step:` per hop.
Unanswerable questions lose one needed fact (the steps stop where the passage does and the answer is
`No answer`); counterfactual passages change the object of one needed fact to another entity of the
same type, so the passage contradicts the KB and the passage wins. Distractors are true KB facts whose
(subject, relation) differ from every needed hop: facts of the same subject (other relations), facts
of the same relation (other subjects) and random facts.

Labels (`label_output`): a claimed triple `s r o` is supported when the passage states `s r o`.
Otherwise it is a hallucination of one type: `override` (o is the KB value, the passage says
otherwise or nothing), `misread` (o appears in the passage: the wrong fact was copied) or
`fabrication` (o appears nowhere in the passage). An answer is judged against the gold answer: a
wrong entity gets the same three types (against the KB chain's answer), an entity for an unanswerable
question is `unanswerable`; `No answer` to an answerable question is a false abstention and an
unparseable output is `malformed` (both wrong, neither a hallucination). Token-level labels mark the
object token of each hallucinated step and of a hallucinated answer.

Metrics: exact match and bag-of-words F1 after DROP-style normalisation (the official evaluation's
`eval.py`: lower case, punctuation and articles removed); the answers here are single spans, so the
DROP multi-span alignment reduces to one pair.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string

import numpy as np

RELATIONS = ("born_in", "works_at", "age", "spouse", "ceo")
KEYWORDS = ("Fact:", "Passage:", "Question:", "Step:", "Answer:", "No", "answer", ".", "?")
ONE_HOP = (("born_in",), ("works_at",), ("age",), ("spouse",), ("ceo",))
TWO_HOP = (("spouse", "born_in"), ("spouse", "works_at"), ("spouse", "age"), ("works_at", "ceo"))
NO_ANSWER = "No answer"
HALLUCINATION_TYPES = ("override", "misread", "fabrication", "unanswerable")
STEP_TYPES = ("override", "misread", "fabrication")
_OBJECT_KIND = {"born_in": "city", "works_at": "company", "age": "age", "spouse": "person"}
_OBJECT_KIND["ceo"] = "person"


@dataclasses.dataclass(frozen=True)
class World:
  """Entity names by kind and the KB `facts[(subject, relation)] = object`."""

  entities: dict[str, tuple[str, ...]]
  facts: dict[tuple[str, str], str]

  def subjects(self, relation: str) -> list[str]:
    return sorted(s for (s, r) in self.facts if r == relation)

  def answer(self, subject: str, path: tuple[str, ...]) -> str | None:
    """The KB's answer to `path` from `subject` (None if a hop has no fact)."""
    node = subject
    for relation in path:
      node = self.facts.get((node, relation))
      if node is None:
        return None
    return node


def make_world(
  num_persons: int = 200,
  num_cities: int = 30,
  num_companies: int = 20,
  num_ages: int = 60,
  married_fraction: float = 0.6,
  seed: int = 0,
) -> World:
  """The seeded KB (module docstring)."""
  if min(num_persons, num_cities, num_companies, num_ages) < 2 or num_persons < num_companies + 2:
    raise ValueError(
      "factual_world: needs >= 2 entities of each kind and more persons than companies"
    )
  width = len(str(num_persons - 1))
  entities = {
    "person": tuple(f"P{i:0{width}d}" for i in range(num_persons)),
    "city": tuple(f"C{i:02d}" for i in range(num_cities)),
    "company": tuple(f"K{i:02d}" for i in range(num_companies)),
    "age": tuple(f"A{20 + i}" for i in range(num_ages)),
  }
  rng = np.random.default_rng(seed)
  facts = {}
  for person in entities["person"]:
    facts[(person, "born_in")] = str(rng.choice(entities["city"]))
    facts[(person, "works_at")] = str(rng.choice(entities["company"]))
    facts[(person, "age")] = str(rng.choice(entities["age"]))
  order = rng.permutation(num_persons)
  pairs = int(married_fraction * num_persons) // 2
  for a, b in order[: 2 * pairs].reshape(pairs, 2):
    pa, pb = entities["person"][a], entities["person"][b]
    facts[(pa, "spouse")], facts[(pb, "spouse")] = pb, pa
  ceos = rng.choice(num_persons, num_companies, replace=False)
  for company, ceo in zip(entities["company"], ceos, strict=True):
    facts[(company, "ceo")] = entities["person"][ceo]
    facts[(entities["person"][ceo], "works_at")] = company
  return World(entities, facts)


def vocabulary(world: World) -> list[str]:
  """Every word the sequences use (a `WordTokenizer` adds the special tokens in front)."""
  words = list(KEYWORDS) + list(RELATIONS)
  for kind in ("person", "city", "company", "age"):
    words += world.entities[kind]
  return words


# ---------------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Example:
  """One passage-QA item with everything its checker needs."""

  passage: tuple[tuple[str, str, str], ...]
  subject: str
  path: tuple[str, ...]
  steps: tuple[tuple[str, str, str], ...]  # the gold chain of thought (as far as the passage goes)
  answer: str  # the gold answer: an entity or NO_ANSWER
  kb_answer: str | None  # what the KB (closed book) answers
  unanswerable: bool
  counterfactual: bool

  @property
  def prompt(self) -> str:
    facts = " ".join(f"{s} {r} {o} ." for s, r, o in self.passage)
    return f"Passage: {facts} Question: {self.subject} {' '.join(self.path)} ?"

  @property
  def target(self) -> str:
    steps = " ".join(f"Step: {s} {r} {o} ." for s, r, o in self.steps)
    return f"{steps} Answer: {self.answer}".strip()

  @property
  def passage_facts(self) -> dict[tuple[str, str], str]:
    return {(s, r): o for s, r, o in self.passage}

  @property
  def passage_entities(self) -> set[str]:
    return {e for s, _, o in self.passage for e in (s, o)}


def _other(rng, choices, *exclude) -> str:
  pool = [c for c in choices if c not in exclude]
  return str(pool[rng.integers(len(pool))])


def _pick_question(world: World, rng, two_hop_fraction: float):
  templates = TWO_HOP if rng.random() < two_hop_fraction else ONE_HOP
  path = templates[rng.integers(len(templates))]
  subjects = [s for s in world.subjects(path[0]) if world.answer(s, path) is not None]
  return str(subjects[rng.integers(len(subjects))]), path


def _needed_facts(world, rng, subject, path, counterfactual: bool):
  """The passage facts the question needs, one of them changed when `counterfactual`."""
  changed = rng.integers(len(path)) if counterfactual else -1
  facts, node = [], subject
  for hop, relation in enumerate(path):
    obj = world.facts[(node, relation)]
    if hop == changed:
      kind = _OBJECT_KIND[relation]
      # a changed spouse/works_at must still lead somewhere the next hop can answer
      pool = [
        e for e in world.entities[kind] if hop + 1 == len(path) or (e, path[hop + 1]) in world.facts
      ]
      obj = _other(rng, pool, obj, node)
    facts.append((node, relation, obj))
    node = obj
  return facts


def _distractors(world, rng, needed, count: int):
  """`count` true KB facts whose (subject, relation) differs from every needed hop."""
  taken = {(s, r) for s, r, _ in needed}
  keys = list(world.facts)
  subjects = [s for s, _, _ in needed]
  relations = [r for _, r, _ in needed]
  out, tries = [], 0
  while len(out) < count and tries < 100 * (count + 1):
    tries += 1
    style = rng.integers(3)
    if style == 0:  # same subject, another relation
      subject = subjects[rng.integers(len(subjects))]
      key = (subject, RELATIONS[rng.integers(len(RELATIONS))])
    elif style == 1:  # same relation, another subject
      relation = relations[rng.integers(len(relations))]
      pool = world.subjects(relation)
      key = (pool[rng.integers(len(pool))], relation)
    else:
      key = keys[rng.integers(len(keys))]
    if key in world.facts and key not in taken:
      taken.add(key)
      out.append((key[0], key[1], world.facts[key]))
  return out


def make_example(
  world: World,
  rng: np.random.Generator,
  *,
  two_hop_fraction: float = 0.5,
  unanswerable_fraction: float = 0.1,
  counterfactual_fraction: float = 0.25,
  min_facts: int = 3,
  max_facts: int = 6,
) -> Example:
  """One passage-QA item (module docstring); a pure function of the generator's state."""
  subject, path = _pick_question(world, rng, two_hop_fraction)
  counterfactual = rng.random() < counterfactual_fraction
  unanswerable = rng.random() < unanswerable_fraction
  needed = _needed_facts(world, rng, subject, path, counterfactual)
  kept = list(needed)
  if unanswerable:
    del kept[rng.integers(len(kept))]
  count = max(int(rng.integers(min_facts, max_facts + 1)) - len(kept), 1)
  passage = kept + _distractors(world, rng, needed, count)
  if unanswerable:  # the dropped fact's subject stays in the passage through another relation
    dropped = next(fact for fact in needed if fact not in kept)
    same = [(s, r, o) for (s, r), o in world.facts.items() if s == dropped[0] and r != dropped[1]]
    same = [f for f in same if f not in passage]
    if same:
      passage.append(same[rng.integers(len(same))])
  passage = [passage[i] for i in rng.permutation(len(passage))]
  steps = []
  for fact in needed:
    if fact not in kept:
      break
    steps.append(fact)
  answer = NO_ANSWER if unanswerable else needed[-1][2]
  return Example(
    tuple(passage),
    subject,
    path,
    tuple(steps),
    answer,
    world.answer(subject, path),
    unanswerable,
    counterfactual and not unanswerable,
  )


def make_examples(world: World, count: int, seed: int, **options) -> list[Example]:
  rng = np.random.default_rng(seed)
  return [make_example(world, rng, **options) for _ in range(count)]


def fact_sequence(world: World, rng: np.random.Generator, num_facts: int) -> str:
  """A closed-book `Fact:` sequence of `num_facts` random KB facts."""
  keys = list(world.facts)
  picks = rng.choice(len(keys), num_facts, replace=False)
  facts = " ".join(f"{keys[i][0]} {keys[i][1]} {world.facts[keys[i]]} ." for i in picks)
  return f"Fact: {facts}"


# ---------------------------------------------------------------------------------------------------
# Checking outputs
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Parsed:
  steps: tuple[tuple[str, str, str], ...]
  step_positions: tuple[int, ...]  # word index of each step's object
  answer: str | None  # None when no `Answer:` could be read
  answer_position: int  # word index of the answer's first word, -1 if none


def parse_output(words: list[str]) -> Parsed:
  """Reads `Step: s r o .` triples and `Answer: X` from generated words; malformed steps are
  skipped, reading stops at the answer."""
  steps, positions, i = [], [], 0
  while i < len(words):
    if words[i] == "Step:" and i + 3 < len(words):
      steps.append(tuple(words[i + 1 : i + 4]))
      positions.append(i + 3)
      i += 4
    elif words[i] == "Answer:":
      rest = words[i + 1 :]
      if rest[:2] == ["No", "answer"]:
        return Parsed(tuple(steps), tuple(positions), NO_ANSWER, i + 1)
      answer = rest[0] if rest and rest[0] not in KEYWORDS else None
      return Parsed(tuple(steps), tuple(positions), answer, i + 1 if answer else -1)
    else:
      i += 1
  return Parsed(tuple(steps), tuple(positions), None, -1)


def _entity_type(example: Example, claimed: str, kb_value: str | None) -> str:
  if kb_value is not None and claimed == kb_value:
    return "override"
  return "misread" if claimed in example.passage_entities else "fabrication"


def step_label(example: Example, world: World, step: tuple[str, str, str]) -> str | None:
  """None if the passage states the triple, else its hallucination type."""
  s, r, o = step
  if example.passage_facts.get((s, r)) == o:
    return None
  return _entity_type(example, o, world.facts.get((s, r)))


def answer_label(example: Example, answer: str | None) -> str:
  """`correct`, `abstained` (false abstention), `malformed`, or a hallucination type."""
  if answer == example.answer:
    return "correct"
  if answer is None:
    return "malformed"
  if example.unanswerable:
    return "unanswerable"
  if answer == NO_ANSWER:
    return "abstained"
  return _entity_type(example, answer, example.kb_answer)


@dataclasses.dataclass(frozen=True)
class Labels:
  answer: str | None
  answer_label: str
  step_labels: tuple[str | None, ...]
  token_labels: np.ndarray  # [num words] int8: 1 hallucinated object, 0 supported object, -1 other


def label_output(example: Example, world: World, words: list[str]) -> Labels:
  """The hallucination labels of one output (module docstring)."""
  parsed = parse_output(words)
  step_labels = tuple(step_label(example, world, step) for step in parsed.steps)
  verdict = answer_label(example, parsed.answer)
  tokens = np.full(len(words), -1, np.int8)
  for position, label in zip(parsed.step_positions, step_labels, strict=True):
    tokens[position] = label is not None
  if parsed.answer_position >= 0:
    tokens[parsed.answer_position] = verdict in HALLUCINATION_TYPES
  return Labels(parsed.answer, verdict, step_labels, tokens)


def normalize_answer(text: str) -> list[str]:
  """DROP-style normalisation: lower case, punctuation and articles removed, split on spaces."""
  text = "".join(c for c in text.lower() if c not in set(string.punctuation) - {"_"})
  return re.sub(r"\b(a|an|the)\b", " ", text).split()


def exact_match(prediction: str | None, gold: str) -> float:
  return float(normalize_answer(prediction or "") == normalize_answer(gold))


def f1_score(prediction: str | None, gold: str) -> float:
  """Bag-of-words F1 of the normalised answers."""
  pred, ref = normalize_answer(prediction or ""), normalize_answer(gold)
  common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
  if not pred or not ref or not common:
    return float(pred == ref)
  precision, recall = common / len(pred), common / len(ref)
  return 2 * precision * recall / (precision + recall)


# ---------------------------------------------------------------------------------------------------
# Token sequences
# ---------------------------------------------------------------------------------------------------


def training_batch(
  world: World,
  tokenizer,
  seed: int,
  step: int,
  batch_size: int,
  seq_len: int,
  fact_fraction: float = 0.2,
  facts_per_sequence: int = 8,
  **example_options,
) -> dict[str, np.ndarray]:
  """`{"tokens": int32 [B, seq_len + 1], "loss_mask": float32 [B, seq_len]}` for `step`: a
  `fact_fraction` of closed-book `Fact:` sequences (every token predicted) and passage-QA sequences
  whose loss covers the chain of thought and the answer only. `tokenizer` maps text to ids
  (`core.data.tokenizers.WordTokenizer` over `vocabulary(world)`)."""
  rng = np.random.default_rng([seed, step])
  tokens = np.zeros((batch_size, seq_len + 1), np.int32)
  mask = np.zeros((batch_size, seq_len), np.float32)
  for row in range(batch_size):
    if rng.random() < fact_fraction:
      ids = tokenizer.encode(fact_sequence(world, rng, facts_per_sequence), True, True)
      start = 1
    else:
      example = make_example(world, rng, **example_options)
      prompt = tokenizer.encode(example.prompt, add_bos=True)
      ids = prompt + tokenizer.encode(example.target, add_eos=True)
      start = len(prompt)
    if len(ids) > seq_len + 1:
      raise ValueError(f"factual_world: a sequence of {len(ids)} tokens exceeds seq_len + 1")
    tokens[row, : len(ids)] = ids
    mask[row, start - 1 : len(ids) - 1] = 1.0
  return {"tokens": tokens, "loss_mask": mask}


def encode_prompts(examples, tokenizer, length: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded prompt ids `[N, length]` (with <bos>) and their lengths."""
  return tokenizer.encode_batch([e.prompt for e in examples], length, add_bos=True)
