r"""ShapeTriplet: procedural before/after image pairs of one action on one object, with OOD splits.

A small stand-in for the Causal Triplet benchmark (Liu et al., "Causal Triplet: An Open Challenge for
Intervention-centric Causal Representation Learning", CLeaR 2023; github.com/CausalTriplet/causaltriplet),
on which "Learning Robust Intervention Representations with Delta Embeddings" (Alimisis & Diou,
ICLR 2026) evaluates. A record is a pair `(x, x~)`: the same scene before and after an action `a` on
the target object, plus the labels `action`, `object`, `palette` and the target's box.

World.
  * 8 object classes (`OBJECTS`) drawn as signed-distance masks on the pixel grid with a random position,
    scale, hue and rotation (within +-30 degrees, so that a lid stays "above").
  * 8 actions (`ACTIONS`) that change one attribute of the target only, each with a precondition:
    open/close (a lid bar above the object disappears / appears), fill/empty (filled <-> hollow
    outline), turn_on/turn_off (an inner lamp dot dark <-> bright), paint (a new hue), break (the
    object splits into two halves with a 2-px gap; precondition: not broken). Three antonym pairs.
  * Affordances (`AFFORDANCES`): each class supports 4-6 actions, as a fridge can be opened but not
    sliced in ProcTHOR; an attribute a class does not afford is never drawn.
  * Optional digit objects (`Settings.objects = "shapes_digits"`): the 10 classes of scikit-learn's
    bundled 8x8 handwritten digits (`sklearn.datasets.load_digits`, no download) as 10 more object
    classes (`DIGITS`, indices 8-17). Each record draws one of the class's ~180 handwritten
    instances, upsampled to a signed-distance field; a digit is drawn, lidded, lit, painted and
    broken like a shape. Digits do not afford fill/empty: their strokes (~3 px) are thinner than the
    hollow outline, so an empty digit would look like a filled one.
  * Scenes: a two-colour gradient of a palette family plus low-frequency sinusoidal texture, and
    either 0-2 small plain distractor shapes ("single") or 3-4 full objects of which one is the
    target ("multi"). Before and after share the scene exactly.
  * Actionable-counterfactual noise: each image of a pair gets its own pixel noise (sigma 0.02) and
    its own global shift of up to `max_shift` pixels, so `x~ - x` is not zero off the target.

Splits (`combinations`), mirroring Causal Triplet's `dataset.split_df`:
  * `syst` (its "noun" split): `num_syst_objects` classes are held out entirely (from training scenes
    too); the choice is seeded among the subsets that leave every action afforded by >= 2 training
    classes (Causal Triplet takes the middle of the count ranking; here counts are equal by design).
  * `comp`: a `comp_fraction` of the training classes' valid (action, object) pairs is held out; a pair
    may leave only if its verb has an antonym, its verb and noun stay seen in training, and
    (antonym(verb), noun) stays in training (the same rule as `split_df(axis='comp')`).
  * `iid`: fresh pairs of the training combinations; `scene`: the training combinations on palettes
    never seen in training.

Storage: `ShapeTriplets` is a `tfds.core.GeneratorBasedBuilder` (array_record, random access) whose
`_split_generators` call the generator below, so each split is versioned and built once into a tfds
`data_dir` (nothing is downloaded). `load` builds it if needed and returns in-memory arrays;
`python -m core.data.shape_triplets --config=single64 --data_dir=DIR` prepares a preset ahead of time.

Everything is a pure function of the `Settings` and their seeds: chunk `c` of split `s` is drawn from
`np.random.default_rng([seed, s, c])`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math

import numpy as np
import tensorflow_datasets as tfds

OBJECTS = ("square", "circle", "triangle", "cross", "ring", "diamond", "l_shape", "bar")
DIGITS = tuple(f"digit_{d}" for d in range(10))
# The classes a `Settings.objects` choice draws from; class indices are global (digits are 8-17).
OBJECT_SETS = {"shapes": OBJECTS, "shapes_digits": OBJECTS + DIGITS}
ALL_OBJECTS = OBJECTS + DIGITS
ACTIONS = ("open", "close", "fill", "empty", "turn_on", "turn_off", "paint", "break")
ANTONYM_PAIRS = (("open", "close"), ("fill", "empty"), ("turn_on", "turn_off"))
ANTONYM = {
  ACTIONS.index(x): ACTIONS.index(y) for a, b in ANTONYM_PAIRS for x, y in ((a, b), (b, a))
}
# The attribute family each action changes; a class affords whole families.
FAMILY = {"open": "lid", "close": "lid", "fill": "fill", "empty": "fill", "turn_on": "lamp"}
FAMILY |= {"turn_off": "lamp", "paint": "paint", "break": "break"}
FAMILIES = ("lid", "fill", "lamp", "paint", "break")
AFFORDED_FAMILIES = {
  "square": ("lid", "fill", "paint", "break"),
  "circle": ("fill", "lamp", "paint"),
  "triangle": ("lid", "fill", "break"),
  "cross": ("lamp", "paint", "break"),
  "ring": ("lid", "lamp", "paint"),
  "diamond": ("fill", "lamp", "paint", "break"),
  "l_shape": ("lid", "fill", "paint"),
  "bar": ("lid", "lamp", "break"),
  # digits: 3-4 of the families other than fill (module docstring)
  "digit_0": ("lid", "lamp", "paint"),
  "digit_1": ("lid", "paint", "break"),
  "digit_2": ("lamp", "paint", "break"),
  "digit_3": ("lid", "lamp", "break"),
  "digit_4": ("lid", "lamp", "paint", "break"),
  "digit_5": ("lid", "lamp", "paint"),
  "digit_6": ("lid", "paint", "break"),
  "digit_7": ("lamp", "paint", "break"),
  "digit_8": ("lid", "lamp", "break"),
  "digit_9": ("lid", "lamp", "paint", "break"),
}
# AFFORDANCES[object, action]: the action is valid on the class (rows: ALL_OBJECTS).
AFFORDANCES = np.array(
  [[FAMILY[a] in AFFORDED_FAMILIES[o] for a in ACTIONS] for o in ALL_OBJECTS], dtype=bool
)
_FAMILY_AFFORDED = np.array(
  [[f in AFFORDED_FAMILIES[o] for f in FAMILIES] for o in ALL_OBJECTS], dtype=bool
)

# Palette families (two gradient end colours); the last two appear only in the `scene` split.
PALETTES = (
  ((0.76, 0.70, 0.50), (0.52, 0.43, 0.28)),  # sand
  ((0.58, 0.72, 0.86), (0.24, 0.33, 0.52)),  # sky
  ((0.48, 0.58, 0.42), (0.22, 0.32, 0.20)),  # moss
  ((0.62, 0.62, 0.64), (0.30, 0.30, 0.33)),  # slate
  ((0.55, 0.33, 0.55), (0.88, 0.58, 0.40)),  # dusk (held out)
  ((0.22, 0.55, 0.52), (0.08, 0.22, 0.28)),  # teal (held out)
)
TRAIN_PALETTES = (0, 1, 2, 3)
SCENE_PALETTES = (4, 5)
SPLITS = ("train", "iid", "comp", "syst", "scene")
SCENES = ("single", "multi")
_CHUNK = 512


@dataclasses.dataclass(frozen=True)
class Settings:
  """Everything that shapes the generated pairs (a tfds builder config holds one).

  Attributes:
    image_size: H = W in pixels; sizes and widths scale with `image_size / 32`.
    num_train: pairs in `train`; num_eval: pairs in each of `iid`, `comp`, `syst`, `scene`.
    scene: "single" (target + 0-2 small plain distractors) or "multi" (3-4 objects, one acted on).
    noise_sigma: per-image pixel noise of the actionable counterfactual.
    max_shift: per-image global shift in pixels, uniform in [-max_shift, max_shift]^2.
    split_seed: which classes and pairs are held out; seed: the pairs drawn.
    comp_fraction: share of the training classes' valid pairs held out for `comp`.
    num_syst_objects: classes held out for `syst`.
    objects: the object classes, a key of `OBJECT_SETS` ("shapes": the 8 shapes; "shapes_digits":
      the shapes and the 10 digits).
  """

  image_size: int = 32
  num_train: int = 10_000
  num_eval: int = 2_000
  scene: str = "single"
  noise_sigma: float = 0.02
  max_shift: int = 1
  split_seed: int = 0
  seed: int = 0
  comp_fraction: float = 0.3
  num_syst_objects: int = 3
  objects: str = "shapes"

  def __post_init__(self):
    if self.objects not in OBJECT_SETS:
      raise ValueError(
        f"Settings.objects must be one of {tuple(OBJECT_SETS)}, got {self.objects!r}"
      )

  def split_size(self, split: str) -> int:
    return self.num_train if split == "train" else self.num_eval

  @property
  def num_objects(self) -> int:
    return len(OBJECT_SETS[self.objects])


PRESETS = {
  "single32": Settings(),
  "multi32": Settings(scene="multi"),
  "single64": Settings(image_size=64, num_train=100_000, num_eval=10_000),
  "multi64": Settings(image_size=64, num_train=100_000, num_eval=10_000, scene="multi"),
}


# ---------------------------------------------------------------------------------------------------
# Splits of the (action, object) combinations
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Combinations:
  """Which (action, object) pairs each split draws from (pairs are `(action index, object index)`)."""

  train_objects: tuple[int, ...]
  syst_objects: tuple[int, ...]
  iid: tuple[tuple[int, int], ...]
  comp: tuple[tuple[int, int], ...]
  syst: tuple[tuple[int, int], ...]
  num_objects: int = len(OBJECTS)

  def pairs(self, split: str) -> tuple[tuple[int, int], ...]:
    if split in ("train", "iid", "scene"):
      return self.iid
    return self.comp if split == "comp" else self.syst

  def objects(self, split: str) -> tuple[int, ...]:
    """Classes that may appear in the split's scenes (targets and the other objects)."""
    if split == "syst":
      return tuple(range(self.num_objects))
    return self.train_objects


