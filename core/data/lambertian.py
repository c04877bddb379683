"""Lambertian scenes with exact normals, relit by a moving point light: the data of LightCtrl's small-scale
reproduction ("LightCtrl: Training-free Controllable Video Relighting", ICLR 2026; official code
GVCLab/LightCtrl).

A scene is a ground plane plus 1..`max_objects` primitives seen from above as analytic height fields
`z(x, y)` in pixel units (x to the right, y down, z towards the camera):
  sphere    `z = sqrt(r^2 - d^2)`, normal `(x - cx, y - cy, z) / r`;
  cylinder  lying along x or y, `z = sqrt(r^2 - u^2)` across its axis, normal `(u, 0, z) / r` rotated;
  box       a flat top at height `h`, normal `(0, 0, 1)`.
Where primitives overlap the highest surface is seen. Albedo is a flat colour or a checker texture
attached to each object; objects translate slowly (constant velocity). Normals are exact, not finite
differences (`tests/test_lightctrl.py` checks them against finite differences of the height field).

Shading of a point light at `(lx, ly, h)` with colour `c` and footprint radius `R` (Lambert's law with
a Gaussian spot, so that the lit region matches the light map of the same radius):
`I = albedo * (ambient + gain * c * max(0, n . l) * exp(-|p_xy - l_xy|^2 / (2 R^2)))`, clipped to [0, 1].

Each clip is rendered twice: under a static white side light (the **source**, broad and grazing, so that
it leaves strong directional shading) and under a light following a **target trajectory** with the
colour of a lighting prompt. The target trajectories are the paper's six (official `src/ic_light.py`,
`create_dynamic_background`: top-left to bottom-right, bottom-left to top-right, top to bottom at x =
W/4, left to right at y = H/4, circular around the centre with radius min(W, H)/2, semi-circular over
the top) plus random smooth curves. Light centres are kept as floats (the official code truncates to
integer pixels, which at 32 px would make the path jerky). Light maps are `exp(-d^2 / (2 R^2))`, the
official grey maps divided by 255. The normal video is `(n + 1) / 2` as RGB (the paper estimates it with
StableNormal; `normal_noise` mimics an estimator's error).

Everything is a pure function of its seed: `clip_batch(seed, index, n)` is batch `index` of stream `seed`.
Evaluation sets (`paths="paper"`) assign (trajectory, prompt) pairs round-robin (`paper_assignment`): any
`len(TRAJECTORIES)` consecutive clips cover every trajectory and every prompt, and 18 cover every pair.
"""

from __future__ import annotations

import numpy as np

TRAJECTORIES = (
  "top_left_to_bottom_right",
  "bottom_left_to_top_right",
  "top_to_bottom",
  "left_to_right",
  "circular",
  "semi_circular",
)
PROMPTS = ("white", "warm", "cool")  # lighting-prompt tokens; index len(PROMPTS) is the null prompt
LIGHT_COLOURS = np.array([(1.0, 1.0, 1.0), (1.0, 0.72, 0.42), (0.45, 0.68, 1.0)], np.float32)
AMBIENT = 0.25
GAIN = 0.9
SOURCE_GAIN = 0.75
PRIMITIVES = ("sphere", "cylinder", "box")


# ---------------------------------------------------------------------------------------------------
# Light trajectories and light maps
# ---------------------------------------------------------------------------------------------------


