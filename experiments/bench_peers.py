r"""The shared transformer against Hugging Face transformers (PyTorch) on the same Llama-layout model.

  pip install -e ".[peers]"
  python experiments/bench_peers.py [--width=256 --depth=4 --heads=4 --kv_heads=2 --vocab=4096]
      [--json=runs/bench_peers.json]

A `LlamaForCausalLM` with random weights (seeded; `--init_std` wide enough that greedy decoding has
no near-ties) is converted with `core.nn.hf_convert.llama_to_flax` into `core.nn.transformer`'s
parameters. Its logits must agree with ours to `--tolerance` (float32; the run stops otherwise).
Then, in one process, alternating ours / theirs per repeat, each side compiled or warmed up first:

  train     one training step (forward, backward, AdamW) on `[--train_batch, --train_len]` tokens:
            ours `jax.jit(value_and_grad + optax.adamw)` with the state donated, theirs
            `loss.backward(); torch.optim.AdamW.step()`; tokens/s.
  prefill   one forward of a `[--prefill_batch, L]` prompt that fills the KV cache
            (`core.decoding.prefill`; `model(ids, use_cache=True)`); tokens/s.
  decode    greedy generation of `--new_tokens` tokens after a prompt of L tokens at each batch size:
            `core.decoding.generate` (prefill + one `lax.while_loop` over a preallocated cache) vs
            `model.generate(do_sample=False, use_cache=True)`; new tokens/s, prefill included on both
            sides. The generated tokens must be identical.
  memory    ours: XLA's memory analysis of the compiled program (arguments + outputs + temporaries,
            less donated buffers); both: the growth of the process's resident memory during one
            call, sampled every millisecond (the only figure torch gives on a CPU).

Each time is the median of `--repeats` calls; the table gives both rates and the ratio ours/theirs
(above 1: ours is faster), measured in the same run so that the ratio does not depend on the machine.
It prints one Markdown table and writes it, with the settings and the machine, as JSON (`--json`).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import sys
import threading
import time

from absl import app, flags, logging


def define_flags() -> None:
  """The command line's flags; defined only when run as a script, so that tests can import this
  module."""
  flags.DEFINE_integer("width", 256, "Model width (hidden_size).")
  flags.DEFINE_integer("depth", 4, "Blocks (num_hidden_layers).")
  flags.DEFINE_integer("heads", 4, "Attention heads.")
  flags.DEFINE_integer("kv_heads", 2, "Key/value heads (grouped-query attention).")
  flags.DEFINE_integer("vocab", 4096, "Vocabulary size.")
  flags.DEFINE_integer("mlp_hidden", 704, "SwiGLU hidden width (intermediate_size).")
  flags.DEFINE_float("init_std", 0.1, "Std of the random weights (initializer_range).")
  flags.DEFINE_integer("train_batch", 8, "Training step: sequences.")
  flags.DEFINE_integer("train_len", 256, "Training step: tokens per sequence.")
  flags.DEFINE_list("prefill_lengths", ["128", "512", "2048"], "Prefill lengths.")
  flags.DEFINE_integer("prefill_batch", 1, "Prefill: sequences.")
  flags.DEFINE_list("prompt_lengths", ["128", "512", "2048"], "Decode prompts.")
  flags.DEFINE_list("decode_batches", ["1", "8"], "Decode batch sizes.")
  flags.DEFINE_integer("new_tokens", 64, "Greedy tokens generated per measurement.")
  flags.DEFINE_integer("repeats", 5, "Timed calls per measurement (the median counts).")
  flags.DEFINE_float("tolerance", 1e-4, "Largest allowed |logit difference| (float32).")
  flags.DEFINE_list(
    "measures", ["train", "prefill", "decode"], "Which of train, prefill, decode to time."
  )
  flags.DEFINE_string("json", "runs/bench_peers.json", "Where the table is written as JSON.")


# ---------------------------------------------------------------------------------------------------
# The two models
# ---------------------------------------------------------------------------------------------------


def hf_llama(width, depth, heads, kv_heads, vocab, mlp_hidden, init_std, max_positions, seed=0):
  """A `LlamaForCausalLM` with seeded random weights, float32, eval mode, SDPA attention."""
  import torch
  import transformers

  config = transformers.LlamaConfig(
    vocab_size=vocab,
    hidden_size=width,
    intermediate_size=mlp_hidden,
    num_hidden_layers=depth,
    num_attention_heads=heads,
    num_key_value_heads=kv_heads,
    max_position_embeddings=max_positions,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    initializer_range=init_std,
    attn_implementation="sdpa",
  )
  torch.manual_seed(seed)
  return transformers.LlamaForCausalLM(config).float().eval()


def converted(hf_model):
  """`(Transformer, params)` computing the same function as `hf_model`."""
  import jax.numpy as jnp

  from core.nn import hf_convert
  from core.nn.transformer import Transformer

  settings = hf_convert.transformer_settings(hf_model.config.to_dict())
  model = Transformer(**settings, dtype=jnp.float32)
  # copies: a CPU tensor's numpy view (and a jax array made from it) would share torch's memory,
  # which torch's optimiser updates in place
  state = {k: v.detach().cpu().numpy().copy() for k, v in hf_model.state_dict().items()}
  return model, hf_convert.llama_to_flax(state, model)


def logit_difference(model, params, hf_model, tokens) -> float:
  """max |ours - theirs| of the logits of `tokens [B, L]` (numpy int)."""
  import jax.numpy as jnp
  import numpy as np
  import torch

  from core.nn import attention

  ours = model.apply(params, jnp.asarray(tokens), mask=attention.causal_mask()).logits
  with torch.inference_mode():
    theirs = hf_model(torch.as_tensor(tokens)).logits.numpy()
  return float(np.max(np.abs(np.asarray(ours) - theirs)))


# ---------------------------------------------------------------------------------------------------
# Timing and memory
# ---------------------------------------------------------------------------------------------------


def _resident_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def resident_growth(fn) -> int:
  """Peak growth of the process's resident memory while `fn()` runs, sampled every millisecond;
  0 where /proc is not available."""
  if not os.path.exists("/proc/self/statm"):
    fn()
    return 0
  start, peak, running = _resident_bytes(), [0], [True]

  def sample():
    while running[0]:
      peak[0] = max(peak[0], _resident_bytes())
      time.sleep(1e-3)

  thread = threading.Thread(target=sample, daemon=True)
  thread.start()
  try:
    fn()
  finally:
    running[0] = False
    thread.join()
  return max(peak[0], _resident_bytes()) - start


def alternate(ours, theirs, repeats: int) -> tuple[float, float]:
  """Median seconds of `ours()` and `theirs()`, called in turn `repeats` times after a warm-up call
  of each (compilation on our side, allocator warm-up on theirs)."""
  ours(), theirs()
  ours_s, theirs_s = [], []
  for _ in range(repeats):
    for fn, times in ((ours, ours_s), (theirs, theirs_s)):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
  return statistics.median(ours_s), statistics.median(theirs_s)


def xla_bytes(compiled) -> int | None:
  """Arguments + outputs + temporaries of a compiled program, less the donated (aliased) buffers."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  return int(
    analysis.argument_size_in_bytes
    + analysis.output_size_in_bytes
    + analysis.temp_size_in_bytes
    - analysis.alias_size_in_bytes
  )


