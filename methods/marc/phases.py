"""MARC's phases: `retriever` (InfoNCE), `teacher` (SFT on all frames), `teacher_answers` (a_full on
the RL pool), one phase per student of `config.students`, and `evaluate` (methods/marc/evaluation.py).

A student starts from the teacher's weights (as in the paper) with the frame encoder frozen, so the
merge reads the same features the teacher was trained on; its decoder and visual-token embedding
train. RL students sample `rl.group` rollouts per question on the compressed input, score them with
`core.grpo` and update, all in one jitted step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from core import grpo, token_merge
from core import video_memory as retrieval
from core.data import batching, eventworld
from core.nn import vlm as vlm_lib
from methods.base import Phase
from methods.marc import evaluation
from methods.marc import inputs as mi
from methods.marc.students import CURVES, STUDENTS, Student, adam, record_rl_step, student_curves

# ---------------------------------------------------------------------------------------------------
# Retriever
# ---------------------------------------------------------------------------------------------------


def retriever_init(config, rng, inputs):
  del inputs
  d = config.data
  frames = jnp.zeros((1, d.num_frames, eventworld.SIZE, eventworld.SIZE, 3))
  question = jnp.zeros((1, d.question_len), jnp.int32)
  params = mi.retriever_of(config).init(
    rng, question, jnp.ones((1,), jnp.int32), frames, jnp.zeros((1, d.num_frames), jnp.int32), 1
  )
  r = config.retriever
  return {"params": params, "opt_state": adam(r.learning_rate, r.steps).init(params)}


def retriever_step(config, state, batch, rng):
  """InfoNCE on (question, its relevant event clips) with every clip of the batch as candidates;
  the clips are the true events (the detector's cuts are checked separately)."""
  del rng
  r, num = config.retriever, config.data.max_events
  clip_valid = jnp.arange(num)[None] < batch["num_events"][:, None]

  def loss_fn(params):
    query, clips = mi.retriever_of(config).apply(
      params,
      batch["question"],
      batch["question_length"],
      batch["frames"],
      batch["event_of_frame"],
      num,
    )
    loss = retrieval.info_nce(query, clips, clip_valid, batch["relevant"], r.temperature)
    scores = jnp.where(clip_valid, jnp.einsum("bd,bsd->bs", query, clips), -jnp.inf)
    top1 = jnp.take_along_axis(batch["relevant"], jnp.argmax(scores, -1)[:, None], 1)[:, 0]
    return loss, top1

  (loss, top1), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  has = jnp.any(batch["relevant"], -1)
  updates, opt_state = adam(r.learning_rate, r.steps).update(grads, state["opt_state"])
  params = optax.apply_updates(state["params"], updates)
  top1_rate = jnp.sum(top1 & has) / jnp.maximum(jnp.sum(has), 1)
  return {"params": params, "opt_state": opt_state}, {"loss": loss, "retriever_top1": top1_rate}


# ---------------------------------------------------------------------------------------------------
# Teacher
# ---------------------------------------------------------------------------------------------------


def frame_probe() -> vlm_lib.FrameProbe:
  return vlm_lib.FrameProbe(tuple(eventworld.FRAME_ATTRIBUTES.values()))


def teacher_init(config, rng, inputs):
  del inputs
  d = config.data
  vlm_rng, probe_rng = jax.random.split(rng)
  params = mi.vlm_of(config).init(vlm_rng, (eventworld.SIZE, eventworld.SIZE, 3), d.question_len)
  per_frame = mi.tokens_per_frame(config)
  probe = frame_probe().init(probe_rng, jnp.zeros((1, per_frame, config.model.width)))
  trainable = {"params": params, "probe": probe}
  t = config.teacher
  opt = adam(t.learning_rate, t.steps, t.warmup_steps)
  return {**trainable, "opt_state": opt.init(trainable)}


def frame_attribute_loss(probe, features, batch) -> jax.Array:
  """Cross-entropy of each frame's background, shape and colour from its tokens."""
  losses = []
  logits = frame_probe().apply(probe, features)
  for name, head in zip(eventworld.FRAME_ATTRIBUTES, logits, strict=True):
    labels = jnp.take_along_axis(batch[f"event_{name}"], batch["event_of_frame"], 1)
    losses.append(optax.softmax_cross_entropy_with_integer_labels(head, labels).mean())
  return sum(losses) / len(losses)


def sft_loss(config, params, frames, batch):
  """Cross-entropy of the target completion `<ans> X </ans>` and the answer-word accuracy."""
  completion = mi.completion_of(batch["answer"])
  log_probs = vlm_lib.completion_log_probs(
    mi.vlm_of(config), params, frames, batch["question"], batch["question_length"], completion
  )
  return -jnp.mean(log_probs), jnp.mean(log_probs[:, 1] > jnp.log(0.5))


def teacher_step(config, state, batch, rng):
  """SFT on all frames, plus `teacher.frame_loss_weight` x the frame-attribute loss on the frame
  encoder's tokens; the encoder trains with the decoder."""
  del rng
  t = config.teacher

  def loss_fn(trainable):
    params = trainable["params"]
    features = mi.vlm_of(config).encode(params, batch["frames"])
    batch_size, num = features.shape[:2]
    times = jnp.broadcast_to(jnp.arange(num, dtype=jnp.float32), (batch_size, num))
    frames = token_merge.Frames(features, times, jnp.ones((batch_size, num), bool))
    answer_loss, acc = sft_loss(config, params, frames, batch)
    frame_loss = frame_attribute_loss(trainable["probe"], features, batch)
    return answer_loss + t.frame_loss_weight * frame_loss, (answer_loss, frame_loss, acc)

  trainable = {"params": state["params"], "probe": state["probe"]}
  (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
  opt = adam(t.learning_rate, t.steps, t.warmup_steps)
  updates, opt_state = opt.update(grads, state["opt_state"])
  trainable = optax.apply_updates(trainable, updates)
  metrics = {
    "loss": loss,
    "teacher_answer_loss": aux[0],
    "teacher_frame_loss": aux[1],
    "teacher_train_accuracy": aux[2],
  }
  return {**trainable, "opt_state": opt_state}, metrics


# ---------------------------------------------------------------------------------------------------
# Teacher answers on the RL pool (a_full)
# ---------------------------------------------------------------------------------------------------


def pool_size(config) -> int:
  return config.rl.pool_chunks * config.rl.prompts


def reward_target(config, student: Student | None) -> str:
  return config.rl.reward_target if student is None or student.target is None else student.target


def pool_source(config, student: Student | None = None, inputs=None) -> batching.GeneratedBatches:
  """Step `s` reads pool chunk `s mod pool_chunks`; once the teacher's answers are known, each
  question also carries the student's `target` answer and the teacher's `a_full` against it."""
  answers = None if inputs is None else jax.tree.map(np.asarray, inputs["teacher_answers"])
  teacher_target = reward_target(config, student) == "teacher"

  def generate(step):
    chunk = dict(mi.pool_chunk(config, step % config.rl.pool_chunks))
    if answers is not None:
      rows = chunk["row"]
      a_full = answers["a_full_teacher" if teacher_target else "a_full"][rows]
      chunk["a_full"] = a_full.astype(np.float32)
      chunk["target"] = answers["answer"][rows] if teacher_target else chunk["answer"]
    return chunk

  return batching.GeneratedBatches(generate, config.rl.prompts)


def answers_init(config, rng, inputs):
  del rng
  size = pool_size(config)
  return {
    "params": inputs["teacher"],
    "a_full": jnp.zeros((size,), jnp.float32),
    "a_full_teacher": jnp.zeros((size,), jnp.float32),
    "answer": jnp.full((size,), -1, jnp.int32),
  }


def answers_step(config, state, batch, rng):
  """The teacher on all frames of each pool question: its greedy answer (`answer`, -1 when not
  well formed) and `rl.teacher_rollouts` samples, whose share of correct answers is a_full
  (`a_full_teacher`: the share agreeing with the greedy answer, for `reward_target="teacher"`)."""
  params, g = state["params"], config.rl.teacher_rollouts
  frames = mi.visual_input(config, params["encoder"], None, batch, "full")
  ids = mi.special_ids()
  greedy = mi.answer(config, params, frames, batch, rng, 0.0)
  _, formed = grpo.completion_checks(
    greedy.tokens, greedy.lengths, batch["answer"], ids["open"], ids["close"], ids["answers"]
  )
  answer = jnp.where(formed, greedy.tokens[:, 1], -1).astype(jnp.int32)
  repeated = jax.tree.map(lambda x: jnp.repeat(x, g, 0), (frames, batch))
  gen = mi.answer(config, params, repeated[0], repeated[1], rng, config.rl.temperature)

  def share_matching(target):
    correct, _ = grpo.completion_checks(
      gen.tokens, gen.lengths, jnp.repeat(target, g), ids["open"], ids["close"], ids["answers"]
    )
    return jnp.mean(correct.reshape(-1, g).astype(jnp.float32), -1)

  a_full, a_full_teacher = share_matching(batch["answer"]), share_matching(answer)
  rows = batch["row"]
  state = {
    **state,
    "a_full": state["a_full"].at[rows].set(a_full),
    "a_full_teacher": state["a_full_teacher"].at[rows].set(a_full_teacher),
    "answer": state["answer"].at[rows].set(answer),
  }
  greedy_correct = jnp.mean((answer == batch["answer"]).astype(jnp.float32))
  metrics = {"loss": 1.0 - jnp.mean(a_full), "a_full": jnp.mean(a_full)}
  return state, {**metrics, "teacher_greedy_accuracy": greedy_correct}


# ---------------------------------------------------------------------------------------------------
# Students
# ---------------------------------------------------------------------------------------------------


def student_steps(config, student: Student) -> int:
  return config.sft.steps if student.objective == "sft" else config.rl.steps


def student_optimizer(config, student: Student) -> optax.GradientTransformation:
  if student.objective == "sft":
    return adam(config.sft.learning_rate, config.sft.steps)
  return adam(config.rl.learning_rate, config.rl.steps)


def student_init(config, student: Student, rng, inputs):
  del rng
  teacher = inputs["teacher"]
  trainable = {"visual": teacher["visual"], "decoder": teacher["decoder"]}
  state = {
    "params": trainable,
    "ref": jax.tree.map(jnp.copy, trainable),
    "frozen": {"encoder": teacher["encoder"], "retriever": inputs["retriever"]},
    "opt_state": student_optimizer(config, student).init(trainable),
  }
  if student.objective == "grpo":
    state["step"] = jnp.zeros((), jnp.int32)
    state["curves"] = jnp.zeros((config.rl.steps, len(CURVES)), jnp.float32)
  return state


def full_params(state, which: str = "params") -> dict:
  return {"encoder": state["frozen"]["encoder"], **state[which]}


def student_frames(config, student, state, batch):
  frozen = state["frozen"]
  return mi.visual_input(config, frozen["encoder"], frozen["retriever"], batch, student.mode)


def sft_student_step(config, student, state, batch, rng):
  """SFT baseline: cross-entropy to the ground-truth answer on the compressed input."""
  del rng
  frames = student_frames(config, student, state, batch)

  def loss_fn(trainable):
    return sft_loss(config, {"encoder": state["frozen"]["encoder"], **trainable}, frames, batch)

  (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  return _apply(config, student, state, grads), {"loss": loss, "sft_train_accuracy": acc}


def _apply(config, student, state, grads):
  opt = student_optimizer(config, student)
  updates, opt_state = opt.update(grads, state["opt_state"])
  params = optax.apply_updates(state["params"], updates)
  return {**state, "params": params, "opt_state": opt_state}


def rollout_rewards(config, student, gen, batch) -> grpo.Rewards:
  ids, g = mi.special_ids(), config.rl.group
  target = jnp.repeat(batch["target"], g)
  correct, formed = grpo.completion_checks(
    gen.tokens, gen.lengths, target, ids["open"], ids["close"], ids["answers"]
  )
  alpha = config.rl.alpha if student.alpha is None else student.alpha
  tau = config.rl.tau if student.tau is None else student.tau
  return grpo.c_grpo_rewards(
    correct.reshape(-1, g),
    formed.reshape(-1, g),
    batch["a_full"],
    alpha=alpha,
    tau=tau,
    format_weight=config.rl.format_weight,
  )


def grpo_student_step(config, student, state, batch, rng):
  """C-GRPO (or vanilla GRPO, alpha = 0): rollouts on the compressed input, rewards, group
  advantages and one clipped update with the KL to the initial student, in one jitted step."""
  r, vlm = config.rl, mi.vlm_of(config)
  frames = student_frames(config, student, state, batch)
  repeated = jax.tree.map(lambda x: jnp.repeat(x, r.group, 0), (frames, batch))
  frames_g, batch_g = repeated
  gen = mi.answer(config, full_params(state), frames_g, batch_g, rng, r.temperature)
  rewards = rollout_rewards(config, student, gen, batch)
  advantages = grpo.group_advantages(rewards.total).reshape(-1)
  mask = jnp.arange(gen.tokens.shape[1])[None] < gen.lengths[:, None]
  score = functools.partial(
    vlm_lib.completion_log_probs,
    vlm,
    frames=frames_g,
    question=batch_g["question"],
    question_length=batch_g["question_length"],
    completion=gen.tokens,
  )
  ref = jax.lax.stop_gradient(score(full_params(state, "ref")))

  def loss_fn(trainable):
    log_probs = score({"encoder": state["frozen"]["encoder"], **trainable})
    return grpo.grpo_loss(log_probs, gen.log_probs, ref, advantages, mask, clip=r.clip, beta=r.beta)

  (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  state = _apply(config, student, state, grads)
  return record_rl_step(state, grpo.step_metrics(loss, rewards, stats))


def student_phase(config, name: str) -> Phase:
  student = STUDENTS[name]
  if student.objective == "sft":
    step, data = sft_student_step, lambda inputs: mi.stream(config, "sft", config.sft.batch_size)
  else:
    step, data = grpo_student_step, functools.partial(pool_source, config, student)
  return Phase(
    name=name,
    num_steps=student_steps(config, student),
    init=functools.partial(student_init, config, student),
    step=functools.partial(step, config, student),
    data=data,
    evaluate=lambda state, rng, inputs: student_curves(name, state),
    outputs=lambda state, inputs: state["params"],
  )


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  if config.variant == "gpu" or config.model.checkpoint or config.data.data_dir:
    from methods.marc import paper_phases

    return paper_phases.phases(config)
  retriever = Phase(
    name="retriever",
    num_steps=config.retriever.steps,
    init=functools.partial(retriever_init, config),
    step=functools.partial(retriever_step, config),
    data=lambda inputs: mi.stream(config, "retriever", config.retriever.batch_size),
    outputs=lambda state, inputs: state["params"],
  )
  teacher = Phase(
    name="teacher",
    num_steps=config.teacher.steps,
    init=functools.partial(teacher_init, config),
    step=functools.partial(teacher_step, config),
    data=lambda inputs: mi.stream(config, "teacher", config.teacher.batch_size),
    outputs=lambda state, inputs: state["params"],
  )
  answers = Phase(
    name="teacher_answers",
    num_steps=config.rl.pool_chunks,
    init=functools.partial(answers_init, config),
    step=functools.partial(answers_step, config),
    data=lambda inputs: pool_source(config),
    outputs=lambda state, inputs: {k: state[k] for k in ("a_full", "a_full_teacher", "answer")},
  )
  students = [student_phase(config, name) for name in config.students]
  needs_pool = any(STUDENTS[name].objective == "grpo" for name in config.students)
  final = Phase(
    name="evaluate",
    num_steps=0,
    init=lambda rng, inputs: {"seed": jnp.zeros((), jnp.int32)},
    evaluate=lambda state, rng, inputs: evaluation.evaluate(config, inputs, rng),
  )
  return [retriever, teacher] + ([answers] if needs_pool else []) + students + [final]