def trajectory(name: str, frames: int, size: int) -> np.ndarray:
  """Light centres `(frames, 2)` as `(x, y)` pixels for one of `TRAJECTORIES`, `tau = k / (F - 1)`."""
  tau = np.linspace(0.0, 1.0, frames)
  last, centre, radius = size - 1.0, size // 2, size // 2
  if name == "top_left_to_bottom_right":
    xy = (tau * last, tau * last)
  elif name == "bottom_left_to_top_right":
    xy = (tau * last, (1 - tau) * last)
  elif name == "top_to_bottom":
    xy = (np.full_like(tau, size // 4), tau * last)
  elif name == "left_to_right":
    xy = (tau * last, np.full_like(tau, size // 4))
  elif name == "circular":
    xy = (centre + radius * np.cos(2 * np.pi * tau), centre + radius * np.sin(2 * np.pi * tau))
  elif name == "semi_circular":
    xy = (centre - radius * np.cos(np.pi * tau), centre - radius * np.sin(np.pi * tau))
  else:
    raise ValueError(f"unknown trajectory {name!r}; known: {TRAJECTORIES}")
  return np.stack(xy, axis=-1).astype(np.float32)


def random_trajectory(rng: np.random.Generator, frames: int, size: int) -> np.ndarray:
  """A smooth random path: a straight segment between uniform end points bent by a half sine."""
  tau = np.linspace(0.0, 1.0, frames)[:, None]
  start, end = rng.uniform(0, size - 1, (2, 2))
  bend = rng.normal(0.0, size / 6, 2)
  path = start + (end - start) * tau + bend * np.sin(np.pi * tau)
  return np.clip(path, 0, size - 1).astype(np.float32)


def light_maps(centres: np.ndarray, size: int, radius: float) -> np.ndarray:
  """Grey light maps `(..., size, size)` in [0, 1]: `exp(-d^2 / (2 R^2))` around each centre `(..., 2)`."""
  yy, xx = np.mgrid[:size, :size].astype(np.float32)
  dx = xx - centres[..., 0, None, None]
  dy = yy - centres[..., 1, None, None]
  return np.exp(-(dx**2 + dy**2) / (2 * radius**2)).astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# Scenes: height fields, exact normals, albedo
# ---------------------------------------------------------------------------------------------------


def _random_object(rng: np.random.Generator, size: int) -> dict:
  return {
    "kind": PRIMITIVES[rng.integers(len(PRIMITIVES))],
    "centre": rng.uniform(0.2 * size, 0.8 * size, 2),
    "velocity": rng.uniform(-0.6, 0.6, 2),
    "radius": rng.uniform(0.12, 0.25) * size,
    "extent": rng.uniform(0.15, 0.3) * size,  # cylinder half-length, box half-side
    "along_x": bool(rng.integers(2)),
    "box_height": rng.uniform(0.1, 0.3) * size,
    "colours": rng.uniform(0.3, 0.95, (2, 3)),
    "checker": int(rng.choice([0, 3, 4])),  # 0: flat colour, else the checker period in pixels
  }


def random_scene(rng: np.random.Generator, size: int, max_objects: int) -> dict:
  """Ground albedo and 1..`max_objects` primitives (kind, position, velocity, size, albedo)."""
  return {
    "ground": {"colours": rng.uniform(0.35, 0.9, (2, 3)), "checker": int(rng.choice([0, 4, 8]))},
    "objects": [_random_object(rng, size) for _ in range(rng.integers(1, max_objects + 1))],
  }


def _checker(u: np.ndarray, v: np.ndarray, colours: np.ndarray, period: int) -> np.ndarray:
  if not period:
    return np.broadcast_to(colours[0], (*u.shape, 3))
  parity = (np.floor(u / period) + np.floor(v / period)) % 2
  return np.where(parity[..., None] > 0, colours[1], colours[0])


def primitive_surface(obj: dict, xx: np.ndarray, yy: np.ndarray, frame: int):
  """Height `(H, W)` (-inf outside), exact unit normals `(H, W, 3)` and albedo `(H, W, 3)` of one object."""
  cx, cy = obj["centre"] + obj["velocity"] * frame
  u, v = xx - cx, yy - cy
  r = obj["radius"]
  normal = np.zeros((*xx.shape, 3))
  if obj["kind"] == "sphere":
    inside = u**2 + v**2 < r**2
    z = np.sqrt(np.maximum(r**2 - u**2 - v**2, 0.0))
    normal[..., 0], normal[..., 1], normal[..., 2] = u / r, v / r, z / r
  elif obj["kind"] == "cylinder":
    across, along = (v, u) if obj["along_x"] else (u, v)
    inside = (across**2 < r**2) & (np.abs(along) < obj["extent"])
    z = np.sqrt(np.maximum(r**2 - across**2, 0.0))
    normal[..., 1 if obj["along_x"] else 0] = across / r
    normal[..., 2] = z / r
  else:
    inside = (np.abs(u) < obj["extent"]) & (np.abs(v) < obj["extent"])
    z = np.full(xx.shape, obj["box_height"])
    normal[..., 2] = 1.0
  height = np.where(inside, z, -np.inf)
  albedo = _checker(u, v, obj["colours"], obj["checker"])
  return height, normal, albedo


def scene_frame(scene: dict, size: int, frame: int):
  """Height `(H, W)`, unit normals `(H, W, 3)` and albedo `(H, W, 3)` of frame `frame`."""
  yy, xx = np.mgrid[:size, :size].astype(np.float64)
  height = np.zeros((size, size))
  normal = np.zeros((size, size, 3))
  normal[..., 2] = 1.0
  albedo = np.array(_checker(xx, yy, scene["ground"]["colours"], scene["ground"]["checker"]))
  for obj in scene["objects"]:
    h, n, a = primitive_surface(obj, xx, yy, frame)
    above = h > height
    height = np.where(above, h, height)
    normal = np.where(above[..., None], n, normal)
    albedo = np.where(above[..., None], a, albedo)
  return height, normal, albedo


# ---------------------------------------------------------------------------------------------------
# Shading and clips
# ---------------------------------------------------------------------------------------------------


def lambert_shading(
  height: np.ndarray, normal: np.ndarray, light: np.ndarray, radius: float
) -> np.ndarray:
  """`max(0, n . l) * exp(-|p_xy - l_xy|^2 / (2 R^2))` `(..., H, W)` for lights `(..., 3)` at `(x, y, z)`."""
  size = height.shape[-1]
  yy, xx = np.mgrid[:size, :size].astype(np.float64)
  to_light = np.stack(
    np.broadcast_arrays(
      light[..., 0, None, None] - xx,
      light[..., 1, None, None] - yy,
      light[..., 2, None, None] - height,
    ),
    axis=-1,
  )
  planar = to_light[..., 0] ** 2 + to_light[..., 1] ** 2
  direction = to_light / np.linalg.norm(to_light, axis=-1, keepdims=True)
  lambert = np.maximum(np.sum(normal * direction, axis=-1), 0.0)
  return lambert * np.exp(-planar / (2 * radius**2))


def shade(albedo, shading, colour, gain) -> np.ndarray:
  """`albedo * (ambient + gain * colour * shading)` in [0, 1]."""
  return np.clip(albedo * (AMBIENT + gain * colour * shading[..., None]), 0.0, 1.0)


def render_clip(
  rng: np.random.Generator,
  frames: int,
  size: int,
  light_radius: float,
  light_height: float,
  max_objects: int,
  path: str | np.ndarray,
  prompt: int,
  normal_noise: float = 0.0,
) -> dict[str, np.ndarray]:
  """One clip under the source light and under the target light along `path` (a name of
  `TRAJECTORIES`, "random", or centres `(frames, 2)`), coloured by `prompt` (an index of `PROMPTS`).

  Returns float32 arrays: `source`, `target`, `normals` (RGB `(n + 1) / 2`, with noise), `albedo`
  `(F, H, W, 3)`; `light_map`, `source_shading` (`max(0, n . l_src)` times its spot) `(F, H, W)`;
  `light_path` `(F, 2)`; `prompt` (int32 scalar).
  """
  scene = random_scene(rng, size, max_objects)
  if isinstance(path, str):
    centres = (
      random_trajectory(rng, frames, size) if path == "random" else trajectory(path, frames, size)
    )
  else:
    centres = np.asarray(path, np.float32)
  side = rng.uniform(0, 2 * np.pi)
  source_light = np.array(
    [size / 2 + 0.6 * size * np.cos(side), size / 2 + 0.6 * size * np.sin(side), 0.3 * size]
  )
  surfaces = [scene_frame(scene, size, f) for f in range(frames)]
  height, normal, albedo = (np.stack(parts) for parts in zip(*surfaces, strict=True))
  target_light = np.concatenate([centres, np.full((frames, 1), light_height)], axis=-1)
  source_shading = lambert_shading(height, normal, np.broadcast_to(source_light, (frames, 3)), size)
  target_shading = lambert_shading(height, normal, target_light, light_radius)
  normals_rgb = (normal + 1.0) / 2.0 + normal_noise * rng.normal(size=normal.shape)
  return {
    "source": shade(albedo, source_shading, LIGHT_COLOURS[0], SOURCE_GAIN).astype(np.float32),
    "target": shade(albedo, target_shading, LIGHT_COLOURS[prompt], GAIN).astype(np.float32),
    "normals": np.clip(normals_rgb, 0.0, 1.0).astype(np.float32),
    "albedo": albedo.astype(np.float32),
    "light_map": light_maps(centres, size, light_radius),
    "source_shading": source_shading.astype(np.float32),
    "light_path": centres,
    "prompt": np.int32(prompt),
  }


def paper_assignment(n: int) -> list[tuple[str, int]]:
  """(trajectory, prompt index) of evaluation clip `i < n`: trajectory `i % T`, prompt `(i + i // T) % P`
  (T = 6 trajectories, P = 3 prompts). Each block of T clips covers every trajectory and, as P divides T,
  every prompt equally often; the shift by `i // T` gives the next block's trajectories other prompts, so
  the first `T * P` clips hold every (trajectory, prompt) pair once."""
  t, p = len(TRAJECTORIES), len(PROMPTS)
  return [(TRAJECTORIES[i % t], (i + i // t) % p) for i in range(n)]


MIN_PAPER_CLIPS = max(
  len(TRAJECTORIES), len(PROMPTS)
)  # clips that cover every trajectory and prompt


def clip_batch(
  seed: int,
  index: int,
  n: int,
  frames: int = 8,
  size: int = 32,
  light_radius: float = 6.0,
  light_height: float = 16.0,
  max_objects: int = 3,
  paths: str = "paper",
  normal_noise: float = 0.0,
) -> dict[str, np.ndarray]:
  """`n` clips stacked on a leading axis; batch `index` of stream `seed`.

  `paths="paper"`: clip i follows `paper_assignment(n)[i]` (evaluation sets; `n >= MIN_PAPER_CLIPS`
  covers every trajectory and prompt);
  `"random"`: random smooth paths and uniform prompts (training the video prior);
  `"point"`: one frame per clip lit from a uniform position (training the image relighter).
  """
  rng = np.random.default_rng([seed, index])
  assignment = paper_assignment(n) if paths == "paper" else None
  clips = []
  for i in range(n):
    if paths == "paper":
      path, prompt = assignment[i]
    elif paths == "random":
      path, prompt = "random", int(rng.integers(len(PROMPTS)))
    elif paths == "point":
      path = rng.uniform(-0.1 * size, 1.1 * size, (frames, 2))
      prompt = int(rng.integers(len(PROMPTS)))
    else:
      raise ValueError(f"paths must be 'paper', 'random' or 'point', got {paths!r}")
    clips.append(
      render_clip(
        rng, frames, size, light_radius, light_height, max_objects, path, prompt, normal_noise
      )
    )
  return {key: np.stack([c[key] for c in clips]) for key in clips[0]}
