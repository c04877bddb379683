"""MARC's gpu variant on a TINY random Qwen2.5-VL checkpoint of the released layout (with a byte-level
BPE tokenizer.json in Qwen2's format) and a tiny Video-R1-format folder: the reader, the chat
prompt, Video-R1's rewards, validation, and the phases through `experiments.loop` end to end."""

import functools
import json
import math
import pathlib

import jax
import numpy as np
import pytest
import tiny_qwen

from configs import marc as marc_config
from core.data import tokenizers
from core.data import video_r1 as vr
from experiments import loop
from methods.base import ConfigError

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>")
SPECIAL += ("<|video_pad|>", "<|image_pad|>")
QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
  r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
MERGES = (("Ġ", "t"), ("h", "e"), ("<", "answer"[0]))


def tokenizer_payload() -> dict:
  """Qwen2's tokenizer.json layout (NFC, regex Split + ByteLevel, BPE, added specials), tiny."""
  symbols = list(tokenizers.bytes_to_unicode().values())
  vocab = {s: i for i, s in enumerate(symbols)}
  for a, b in MERGES:
    vocab[a + b] = len(vocab)
  added = [
    {"id": len(vocab) + i, "content": c, "special": True, "single_word": False}
    | {"lstrip": False, "rstrip": False, "normalized": False}
    for i, c in enumerate(SPECIAL)
  ]
  byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}
  byte_level["use_regex"] = False
  return {
    "added_tokens": added,
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {
      "type": "Sequence",
      "pretokenizers": [
        {
          "type": "Split",
          "pattern": {"Regex": QWEN2_SPLIT},
          "behavior": "Isolated",
          "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
      ],
    },
    "post_processor": byte_level,
    "decoder": byte_level,
    "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in MERGES]},
  }


def write_checkpoint(folder):
  """config.json, model.safetensors (random, the released key names) and tokenizer.json."""
  payload = tokenizer_payload()
  ids = {t["content"]: t["id"] for t in payload["added_tokens"]}
  tiny_qwen.write_checkpoint(folder, tiny_qwen.config(ids))
  (folder / "tokenizer.json").write_text(json.dumps(payload))


def qa_entries() -> list[dict]:
  mc = {
    "problem_type": "multiple choice",
    "problem": "What moves first? ",
    "options": ["A. a cat", "B. a dog"],
    "data_type": "video",
  }
  return [
    {**mc, "path": "./videos/a.mp4", "solution": "<answer>A</answer>"},
    {
      **mc,
      "path": "./videos/b.mp4",
      "solution": "<answer>B</answer>",
      "process": "<think>x</think>",
    },
    {**mc, "path": "./videos/a.mp4", "solution": "<answer>B</answer>"},
    {**mc, "path": "./videos/b.mp4", "solution": "<answer>A</answer>"},
    {
      "problem_type": "numerical",
      "problem": "How many?",
      "data_type": "video",
      "path": "./videos/a.mp4",
      "solution": "<answer>3</answer>",
    },
    {**mc, "data_type": "image", "path": "./images/c.jpg", "solution": "<answer>A</answer>"},
    {
      "problem_type": "OCR",
      "problem": "Read it.",
      "data_type": "video",
      "path": "./videos/a.mp4",
      "solution": "<answer>hi</answer>",
    },
  ]


def write_video_r1(folder, videos: bool = True):
  (folder / "videos").mkdir(parents=True, exist_ok=True)
  (folder / "Video-R1-260k.json").write_text(json.dumps(qa_entries()))
  if videos:
    tiny_qwen.write_video(folder / "videos" / "a.mp4", seed=1)
    tiny_qwen.write_video(folder / "videos" / "b.mp4", seed=2)


def tiny_config(checkpoint, data_dir):
  config = marc_config.get_config("gpu")
  config.model.checkpoint = str(checkpoint)
  config.model.dtype = "float32"
  config.data.data_dir = str(data_dir)
  config.data.update(num_frames=4, min_pixels=28 * 28, max_pixels=56 * 84, num_test=2)
  config.data.question_tokens = 700
  config.compress.budget = 1
  config.rl.update(prompts=2, group=2, teacher_rollouts=2, steps=2, max_new_tokens=4)
  config.sft.update(steps=2, batch_size=2, max_tokens=8)
  config.eval.chunk = 2
  config.students = ("sft", "marc")
  config.loop.update(log_every=1, checkpoint_every=1)
  return config


# ---------------------------------------------------------------------------------------------------


def test_reader_keeps_video_entries_of_exact_match_types_and_splits_purely(tmp_path):
  write_video_r1(tmp_path, videos=False)
  records, skipped = vr.read_records(str(tmp_path / "Video-R1-260k.json"))
  assert len(records) == 5 and skipped == {"image": 1, "other_type": 1}
  assert records[0].path == str(tmp_path / "videos" / "a.mp4")
  assert "What moves first? Options:\nA. a cat\nB. a dog\n" in records[0].question
  assert records[0].question.endswith(
    "(e.g., A, B, C, D, etc.) within the <answer> </answer> tags."
  )
  assert records[1].process == "<think>x</think>"
  pool, test = vr.split(records, 2, seed=7)
  assert (pool, test) == vr.split(records, 2, seed=7)
  assert sorted(r.solution for r in pool + test) == sorted(r.solution for r in records)
  assert vr.missing_videos(records) == sorted({r.path for r in records})


def test_video_r1_rewards():
  good = "<think>hmm</think>\n<answer> B </answer>"
  assert vr.format_reward(good) == 1.0 and vr.format_reward("<answer>B</answer>") == 0.0
  assert vr.accuracy_reward(good, "<answer>B</answer>", "multiple choice") == 1.0
  assert vr.accuracy_reward(good, "<answer>A</answer>", "multiple choice") == 0.0
  assert vr.accuracy_reward("<answer>3.001</answer>", "<answer>3.0</answer>", "numerical") == 1.0
  assert vr.accuracy_reward("<answer>1,000</answer>", "<answer>1000</answer>", "numerical") == 0.0
  assert vr.accuracy_reward("<answer>3</answer>", "<answer>3.5</answer>", "numerical") == 0.0
  assert vr.accuracy_reward("no tags", "<answer>3</answer>", "numerical") == 0.0


def test_qwen2_format_tokenizer_round_trips_the_chat_prompt():
  tok = tokenizers.ByteLevelBPETokenizer(tokenizer_payload(), eos_token="<|im_end|>")
  text = vr.chat_prefix() + "<|vision_start|><|video_pad|><|vision_end|>" + vr.chat_suffix("the Q?")
  ids = tok.encode(text)
  assert tok.decode(ids, skip_special=False, stop_at_eos=False) == text
  assert ids[0] == tok.token_id("<|im_start|>")
  assert ids.count(tok.token_id("<|video_pad|>")) == 1
  assert tok.encode(" the") == [tok.vocab["Ġt"], tok.vocab["he"]]  # merges apply inside words


def test_rewards_inside_a_jitted_step_decode_and_score_each_rollout(tmp_path):
  from methods.marc import paper_phases

  write_checkpoint(tmp_path)
  write_video_r1(tmp_path, videos=False)
  config = tiny_config(tmp_path, tmp_path)
  tok, pool = paper_phases.tokenizer_of(config), paper_phases.splits_of(config)["pool"]
  truth = vr.extract_answer(pool[0].solution)
  wrong = "B" if truth == "A" else "A"
  texts = [f"<think>a</think> <answer>{truth}</answer>", f"<answer>{truth}</answer>"]
  texts += [f"<think>a</think><answer>{wrong}</answer>", "<answer>"]
  ids, lengths = tok.encode_batch([t + "<|im_end|>" for t in texts], 40)
  rows = np.array([0, 0], np.int32)  # two prompts (pool row 0), two rollouts each
  score = jax.jit(lambda t, n, r: paper_phases.host_rewards(config, "pool", t, n, r, 2))
  accuracy, formed = score(ids, lengths, rows)
  np.testing.assert_array_equal(accuracy, [1, 1, 0, 0])
  np.testing.assert_array_equal(formed, [1, 0, 1, 0])


def test_gpu_validation_names_missing_json_and_videos(tmp_path):
  checkpoint, data = tmp_path / "qwen", tmp_path / "data"
  checkpoint.mkdir()
  write_checkpoint(checkpoint)
  data.mkdir()
  config = tiny_config(checkpoint, data)
  with pytest.raises(ConfigError, match="^config.data.qa_file: .*Video-R1-260k.json is missing"):
    loop.validate(config, data_devices=1)
  write_video_r1(data, videos=False)
  with pytest.raises(ConfigError, match="^config.data.data_dir: 2 video files .* are missing"):
    loop.validate(config, data_devices=1)
  config.data.num_test = 5
  with pytest.raises(ConfigError, match="^config.data.num_test: 5 must be below the 5 usable"):
    loop.validate(config, data_devices=1)
  hf_config = json.loads((checkpoint / "config.json").read_text())
  hf_config["eos_token_id"] = 3  # a tokenizer.json of another checkpoint
  (checkpoint / "config.json").write_text(json.dumps(hf_config))
  with pytest.raises(ConfigError, match="^config.model.checkpoint: .* gives <\\|im_end\\|> id"):
    loop.validate(config, data_devices=1)


@pytest.mark.slow
def test_gpu_variant_runs_every_phase_end_to_end_and_resumes(tmp_path):
  checkpoint, data = tmp_path / "qwen", tmp_path / "data"
  checkpoint.mkdir()
  write_checkpoint(checkpoint)
  write_video_r1(data)
  config = tiny_config(checkpoint, data)
  loop.validate(config, data_devices=1)
  one = jax.devices()[:1]  # the pool holds 3 questions: 2 prompts a step
  summary = loop.run(config, str(tmp_path / "run"), devices=one)
  results = summary.results
  for key in ("accuracy", "teacher_accuracy", "token_ratio", "latency_ratio"):
    assert math.isfinite(results[key]), key
  # full: 2 temporal patches of 6 merged tokens; the student keeps compress.budget = 1 of them
  assert results["token_ratio"] == pytest.approx(0.5)
  assert len(results["marc_reward_curve"]) == config.rl.steps
  traced = {name: n for name, n in summary.step_traces.items() if name not in ("qwen", "evaluate")}
  assert traced == {"teacher_answers": 1, "sft": 1, "marc": 1}, traced
  again = loop.run(
    tiny_config(checkpoint, data), str(tmp_path / "run"), devices=one
  )  # restored, not retrained
  assert again.results["accuracy_marc"] == results["accuracy_marc"]
  assert all(count == 0 for count in again.step_traces.values())


@pytest.mark.slow
def test_student_steps_update_the_decoder_on_merged_batches(tmp_path):
  from methods.marc import paper_phases
  from methods.marc.students import STUDENTS

  write_checkpoint(tmp_path)
  write_video_r1(tmp_path)
  config = tiny_config(tmp_path, tmp_path)
  config.rl.update(learning_rate=1e-3, beta=0.5)
  decoder = paper_phases.ps.model_of(config)[1]["decoder"]
  extra = functools.partial(paper_phases.sft_targets, config)
  batch = paper_phases.source(config, "pool", "merge", 2, extra).batch(0)
  assert batch["visual"].shape == (2, 6, 32) and list(batch["visual_counts"]) == [6, 6]
  batch["a_full"] = np.array([1.0, 0.5], np.float32)
  for name, step in (("sft", paper_phases.sft_step), ("marc", paper_phases.grpo_step)):
    state = paper_phases.student_init(config, STUDENTS[name], None, {"qwen": decoder})
    if "ref" in state:  # a reference away from the policy: the KL term alone gives a gradient
      state["ref"] = jax.tree.map(lambda x: x * 1.05, state["ref"])
    new, metrics = jax.jit(functools.partial(step, config, STUDENTS[name]))(
      state, batch, jax.random.key(0)
    )
    assert all(bool(np.isfinite(v)) for v in jax.tree.leaves(metrics)), name
    moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), new["params"], decoder)
    assert max(jax.tree.leaves(moved)) > 0, name


