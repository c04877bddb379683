"""The token codec (`core/nn/codec.py`, EnCodec's layout) and the EnCodec converter
(`core/nn/encodec_convert.py`): residual vector quantization, codebook updates, the codec phase of
Flow2GAN's token conditioning ("Flow2GAN", ICLR 2026), and a tiny transformers `EncodecModel`
(tests/fixtures/make_encodec.py) converted: the same embeddings and the same tokens."""

import functools
import importlib

import fixture_files
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import flow2gan as flow2gan_config
from core.nn import codec, encodec_convert

tokens = importlib.import_module("methods.flow2gan.tokens")
phases = importlib.import_module("methods.flow2gan.phases")


# ---------------------------------------------------------------------------------------------------
# Residual vector quantization
# ---------------------------------------------------------------------------------------------------


def test_rvq_round_trip_is_exact_when_the_codebooks_contain_the_data():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((6, 5, 4)).astype(np.float32)
  points = x.reshape(-1, 4)
  perm = rng.permutation(len(points))
  first = np.concatenate([points[perm], rng.standard_normal((7, 4))]).astype(np.float32)
  later = rng.standard_normal((2, len(first), 4)).astype(np.float32)
  later[:, 3] = 0.0  # the residual after the first stage is exactly zero
  books = jnp.asarray(np.concatenate([first[None], later]))
  codes, quantized = codec.rvq_encode(jnp.asarray(x), books, 3)
  assert codes.shape == (6, 5, 3) and codes.dtype == jnp.int32
  np.testing.assert_array_equal(codes[..., 0].reshape(-1), np.argsort(perm))
  np.testing.assert_array_equal(codes[..., 1:], 3)
  np.testing.assert_array_equal(quantized, x)
  np.testing.assert_array_equal(codec.rvq_decode(codes, books), x)


def test_rvq_stages_recover_the_codes_of_a_sum_of_codewords():
  """Coarse codewords far apart, fine ones small: greedy residual coding finds every stage's code."""
  rng = np.random.default_rng(1)
  books = np.stack([10.0 * np.eye(8)[:, :8], 0.1 * rng.standard_normal((8, 8))]).astype(np.float32)
  want = np.stack([rng.integers(0, 8, 20), rng.integers(0, 8, 20)], -1).astype(np.int32)
  x = codec.rvq_decode(jnp.asarray(want), jnp.asarray(books))
  codes, _ = codec.rvq_encode(x, jnp.asarray(books), 2)
  np.testing.assert_array_equal(codes, want)
  one, _ = codec.rvq_encode(x, jnp.asarray(books), 1)  # fewer codebooks: a prefix of the tokens
  np.testing.assert_array_equal(one[..., 0], want[:, 0])


def test_ema_update_moves_the_assigned_codeword_toward_its_points():
  embed = jnp.asarray([[0.0, 0.0], [5.0, 5.0]])
  layer = {"embed": embed, "embed_avg": embed, "cluster_size": jnp.ones(2)}
  target = jnp.asarray([1.0, -1.0])
  x = target + 0.01 * jax.random.normal(jax.random.key(0), (16, 2))
  idx = codec.nearest(x, layer["embed"])
  np.testing.assert_array_equal(idx, 0)
  before = float(jnp.linalg.norm(layer["embed"][0] - target))
  new = codec.ema_update(layer, x, idx, decay=0.9, eps=1e-5)
  assert float(jnp.linalg.norm(new["embed"][0] - target)) < before
  assert float(new["cluster_size"][0]) > 1.0 > float(new["cluster_size"][1])
  for _ in range(200):
    new = codec.ema_update(new, x, idx, decay=0.9, eps=1e-5)
  np.testing.assert_allclose(new["embed"][0], x.mean(0), atol=1e-3)