def valid_pairs(objects) -> list[tuple[int, int]]:
  return [(a, o) for o in objects for a in range(len(ACTIONS)) if AFFORDANCES[o, a]]


@functools.cache
def held_out_objects(
  split_seed: int, count: int, min_objects_per_action: int = 2, num_objects: int = len(OBJECTS)
):
  """A seeded choice of `count` of the first `num_objects` classes whose removal leaves every action
  afforded by at least `min_objects_per_action` of the remaining classes."""
  afforded = AFFORDANCES[:num_objects].astype(np.int64)
  total = afforded.sum(0)
  candidates = [
    held
    for held in itertools.combinations(range(num_objects), count)
    if np.all(total - afforded[list(held)].sum(0) >= min_objects_per_action)
  ]
  if not candidates:
    raise ValueError(f"no {count} classes can be held out with every action still seen")
  return candidates[np.random.default_rng(split_seed).integers(len(candidates))]


def compositional_holdout(pairs, fraction: float, split_seed: int):
  """`(iid, ood)`: up to `round(fraction * len(pairs))` pairs moved to `ood`, visiting them in a
  seeded order; a pair moves only if its verb has an antonym, (antonym, noun) stays in `iid`, and
  its verb and its noun each stay seen in `iid`."""
  order = np.random.default_rng([split_seed, 1]).permutation(len(pairs))
  iid, ood = set(pairs), []
  target = round(fraction * len(pairs))
  for index in order:
    if len(ood) == target:
      break
    verb, noun = pairs[index]
    rest = iid - {(verb, noun)}
    if (
      verb in ANTONYM
      and (ANTONYM[verb], noun) in rest
      and any(v == verb for v, _ in rest)
      and any(n == noun for _, n in rest)
    ):
      iid, ood = rest, ood + [(verb, noun)]
  return tuple(sorted(iid)), tuple(sorted(ood))


