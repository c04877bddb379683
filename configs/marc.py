r"""MARC: "MARC: Memory-Augmented RL Token Compression for Efficient Video Understanding" (Wu, Yu, Liu,
Wu, Zhou, Shen; ICLR 2026, arXiv 2510.07915; official code github.com/Gimlettt/MARC).

Claim: retrieve-then-compress (a visual memory retriever keeps the question's event clips, a two-stage
similarity merge squeezes them to about one frame of visual tokens) plus RL distillation from the
full-input teacher (C-GRPO: accuracy and format rewards, and a compression reward alpha max(0, eta -
tau) for correct rollouts, eta the student's accuracy over the teacher's) keeps a video LLM near its
full-input accuracy at ~5% of the visual tokens, ahead of SFT on the compressed input and of GRPO
without the compression reward; global (counting, long-video) questions lose most.

Phases: `retriever` (InfoNCE dual encoder), `teacher` (SFT on all 32 frames), `teacher_answers`
(the teacher's full-input rollouts on the RL pool: a_full), one phase per student of
`config.students` (each starts from the teacher), `evaluate` (every arm on the same test questions).

Variants:
  default  EventWorld videos of 16 frames; a 3-block width-64 VLM; the teacher, the retriever and
           the MARC student (VMR + merge to 2 frames = 8 of 64 tokens, C-GRPO); a few minutes on
           2 CPU cores.
  study    the same with the teacher trained longer (3000 steps) and every student: SFT, vanilla
           GRPO, C-GRPO without VMR, MARC at tau 0.4 / 0.6 / 0.8 and rewarded against the
           teacher's answers; zero-shot and diagnostic arms (teacher on full, retrieved, true-event,
           merged, uniformly subsampled input; the top-k sweep); ~25 minutes per seed on 2 cores.
  gpu      the paper's scale (Qwen2.5-VL-3B teacher and student, 64 frames, Video-R1 data, G = 8):
           names its weights (`model.checkpoint`: config.json, *.safetensors, tokenizer.json) and
           data (`data.data_dir` holding `data.qa_file` and the videos it names). Phases
           (methods/marc/paper_phases.py): `qwen` (reads the checkpoint), `teacher_answers`
           (a_full on the RL pool), the students `sft`, `grpo`, `marc` (C-GRPO) and `evaluate` on
           held-out Video-R1 questions. Video entries of multiple-choice and numerical type only
           (core/data/video_r1.py). The students get the two-stage merge down to
           `compress.budget` temporal patches: of the Visual Memory Retriever's `retriever.top_k`
           clips when `retriever.clip_checkpoint` names a CLIP folder (cuts on CLIP frame
           embeddings, methods/marc/paper_vmr.py), of the whole video when it is "" (the default;
           the `cgrpo_novmr` arm of the study).

  python experiments/train.py --config=configs/marc.py --workdir=runs/marc
  python experiments/study.py --config=configs/marc.py:study --workdir=runs/marc_study
"""

import ml_collections

from configs import common