def test_kmeans_separates_clusters_and_dead_codes_rejoin_the_data():
  centers = jnp.asarray([[-4.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
  x = jnp.repeat(centers, 20, 0) + 0.1 * jax.random.normal(jax.random.key(0), (60, 2))
  found, counts = codec.kmeans(x, 3, 10, jax.random.key(3))
  key = lambda c: np.argsort(np.asarray(c[:, 0] + 0.1 * c[:, 1]))  # noqa: E731
  np.testing.assert_allclose(found[key(found)], centers[key(centers)], atol=0.1)
  np.testing.assert_array_equal(np.sort(counts), [20, 20, 20])
  layer = {"embed": jnp.full((3, 2), 100.0), "embed_avg": jnp.zeros((3, 2))}
  layer["cluster_size"] = jnp.asarray([5.0, 0.0, 0.1])
  new = codec.expire_dead_codes(layer, x, 1.0, jax.random.key(1))
  np.testing.assert_array_equal(new["embed"][0], 100.0)
  for row in np.asarray(new["embed"][1:]):
    assert np.any(np.all(np.isclose(np.asarray(x), row), axis=1))


def test_encoder_frames_are_ceil_of_length_over_hop_and_decoder_inverts_the_rate():
  enc = codec.SEANetEncoder(num_filters=2, ratios=(4, 2), dimension=3, lstm_layers=1)
  dec = codec.SEANetDecoder(num_filters=2, ratios=(4, 2), dimension=3, lstm_layers=0)
  x = jax.ShapeDtypeStruct((2, 203), jnp.float32)
  z, params = jax.eval_shape(functools.partial(enc.init_with_output, jax.random.key(0)), x)
  assert z.shape == (2, 26, 3) and z.dtype == jnp.float32
  y = jax.eval_shape(functools.partial(dec.init_with_output, jax.random.key(1)), z)[0]
  assert y.shape == (2, 26 * 8)
  assert "kernel_ih_0" in params["params"]["layers_7"]  # the LSTM at its torch index


# ---------------------------------------------------------------------------------------------------
# The codec phase
# ---------------------------------------------------------------------------------------------------


def tiny_codec_config():
  config = flow2gan_config.get_config("tokens")
  config.data.update(num_train=16, num_test=4, segment_length=512)
  config.model.update(n_ffts=(32, 16), hops=(16, 8), channels=(8, 8), num_blocks=(1, 1))
  config.codec.update(
    num_filters=4,
    ratios=(4, 4),
    dimension=8,
    codebook_size=4,  # few codewords for 128 frames: no empty cluster, no dead-code churn
    num_quantizers=2,
    quantizers=2,
    batch_size=4,
    learning_rate=3e-3,
    warmup_steps=3,
    quantizer_dropout=False,
    kmeans_iters=3,
  )
  config.gan.update(mel_n_ffts=(64,), mel_n_mels=(8,))
  config.eval.update(batch_size=4)
  return config


@pytest.mark.slow
def test_codec_phase_initialises_codebooks_and_lowers_its_loss():
  config = tiny_codec_config()
  state = tokens.init_codec_state(config, jax.random.key(0))
  assert not bool(state["rvq"]["inited"])
  batch = {"audio": jnp.asarray(phases.train_arrays(config)["audio"][:4])}
  step = jax.jit(functools.partial(tokens.codec_step, config))
  losses = []
  for i in range(12):
    state, metrics = step(state, batch, jax.random.key(i))
    losses.append(float(metrics["loss"]))
  assert bool(state["rvq"]["inited"]) and float(jnp.abs(state["rvq"]["embed"]).min()) >= 0.0
  assert float(jnp.abs(state["rvq"]["embed"]).sum(-1).min()) > 0.0  # every codeword placed
  # the log-mel loss of an untrained decoder is noisy step to step: compare the ends' means
  assert np.mean(losses[-3:]) < 0.97 * np.mean(losses[:3]), losses
  out = tokens.codec_outputs(state)
  assert set(out) == {"encoder", "codebooks"} and out["codebooks"].shape == (2, 4, 8)
  codes = tokens.tokens(config, out, batch["audio"])
  assert codes.shape == (4, 512 // 16, 2) and codes.dtype == jnp.int32
  assert int(codes.max()) < 4 and int(codes.min()) >= 0


# ---------------------------------------------------------------------------------------------------
# EnCodec's released layout
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def fixture():
  arrays = fixture_files.arrays("encodec")
  state_dict = fixture_files.state_dict(arrays, "sd/")
  return arrays, state_dict


def _encoder():
  # tests/fixtures/make_encodec.py's CONFIG: 4 filters, ratios (4, 2), 8-d, 2 LSTM layers
  return codec.SEANetEncoder(num_filters=4, ratios=(4, 2), dimension=8, lstm_layers=2)


def _abstract(length):
  return jax.eval_shape(_encoder().init, jax.random.key(0), jnp.zeros((1, length)))


@pytest.mark.slow
def test_encodec_encoder_and_quantizer_match_transformers():
  arrays, state_dict = fixture()
  wave = arrays["waveform"]
  converted = encodec_convert.encodec_to_flax(state_dict, _abstract(wave.shape[1]), 4)
  z = _encoder().apply({"params": converted["encoder"]}, jnp.asarray(wave))
  np.testing.assert_allclose(z, arrays["embeddings"], atol=1e-4)
  codes, _ = codec.rvq_encode(z, jnp.asarray(converted["codebooks"]), 4)
  np.testing.assert_array_equal(codes, arrays["codes"])
  assert len(np.unique(arrays["codes"][..., 0])) > 4  # the fixture's tokens are not all alike


def test_weight_norm_is_folded_over_all_but_the_output_axis():
  g = np.asarray([[[2.0]], [[3.0]]])
  v = np.asarray([[[3.0, 4.0]], [[0.0, 1.0]]])
  folded = encodec_convert.fold_weight_norm(
    {"a.parametrizations.weight.original0": g, "a.parametrizations.weight.original1": v}
  )
  np.testing.assert_allclose(folded["a.weight"], [[[1.2, 1.6]], [[0.0, 3.0]]])
  with pytest.raises(encodec_convert.CheckpointError, match="b.weight_v"):
    encodec_convert.fold_weight_norm({"b.weight_g": g})


@pytest.mark.parametrize(
  "change, message",
  [
    (lambda sd: sd.pop("encoder.layers.7.lstm.bias_hh_l1"), "missing keys.*bias_hh_l1"),
    (
      lambda sd: sd.__setitem__("encoder.layers.0.conv.bias", np.zeros(5, np.float32)),
      r"encoder.layers.0.conv.bias: expected shape \(4,\)",
    ),
    (lambda sd: sd.pop("quantizer.layers.3.codebook.embed"), "quantizer.layers.3.codebook.embed"),
    (
      lambda sd: sd.__setitem__("quantizer.layers.0.codebook.inited", np.zeros(1, np.float32)),
      "never initialised",
    ),
  ],
)
def test_a_state_dict_that_does_not_fit_names_the_key(change, message):
  _, state_dict = fixture()
  state_dict = dict(state_dict)
  change(state_dict)
  with pytest.raises(encodec_convert.CheckpointError, match=message):
    encodec_convert.encodec_to_flax(state_dict, _abstract(203), 4)


def test_codec_checkpoint_through_the_config(tmp_path):
  """The fixture as `model.codec_checkpoint`: the codec phase loads it (0 steps); a wrong layout is
  a `ConfigError` naming the field."""
  from methods.base import ConfigError

  _, state_dict = fixture()
  path = str(tmp_path / "encodec.npz")
  np.savez(path, **state_dict)
  config = tiny_codec_config()
  config.codec.update(num_filters=4, ratios=(4, 2), dimension=8, lstm_layers=2)
  config.codec.update(codebook_size=16, num_quantizers=4, quantizers=4, warmup_steps=1)
  config.model.update(codec_checkpoint=path, hops=(8, 8), n_ffts=(16, 16))
  assert phases.codec_phase(config).num_steps == 0
  state = tokens.init_codec_state(config, jax.random.key(0))
  assert state["codebooks"].shape == (4, 16, 8)
  config.codec.num_filters = 8
  with pytest.raises(ConfigError, match="config.model.codec_checkpoint: .*expected shape"):
    tokens.init_codec_state(config, jax.random.key(0))