@functools.cache
def combinations(settings: Settings) -> Combinations:
  num_objects = settings.num_objects
  syst_objects = held_out_objects(
    settings.split_seed, settings.num_syst_objects, num_objects=num_objects
  )
  train_objects = tuple(o for o in range(num_objects) if o not in syst_objects)
  iid, comp = compositional_holdout(
    valid_pairs(train_objects), settings.comp_fraction, settings.split_seed
  )
  return Combinations(
    train_objects, tuple(syst_objects), iid, comp, tuple(valid_pairs(syst_objects)), num_objects
  )


# ---------------------------------------------------------------------------------------------------
# Scenes and the action's effect on the target
# ---------------------------------------------------------------------------------------------------


def _slot_count(scene: str) -> int:
  return 3 if scene == "single" else 4


def sample_scenes(rng: np.random.Generator, pairs: np.ndarray, objects, palettes, settings):
  """Scene parameters and the before/after states of the target (the last slot) for `pairs`
  `[N, 2]` of (action, object). Returns `(scene, before, after)`: dicts of arrays with a leading
  `[N]` (scene) or `[N, K]` (per-slot states) axis."""
  n, size, unit = len(pairs), settings.image_size, settings.image_size / 32
  slots = _slot_count(settings.scene)
  objects = np.asarray(objects)
  scene = {
    "palette": rng.choice(np.asarray(palettes), n),
    "gradient_angle": rng.uniform(0, 2 * np.pi, n),
    "colour_jitter": rng.uniform(-0.05, 0.05, (n, 2, 3)),
    "wave_frequency": rng.uniform(0.5, 2.0, (n, 3, 2)) * rng.choice([-1, 1], (n, 3, 2)),
    "wave_phase": rng.uniform(0, 2 * np.pi, (n, 3)),
    "wave_amplitude": rng.uniform(0.02, 0.05, (n, 3)),
    "cls": rng.choice(objects, (n, slots)),
    "theta": rng.uniform(-np.pi / 6, np.pi / 6, (n, slots)),
    "present": np.ones((n, slots), bool),
  }
  scene["cls"][:, -1] = pairs[:, 1]
  if settings.scene == "single":
    radius = rng.uniform(2.0, 3.0, (n, slots)) * unit
    radius[:, -1] = rng.uniform(5.5, 7.0, n) * unit
    lo_y = 1.45 * radius + 2 * unit
    cx = rng.uniform(radius + 2 * unit, size - radius - 2 * unit)
    cy = rng.uniform(lo_y, size - radius - 2 * unit)
    scene["present"][:, :-1] = np.arange(slots - 1)[None] < rng.integers(0, slots, n)[:, None]
    scene["plain"] = np.arange(slots)[None].repeat(n, 0) < slots - 1
  else:
    radius = rng.uniform(4.5, 5.5, (n, slots)) * unit
    anchors = np.array([(8.5, 11.0), (23.5, 11.0), (8.5, 24.0), (23.5, 24.0)]) * unit
    where = np.argsort(rng.random((n, slots)), axis=1)
    jitter = rng.uniform(-1.0, 1.0, (n, slots, 2)) * unit
    cx, cy = (anchors[where] + jitter)[..., 0], (anchors[where] + jitter)[..., 1]
    scene["present"][:, 0] = rng.random(n) < 0.5
    scene["plain"] = np.zeros((n, slots), bool)
  scene.update(cx=cx, cy=cy, radius=radius)
  state = {
    "lid": rng.random((n, slots)) < 0.5,
    "filled": rng.random((n, slots)) < 0.5,
    "lamp": rng.random((n, slots)) < 0.5,
    "broken": rng.random((n, slots)) < 0.25,
    "hue": rng.random((n, slots)),
  }
  before = {k: v.copy() for k, v in state.items()}
  after = {k: v.copy() for k, v in state.items()}
  apply_action(pairs[:, 0], before, after, rng.uniform(0.25, 0.75, n))
  if settings.objects != "shapes":
    # drawn last, so that the shapes-only scenes keep their random stream
    scene["glyph"] = rng.random((n, slots))  # which handwritten instance a digit slot shows
  return scene, before, after


