"""MARC's gpu variant as phases: Qwen2.5-VL-3B (`model.checkpoint`) on Video-R1 (`data.data_dir`),
"MARC: Memory-Augmented RL Token Compression for Efficient Video Understanding" (ICLR 2026; official
code github.com/Gimlettt/MARC, on Video-R1's trainer).

Phases:
  `qwen`             reads the checkpoint once; its output is the decoder's parameters.
  `teacher_answers`  a_full: `rl.teacher_rollouts` sampled answers of the teacher on every RL-pool
                     question with all visual tokens, scored by Video-R1's accuracy reward.
  students           each starts from the checkpoint's decoder (the vision tower stays frozen, so the
                     batches carry the tower's tokens, computed by the data source): `sft` (cross
                     entropy of the record's `<think>` process, if any, and `<answer>` on the merged
                     input), `grpo` (alpha = 0) and `marc` (C-GRPO), `rl.group` rollouts per prompt.
  `evaluate`         greedy answers of the teacher (full input) and every student (merged input) on the
                     test questions: `accuracy` (the main student), `teacher_accuracy`, `token_ratio`,
                     `latency_ratio`.

The students' input: with `retriever.clip_checkpoint` set (a transformers `CLIPModel` folder), the
Visual Memory Retriever of `paper_vmr.py` keeps the `retriever.top_k` event clips closest to the
question and MARC's two-stage merge compresses their temporal patches; with it unset, the merge runs
over the whole video (the `cgrpo_novmr` arm of the EventWorld study). The teacher always sees every
frame. Rewards are Video-R1's rules on the decoded text (`core.data.video_r1`), computed on
the host inside the jitted step through `jax.pure_callback`.
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import decoding, grpo
from core.data import batching, tokenizers
from core.data import video_r1 as vr
from core.nn import vlm as vlm_lib
from methods.base import ConfigError, Phase, cached_per_config
from methods.marc import paper_scale as ps
from methods.marc.students import CURVES, STUDENTS, adam, record_rl_step, student_curves


@cached_per_config(maxsize=1)
def tokenizer_of(config) -> tokenizers.ByteLevelBPETokenizer:
  """The checkpoint's tokenizer.json, ending answers at `<|im_end|>`."""
  path = os.path.join(ps.checkpoint_folder(config.model.checkpoint), "tokenizer.json")
  return tokenizers.ByteLevelBPETokenizer.from_file(path, eos_token="<|im_end|>")


@cached_per_config(maxsize=1)
def splits_of(config) -> dict[str, list[vr.Record]]:
  """`{"pool", "test"}` records of `data.qa_file` under `data.data_dir`: `data.num_test` test
  questions, and an RL pool of at most `rl.pool_chunks x rl.prompts` of the others."""
  d = config.data
  records, _ = vr.read_records(os.path.join(d.data_dir, d.qa_file), d.data_dir)
  pool, test = vr.split(records, d.num_test, d.test_seed)
  return {"pool": pool[: config.rl.pool_chunks * config.rl.prompts], "test": test}


def pool_size(config) -> int:
  return len(splits_of(config)["pool"])


# ---------------------------------------------------------------------------------------------------
# Batches: the tower's tokens and the chat prompt, padded to shapes fixed by the config
# ---------------------------------------------------------------------------------------------------


