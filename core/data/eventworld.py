"""EventWorld: seeded synthetic videos made of scene-cut events, with templated questions of five
types; the small-scale stand-in for the long-video QA of "MARC: Memory-Augmented RL Token Compression
for Efficient Video Understanding" (ICLR 2026), where most of a video is irrelevant to the question.

A video is `num_frames` frames of 16 x 16 RGB in [0, 1]. It is cut into 3..`max_events` events of
3..11 frames; each event has its own background colour (distinct within a video) and one 6 x 6 object
(a shape and a colour, the pair distinct within a video) moving 1 px per frame in one of four
directions, so an event boundary is a scene cut (background and object change at once).

Questions (word tokens, right-padded to `question_len`), each answered by one word:
  0 "shape on bg"    which shape is on the <bg> background ?          -> shape       (one event)
  1 "direction"      which way does the <colour> <shape> move ?       -> direction   (one event)
  2 "colour on bg"   what colour is the object on the <bg> background -> colour      (one event)
  3 "shape after"    which shape comes after the <bg> background ?    -> shape       (two events)
  4 "count"          how many events show a <shape> ?                 -> zero .. six (global)
The answer is generated as the completion `<ans> X </ans>` (so a format reward exists).

Answers are balanced within each type: types 0-3 by symmetry (the keyed event is drawn uniformly and
its attributes are uniform), the count by construction (`balanced_counts`: the asked shape is placed
on a uniform 0..num_events of the video's events), so a blind guess per type scores 1/4, 1/4, 1/6,
1/4 and about 1/5. Without it the count is mostly "one" (a random shape on 3-5 of 24 pairs).

`batch(seed, index, n, ...)` is a pure function of its arguments (resumable, no state); it also
returns each frame's true event id and which events a question needs (the retriever's supervision).
"""

from __future__ import annotations

import numpy as np

from core.data import tokenizers

SIZE = 16  # frame side, px
OBJECT = 6  # object side, px
MIN_EVENT = 3  # frames
MAX_EVENT = SIZE - OBJECT + 1  # frames: the object stays inside the frame at 1 px / frame
SHAPES = ("circle", "square", "triangle", "cross")
OBJECT_COLOURS = {
  "red": (0.95, 0.15, 0.15),
  "green": (0.15, 0.9, 0.2),
  "blue": (0.2, 0.35, 1.0),
  "yellow": (0.95, 0.9, 0.1),
  "magenta": (0.95, 0.2, 0.9),
  "cyan": (0.1, 0.9, 0.95),
}
BACKGROUNDS = {
  "black": (0.0, 0.0, 0.0),
  "grey": (0.45, 0.45, 0.45),
  "navy": (0.05, 0.05, 0.4),
  "maroon": (0.4, 0.05, 0.05),
  "olive": (0.35, 0.35, 0.0),
  "teal": (0.0, 0.35, 0.35),
  "purple": (0.3, 0.0, 0.4),
  "white": (0.85, 0.85, 0.85),
}
DIRECTIONS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
COUNTS = ("zero", "one", "two", "three", "four", "five", "six")
QUESTION_TYPES = ("shape_on_bg", "direction", "colour_on_bg", "shape_after", "count")
LOCAL_TYPES = (0, 1, 2)  # answered by one event
# what one frame shows, with the number of values: the frame encoder's auxiliary labels
FRAME_ATTRIBUTES = {
  "background": len(BACKGROUNDS),
  "shape": len(SHAPES),
  "colour": len(OBJECT_COLOURS),
}
ANSWER_OPEN, ANSWER_CLOSE, IMAGE = "<ans>", "</ans>", "<img>"
TEMPLATE_WORDS = (
  "which shape is on the background ? way does move what colour object comes after how many "
  "events show a"
).split()


def vocabulary() -> list[str]:
  """Every word of the questions and answers, and the answer and image markers."""
  words = [ANSWER_OPEN, ANSWER_CLOSE, IMAGE] + TEMPLATE_WORDS + list(SHAPES)
  words += list(OBJECT_COLOURS) + list(BACKGROUNDS) + list(DIRECTIONS) + list(COUNTS)
  return list(dict.fromkeys(words))


def tokenizer() -> tokenizers.WordTokenizer:
  return tokenizers.WordTokenizer(vocabulary())


def answer_words() -> list[str]:
  """The words an answer can be (the middle token of `<ans> X </ans>`)."""
  return list(SHAPES) + list(OBJECT_COLOURS) + list(DIRECTIONS) + list(COUNTS)