def write_clip_checkpoint(folder):
  """A tiny random transformers `CLIPModel` folder (the layout of `fixtures/clip_vision.npz`)."""
  from safetensors.numpy import save_file

  fixtures = pathlib.Path(__file__).with_name("fixtures")
  with np.load(fixtures / "clip_vision.npz") as archive:
    state = {k.removeprefix("state_dict."): archive[k] for k in archive.files if "state_dict." in k}
    (folder / "config.json").write_text(str(archive["config_json"]))
  with np.load(fixtures / "clip_text.npz") as archive:
    (folder / "vocab.json").write_text(str(archive["vocab_json"]), encoding="utf-8")
    (folder / "merges.txt").write_text(str(archive["merges_txt"]), encoding="utf-8")
  save_file(state, str(folder / "model.safetensors"))


def write_two_scene_video(path, size=(56, 84)):
  """8 frames: 4 of one noise image, then 4 of another (one cut, after frame 3)."""
  av = pytest.importorskip("av")
  rng = np.random.default_rng(5)
  scenes = rng.integers(0, 256, (2, *size, 3)).astype(np.uint8)
  with av.open(str(path), "w") as container:
    stream = container.add_stream("mpeg4", rate=2)
    stream.height, stream.width = size
    stream.pix_fmt = "yuv420p"
    for i in range(8):
      frame = av.VideoFrame.from_ndarray(scenes[i // 4], format="rgb24")
      for packet in stream.encode(frame):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)


@pytest.mark.slow
def test_students_encode_and_merge_only_the_retrieved_clips(tmp_path):
  from methods.marc import paper_phases, paper_vmr

  (tmp_path / "clip").mkdir()
  write_clip_checkpoint(tmp_path / "clip")
  write_checkpoint(tmp_path)
  write_video_r1(tmp_path, videos=False)
  write_two_scene_video(tmp_path / "videos" / "a.mp4")
  config = tiny_config(tmp_path, tmp_path)
  config.data.num_frames = 8  # 4 temporal patches
  config.retriever.update(clip_checkpoint=str(tmp_path / "clip"), top_k=1, min_clip_frames=2)
  config.retriever.cut_threshold = 0.01
  path, question = str(tmp_path / "videos" / "a.mp4"), vr.user_text(qa_entries()[0])
  assert paper_vmr.retrieval_text(question) == "What moves first? Options:\nA. a cat\nB. a dog"
  (whole,) = paper_phases.ps.encode(config, [path])
  ((kept, times),) = paper_phases.ps.encode_retrieved(config, [path], [question])
  assert whole.grid[0] == 4
  # one of the two scenes: its 2 temporal patches, with the tokens they have in the whole video
  assert kept.grid[0] == 2 and times.tolist() in ([0.0, 1.0], [2.0, 3.0])
  np.testing.assert_allclose(kept.tokens, whole.tokens[times.astype(int)], atol=1e-4, rtol=1e-4)
  inputs = paper_phases.ps.visual_input(config, [kept], [[5, 6]], "merge", times=[times])
  assert inputs.visual.shape[0] == 6  # compress.budget = 1 patch of 6 merged tokens
  # padded to the whole video's 4 patches with invalid ones: the 2 kept patches merge into one
  merged_tokens, merged_times = paper_phases.ps.merged(config, kept.tokens, times)
  np.testing.assert_allclose(merged_tokens[0], np.mean(kept.tokens, 0), atol=1e-5)
  assert merged_times.tolist() == [float(np.mean(times))]  # the merged patch's M-RoPE time
  records = [vr.Record(path, question, "<answer>A</answer>", "multiple choice", "")]
  batch = paper_phases.prompt_batch(config, records, [0], "merge")
  np.testing.assert_allclose(batch["visual"][0, :6], inputs.visual, atol=1e-5)
  config.retriever.clip_checkpoint = ""  # unset: the students merge the whole video
  whole_merge = paper_phases.ps.visual_input(config, [whole], [[5, 6]], "merge")
  batch = paper_phases.prompt_batch(config, records, [0], "merge")
  np.testing.assert_allclose(batch["visual"][0, :6], whole_merge.visual, atol=1e-5)