def slot_counts(config, mode: str) -> tuple[int, int]:
  """`(visual tokens per row, prompt slots)` at most, from the pixel bound and the frame count."""
  c = ps.model_of(config)[0].tower.config
  factor = c.patch_size * c.spatial_merge_size
  slices = -(-config.data.num_frames // c.temporal_patch_size)
  if mode == "merge":
    slices = min(config.compress.budget, slices)
  visual = slices * (config.data.max_pixels // factor**2)
  return visual, visual + len(_prefix_ids(config)) + 2 + config.data.question_tokens


def _prefix_ids(config) -> list[int]:
  return tokenizer_of(config).encode(vr.chat_prefix())


def question_ids(config, record: vr.Record) -> list[int]:
  ids = tokenizer_of(config).encode(vr.chat_suffix(record.question))
  if len(ids) > config.data.question_tokens:
    raise ConfigError(
      f"config.data.question_tokens: {config.data.question_tokens} is too few for the question of "
      f"{record.path} ({len(ids)} tokens)"
    )
  return ids


def prompt_batch(config, records, rows, mode: str) -> dict[str, np.ndarray]:
  """Prompts `[system, user: <|vision_start|> video <|vision_end|> question, assistant:]` of
  `records[rows]` with the teacher's (`full`) or the merged (`merge`) visual tokens."""
  qvl, _ = ps.model_of(config)
  picked = [records[int(r)] for r in rows]
  paths, times = [r.path for r in picked], None
  if mode == "merge" and config.retriever.clip_checkpoint:  # the students' VMR
    retrieved = ps.encode_retrieved(config, paths, [r.question for r in picked])
    videos, times = [v for v, _ in retrieved], [t for _, t in retrieved]
  else:
    videos = ps.encode(config, paths)
  prefix = _prefix_ids(config)
  questions = [question_ids(config, r) for r in picked]
  inputs = ps.visual_input(config, videos, questions, mode, before=prefix, times=times)
  visual_slots, length = slot_counts(config, mode)
  batch = len(picked)
  tokens = np.full((batch, length), qvl.pad_id, np.int32)
  tokens[:, : inputs.tokens.shape[1]] = inputs.tokens
  rope = np.zeros((batch, 3, length), np.int32)
  rope[..., : inputs.tokens.shape[1]] = np.transpose(inputs.rope, (1, 0, 2))
  visual = np.zeros((batch, visual_slots, inputs.visual.shape[-1]), np.float32)
  flat, start = np.asarray(inputs.visual, np.float32), 0
  for row, count in enumerate(inputs.visual_counts):
    visual[row, :count] = flat[start : start + count]
    start += count
  return {
    "tokens": tokens,
    "lengths": inputs.lengths.astype(np.int32),
    "visual": visual,
    "visual_counts": inputs.visual_counts.astype(np.int32),
    "rope": rope,
    "deltas": inputs.deltas.astype(np.int32),
    "row": np.asarray(rows, np.int32),
  }


def packed_visual(visual, counts, dtype):
  """`[B, V, d]` rows of `counts [B]` tokens each -> `[B V, d]` with every row's tokens in a run
  (`vlm.qwen_embeddings` reads them in order)."""
  batch, slots, width = visual.shape
  ends = jnp.cumsum(counts)
  j = jnp.arange(batch * slots)
  row = jnp.clip(jnp.searchsorted(ends, j, side="right"), 0, batch - 1)
  offset = jnp.clip(j - (ends[row] - counts[row]), 0, slots - 1)
  return visual[row, offset].astype(dtype).reshape(batch * slots, width)


def model_args(config, batch, group: int = 1) -> tuple:
  """`(tokens, lengths, visual, rope, deltas)` for `vlm.qwen_*`, each prompt `group` times."""
  rep = functools.partial(jnp.repeat, repeats=group, axis=0)
  dtype = ps.DTYPES[config.model.dtype]
  visual = packed_visual(rep(batch["visual"]), rep(batch["visual_counts"]), dtype)
  rope = jnp.transpose(rep(batch["rope"]), (1, 0, 2))
  return rep(batch["tokens"]), rep(batch["lengths"]), visual, rope, rep(batch["deltas"])


def source(config, split: str, mode: str, batch_size: int, extra=None) -> batching.GeneratedBatches:
  """Step `s` reads rows `[s B, (s + 1) B)` of the split, wrapping around (pure in `s`)."""
  size = len(splits_of(config)[split])

  def generate(step):
    rows = (step * batch_size + np.arange(batch_size)) % size
    batch = prompt_batch(config, splits_of(config)[split], rows, mode)
    return {**batch, **(extra(rows) if extra else {})}

  return batching.GeneratedBatches(generate, batch_size)


# ---------------------------------------------------------------------------------------------------
# Rewards on the host
# ---------------------------------------------------------------------------------------------------


def host_rewards(config, split: str, tokens, lengths, rows, group: int):
  """`(accuracy, format)` `[B G]` float32 of the decoded completions against `split`'s records."""
  tokenizer, records = tokenizer_of(config), splits_of(config)[split]

  def score(tokens, lengths, rows):
    accuracy = np.zeros(len(tokens), np.float32)
    formed = np.zeros(len(tokens), np.float32)
    for i, (ids, n) in enumerate(zip(tokens, lengths, strict=True)):
      text = tokenizer.decode(ids[:n])
      record = records[int(rows[i // group])]
      accuracy[i] = vr.accuracy_reward(text, record.solution, record.problem_type)
      formed[i] = vr.format_reward(text)
    return accuracy, formed

  shape = jax.ShapeDtypeStruct((tokens.shape[0],), jnp.float32)
  return jax.pure_callback(score, (shape, shape), tokens, lengths, rows)


def generate(config, decoder, batch, rng, *, group, temperature, max_new_tokens):
  qvl, _ = ps.model_of(config)
  return vlm_lib.qwen_generate(
    qvl,
    {"decoder": decoder},
    *model_args(config, batch, group),
    rng,
    max_new_tokens=max_new_tokens,
    sampling=decoding.Sampling(temperature=temperature),
  )


# ---------------------------------------------------------------------------------------------------
# Teacher answers (a_full)
# ---------------------------------------------------------------------------------------------------


def answers_init(config, rng, inputs):
  del rng
  return {"params": inputs["qwen"], "a_full": jnp.zeros((pool_size(config),), jnp.float32)}


def answers_step(config, state, batch, rng):
  g, r = config.rl.teacher_rollouts, config.rl
  gen = generate(
    config, state["params"], batch, rng, group=g, temperature=r.temperature,
    max_new_tokens=r.max_new_tokens,
  )  # fmt: skip
  accuracy, _ = host_rewards(config, "pool", gen.tokens, gen.lengths, batch["row"], g)
  a_full = jnp.mean(accuracy.reshape(-1, g), -1)
  state = {**state, "a_full": state["a_full"].at[batch["row"]].set(a_full)}
  return state, {"loss": 1.0 - jnp.mean(a_full), "a_full": jnp.mean(a_full)}


# ---------------------------------------------------------------------------------------------------
# Students
# ---------------------------------------------------------------------------------------------------


def optimizer(config, objective: str):
  section = config.sft if objective == "sft" else config.rl
  return adam(section.learning_rate, section.steps)


def student_init(config, student, rng, inputs):
  del rng
  decoder = inputs["qwen"]
  state = {"params": decoder, "opt_state": optimizer(config, student.objective).init(decoder)}
  if student.objective == "grpo":
    state["ref"] = jax.tree.map(jnp.copy, decoder)
    state["step"] = jnp.zeros((), jnp.int32)
    state["curves"] = jnp.zeros((config.rl.steps, len(CURVES)), jnp.float32)
  return state


def _apply(config, objective, state, grads):
  updates, opt_state = optimizer(config, objective).update(
    grads, state["opt_state"], state["params"]
  )
  return {**state, "params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}


def sft_targets(config, rows) -> dict[str, np.ndarray]:
  """The record's `process` (if any) and `solution`, then `<|im_end|>`, right-padded."""
  tokenizer, records = tokenizer_of(config), splits_of(config)["pool"]
  size = config.sft.max_tokens
  target = np.full((len(rows), size), tokenizer.pad_id, np.int32)
  lengths = np.zeros((len(rows),), np.int32)
  for i, row in enumerate(rows):
    record = records[int(row)]
    ids = tokenizer.encode(record.process + record.solution)[: size - 1] + [tokenizer.eos_id]
    target[i, : len(ids)], lengths[i] = ids, len(ids)
  return {"target": target, "target_length": lengths}


def sft_step(config, student, state, batch, rng):
  """Cross-entropy of the target completion on the merged input."""
  del rng
  qvl, _ = ps.model_of(config)
  args = model_args(config, batch)
  mask = jnp.arange(batch["target"].shape[1])[None] < batch["target_length"][:, None]

  def loss_fn(decoder):
    log_probs = vlm_lib.qwen_completion_log_probs(qvl, {"decoder": decoder}, *args, batch["target"])
    return -jnp.sum(log_probs * mask) / jnp.maximum(jnp.sum(mask), 1)

  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  return _apply(config, "sft", state, grads), {"loss": loss}


def grpo_step(config, student, state, batch, rng):
  """C-GRPO (vanilla GRPO at alpha = 0) on the merged input: `rl.group` rollouts per prompt,
  Video-R1's accuracy and format rewards plus alpha max(0, eta - tau) for correct rollouts, group
  advantages, the clipped loss with the k3 KL to the initial student (paper Sec. 3.3)."""
  qvl, _ = ps.model_of(config)
  r = config.rl
  gen = generate(
    config, state["params"], batch, rng, group=r.group, temperature=r.temperature,
    max_new_tokens=r.max_new_tokens,
  )  # fmt: skip
  accuracy, formed = host_rewards(config, "pool", gen.tokens, gen.lengths, batch["row"], r.group)
  rewards = grpo.c_grpo_rewards(
    accuracy.reshape(-1, r.group) > 0.5,
    formed.reshape(-1, r.group) > 0.5,
    batch["a_full"],
    alpha=r.alpha if student.alpha is None else student.alpha,
    tau=r.tau if student.tau is None else student.tau,
    format_weight=r.format_weight,
  )
  advantages = grpo.group_advantages(rewards.total).reshape(-1)
  mask = jnp.arange(gen.tokens.shape[1])[None] < gen.lengths[:, None]
  args = model_args(config, batch, r.group)

  def score(decoder):
    return vlm_lib.qwen_completion_log_probs(qvl, {"decoder": decoder}, *args, gen.tokens)

  ref = jax.lax.stop_gradient(score(state["ref"]))

  def loss_fn(decoder):
    return grpo.grpo_loss(
      score(decoder), gen.log_probs, ref, advantages, mask, clip=r.clip, beta=r.beta
    )

  (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  state = _apply(config, "grpo", state, grads)
  return record_rl_step(state, grpo.step_metrics(loss, rewards, stats))


def student_phase(config, name: str) -> Phase:
  student = STUDENTS[name]
  if student.objective == "sft":
    steps, step = config.sft.steps, sft_step

    def data(inputs):
      extra = functools.partial(sft_targets, config)
      return source(config, "pool", "merge", config.sft.batch_size, extra)
  else:
    steps, step = config.rl.steps, grpo_step

    def data(inputs):
      a_full = np.asarray(inputs["teacher_answers"]["a_full"], np.float32)
      return source(
        config, "pool", "merge", config.rl.prompts, lambda rows: {"a_full": a_full[rows]}
      )

  return Phase(
    name=name,
    num_steps=steps,
    init=functools.partial(student_init, config, student),
    step=functools.partial(step, config, student),
    data=data,
    evaluate=lambda state, rng, inputs: student_curves(name, state),
    outputs=lambda state, inputs: state["params"],
  )


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------


@cached_per_config(maxsize=2)
def _greedy_fn(config, mode: str):
  def run(decoder, batch):
    gen = generate(
      config, decoder, batch, jax.random.key(0), group=1, temperature=0.0,
      max_new_tokens=config.rl.max_new_tokens,
    )  # fmt: skip
    return gen.tokens, gen.lengths

  return jax.jit(run)


def _answer_arm(config, decoder, mode: str) -> tuple[float, float, float]:
  """`(accuracy, mean visual tokens, seconds of one greedy call on the first chunk)` on the test
  split; the call is timed `eval.latency_repeats` times after compilation (the median)."""
  records, chunk = splits_of(config)["test"], config.eval.chunk
  tokenizer, fn = tokenizer_of(config), _greedy_fn(config, mode)
  correct, tokens, first = [], [], None
  for start in range(0, len(records), chunk):
    rows = np.arange(start, min(start + chunk, len(records)))
    batch = prompt_batch(config, records, rows, mode)
    first = batch if first is None else first
    ids, lengths = jax.device_get(fn(decoder, batch))
    for i, row in enumerate(rows):
      record = records[int(row)]
      text = tokenizer.decode(ids[i, : int(lengths[i])])
      correct.append(vr.accuracy_reward(text, record.solution, record.problem_type))
    tokens.extend(batch["visual_counts"].tolist())
  seconds = []
  for _ in range(config.eval.latency_repeats):
    began = time.perf_counter()
    jax.block_until_ready(fn(decoder, first))
    seconds.append(time.perf_counter() - began)
  return float(np.mean(correct)), float(np.mean(tokens)), float(np.median(seconds))


def evaluate(config, inputs) -> dict[str, float]:
  results = {}
  acc, full_tokens, full_seconds = _answer_arm(config, inputs["qwen"], "full")
  results.update(accuracy_teacher_full=acc, visual_tokens_teacher_full=full_tokens)
  for name in config.students:
    acc, tokens, seconds = _answer_arm(config, inputs[name], "merge")
    results.update({f"accuracy_{name}": acc, f"visual_tokens_{name}": tokens})
    results[f"latency_ratio_{name}"] = seconds / full_seconds
  main = "marc" if "marc" in config.students else config.students[-1]
  results["accuracy"] = results[f"accuracy_{main}"]
  results["teacher_accuracy"] = results["accuracy_teacher_full"]
  results["token_ratio"] = results[f"visual_tokens_{main}"] / full_tokens
  results["latency_ratio"] = results[f"latency_ratio_{main}"]
  return results


def phases(config) -> list[Phase]:
  qwen = Phase(
    name="qwen",
    num_steps=0,
    init=lambda rng, inputs: {"seed": jnp.zeros((), jnp.int32)},
    outputs=lambda state, inputs: ps.model_of(config)[1]["decoder"],
  )
  answers = Phase(
    name="teacher_answers",
    num_steps=-(-pool_size(config) // config.rl.prompts),
    init=functools.partial(answers_init, config),
    step=functools.partial(answers_step, config),
    data=lambda inputs: source(config, "pool", "full", config.rl.prompts),
    outputs=lambda state, inputs: {"a_full": state["a_full"]},
  )
  students = [student_phase(config, name) for name in config.students]
  needs_pool = any(STUDENTS[name].objective == "grpo" for name in config.students)
  final = Phase(
    name="evaluate",
    num_steps=0,
    init=lambda rng, inputs: {"seed": jnp.zeros((), jnp.int32)},
    evaluate=lambda state, rng, inputs: evaluate(config, inputs),
  )
  return [qwen] + ([answers] if needs_pool else []) + students + [final]