def _shape_mask(kind: str) -> np.ndarray:
  yy, xx = np.mgrid[:OBJECT, :OBJECT] + 0.5
  centre = OBJECT / 2
  if kind == "circle":
    return (yy - centre) ** 2 + (xx - centre) ** 2 <= (OBJECT / 2) ** 2
  if kind == "square":
    return np.ones((OBJECT, OBJECT), bool)
  if kind == "triangle":  # apex up
    return np.abs(xx - centre) <= yy / 2
  return (np.abs(yy - centre) < 1.1) | (np.abs(xx - centre) < 1.1)


MASKS = {kind: _shape_mask(kind) for kind in SHAPES}


def event_lengths(rng: np.random.Generator, num_frames: int, num_events: int) -> np.ndarray:
  """`num_events` lengths in [MIN_EVENT, MAX_EVENT] summing to `num_frames`, drawn at random."""
  if not MIN_EVENT * num_events <= num_frames <= MAX_EVENT * num_events:
    raise ValueError(f"eventworld: {num_events} events cannot fill {num_frames} frames")
  lengths = np.full(num_events, MIN_EVENT)
  for _ in range(num_frames - lengths.sum()):
    lengths[rng.choice(np.flatnonzero(lengths < MAX_EVENT))] += 1
  return lengths


def object_pairs(rng, count: int, shape_on: int | None = None) -> np.ndarray:
  """`count` distinct (shape, colour) pairs as `colour * len(SHAPES) + shape`; with `shape_on`,
  that shape is on a uniform 0..count of them (the balanced count question)."""
  pairs = np.arange(len(SHAPES) * len(OBJECT_COLOURS))
  if shape_on is None:
    return rng.choice(pairs, count, replace=False)
  hits = int(rng.integers(0, count + 1))
  own = pairs % len(SHAPES) == shape_on
  chosen = np.concatenate(
    [rng.choice(pairs[own], hits, replace=False), rng.choice(pairs[~own], count - hits, False)]
  )
  return rng.permutation(chosen)