def apply_action(actions: np.ndarray, before: dict, after: dict, hue_step: np.ndarray) -> None:
  """Sets the target's (last slot's) precondition in `before` and the action's effect in `after`,
  in place; every other attribute stays as drawn, equal in both."""
  name = np.asarray(ACTIONS)[actions]
  for attribute, on, off in (
    ("lid", "close", "open"),
    ("filled", "fill", "empty"),
    ("lamp", "turn_on", "turn_off"),
  ):
    # `on` makes the attribute true (precondition false); `off` the reverse. A lid is present when
    # the object is closed.
    for action, value in ((on, True), (off, False)):
      rows = name == action
      before[attribute][rows, -1] = not value
      after[attribute][rows, -1] = value
  rows = name == "paint"
  after["hue"][rows, -1] = (before["hue"][rows, -1] + hue_step[rows]) % 1.0
  rows = name == "break"
  before["broken"][rows, -1] = False
  after["broken"][rows, -1] = True


def target_box(scene: dict, image_size: int) -> np.ndarray:
  """`[N, 4]` (x0, y0, x1, y1) of the pixels the action can change (unshifted coordinates)."""
  unit = image_size / 32
  reach = 1.6 * scene["radius"][:, -1] + 2 * unit
  cx, cy = scene["cx"][:, -1], scene["cy"][:, -1]
  box = np.stack([cx - reach, cy - reach, cx + reach, cy + reach], axis=1)
  return np.clip(box, 0, image_size).astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# Rendering (signed distances in object units; alpha from the distance in pixels)
