"""Hugging Face Llama-layout checkpoints as `Transformer` parameters: a pure mapping, plus a reader.

Llama 3 (`LlamaForCausalLM`, e.g. Meta-Llama-3-8B-Instruct) computes the same function as
`Transformer(mlp="swiglu", use_rope=True, rope_base=rope_theta, norm_eps=rms_norm_eps,
num_kv_heads=num_key_value_heads, mlp_hidden=intermediate_size, tie_embeddings=tie_word_embeddings)`:
pre-norm RMSNorm blocks, rotary embeddings in the rotate-half layout (the Hugging Face checkpoints
already store q/k projections permuted for it), grouped-query attention without biases, SwiGLU.
Hugging Face names and layouts -> here:

  model.embed_tokens.weight [V, D]                   embed/embedding [V, D]
  model.layers.N.input_layernorm.weight              block_N/attention_norm/scale
  model.layers.N.self_attn.q_proj.weight [H*d, D]    block_N/attention/query/kernel [D, H, d]
  model.layers.N.self_attn.k_proj / v_proj           block_N/attention/key, value/kernel [D, KV, d]
  model.layers.N.self_attn.o_proj.weight [D, H*d]    block_N/attention/out/kernel [H, d, D]
  model.layers.N.post_attention_layernorm.weight     block_N/mlp_norm/scale
  model.layers.N.mlp.gate_proj / up_proj [F, D]      block_N/mlp/gate, up/kernel [D, F]
  model.layers.N.mlp.down_proj.weight [D, F]         block_N/mlp/down/kernel [F, D]
  model.norm.weight                                  final_norm/scale
  lm_head.weight [V, D]                              unembed/kernel [D, V] (absent when tied)
  *.rotary_emb.inv_freq (older checkpoints)          recomputed here: dropped

Linear weights `[out, in]` become kernels `[in, out]`. A missing, unexpected or misshapen key raises
`CheckpointError` naming it.

Qwen2 (`Qwen2ForCausalLM`, transformers/models/qwen2/modeling_qwen2.py) is the same stack with biases
on the q/k/v projections (none on o_proj): `transformer_settings` of a `model_type: qwen2` config
sets `attention_bias=True`, and the extra keys map as

  model.layers.N.self_attn.q_proj.bias [H*d]         block_N/attention/query/bias [H, d]
  model.layers.N.self_attn.k_proj / v_proj.bias      block_N/attention/key, value/bias [KV, d]

Qwen2.5-VL's language model is this Qwen2 stack with M-RoPE (`core/nn/qwen_vl_convert.py` maps it,
reusing `decoder_rules` under its own key prefix). Not supported (an error names them in
`transformer_settings`): Llama's `attention_bias` (it also biases o_proj), q/k norms (Qwen3) and
RoPE frequency scaling (Llama 3.1's `rope_scaling`), which `core.nn.transformer.rope` does not
implement.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import attention
from core.nn.convert import CheckpointError, Rule, apply_rules, param_shapes
from core.nn.transformer import Transformer

__all__ = [
  "CheckpointError",
  "decoder_rules",
  "llama_to_flax",
  "read_safetensors",
  "transformer_settings",
]


MODEL_TYPES = ("llama", "qwen2", "qwen2_5_vl", "qwen2_5_vl_text")


def transformer_settings(hf_config: Mapping) -> dict:
  """`Transformer` keyword arguments for a Hugging Face Llama, Qwen2 or Qwen2.5-VL `config.json` (a
  dict; Qwen2.5-VL's text model, flat as released or under transformers 5's `text_config`, with
  M-RoPE's `mrope_section`)."""
  model_type = hf_config.get("model_type", "llama")
  if model_type not in MODEL_TYPES:
    raise CheckpointError(f"config.json: model_type {model_type!r} is not one of {MODEL_TYPES}")
  multimodal = model_type in ("qwen2_5_vl", "qwen2_5_vl_text")
  text = {**hf_config, **(hf_config.get("text_config") or {})}
  rope = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
  rope_type = rope.get("rope_type", rope.get("type", "default"))  # transformers 5 nests rope_theta
  if rope_type not in (("default", "mrope") if multimodal else ("default",)):
    raise CheckpointError(
      f"config.json: rope_scaling / rope_parameters type {rope_type!r} is not supported"
    )
  for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
    if text.get(key):
      raise CheckpointError(f"config.json: {key}={text[key]!r} is not supported")
  if text.get("hidden_act", "silu") != "silu":
    raise CheckpointError(f"config.json: hidden_act {text['hidden_act']!r} is not 'silu'")
  settings = dict(
    vocab_size=text["vocab_size"],
    width=text["hidden_size"],
    depth=text["num_hidden_layers"],
    num_heads=text["num_attention_heads"],
    num_kv_heads=text.get("num_key_value_heads", text["num_attention_heads"]),
    mlp="swiglu",
    mlp_hidden=text["intermediate_size"],
    tie_embeddings=bool(
      hf_config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    ),
    rope_base=float(text.get("rope_theta", rope.get("rope_theta", 1e6 if multimodal else 1e4))),
    norm_eps=float(text.get("rms_norm_eps", 1e-6)),
    attention_bias=model_type != "llama",
  )
  if multimodal:
    settings["mrope_section"] = tuple(rope.get("mrope_section", (16, 24, 24)))
  return settings


def llama_to_flax(state_dict: Mapping[str, np.ndarray], model: Transformer) -> dict:
  """Converts a Llama- or Qwen2-layout state dict (numpy or jax arrays) into `model.init`'s
  `{"params": ...}` (Qwen2's q/k/v biases when `model.attention_bias`)."""
  if model.mlp != "swiglu" or not model.use_rope or not model.vocab_size:
    raise CheckpointError("a Llama checkpoint needs Transformer(mlp='swiglu', use_rope=True)")
  state_dict = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
  source = "Qwen2" if model.attention_bias else "Llama"
  return apply_rules(
    state_dict, decoder_rules(model), decoder_shapes(model), source=source, dtype=model.param_dtype
  )


def decoder_shapes(model: Transformer) -> dict:
  """`param_shapes` of the decoder, without materialising it."""
  tokens = jnp.zeros((1, 2), jnp.int32)
  return param_shapes(
    jax.eval_shape(lambda: model.init(jax.random.key(0), tokens, mask=attention.causal_mask()))
  )


def decoder_rules(
  model: Transformer, prefix: str = "model.", head: str = "lm_head."
) -> dict[str, Rule]:
  """HF key -> (HF shape, conversion to {flax path: array}), the decoder's keys under `prefix`
  (`model.` in Llama and Qwen2, `model.language_model.` in transformers 5's Qwen2.5-VL) and the
  untied head's under `head`; q/k/v biases when `model.attention_bias`."""
  d, h, kv, hd, f, v = (
    model.width,
    model.num_heads,
    model.kv_heads,
    model.head_dim,
    model.hidden_width,
    model.vocab_size,
  )

  def to(path: tuple[str, ...], shape: tuple[int, ...], convert=lambda w: w) -> Rule:
    return shape, lambda w: {path: convert(w)}

  transpose = lambda w: jnp.asarray(w).T  # noqa: E731
  heads = lambda n: lambda w: jnp.asarray(w).reshape(n, hd, d).transpose(2, 0, 1)  # noqa: E731
  rules = {prefix + "embed_tokens.weight": to(("embed", "embedding"), (v, d))}
  rules[prefix + "norm.weight"] = to(("final_norm", "scale"), (d,))
  if not model.tie_embeddings:
    rules[head + "weight"] = to(("unembed", "kernel"), (v, d), transpose)
  for n in range(model.depth):
    hf, ours = f"{prefix}layers.{n}.", f"block_{n}"
    rules[hf + "input_layernorm.weight"] = to((ours, "attention_norm", "scale"), (d,))
    rules[hf + "post_attention_layernorm.weight"] = to((ours, "mlp_norm", "scale"), (d,))
    for name, ours_name, count in (("q", "query", h), ("k", "key", kv), ("v", "value", kv)):
      rules[hf + f"self_attn.{name}_proj.weight"] = to(
        (ours, "attention", ours_name, "kernel"), (count * hd, d), heads(count)
      )
      if model.attention_bias:
        rules[hf + f"self_attn.{name}_proj.bias"] = to(
          (ours, "attention", ours_name, "bias"),
          (count * hd,),
          lambda b, count=count: jnp.asarray(b).reshape(count, hd),
        )
    rules[hf + "self_attn.o_proj.weight"] = to(
      (ours, "attention", "out", "kernel"),
      (d, h * hd),
      lambda w: jnp.asarray(w).T.reshape(h, hd, d),
    )
    for name in ("gate", "up"):
      rules[hf + f"mlp.{name}_proj.weight"] = to((ours, "mlp", name, "kernel"), (f, d), transpose)
    rules[hf + "mlp.down_proj.weight"] = to((ours, "mlp", "down", "kernel"), (d, f), transpose)
  return rules


def read_safetensors(path: str) -> dict[str, jax.Array]:
  """A state dict from a `.safetensors` file, or from every shard that a Hugging Face
  `model.safetensors.index.json` names (read beside it). bfloat16 weights stay bfloat16."""
  from safetensors.flax import load_file

  try:
    if path.endswith(".json"):
      with open(path) as file:
        shards = sorted(set(json.load(file)["weight_map"].values()))
      state = {}
      for shard in shards:
        state.update(load_file(os.path.join(os.path.dirname(path), shard)))
      return state
    return load_file(path)
  except (OSError, KeyError, ValueError) as error:
    raise CheckpointError(f"cannot read {path!r}: {type(error).__name__}: {error}") from None