def sample_events(
  rng, num_frames: int, min_events: int, max_events: int, shape_on: int | None = None
) -> dict[str, np.ndarray]:
  """One video's events: int arrays `[max_events]` (padded with -1) of background, shape, colour,
  direction, length, start row and column; `num_events`. `shape_on`: see `object_pairs`."""
  lowest = max(min_events, -(-num_frames // MAX_EVENT))
  highest = min(max_events, num_frames // MIN_EVENT)
  count = int(rng.integers(lowest, highest + 1))
  pairs = object_pairs(rng, count, shape_on)
  events = {
    "background": rng.choice(len(BACKGROUNDS), count, replace=False),
    "shape": pairs % len(SHAPES),
    "colour": pairs // len(SHAPES),
    "direction": rng.integers(0, len(DIRECTIONS), count),
    "length": event_lengths(rng, num_frames, count),
  }
  rows, cols = [], []
  for direction, length in zip(events["direction"], events["length"], strict=True):
    dy, dx = list(DIRECTIONS.values())[direction]
    travel = length - 1
    rows.append(_start(rng, dy, travel))
    cols.append(_start(rng, dx, travel))
  events["row"], events["col"] = np.array(rows), np.array(cols)
  padded = {k: np.pad(v, (0, max_events - count), constant_values=-1) for k, v in events.items()}
  return {**padded, "num_events": np.int32(count)}


def _start(rng, step: int, travel: int) -> int:
  room = SIZE - OBJECT
  if step > 0:
    return int(rng.integers(0, room - travel + 1))
  if step < 0:
    return int(rng.integers(travel, room + 1))
  return int(rng.integers(0, room + 1))


def render(events: dict[str, np.ndarray], num_frames: int) -> tuple[np.ndarray, np.ndarray]:
  """`(frames float32 [F, 16, 16, 3], event id per frame int32 [F])`."""
  frames = np.empty((num_frames, SIZE, SIZE, 3), np.float32)
  event_of_frame = np.empty(num_frames, np.int32)
  backgrounds, colours = list(BACKGROUNDS.values()), list(OBJECT_COLOURS.values())
  start = 0
  for e in range(int(events["num_events"])):
    dy, dx = list(DIRECTIONS.values())[events["direction"][e]]
    mask = MASKS[SHAPES[events["shape"][e]]]
    for t in range(events["length"][e]):
      frame = frames[start + t]
      frame[:] = backgrounds[events["background"][e]]
      r, c = events["row"][e] + dy * t, events["col"][e] + dx * t
      frame[r : r + OBJECT, c : c + OBJECT][mask] = colours[events["colour"][e]]
    event_of_frame[start : start + events["length"][e]] = e
    start += events["length"][e]
  return frames, event_of_frame


def make_question(rng, events, qtype: int, asked: int | None = None) -> tuple[str, str, np.ndarray]:
  """`(question text, answer word, relevant events bool [max_events])` of type `qtype`; `asked`:
  the shape a count question asks about (drawn here when None)."""
  count = int(events["num_events"])
  relevant = np.zeros(len(events["shape"]), bool)
  bg_names, colour_names = list(BACKGROUNDS), list(OBJECT_COLOURS)
  direction_names = list(DIRECTIONS)
  last = count - 1 if qtype == 3 else count
  e = int(rng.integers(0, last))
  bg, shape, colour = (
    bg_names[events["background"][e]],
    SHAPES[events["shape"][e]],
    colour_names[events["colour"][e]],
  )
  relevant[e] = True
  if qtype == 0:
    return f"which shape is on the {bg} background ?", shape, relevant
  if qtype == 1:
    answer = direction_names[events["direction"][e]]
    return f"which way does the {colour} {shape} move ?", answer, relevant
  if qtype == 2:
    return f"what colour is the object on the {bg} background ?", colour, relevant
  if qtype == 3:
    relevant[e + 1] = True
    return (
      f"which shape comes after the {bg} background ?",
      SHAPES[events["shape"][e + 1]],
      relevant,
    )
  if asked is None:
    asked = int(rng.integers(0, len(SHAPES)))
  relevant[:] = events["shape"] == asked
  answer = COUNTS[int(relevant.sum())]
  return f"how many events show a {SHAPES[asked]} ?", answer, relevant


def batch(
  seed: int | tuple[int, ...],
  index: int,
  size: int,
  *,
  num_frames: int = 32,
  min_events: int = 3,
  max_events: int = 6,
  question_len: int = 10,
  question_types: tuple[int, ...] = (0, 1, 2, 3, 4),
  balanced_counts: bool = True,
) -> dict[str, np.ndarray]:
  """Batch `index` of the stream `seed` (an int or a tuple of ints: the entropy of numpy's
  SeedSequence, with `index` appended): `frames [n, F, 16, 16, 3]`, `question [n, question_len]`
  and `question_length [n]` (word ids), `answer [n]` (id of the answer word), `qtype [n]`,
  `event_of_frame [n, F]`, `relevant [n, max_events]`, `num_events [n]`, and each event's
  `event_background`, `event_shape`, `event_colour` `[n, max_events]` (-1 past `num_events`)."""
  rng = np.random.default_rng([*np.atleast_1d(seed).tolist(), index])
  tok = tokenizer()
  fields = ("frames", "event_of_frame", "relevant", "num_events", "answer", "qtype")
  rows = {k: [] for k in fields + tuple(f"event_{name}" for name in FRAME_ATTRIBUTES)}
  texts = []
  for _ in range(size):
    qtype = int(rng.choice(question_types))
    asked = int(rng.integers(0, len(SHAPES))) if qtype == 4 else None
    shape_on = asked if balanced_counts else None
    events = sample_events(rng, num_frames, min_events, max_events, shape_on)
    frames, event_of_frame = render(events, num_frames)
    text, answer, relevant = make_question(rng, events, qtype, asked)
    texts.append(text)
    rows["frames"].append(frames)
    rows["event_of_frame"].append(event_of_frame)
    rows["relevant"].append(relevant)
    rows["num_events"].append(events["num_events"])
    for name in FRAME_ATTRIBUTES:
      rows[f"event_{name}"].append(events[name])
    rows["answer"].append(tok.ids[answer])
    rows["qtype"].append(qtype)
  out = {k: np.stack(v) for k, v in rows.items()}
  out["question"], out["question_length"] = tok.encode_batch(texts, question_len)
  out["answer"] = out["answer"].astype(np.int32)
  out["qtype"] = out["qtype"].astype(np.int32)
  for name in ("num_events",) + tuple(f"event_{name}" for name in FRAME_ATTRIBUTES):
    out[name] = out[name].astype(np.int32)
  return out