# ---------------------------------------------------------------------------------------------------


def _box(qx, qy, half_x, half_y):
  dx, dy = np.abs(qx) - half_x, np.abs(qy) - half_y
  outside = np.hypot(np.maximum(dx, 0), np.maximum(dy, 0))
  return outside + np.minimum(np.maximum(dx, dy), 0)


def _triangle(qx, qy, size=0.9):
  """Equilateral triangle pointing up (image y grows downwards), after Quilez's 2-D SDFs."""
  k = math.sqrt(3.0)
  px, py = np.abs(qx) - size, -qy + size / k
  fold = px + k * py > 0
  px, py = np.where(fold, (px - k * py) / 2, px), np.where(fold, (-k * px - py) / 2, py)
  px = px - np.clip(px, -2 * size, 0)
  return -np.hypot(px, py) * np.sign(py)


_SHAPES = (
  lambda qx, qy: _box(qx, qy, 0.75, 0.75),  # square
  lambda qx, qy: np.hypot(qx, qy) - 0.85,  # circle
  _triangle,
  lambda qx, qy: np.minimum(_box(qx, qy, 0.85, 0.28), _box(qx, qy, 0.28, 0.85)),  # cross
  lambda qx, qy: np.abs(np.hypot(qx, qy) - 0.65) - 0.25,  # ring
  lambda qx, qy: (np.abs(qx) + np.abs(qy) - 0.95) / math.sqrt(2.0),  # diamond
  lambda qx, qy: np.minimum(_box(qx + 0.45, qy, 0.3, 0.85), _box(qx, qy - 0.55, 0.75, 0.3)),
  lambda qx, qy: _box(qx, qy, 0.9, 0.3),  # bar
)


_GLYPH_GRID = 32  # the digits' 8x8 pixels are upsampled to this grid before the distance transform
_GLYPH_HALF = 0.9  # a glyph spans [-0.9, 0.9]^2 object units (a lid bar starts at -0.99)


@functools.cache
def digit_glyphs() -> tuple[np.ndarray, ...]:
  """Per digit class, the signed distance fields `[n_c, G, G]` (object units, negative on ink) of
  scikit-learn's bundled 8x8 handwritten digits: bilinear upsampling to G = 32, ink where the
  intensity exceeds half the image's maximum, then Euclidean distance transforms."""
  from scipy import ndimage
  from sklearn.datasets import load_digits

  digits = load_digits()
  scale = _GLYPH_GRID / 8
  images = ndimage.zoom(digits.images.astype(np.float64), (1, scale, scale), order=1)
  pixel = 2 * _GLYPH_HALF / _GLYPH_GRID
  fields = np.empty(images.shape, np.float32)
  for i, image in enumerate(images):
    ink = image > 0.5 * image.max()
    outside = ndimage.distance_transform_edt(~ink) - 0.5
    inside = ndimage.distance_transform_edt(ink) - 0.5
    fields[i] = np.where(ink, -inside, outside) * pixel
  return tuple(fields[digits.target == d] for d in range(len(DIGITS)))


