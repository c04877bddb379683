"""MenuWorld: a symbolic computer-use environment with menu apps, version updates and tutorials.

A small stand-in for the OSWorld / WebArena apps of "R-WoM: Retrieval-augmented World Model for
Computer-use Agents" (Mei et al., ICLR 2026): what an agent must know to act is an app's menu layout,
which differs between apps (novel apps) and between versions of one app (a UI update that makes
memorised knowledge stale), and which a tutorial corpus describes.

World. Every app has a home screen with 4 top menus; each top menu holds 3 items; an item is a leaf or
(with probability `submenu_prob`) a submenu of 2-3 leaves. The 8 settings of `SETTINGS` sit at random
leaves (the leaf's label is the setting's name); the other leaves are decoys. Half of the settings
open a confirm dialog that needs `ok`. Version 2 of an app is version 1 with 3 settings moved to
decoy leaves on other screens.

State `[screen, dialog, bit_0..bit_7]` (int32; dialog = pending setting or -1). Actions: click a label
(menu words, then setting names), then `back`, `home`, `ok`. A click on a label that is not on the
screen, `ok` without a dialog, or anything but `ok`/`back` while a dialog is open, is a no-op; a decoy
leaf is a no-op; a setting leaf toggles its bit (or opens its dialog, whose `ok` toggles it).

Tasks turn on 1-3 settings in order. The canonical expert (`expert_action`) finishes them; its number
of remaining steps `distance` defines the milestone flag of a transition, `distance(s') <
distance(s)`: entering the right menu, the right submenu, opening the right dialog, turning a target
on (and going home or back when off-path). `step`, `expert_action`, `distance` and `reward` are pure
jnp functions of a `Layouts` pytree, so batches of agents roll out under `jit`/`vmap`.

Text. Tutorials (one per app, version and setting) and task texts (setting synonyms, so raw queries
retrieve imperfectly); `vocabulary()` lists every token the world model reads.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core.data.batching import power_of_two_at_least

MENU_WORDS = tuple(
  "file edit view insert format tools table window help data layout review page style font color "
  "shape chart image link media audio video share print export import account profile privacy "
  "security network display power storage system update backup restore device sound keyboard mouse "
  "theme panel sidebar toolbar ribbon grid ruler guide zoomin zoomout filter sort search replace "
  "macro plugin script debug".split()
)
SETTINGS = ("wifi", "bluetooth", "darkmode", "bold", "autosave", "sync", "alarm", "spellcheck")
# Task texts name a setting by one of these; query rewriting knows the first `known` of each.
SYNONYMS = {
  "wifi": ("wireless", "internet", "hotspot"),
  "bluetooth": ("pairing", "headset", "earbuds"),
  "darkmode": ("night", "dim", "blackout"),
  "bold": ("heavy", "thick", "strong"),
  "autosave": ("autosaving", "keepwork", "preserve"),
  "sync": ("synchronize", "mirror", "cloud"),
  "alarm": ("wakeup", "reminder", "clock"),
  "spellcheck": ("spelling", "typos", "proofing"),
}
NUM_SETTINGS = len(SETTINGS)
TOP_MENUS, ITEMS_PER_MENU, SLOTS = 4, 3, 4
MAX_SCREENS = 1 + TOP_MENUS + TOP_MENUS * ITEMS_PER_MENU
NUM_LABELS = len(MENU_WORDS) + NUM_SETTINGS
BACK, HOME, OK = NUM_LABELS, NUM_LABELS + 1, NUM_LABELS + 2
NUM_ACTIONS = NUM_LABELS + 3
MAX_TARGETS = 3
MOVED_PER_UPDATE = 3
STATE_SIZE = 2 + NUM_SETTINGS
# Tokens of the world model's state: path word 1, path word 2, dialog, then one bit per setting.
STATE_TOKENS = 3 + NUM_SETTINGS

# An app is named by two words (16 x 16 names): every word is seen in training, so a novel app is a
# new combination of known tokens rather than an untrained embedding.
APP_FIRST = tuple(
  "nova kilo vega lumo pico zeta orbi tera brio celo dyna echo flux giga hexa iona".split()
)
APP_SECOND = tuple("ark box cab dot elm fig gem hub ink jar key log map nut oak pad".split())
MAX_APPS = len(APP_FIRST) * len(APP_SECOND)
STRUCTURE = ("sep", "goal", "act", "out", "rwd", "none", "0", "1", "v1", "v2")
TUTORIAL_WORDS = ("turn", "on", "click", "then", "result", ":")
ACTION_WORDS = MENU_WORDS + SETTINGS + ("back", "home", "ok")


class Layouts(NamedTuple):
  """Menu layouts of every (app, version), indexed `layout = 2 * app + version - 1`.

  labels [L, S, 4]: the label id at each screen slot (-1 empty); child [L, S, 4]: the submenu it
  opens (-1 for leaves); setting [L, S, 4]: the setting of a setting leaf (-1 otherwise);
  parent [L, S]: the screen `back` returns to; path [L, S, 2]: the screen's label path from home
  (-1 padded); confirm [L, 8]: settings that open a dialog; location [L, 8, 2]: (screen, slot) of
  each setting.
  """

  labels: np.ndarray
  child: np.ndarray
  setting: np.ndarray
  parent: np.ndarray
  path: np.ndarray
  confirm: np.ndarray
  location: np.ndarray


def layout_index(app, version):
  return 2 * app + version - 1


# ---------------------------------------------------------------------------------------------------
# Generating apps
# ---------------------------------------------------------------------------------------------------


def _tree(rng: np.random.Generator, submenu_prob: float):
  """One app's version-1 tree: (labels, child, parent, leaves) with labels to fill later (-2 = leaf)."""
  while True:
    labels = np.full((MAX_SCREENS, SLOTS), -1, np.int64)
    child = np.full((MAX_SCREENS, SLOTS), -1, np.int64)
    parent = np.zeros((MAX_SCREENS,), np.int64)
    words = iter(rng.permutation(len(MENU_WORDS)))
    leaves, next_screen = [], 1 + TOP_MENUS
    for top in range(TOP_MENUS):
      menu = 1 + top
      labels[0, top], child[0, top] = next(words), menu
      for item in range(ITEMS_PER_MENU):
        labels[menu, item] = next(words)
        if rng.random() < submenu_prob:
          sub = next_screen
          next_screen += 1
          child[menu, item], parent[sub] = sub, menu
          for slot in range(rng.integers(2, 4)):
            leaves.append((sub, slot))
            labels[sub, slot] = -2
        else:
          leaves.append((menu, item))
    decoys_off_screen = len(leaves) - NUM_SETTINGS
    if decoys_off_screen >= MOVED_PER_UPDATE + 2:
      for screen, slot in leaves:
        if labels[screen, slot] == -2:
          labels[screen, slot] = next(words)
      parent[1 : 1 + TOP_MENUS] = 0
      return labels, child, parent, leaves