def row(measure, setting, tokens, ours_s, theirs_s, **extra) -> dict:
  return {
    "measure": measure,
    "setting": setting,
    "ours_tokens_per_s": tokens / ours_s,
    "theirs_tokens_per_s": tokens / theirs_s,
    "ratio_ours_over_theirs": theirs_s / ours_s,
    **extra,
  }


# ---------------------------------------------------------------------------------------------------
# The measures
# ---------------------------------------------------------------------------------------------------


def measure_train(model, params, hf_model, batch: int, length: int, repeats: int) -> dict:
  """One AdamW step on next-token cross-entropy, the same learning rate and betas on both sides."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  import torch

  from core.nn import attention

  tokens = np.random.default_rng(1).integers(0, model.vocab_size, (batch, length + 1))
  inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
  opt = optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)

  def loss_fn(p):
    logits = model.apply(p, inputs, mask=attention.causal_mask()).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

  def step(state):
    p, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, opt_state = opt.update(grads, opt_state, p)
    return (optax.apply_updates(p, updates), opt_state), loss

  ours_params = jax.tree.map(jnp.array, params)  # a copy: the step donates its state
  state = [(ours_params, opt.init(ours_params))]
  jitted = jax.jit(step, donate_argnums=0)
  compiled = jitted.lower(state[0]).compile()

  losses = {"ours": [], "theirs": []}

  def ours():
    state[0], loss = compiled(state[0])
    losses["ours"].append(float(loss))

  hf_model.train()
  torch_opt = torch.optim.AdamW(
    hf_model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
  )
  torch_inputs, torch_targets = torch.as_tensor(tokens[:, :-1]), torch.as_tensor(tokens[:, 1:])

  def theirs():
    logits = hf_model(torch_inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch_targets.flatten())
    loss.backward()
    torch_opt.step()
    torch_opt.zero_grad(set_to_none=True)
    losses["theirs"].append(float(loss.detach()))

  ours_s, theirs_s = alternate(ours, theirs, repeats)
  # the same model, data and optimiser: the losses of the first steps agree on both sides
  loss_gap = max(abs(a - b) for a, b in zip(losses["ours"], losses["theirs"], strict=False))
  memory = {
    "ours_xla_bytes": xla_bytes(compiled),
    "ours_rss_growth_bytes": resident_growth(ours),
    "theirs_rss_growth_bytes": resident_growth(theirs),
  }
  hf_model.eval()
  setting = f"B={batch} L={length}"
  return row("train step", setting, batch * length, ours_s, theirs_s, loss_gap=loss_gap, **memory)


def measure_prefill(model, params, hf_model, batch: int, length: int, repeats: int) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch

  from core import decoding

  tokens = np.random.default_rng(length).integers(0, model.vocab_size, (batch, length))
  lengths = jnp.full((batch,), length, jnp.int32)
  fn = jax.jit(functools.partial(decoding.prefill, model, max_len=length))
  compiled = fn.lower(params, jnp.asarray(tokens), lengths).compile()
  ours = lambda: jax.block_until_ready(compiled(params, jnp.asarray(tokens), lengths))  # noqa: E731
  torch_tokens = torch.as_tensor(tokens)

  def theirs():
    with torch.inference_mode():
      hf_model(torch_tokens, use_cache=True)

  ours_s, theirs_s = alternate(ours, theirs, repeats)
  memory = {
    "ours_xla_bytes": xla_bytes(compiled),
    "ours_rss_growth_bytes": resident_growth(ours),
    "theirs_rss_growth_bytes": resident_growth(theirs),
  }
  return row("prefill", f"B={batch} L={length}", batch * length, ours_s, theirs_s, **memory)


def measure_decode(model, params, hf_model, batch, length, new_tokens, repeats) -> dict:
  """Greedy generation of `new_tokens` after `length` prompt tokens, prefill included."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch

  from core import decoding

  tokens = np.random.default_rng(batch * 7919 + length).integers(
    0, model.vocab_size, (batch, length)
  )
  lengths = jnp.full((batch,), length, jnp.int32)
  generate = functools.partial(
    decoding.generate,
    model,
    params,
    jnp.asarray(tokens),
    lengths,
    jax.random.key(0),
    max_new_tokens=new_tokens,
    sampling=decoding.GREEDY,
  )
  ours = lambda: jax.block_until_ready(generate().tokens)  # noqa: E731
  torch_tokens = torch.as_tensor(tokens)

  def hf_generate():
    with torch.inference_mode():
      return hf_model.generate(
        torch_tokens,
        attention_mask=torch.ones_like(torch_tokens),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
        eos_token_id=None,
      )

  ours_s, theirs_s = alternate(ours, hf_generate, repeats)
  same = np.array_equal(np.asarray(generate().tokens), hf_generate()[:, length:].numpy())
  compiled = decoding._generate.lower(
    model,
    params,
    jnp.asarray(tokens),
    lengths,
    jax.random.key(0),
    None,
    max_new_tokens=new_tokens,
    max_len=length + new_tokens,
    sampling=decoding.GREEDY,
    stop_tokens=(),
    pad_id=0,
  ).compile()
  memory = {
    "ours_xla_bytes": xla_bytes(compiled),
    "ours_rss_growth_bytes": resident_growth(ours),
    "theirs_rss_growth_bytes": resident_growth(hf_generate),
  }
  setting = f"B={batch} prompt={length} new={new_tokens}"
  return row(
    "greedy decode", setting, batch * new_tokens, ours_s, theirs_s, same_tokens=bool(same), **memory
  )


# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------


def _mib(value) -> str:
  return "-" if not value else f"{value / 2**20:.1f}"


def markdown(rows, logit_diff: float) -> str:
  gaps = [f"{r['loss_gap']:.1e}" for r in rows if "loss_gap" in r]
  lines = [
    f"max |logit difference| (float32): {logit_diff:.2e}"
    + (f"; largest training-loss gap over the timed steps: {gaps[0]}" if gaps else ""),
    "",
    "| measure | setting | ours tok/s | theirs tok/s | ours/theirs | same tokens | "
    "ours XLA MiB | ours RSS+ MiB | theirs RSS+ MiB |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['measure']} | {r['setting']} | {r['ours_tokens_per_s']:.0f} | "
      f"{r['theirs_tokens_per_s']:.0f} | {r['ratio_ours_over_theirs']:.2f} | "
      f"{r.get('same_tokens', '')} | {_mib(r['ours_xla_bytes'])} | "
      f"{_mib(r['ours_rss_growth_bytes'])} | {_mib(r['theirs_rss_growth_bytes'])} |"
    )
  return "\n".join(lines)


def machine() -> dict:
  import jax
  import torch
  import transformers

  return {
    "platform": platform.platform(),
    "processor": platform.processor() or platform.machine(),
    "cpus": os.cpu_count(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "torch": torch.__version__,
    "torch_threads": torch.get_num_threads(),
    "transformers": transformers.__version__,
  }


def run(values) -> dict:
  prefill_lengths = [int(x) for x in values.prefill_lengths]
  prompt_lengths = [int(x) for x in values.prompt_lengths]
  max_positions = max(
    [*prefill_lengths, values.train_len + 1, max(prompt_lengths) + values.new_tokens]
  )
  same_random_model = functools.partial(
    hf_llama,
    values.width,
    values.depth,
    values.heads,
    values.kv_heads,
    values.vocab,
    values.mlp_hidden,
    values.init_std,
    max_positions,
  )
  hf_model = same_random_model()
  model, params = converted(hf_model)
  import numpy as np

  probe = np.random.default_rng(0).integers(0, values.vocab, (2, 64))
  diff = logit_difference(model, params, hf_model, probe)
  logging.info("max |logit difference| = %.3g", diff)
  if not diff <= values.tolerance:
    raise SystemExit(
      f"error: converted logits differ from transformers' by {diff:.3g} > --tolerance="
      f"{values.tolerance}; the conversion is wrong, timings would compare different models"
    )
  rows = []
  if "train" in values.measures:
    rows.append(
      measure_train(model, params, hf_model, values.train_batch, values.train_len, values.repeats)
    )
    hf_model = same_random_model()  # training moved the weights: the same random model again
  if "prefill" in values.measures:
    for length in prefill_lengths:
      rows.append(
        measure_prefill(model, params, hf_model, values.prefill_batch, length, values.repeats)
      )
      logging.info("%s", rows[-1])
  if "decode" in values.measures:
    for batch in (int(b) for b in values.decode_batches):
      for length in prompt_lengths:
        rows.append(
          measure_decode(model, params, hf_model, batch, length, values.new_tokens, values.repeats)
        )
        logging.info("%s", rows[-1])
  return {"logit_difference": diff, "rows": rows, "machine": machine(), "flags": _settings(values)}


def _settings(values) -> dict:
  names = (
    "width depth heads kv_heads vocab mlp_hidden init_std train_batch train_len prefill_lengths "
    "prefill_batch prompt_lengths decode_batches new_tokens repeats"
  ).split()
  return {name: getattr(values, name) for name in names}


def main(argv):
  del argv
  from experiments import runtime

  runtime.setup()
  result = run(flags.FLAGS)
  table = markdown(result["rows"], result["logit_difference"])
  print(table)
  mismatched = [r["setting"] for r in result["rows"] if r.get("same_tokens") is False]
  path = flags.FLAGS.json
  if path:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
      json.dump({**result, "markdown": table}, f, indent=2)
  if mismatched:
    sys.exit(f"error: greedy tokens differ from transformers' at {mismatched}")


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  define_flags()
  app.run(main)
