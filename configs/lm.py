r"""A causal language model on the shared transformer core: the demo of `core/nn/transformer.py`,
`core/decoding.py`, `core/data/tokenizers.py` and `core/data/text.py`.

Claim checked: a small pre-norm RoPE transformer trained on multi-source Markov text gets close to the
corpus's best possible perplexity, which is known exactly (`core/data/text.py`), and samples from it
with the KV-cached decoder look like the chains (their per-token likelihood under the true mixture
matches the entropy rate).

Variants:
  default  3 Markov sources over 32 symbols (entropy rates 0.3/0.5/0.7 of log 32), sequences of 64,
           width 64, 2 blocks; about two minutes on 2 CPU cores.
  gpu      character-level tfds `tiny_shakespeare` read from a prepared --config.data.data_dir
           (array_record, never downloaded), width 384, 6 blocks, sequences of 256, bfloat16
           compute, one GPU.

  python experiments/train.py --config=configs/lm.py
  python experiments/train.py --config=configs/lm.py:gpu --config.data.data_dir=/data/tfds
"""

import ml_collections

from configs import common

VARIANTS = ("default", "gpu")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = common.parse_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.method = "lm"
  config.variant = variant
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.name = "markov"  # "markov" (generated) or a tfds text dataset with a "text" feature
  config.data.seq_len = 64  # tokens predicted per sequence (the model reads seq_len tokens)
  config.data.vocab_size = 32  # markov: chain symbols (the tokenizer adds 5 special tokens)
  config.data.entropy_fractions = (0.3, 0.5, 0.7)  # markov: one source per entry, H_s / log V
  config.data.source_weights = ()  # markov: mixture weights of the sources; () = uniform
  config.data.source_seed = 0  # markov: seed of the transition matrices
  config.data.data_dir = ""  # tfds: data_dir of the prepared dataset (never downloaded)
  config.data.train_split = "train"  # tfds
  config.data.eval_split = "validation"  # tfds
  config.data.max_chars = 0  # tfds: characters read per split, 0 = all

  config.model = ml_collections.ConfigDict()
  config.model.width = 64
  config.model.depth = 2
  config.model.num_heads = 4
  config.model.num_kv_heads = 0  # grouped-query attention; 0 = num_heads
  config.model.mlp = "swiglu"  # "swiglu" | "gelu"
  config.model.mlp_hidden = 0  # 0 = 8D/3 (SwiGLU) or 4D (GELU)
  config.model.tie_embeddings = True
  config.model.max_len = 128  # longest sequence (training, prompt + samples): the KV cache size
  config.model.dtype = "float32"  # compute dtype: "float32" | "bfloat16"; parameters in float32
  config.model.attention = ""  # attention implementation; "" = by backend (core/nn/attention.py)
  config.model.remat = False  # recompute block activations in the backward pass

  config.batch_size = 32
  config.steps = 1200
  config.optim = ml_collections.ConfigDict()
  config.optim.learning_rate = 3e-3
  config.optim.warmup_steps = 100
  config.optim.weight_decay = 0.01
  config.optim.grad_clip = 1.0

  config.eval = ml_collections.ConfigDict()
  config.eval.batch_size = 64  # validation sequences per batch
  config.eval.num_batches = 8  # validation batches (a fixed set, drawn from the validation split)
  config.eval.num_samples = 8  # sequences sampled with the KV-cached decoder
  config.eval.prompt_length = 1  # tokens of a validation sequence that prompt each sample
  config.eval.sample_length = 48  # tokens generated per sample
  config.eval.temperature = 1.0  # 0 = greedy
  config.eval.top_k = 0  # 0 = off
  config.eval.top_p = 1.0  # 1 = off

  config.loop = common.loop_config(log_every=100, checkpoint_every=400)
  common.add_parallelism(config)

  if variant == "gpu":
    config.data.name = "tiny_shakespeare"
    config.data.seq_len = 256
    config.model.width = 384
    config.model.depth = 6
    config.model.num_heads = 6
    config.model.max_len = 512
    config.model.dtype = "bfloat16"
    config.batch_size = 64
    config.steps = 5000
    config.optim.learning_rate = 1e-3
    config.optim.warmup_steps = 200
    config.eval.batch_size = 32
    config.eval.num_batches = 16
    config.eval.prompt_length = 32
    config.eval.sample_length = 256
    config.eval.temperature = 0.8
    config.eval.top_p = 0.95
    config.loop = common.loop_config(log_every=100, checkpoint_every=1000)
  return config