VARIANTS = ("default", "study", "gpu")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "marc"
  config.variant = variant
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.data_dir = ""  # gpu: a prepared Video-R1-260K subset (videos + QA json)
  config.data.qa_file = "Video-R1-260k.json"  # gpu: the QA json inside data_dir
  config.data.question_tokens = 384  # gpu: prompt tokens after the video (question + template)
  config.data.num_frames = 16  # F, frames per video (the teacher's full input: 64 visual tokens)
  config.data.min_events = 3
  config.data.max_events = 5
  config.data.question_len = 10  # word slots of a question
  config.data.num_test = 300  # test questions
  # the test set's generator seed; the training streams (retriever, teacher, sft, RL pool) come from
  # one split of `seed`'s key in another domain (methods/marc/inputs.py: stream_seeds)
  config.data.test_seed = 1001
  # count answers uniform over 0..num_events (else mostly "one"; core/data/eventworld.py)
  config.data.balanced_counts = True
  # gpu: per-frame pixel bounds of the Qwen2.5-VL resize (qwen-vl-utils' VIDEO_MIN/MAX_PIXELS)
  config.data.min_pixels = 128 * 28 * 28
  config.data.max_pixels = 768 * 28 * 28

  config.model = ml_collections.ConfigDict()
  # gpu: the Qwen2.5-VL-3B-Instruct folder (config.json + *.safetensors); its config sets the
  # widths, and the tiny VLM's fields below are unused then
  config.model.checkpoint = ""
  config.model.dtype = "float32"  # of the checkpoint's parameters and compute: float32 / bfloat16
  config.model.width = 64  # d, visual tokens and decoder
  config.model.depth = 3
  config.model.num_heads = 4
  config.model.patch = 4  # px; 4 x 4 patches pooled 2 x 2 -> P = 4 tokens per frame
  config.model.pool = 2
  # prompt order: True = [question, video] (the visual tokens can attend to the question);
  # False = [video, question] as in Qwen2.5-VL's chat template
  config.model.question_first = True

  config.teacher = ml_collections.ConfigDict()
  config.teacher.steps = 600
  config.teacher.batch_size = 32
  config.teacher.learning_rate = 3e-3
  config.teacher.warmup_steps = 100
  # auxiliary per-frame background/shape/colour loss on the frame encoder (stands in for a
  # pretrained vision tower); 0 = answers only
  config.teacher.frame_loss_weight = 1.0

  config.retriever = ml_collections.ConfigDict()
  config.retriever.steps = 200
  config.retriever.batch_size = 32
  config.retriever.learning_rate = 2e-3
  config.retriever.dim = 64
  config.retriever.temperature = 0.1  # InfoNCE
  config.retriever.cut_threshold = 0.015  # cosine distance of consecutive frames that cuts an event
  config.retriever.top_k = 2  # clips kept (paper: 3 on long videos)
  # gpu: a transformers CLIPModel folder (config.json, model.safetensors, vocab.json, merges.txt;
  # e.g. openai/clip-vit-large-patch14) for the students' Visual Memory Retriever; "" = the students
  # merge the whole video
  config.retriever.clip_checkpoint = ""
  config.retriever.min_clip_frames = 4  # gpu: the shortest event clip the cuts may leave (frames)

  config.compress = ml_collections.ConfigDict()
  config.compress.budget = 2  # N_target frames (x P = 8 visual tokens, 12.5% of 64)
  config.compress.window = 4  # m, the short-term window of stage 1
  config.compress.rho = 0.25  # stage-1 keep ratio

  config.rl = ml_collections.ConfigDict()
  config.rl.prompts = 16  # queries per step
  config.rl.group = 8  # G rollouts per query
  config.rl.pool_chunks = 32  # RL pool = pool_chunks x prompts questions
  config.rl.teacher_rollouts = 8  # teacher samples per pool question (a_full)
  config.rl.steps = 60
  config.rl.learning_rate = 1e-4
  config.rl.temperature = 1.0  # rollout sampling
  config.rl.alpha = 0.3  # compression reward scale
  config.rl.tau = 0.6  # maintenance threshold
  config.rl.beta = 0.04  # KL to the initial student
  config.rl.clip = 0.2  # ratio clip
  config.rl.format_weight = 1.0
  config.rl.max_new_tokens = 512  # gpu: rollout and evaluation answer length (tokens)
  config.rl.reward_target = "ground_truth"  # or "teacher": accuracy against the teacher's answer

  config.sft = ml_collections.ConfigDict()
  config.sft.steps = 60  # same number of updates as the RL students
  config.sft.batch_size = 16
  config.sft.learning_rate = 1e-4
  config.sft.max_tokens = 512  # gpu: target completion tokens (<think> process + <answer>)

  # trained students, each a phase starting from the teacher: sft, grpo, cgrpo_novmr, marc,
  # marc_tau04, marc_tau08 (methods/marc/phases.py: STUDENTS)
  config.students = ("marc",)
  config.eval = ml_collections.ConfigDict()
  config.eval.chunk = 100  # test questions per jitted call
  config.eval.latency_batch = 32  # questions per timed call
  config.eval.latency_repeats = 5
  # the VMR diagnostic: the teacher on the top-k retrieved clips and the recall at each k (k at
  # least data.max_events keeps every frame)
  config.eval.top_k_sweep = (1, 3, 5)

  config.study = ml_collections.ConfigDict()
  config.study.seeds = (0,)  # one arm per seed (data streams, initialisation, sampling)

  config.loop = common.loop_config(log_every=50, checkpoint_every=500)
  common.add_parallelism(config)

  if variant == "study":
    config.teacher.steps = 3000  # well above the blind floor of the balanced answers
    config.rl.steps = 100
    config.sft.steps = 100
    config.data.num_test = 500
    config.students = (
      "sft",
      "grpo",
      "cgrpo_novmr",
      "marc",
      "marc_teacher",
      "marc_tau04",
      "marc_tau08",
    )
  if variant == "gpu":
    config.data.num_frames = 64  # 1 fps, at most 64
    config.data.max_events = 6
    config.data.num_test = 5000
    config.model.dtype = "bfloat16"
    config.model.width = 2048  # Qwen2.5-VL-3B
    config.model.depth = 36
    config.model.num_heads = 16
    config.retriever.top_k = 3
    config.retriever.cut_threshold = 0.15  # on CLIP image embeddings (inferred, not tuned)
    config.compress.budget = 1
    config.rl.prompts = 8
    config.rl.steps = 625  # 5K samples, one epoch
    config.rl.learning_rate = 1e-6
    config.rl.pool_chunks = 625  # the RL pool: 5K Video-R1 questions (a_full on each)
    config.sft.update(steps=625, batch_size=8, learning_rate=1e-6)  # one epoch of the same pool
    config.students = ("sft", "grpo", "marc")
    config.loop = common.loop_config(log_every=10, checkpoint_every=100)
  return config