def glyph_distance(digit: int, glyph: np.ndarray, qx: np.ndarray, qy: np.ndarray) -> np.ndarray:
  """Signed distance (object units) of digit class `digit` at `q` `[N, H, W]`; row i shows the
  handwritten instance at quantile `glyph[i]` in [0, 1) of the class's instances. Bilinear inside
  the glyph's square; outside it, the value at the nearest edge plus the distance to the square."""
  fields = digit_glyphs()[digit]
  index = np.minimum((np.asarray(glyph) * len(fields)).astype(np.int64), len(fields) - 1)
  grid = _GLYPH_GRID

  def coordinate(q):
    return np.clip((q + _GLYPH_HALF) / (2 * _GLYPH_HALF) * grid - 0.5, 0.0, grid - 1.0)

  u, v = coordinate(qy), coordinate(qx)  # row (image y grows downwards), column
  u0, v0 = np.minimum(u.astype(np.int64), grid - 2), np.minimum(v.astype(np.int64), grid - 2)
  du, dv = u - u0, v - v0
  rows = np.arange(len(index))[:, None, None]
  f = fields[index]  # [N, G, G]
  value = (
    f[rows, u0, v0] * (1 - du) * (1 - dv)
    + f[rows, u0 + 1, v0] * du * (1 - dv)
    + f[rows, u0, v0 + 1] * (1 - du) * dv
    + f[rows, u0 + 1, v0 + 1] * du * dv
  )
  beyond = np.hypot(
    np.maximum(np.abs(qx) - _GLYPH_HALF, 0.0), np.maximum(np.abs(qy) - _GLYPH_HALF, 0.0)
  )
  return (value + beyond).astype(qx.dtype)


def shape_distance(
  cls: np.ndarray, qx: np.ndarray, qy: np.ndarray, glyph: np.ndarray | None = None
) -> np.ndarray:
  """Signed distance (object units) of each row's class `cls` `[N]` at `q` `[N, H, W]`; digit
  classes also need each row's instance quantile `glyph` `[N]`."""
  out = np.empty_like(qx)
  for c in np.unique(cls):
    rows = cls == c
    if c < len(OBJECTS):
      out[rows] = _SHAPES[c](qx[rows], qy[rows])
    else:
      out[rows] = glyph_distance(c - len(OBJECTS), glyph[rows], qx[rows], qy[rows])
  return out


def hsv_to_rgb(hue: np.ndarray, saturation: float = 0.75, value: float = 0.85) -> np.ndarray:
  k = (np.asarray([5.0, 3.0, 1.0], np.float32) + hue[..., None] * 6) % 6
  rgb = value - value * saturation * np.clip(np.minimum(k, 4 - k), 0, 1)
  return rgb.astype(np.float32)


_LAMP_ON = np.array([1.0, 0.97, 0.7], np.float32)
_LAMP_OFF = np.array([0.08, 0.08, 0.1], np.float32)


def _alpha(distance_px):
  return np.clip(0.5 - distance_px, 0.0, 1.0)


def _background(scene: dict, x: np.ndarray, y: np.ndarray, size: int) -> np.ndarray:
  ends = np.asarray(PALETTES, np.float32)[scene["palette"]] + scene["colour_jitter"]  # [N, 2, 3]
  angle = scene["gradient_angle"][:, None, None]
  t = 0.5 + ((x - size / 2) * np.cos(angle) + (y - size / 2) * np.sin(angle)) / (1.2 * size)
  t = np.clip(t, 0, 1)[..., None]
  image = ends[:, None, None, 0] * (1 - t) + ends[:, None, None, 1] * t
  freq = scene["wave_frequency"] * 2 * np.pi / size  # [N, 3, 2]
  waves = np.sin(
    freq[:, :, None, None, 0] * x[:, None]
    + freq[:, :, None, None, 1] * y[:, None]
    + scene["wave_phase"][:, :, None, None]
  )
  return image + np.sum(scene["wave_amplitude"][:, :, None, None] * waves, axis=1)[..., None]


def _single_precision(arrays: dict) -> dict:
  return {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in arrays.items()}


def render(scene: dict, state: dict, shift: np.ndarray, image_size: int) -> np.ndarray:
  """Float images `[N, H, W, 3]` in [0, 1] (before noise) of `scene` in `state`, every pixel seen
  through the image's global `shift` `[N, 2]` (the whole scene moves by `shift`)."""
  n, size, unit = len(scene["cls"]), image_size, image_size / 32
  scene, state = _single_precision(scene), _single_precision(state)
  grid = np.arange(size, dtype=np.float32) + 0.5
  x = grid[None, None, :] - shift[:, 0, None, None]
  y = grid[None, :, None] - shift[:, 1, None, None]
  x, y = np.broadcast_to(x, (n, size, size)), np.broadcast_to(y, (n, size, size))
  image = _background(scene, x, y, size)
  for k in range(scene["cls"].shape[1]):
    image = _draw_object(image, scene, state, k, x, y, unit)
  return np.clip(image, 0.0, 1.0, dtype=np.float32)