def _paths(labels, child, parent):
  path = np.full((MAX_SCREENS, 2), -1, np.int64)
  for screen in range(1, MAX_SCREENS):
    up = parent[screen]
    slot = np.flatnonzero(child[up] == screen)
    if slot.size:
      depth = 0 if up == 0 else 1
      if up:
        path[screen, 0] = path[up, 0]
      path[screen, depth] = labels[up, slot[0]]
  return path


def _place(labels, placement):
  """Setting arrays for `placement[s] = (screen, slot)`; setting leaves are labelled by name."""
  labels = labels.copy()
  setting = np.full(labels.shape, -1, np.int64)
  for s, (screen, slot) in enumerate(placement):
    setting[screen, slot] = s
    labels[screen, slot] = len(MENU_WORDS) + s
  return labels, setting


def make_layouts(num_apps: int, seed: int, submenu_prob: float = 0.5) -> tuple[Layouts, np.ndarray]:
  """Version 1 and 2 of `num_apps` (<= 256) apps; also `moved [num_apps, 8]` (settings the update
  moved)."""
  if not 0 < num_apps <= MAX_APPS:
    raise ValueError(f"menuworld: num_apps must be in 1..{MAX_APPS}, got {num_apps}")
  rng = np.random.default_rng([seed, 7])
  out = {name: [] for name in Layouts._fields}
  moved_all = np.zeros((num_apps, NUM_SETTINGS), bool)
  for app in range(num_apps):
    base, child, parent, leaves = _tree(rng, submenu_prob)
    order = rng.permutation(len(leaves))
    placement = [leaves[i] for i in order[:NUM_SETTINGS]]
    decoys = [leaves[i] for i in order[NUM_SETTINGS:]]
    confirm = np.zeros((NUM_SETTINGS,), bool)
    confirm[rng.permutation(NUM_SETTINGS)[: NUM_SETTINGS // 2]] = True
    updated = list(placement)
    for s in rng.permutation(NUM_SETTINGS)[:MOVED_PER_UPDATE]:
      off_screen = [i for i, d in enumerate(decoys) if d[0] != placement[s][0]]
      pick = off_screen[rng.integers(len(off_screen))]
      updated[s], decoys[pick] = decoys[pick], placement[s]
      base[updated[s]], base[placement[s]] = base[placement[s]], base[updated[s]]
      moved_all[app, s] = True
    for version_placement in (placement, updated):
      labels, setting = _place(base, version_placement)
      out["labels"].append(labels)
      out["child"].append(child)
      out["setting"].append(setting)
      out["parent"].append(parent)
      out["path"].append(_paths(labels, child, parent))
      out["confirm"].append(confirm)
      out["location"].append(np.asarray(version_placement, np.int64))
  layouts = Layouts(*(np.stack(out[name]).astype(np.int32) for name in Layouts._fields))
  return layouts._replace(confirm=layouts.confirm.astype(bool)), moved_all


# ---------------------------------------------------------------------------------------------------
# Dynamics (pure jnp; one layout index and one state per call, vmap for batches)
# ---------------------------------------------------------------------------------------------------


def initial_state(bits) -> jax.Array:
  """Home screen, no dialog, the given setting bits."""
  bits = jnp.asarray(bits, jnp.int32)
  head = jnp.broadcast_to(jnp.array([0, -1], jnp.int32), bits.shape[:-1] + (2,))
  return jnp.concatenate([head, bits], axis=-1)


def step(layouts: Layouts, layout, state, action) -> jax.Array:
  """The next state after `action` (module docstring); invalid actions are no-ops."""
  screen, dialog, bits = state[0], state[1], state[2:]
  row = layouts.labels[layout, screen]
  hit = row == action
  found = jnp.any(hit) & (action < NUM_LABELS)
  slot = jnp.argmax(hit)
  child = layouts.child[layout, screen, slot]
  setting = layouts.setting[layout, screen, slot]
  confirm = layouts.confirm[layout, jnp.maximum(setting, 0)]

  def toggle(bits, s):
    return bits.at[jnp.maximum(s, 0)].set(jnp.where(s >= 0, 1 - bits[jnp.maximum(s, 0)], bits[0]))

  in_dialog = dialog >= 0
  dialog_bits = jnp.where(action == OK, toggle(bits, dialog), bits)
  dialog_state = jnp.concatenate(
    [jnp.stack([screen, jnp.where((action == OK) | (action == BACK), -1, dialog)]), dialog_bits]
  )
  new_screen = jnp.where(
    action == BACK,
    layouts.parent[layout, screen],
    jnp.where(action == HOME, 0, jnp.where(found & (child >= 0), child, screen)),
  )
  is_setting = found & (child < 0) & (setting >= 0)
  new_dialog = jnp.where(is_setting & confirm, setting, -1)
  new_bits = jnp.where(is_setting & ~confirm, toggle(bits, setting), bits)
  free_state = jnp.concatenate([jnp.stack([new_screen, new_dialog]), new_bits])
  return jnp.where(in_dialog, dialog_state, free_state).astype(jnp.int32)


def pending_target(state, goal) -> jax.Array:
  """The first setting of `goal [3]` (-1 padded) still off, or -1 when the task is done."""
  on = jnp.where(goal >= 0, state[2:][jnp.maximum(goal, 0)] == 1, True)
  index = jnp.argmax(~on)
  return jnp.where(jnp.all(on), -1, goal[index])


def expert_action(layouts: Layouts, layout, state, goal) -> jax.Array:
  """The canonical expert: confirm or cancel a dialog, else walk to the pending setting along its
  menu path (back when the parent is on the path, home otherwise) and click it. `ok` once done."""
  screen, dialog = state[0], state[1]
  target = pending_target(state, goal)
  t_screen, t_slot = layouts.location[layout, jnp.maximum(target, 0)]
  t_parent = layouts.parent[layout, t_screen]
  on_path = (screen == t_screen) | (screen == t_parent) | (screen == 0)
  next_screen = jnp.where(
    screen == t_parent, t_screen, jnp.where(t_parent == 0, t_screen, t_parent)
  )
  via = jnp.argmax(layouts.child[layout, screen] == next_screen)
  click = jnp.where(
    screen == t_screen,
    layouts.labels[layout, t_screen, t_slot],
    layouts.labels[layout, screen, via],
  )
  parent_on_path = (layouts.parent[layout, screen] == t_parent) | (
    layouts.parent[layout, screen] == t_screen
  )
  walk = jnp.where(on_path, click, jnp.where(parent_on_path, BACK, HOME))
  in_dialog = jnp.where(dialog == target, OK, BACK)
  action = jnp.where(dialog >= 0, in_dialog, walk)
  return jnp.where(target < 0, OK, action).astype(jnp.int32)


def distance(layouts: Layouts, layout, state, goal, max_steps: int = 24) -> jax.Array:
  """Steps the expert needs from `state` to finish `goal` (capped at `max_steps`)."""

  def body(carry, _):
    state, count = carry
    done = pending_target(state, goal) < 0
    action = expert_action(layouts, layout, state, goal)
    state = jnp.where(done, state, step(layouts, layout, state, action))
    return (state, count + (~done).astype(jnp.int32)), None

  (_, count), _ = jax.lax.scan(body, (state, jnp.int32(0)), None, length=max_steps)
  return count


def reward(layouts: Layouts, layout, state, next_state, goal) -> jax.Array:
  """The milestone flag of a transition: 1 when it brings the task closer (`distance` drops)."""
  before = distance(layouts, layout, state, goal)
  after = distance(layouts, layout, next_state, goal)
  return (after < before).astype(jnp.int32)


def valid_actions(layouts: Layouts, layout, state) -> jax.Array:
  """bool [NUM_ACTIONS]: the labels on the current screen, `back`, `home` and `ok`."""
  row = layouts.labels[layout, state[0]]
  shown = (
    jnp.zeros((NUM_ACTIONS,), bool).at[jnp.where(row >= 0, row, NUM_ACTIONS)].set(True, mode="drop")
  )
  return shown.at[jnp.array([BACK, HOME, OK])].set(True)


def done(state, goal) -> jax.Array:
  return pending_target(state, goal) < 0


def counterfactual_action(layouts: Layouts, layout, state, goal, key) -> jax.Array:
  """A wrong action from `state`: uniform among the valid actions other than the expert's that change
  the state (a click on a shown menu or setting, `back`, `home`; a decoy leaf, `ok` outside a dialog
  and `back` at home are no-ops and excluded), or -1 when there is none. At the home screen these
  are the three top menus the expert does not take: the negatives whose flag only the tutorial (or
  a memorised layout) decides."""
  expert = expert_action(layouts, layout, state, goal)
  labels = layouts.labels[layout, state[0]]
  candidates = jnp.concatenate([labels, jnp.array([BACK, HOME, OK], jnp.int32)])
  moved = jax.vmap(lambda a: jnp.any(step(layouts, layout, state, jnp.maximum(a, 0)) != state))(
    candidates
  )
  ok = (candidates >= 0) & (candidates != expert) & moved
  pick = jax.random.choice(key, candidates.shape[0], p=ok / jnp.maximum(jnp.sum(ok), 1))
  return jnp.where(jnp.any(ok), candidates[pick], -1).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------------
# Tasks and trajectories
# ---------------------------------------------------------------------------------------------------


class Tasks(NamedTuple):
  """A batch of tasks: layout index, goal settings (-1 padded), start state, text synonyms."""

  layout: np.ndarray  # [N] int32
  goal: np.ndarray  # [N, 3] int32
  start: np.ndarray  # [N, 10] int32
  wording: np.ndarray  # [N, 3] int32: 0 = the setting's name, 1..3 = its synonym


def sample_tasks(
  rng: np.random.Generator,
  num: int,
  apps,
  version: int,
  sizes=(1, 2, 3),
  moved: np.ndarray | None = None,
  name_prob: float = 0.25,
) -> Tasks:
  """`num` tasks on `apps` at `version`, 1-3 distinct targets each (sizes drawn from `sizes`); with
  `moved [apps, 8]` the first target is a setting the update moved. Start bits are random with the
  targets off."""
  apps = np.asarray(apps)
  app = apps[rng.integers(len(apps), size=num)]
  goal = np.full((num, MAX_TARGETS), -1, np.int32)
  bits = rng.integers(0, 2, size=(num, NUM_SETTINGS))
  for row in range(num):
    size = int(sizes[rng.integers(len(sizes))])
    targets = rng.permutation(NUM_SETTINGS)[:size]
    if moved is not None:
      options = np.flatnonzero(moved[app[row]])
      first = options[rng.integers(len(options))]
      targets = np.asarray([first] + [t for t in targets if t != first], np.int64)[:size]
    goal[row, :size] = targets
    bits[row, targets] = 0
  wording = np.where(
    rng.random((num, MAX_TARGETS)) < name_prob, 0, rng.integers(1, 4, (num, MAX_TARGETS))
  )
  layout = layout_index(app, version).astype(np.int32)
  start = np.asarray(initial_state(bits))
  return Tasks(layout, goal, start, wording.astype(np.int32))


def rollout(layouts: Layouts, layout, start, goal, rng, num_steps: int, epsilon: float):
  """One episode of the expert with probability-`epsilon` random valid actions, as arrays over
  `num_steps`: states, actions, next states, rewards, whether the action was the expert's, and
  `live` (the task was not done before the step)."""
  return _episode(layouts, layout, start, goal, jax.random.split(rng, num_steps), epsilon)


def _episode(layouts: Layouts, layout, start, goal, step_keys, epsilon):
  """`rollout` with one key per step, `step_keys [num_steps]`."""

  def body(state, key):
    live = ~done(state, goal)
    expert = expert_action(layouts, layout, state, goal)
    valid = valid_actions(layouts, layout, state)
    k1, k2 = jax.random.split(key)
    random_action = jax.random.choice(k1, NUM_ACTIONS, p=valid / jnp.sum(valid))
    explore = jax.random.uniform(k2) < epsilon
    action = jnp.where(explore, random_action, expert).astype(jnp.int32)
    nxt = step(layouts, layout, state, action)
    r = reward(layouts, layout, state, nxt, goal)
    out = dict(
      state=state,
      action=action,
      next_state=nxt,
      reward=r,
      is_expert=action == expert,
      live=live,
    )
    return jnp.where(live, nxt, state), out

  _, out = jax.lax.scan(body, start, step_keys)
  return out


@jax.jit
def _batched_episodes(layouts, layout, start, goal, step_keys, epsilon):
  fn = lambda *a: _episode(layouts, *a, epsilon)  # noqa: E731
  return jax.vmap(fn)(layout, start, goal, step_keys)


def rollouts(layouts: Layouts, tasks: Tasks, seed: int, num_steps: int, epsilon: float) -> dict:
  """`rollout` of every task (vmapped, jitted); numpy arrays `[N, num_steps, ...]`. Row i's key is
  the i-th of `N` split from `seed`. Rows and steps run padded to powers of two (rows repeated,
  steps run past the end and dropped: a step never reads a later one), so that a few compiled
  programs serve every N and `num_steps`."""
  n = len(tasks.layout)
  keys = jax.random.split(jax.random.key(seed), n)
  step_keys = jax.vmap(lambda key: jax.random.split(key, num_steps))(keys)
  rows = np.arange(power_of_two_at_least(n)) % max(n, 1)
  steps = np.minimum(np.arange(power_of_two_at_least(num_steps)), num_steps - 1)
  out = _batched_episodes(
    jax.tree.map(jnp.asarray, layouts),
    np.asarray(tasks.layout)[rows],
    np.asarray(tasks.start)[rows],
    np.asarray(tasks.goal)[rows],
    step_keys[rows][:, steps],
    epsilon,
  )
  return jax.tree.map(lambda a: np.asarray(a)[:n, :num_steps], out)


# ---------------------------------------------------------------------------------------------------
# Text: tutorials, task texts, tokens
# ---------------------------------------------------------------------------------------------------


def app_name(app: int) -> str:
  """Two words, e.g. `nova box`."""
  first, second = divmod(int(app), len(APP_SECOND))
  return f"{APP_FIRST[first]} {APP_SECOND[second]}"


def action_word(action: int) -> str:
  return ACTION_WORDS[action]


def tutorial_clicks(layouts: Layouts, layout: int, setting: int) -> list[int]:
  """The actions of the tutorial for `setting`: the menu path from home, the leaf, `ok` if asked."""
  screen, slot = (int(v) for v in layouts.location[layout, setting])
  path = [int(w) for w in layouts.path[layout, screen] if w >= 0]
  clicks = path + [int(layouts.labels[layout, screen, slot])]
  return clicks + ([OK] if layouts.confirm[layout, setting] else [])


def tutorial_text(layouts: Layouts, layout: int, setting: int) -> str:
  """e.g. `app7 v2 turn on bold : click format then click font then click bold then click ok result
  bold on` (at most 20 words)."""
  app, version = divmod(layout, 2)
  clicks = " then ".join(
    f"click {action_word(a)}" for a in tutorial_clicks(layouts, layout, setting)
  )
  name = SETTINGS[setting]
  return f"{app_name(app)} v{version + 1} turn on {name} : {clicks} result {name} on"


def corpus(layouts: Layouts) -> tuple[list[str], np.ndarray]:
  """Every tutorial, and `keys [D, 2]` = (layout, setting) of each."""
  keys = [(lay, s) for lay in range(len(layouts.labels)) for s in range(NUM_SETTINGS)]
  return [tutorial_text(layouts, lay, s) for lay, s in keys], np.asarray(keys, np.int32)


def setting_phrase(setting: int, wording: int) -> str:
  name = SETTINGS[setting]
  return name if wording == 0 else SYNONYMS[name][wording - 1]


def task_text(layout: int, setting: int, wording: int) -> str:
  """The user-facing request for one target, e.g. `please enable heavy in app3 v2`."""
  app, version = divmod(int(layout), 2)
  return f"please enable {setting_phrase(setting, wording)} in {app_name(app)} v{version + 1}"


def vocabulary() -> list[str]:
  """Every word the world model reads, in a fixed order (see `TokenIds`)."""
  return list(STRUCTURE) + list(APP_FIRST + APP_SECOND) + list(ACTION_WORDS) + list(TUTORIAL_WORDS)


class TokenIds(NamedTuple):
  """Token ids of the word tokenizer over `vocabulary()` (5 special tokens first)."""

  def word(self, word: str) -> int:
    return 5 + vocabulary().index(word)

  @property
  def action_base(self) -> int:
    return 5 + len(STRUCTURE) + len(APP_FIRST) + len(APP_SECOND)

  def app(self, app) -> tuple[int, int]:
    first, second = divmod(int(app), len(APP_SECOND))
    return 5 + len(STRUCTURE) + first, 5 + len(STRUCTURE) + len(APP_FIRST) + second

  def action(self, action):
    return self.action_base + action

  def version(self, version):
    return self.word("v1") + version - 1


def state_tokens(layouts: Layouts, layout, state, ids: TokenIds) -> jax.Array:
  """`[path word 1, path word 2, dialog, bits...]` token ids of `state` (jnp; "none" for empty)."""
  path = layouts.path[layout, state[0]]
  none = ids.word("none")
  words = jnp.where(path >= 0, ids.action(path), none)
  dialog = jnp.where(state[1] >= 0, ids.action(len(MENU_WORDS) + state[1]), none)
  bits = ids.word("0") + state[2:]
  return jnp.concatenate([words, dialog[None], bits]).astype(jnp.int32)
