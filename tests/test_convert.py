"""The shared checkpoint-conversion rules (`core/nn/convert.py`) on a two-layer Flax model."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.nn import convert


class _Tiny(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3, name="out")(nn.LayerNorm(name="norm")(nn.Dense(4, name="hidden")(x)))


def _torch_state_dict(rng: np.random.Generator) -> dict[str, np.ndarray]:
  shapes = {
    "hidden.weight": (4, 2),
    "hidden.bias": (4,),
    "norm.weight": (4,),
    "norm.bias": (4,),
    "out.weight": (3, 4),
    "out.bias": (3,),
  }
  return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def _rules(expected):
  rules = convert.linear("hidden", ("hidden",), expected)
  rules |= convert.layer_norm("norm", ("norm",), expected)
  return rules | convert.linear("out", ("out",), expected)


def _expected():
  model = _Tiny()
  return model, convert.param_shapes(
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 2)))
  )


def test_converted_model_computes_the_torch_function():
  model, expected = _expected()
  sd = _torch_state_dict(np.random.default_rng(0))
  params = convert.apply_rules(sd, _rules(expected), expected, source="tiny")
  x = np.random.default_rng(1).normal(size=(5, 2)).astype(np.float32)
  h = x @ sd["hidden.weight"].T + sd["hidden.bias"]
  h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-6)
  reference = (h * sd["norm.weight"] + sd["norm.bias"]) @ sd["out.weight"].T + sd["out.bias"]
  ours = model.apply(params, jnp.asarray(x))
  chex.assert_trees_all_close(np.asarray(ours), reference, rtol=1e-5, atol=1e-5)
  assert params["params"]["out"]["kernel"].dtype == jnp.float32


def test_errors_name_the_key():
  _, expected = _expected()
  rules = _rules(expected)
  sd = _torch_state_dict(np.random.default_rng(0))
  with pytest.raises(
    convert.CheckpointError, match=r"tiny state dict .*missing keys \['out.bias'\]"
  ):
    convert.apply_rules(
      {k: v for k, v in sd.items() if k != "out.bias"}, rules, expected, source="tiny"
    )
  with pytest.raises(convert.CheckpointError, match=r"unexpected keys \['extra'\]"):
    convert.apply_rules({**sd, "extra": np.zeros(1)}, rules, expected, source="tiny")
  with pytest.raises(convert.CheckpointError, match=r"out.weight: expected shape \(3, 4\)"):
    convert.apply_rules({**sd, "out.weight": np.zeros((4, 3))}, rules, expected, source="tiny")
  wrong = {**rules, "out.bias": ((3,), lambda b: {("out", "kernel"): b})}
  with pytest.raises(convert.CheckpointError, match=r"out.bias: converts to \(3,\)"):
    convert.apply_rules(sd, wrong, expected, source="tiny")
  partial = {k: r for k, r in rules.items() if k != "norm.bias"}
  sd_partial = {k: v for k, v in sd.items() if k != "norm.bias"}
  with pytest.raises(convert.CheckpointError, match=r"no tiny key for \[\('norm', 'bias'\)\]"):
    convert.apply_rules(sd_partial, partial, expected, source="tiny")


def test_read_npz_round_trip_and_unreadable_file(tmp_path):
  sd = _torch_state_dict(np.random.default_rng(0))
  np.savez(tmp_path / "w.npz", **sd)
  chex.assert_trees_all_equal(convert.read_npz(str(tmp_path / "w.npz")), sd)
  (tmp_path / "bad.npz").write_bytes(b"not a zip")
  with pytest.raises(convert.CheckpointError, match="cannot read"):
    convert.read_npz(str(tmp_path / "bad.npz"))