def _draw_object(image, scene, state, k, x, y, unit):
  cls, radius = scene["cls"][:, k], scene["radius"][:, k, None, None]
  plain = scene["plain"][:, k]
  present = scene["present"][:, k, None, None, None]
  afforded = _FAMILY_AFFORDED[cls] & ~plain[:, None]  # [N, families]
  theta = scene["theta"][:, k, None, None]
  dx, dy = x - scene["cx"][:, k, None, None], y - scene["cy"][:, k, None, None]
  qx = (np.cos(theta) * dx + np.sin(theta) * dy) / radius
  qy = (-np.sin(theta) * dx + np.cos(theta) * dy) / radius
  broken = (state["broken"][:, k] & afforded[:, FAMILIES.index("break")])[:, None, None]
  half_gap = unit / radius
  gap = broken & (np.abs(qx) < half_gap)
  qx = np.where(broken, qx - np.sign(qx) * half_gap, qx)
  visible = present * ~gap[..., None]

  colour = hsv_to_rgb(state["hue"][:, k])[:, None, None]
  glyph = scene["glyph"][:, k] if "glyph" in scene else None
  distance = shape_distance(cls, qx, qy, glyph) * radius
  body = _alpha(distance)
  hollow = (~state["filled"][:, k] & afforded[:, FAMILIES.index("fill")])[:, None, None]
  outline = np.clip(0.5 + distance + 1.6 * unit, 0.0, 1.0)
  body = np.where(hollow, body * outline, body)[..., None] * visible
  image = image * (1 - body) + colour * body

  has_lid = (state["lid"][:, k] & afforded[:, FAMILIES.index("lid")])[:, None, None, None]
  lid = _alpha(_box(qx, qy + 1.15, 0.8, 0.16) * radius)[..., None] * visible * has_lid
  image = image * (1 - lid) + 0.7 * colour * lid

  has_lamp = afforded[:, FAMILIES.index("lamp"), None, None, None]
  lamp = _alpha((np.hypot(qx, qy) - 0.3) * radius)[..., None] * visible * has_lamp
  lamp_colour = np.where(state["lamp"][:, k, None, None, None], _LAMP_ON, _LAMP_OFF)
  return image * (1 - lamp) + lamp_colour * lamp


def observe(rng: np.random.Generator, scene, state, settings: Settings) -> np.ndarray:
  """One noisy, shifted uint8 view per scene: the actionable counterfactual's independent noise."""
  n = len(scene["cls"])
  shift = rng.integers(-settings.max_shift, settings.max_shift + 1, (n, 2))
  image = render(scene, state, shift, settings.image_size)
  image = image + settings.noise_sigma * rng.standard_normal(image.shape, np.float32)
  return np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)


# ---------------------------------------------------------------------------------------------------
# Splits as arrays
# ---------------------------------------------------------------------------------------------------


def generate_chunk(settings: Settings, split: str, chunk: int) -> dict[str, np.ndarray]:
  """Records `[chunk * 512, ...)` of `split` (the last chunk may be short), a pure function of
  `(settings, split, chunk)`."""
  combos = combinations(settings)
  count = min(_CHUNK, settings.split_size(split) - chunk * _CHUNK)
  rng = np.random.default_rng([settings.seed, SPLITS.index(split), chunk])
  allowed = np.asarray(combos.pairs(split))
  pairs = allowed[rng.integers(len(allowed), size=count)]
  palettes = SCENE_PALETTES if split == "scene" else TRAIN_PALETTES
  scene, before, after = sample_scenes(rng, pairs, combos.objects(split), palettes, settings)
  return {
    "before": observe(rng, scene, before, settings),
    "after": observe(rng, scene, after, settings),
    "action": pairs[:, 0].astype(np.int32),
    "object": pairs[:, 1].astype(np.int32),
    "palette": scene["palette"].astype(np.int32),
    "target_box": target_box(scene, settings.image_size),
  }


def generate(settings: Settings, split: str) -> dict[str, np.ndarray]:
  """A whole split as arrays, without tfds (the builder yields the same records)."""
  chunks = range(-(-settings.split_size(split) // _CHUNK))
  parts = [generate_chunk(settings, split, c) for c in chunks]
  return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


# ---------------------------------------------------------------------------------------------------
# The tfds builder
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class ShapeTripletsConfig(tfds.core.BuilderConfig):
  settings: Settings = Settings()


def config_name(settings: Settings) -> str:
  """The preset's name for preset settings, else `custom-<hash of the settings>`."""
  for name, preset in PRESETS.items():
    if preset == settings:
      return name
  fields = dataclasses.asdict(settings)
  if fields["objects"] == "shapes":
    del fields["objects"]  # the names of shapes-only datasets predate the field
  digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode())
  return f"custom-{digest.hexdigest()[:12]}"


class ShapeTriplets(tfds.core.GeneratorBasedBuilder):
  """ShapeTriplet pairs: `before`, `after` uint8 `[H, W, 3]`, `action`, `object`, `palette`,
  `target_box`; splits `train`, `iid`, `comp`, `syst`, `scene`."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  BUILDER_CONFIGS = [ShapeTripletsConfig(name=n, settings=s) for n, s in PRESETS.items()]
  # No checksums file: nothing is downloaded (tfds would otherwise look for one beside this module).
  code_path = None

  def _info(self) -> tfds.core.DatasetInfo:
    size = self.builder_config.settings.image_size
    image = tfds.features.Tensor(shape=(size, size, 3), dtype=np.uint8)
    return tfds.core.DatasetInfo(
      builder=self,
      description="Procedural before/after pairs of one action on one object (ShapeTriplet).",
      disable_shuffling=True,  # records stay in generation order (chunk by chunk)
      features=tfds.features.FeaturesDict(
        {
          "before": image,
          "after": image,
          "action": tfds.features.Scalar(dtype=np.int32),
          "object": tfds.features.Scalar(dtype=np.int32),
          "palette": tfds.features.Scalar(dtype=np.int32),
          "target_box": tfds.features.Tensor(shape=(4,), dtype=np.float32),
        }
      ),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # generated, nothing downloaded
    return {split: self._generate_examples(split) for split in SPLITS}

  def _generate_examples(self, split):
    settings = self.builder_config.settings
    for chunk in range(-(-settings.split_size(split) // _CHUNK)):
      records = generate_chunk(settings, split, chunk)
      for i in range(len(records["action"])):
        yield chunk * _CHUNK + i, {name: value[i] for name, value in records.items()}


def builder(settings: Settings, data_dir: str | None = None) -> ShapeTriplets:
  name = config_name(settings)
  config = name if name in PRESETS else ShapeTripletsConfig(name=name, settings=settings)
  return ShapeTriplets(config=config, data_dir=data_dir or None, file_format="array_record")


def is_prepared(settings: Settings, data_dir: str | None) -> bool:
  return (builder(settings, data_dir).data_path / "dataset_info.json").exists()


def load(
  settings: Settings, data_dir: str | None = None, generate_if_missing: bool = True, splits=SPLITS
) -> dict[str, dict[str, np.ndarray]]:
  """`{split: {field: array}}` read from the tfds dataset in `data_dir` (tfds's default folder when
  empty), built there first when missing and `generate_if_missing`."""
  dataset = builder(settings, data_dir)
  if not is_prepared(settings, data_dir):
    if not generate_if_missing:
      raise FileNotFoundError(
        f"ShapeTriplets {config_name(settings)!r} not prepared in {data_dir!r}"
      )
    tfds.display_progress_bar(False)
    dataset.download_and_prepare()
  sources = dataset.as_data_source()
  out = {}
  for split in splits:
    source = sources[split]
    records = source.__getitems__(range(len(source)))
    out[split] = {name: np.stack([r[name] for r in records]) for name in records[0]}
  return out


def main(argv=None) -> None:
  import argparse

  parser = argparse.ArgumentParser(description="Prepare a ShapeTriplets preset in a tfds data_dir.")
  parser.add_argument("--config", choices=sorted(PRESETS), default="single32")
  parser.add_argument("--data_dir", required=True)
  args = parser.parse_args(argv)
  builder(PRESETS[args.config], args.data_dir).download_and_prepare()


if __name__ == "__main__":
  main()
