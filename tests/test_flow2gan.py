"""Flow2GAN ("Flow2GAN", ICLR 2026): STFT/filterbanks, the endpoint objective and sampler, the
energy-scaled loss, the networks, the GAN step, the data, validation and a run through the loop."""

import functools
import importlib
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import signal

from configs import flow2gan as flow2gan_config
from core import audio, diffusion, gan
from core.data import speech_like, wav
from core.nn import audio_convnext
from experiments import loop
from methods.base import ConfigError
from methods.flow2gan import study

phases = importlib.import_module("methods.flow2gan.phases")
examples = importlib.import_module("experiments.flow2gan_examples")


def tiny_config():
  """One small branch (test_multi_branch_generator_shapes_and_parameter_matched_single_branch_arm
  covers several), two small discriminators, a few steps of each phase (two GAN steps: the first
  updates the discriminator only, the second both). One FFT size per eval metric: the multi-scale
  sums over several sizes are checked in test_gan_losses_at_known_inputs. The speed is timed on the
  quality batch's shape, so one compiled generator per step count serves both."""
  config = flow2gan_config.get_config()
  config.data.update(num_train=32, num_test=8, segment_length=1024)
  config.model.update(n_ffts=(64,), hops=(32,), channels=(8,), num_blocks=(1,), time_dim=8)
  config.model.update(cond_channels=8)
  config.flow.update(steps=2, batch_size=4, warmup_steps=1)
  config.gan.update(
    steps=2,
    disc_only_steps=1,
    batch_size=4,
    periods=(2,),
    period_channels=(2, 2, 2, 2, 2),
    windows=(64,),
    resolution_channels=2,
    mel_n_ffts=(64,),
    mel_n_mels=(8,),
  )
  config.eval.update(
    fm_steps=(1, 2),
    headline_fm_steps=2,
    batch_size=8,
    mel_n_ffts=(64,),
    mel_n_mels=(8,),
    stft_n_ffts=(64,),
    lsd_n_fft=128,
    timing_batch=8,
    timing_repeats=1,
  )
  config.loop.update(log_every=2, checkpoint_every=100)  # checkpoints at each phase's start and end
  return config


# ---------------------------------------------------------------------------------------------------
# STFT and filterbanks
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_fft, hop, length", [(128, 64, 4096), (64, 16, 1000), (256, 64, 777)])
def test_stft_matches_scipy_on_the_reflect_padded_signal_and_istft_inverts_it(n_fft, hop, length):
  x = np.random.default_rng(0).standard_normal((2, length)).astype(np.float32)
  spec = np.asarray(audio.stft(jnp.asarray(x), n_fft, hop))
  assert spec.shape == (2, 1 + length // hop, n_fft // 2 + 1)
  padded = np.pad(x, [(0, 0), (n_fft // 2, n_fft // 2)], mode="reflect")
  _, _, ref = signal.stft(
    padded, window="hann", nperseg=n_fft, noverlap=n_fft - hop, boundary=None, padded=False
  )
  ref = np.swapaxes(ref, -1, -2)[:, : spec.shape[1]] * signal.get_window("hann", n_fft).sum()
  np.testing.assert_allclose(spec, ref, atol=1e-3)
  back = np.asarray(audio.istft(jnp.asarray(spec), n_fft, hop, length))
  usable = hop * (length // hop)  # the inverse covers hop * (frames - 1) samples, then zero-pads
  np.testing.assert_allclose(back[:, :usable], x[:, :usable], atol=2e-5)
  assert np.all(back[:, usable:] == 0)


def test_mel_scales_at_hand_checked_points():
  np.testing.assert_allclose(audio.hz_to_mel(1000.0, "htk"), 1000.0, atol=0.02)
  np.testing.assert_allclose(audio.hz_to_mel([200.0, 1000.0, 6400.0], "slaney"), [3.0, 15.0, 42.0])
  f = np.array([50.0, 700.0, 1000.0, 3000.0, 11025.0])
  for scale in audio.MEL_SCALES:
    np.testing.assert_allclose(audio.mel_to_hz(audio.hz_to_mel(f, scale), scale), f, rtol=1e-9)


def test_filterbanks_are_the_triangles_they_claim():
  # corners on FFT bins: 127 linear filters at 8 kHz, n_fft 256 (31.25 Hz bins) peak at bin j + 1
  bank = audio.linear_filterbank(8000, 256, 127)
  np.testing.assert_allclose(bank[1:128], np.eye(127), atol=1e-6)
  # half-way between corners a triangle is 1/2: 63 filters, corners every 62.5 Hz = 2 bins
  bank = audio.linear_filterbank(8000, 256, 63)
  np.testing.assert_allclose(bank[[1, 2, 3], 0], [0.5, 1.0, 0.5], atol=1e-6)
  for scale in audio.MEL_SCALES:
    mel = audio.mel_filterbank(22050, 2048, 40, scale=scale)
    assert mel.shape == (1025, 40) and mel.max() <= 1.0 + 1e-6
    # unnormalised triangles overlap to a partition of unity between the first and last centre
    corners = audio.mel_to_hz(np.linspace(0, audio.hz_to_mel(11025.0, scale), 42), scale)
    freqs = audio.fft_bin_freqs(2048, 22050)
    inside = (freqs >= corners[1]) & (freqs <= corners[-2])
    np.testing.assert_allclose(mel[inside].sum(1), 1.0, atol=1e-5)
    # Slaney normalisation gives each triangle unit area in Hz
    normed = audio.mel_filterbank(22050, 8192, 40, scale=scale, slaney_norm=True)
    area = normed.sum(0) * (22050 / 8192)
    np.testing.assert_allclose(area[5:], 1.0, rtol=0.02)


@pytest.mark.parametrize(
  "sr, n_fft, n_mels, fmin, fmax",
  [
    (8000, 256, 32, 0.0, None),
    (16000, 512, 40, 20.0, 7600.0),
    (24000, 1024, 100, 0.0, None),
    (22050, 2048, 128, 50.0, 11000.0),
  ],
)
def test_mel_filterbanks_match_librosa(sr, n_fft, n_mels, fmin, fmax):
  """HTK and Slaney scales, with and without Slaney area normalisation, against librosa.filters.mel."""
  librosa = pytest.importorskip("librosa")
  for scale, norm in [("htk", None), ("htk", "slaney"), ("slaney", None), ("slaney", "slaney")]:
    ours = audio.mel_filterbank(sr, n_fft, n_mels, fmin, fmax, scale, slaney_norm=norm is not None)
    want = librosa.filters.mel(
      sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, htk=scale == "htk", norm=norm
    ).T
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-6 * want.max(), err_msg=scale)


def test_energy_scaled_loss_weights_quiet_targets_up_and_clamps():
  rng = np.random.default_rng(0)
  error = jnp.asarray(0.1 * rng.standard_normal((2, 1024)), jnp.float32)
  bank = jnp.asarray(audio.linear_filterbank(8000, 256, 32))
  loss = functools.partial(audio.energy_scaled_spectral_loss, bank=bank, n_fft=256, hop=64)
  assert float(loss(jnp.zeros_like(error), error)) == 0.0
  free = dict(eps=1e-12, scale_min=0.0, scale_max=np.inf)
  np.testing.assert_allclose(
    loss(error, 2 * error, **free), loss(error, error, **free) / 2, rtol=1e-4
  )
  plain = jnp.mean(audio.filterbank_power(error, bank, 256, 64))
  np.testing.assert_allclose(loss(error, error, power=0.0), plain, rtol=1e-5)
  np.testing.assert_allclose(loss(error, 1e4 * error), 0.01 * plain, rtol=1e-5)  # scale at min


def test_gan_losses_at_known_inputs():
  one = [jnp.ones((2, 3))]
  assert float(gan.hinge_discriminator_loss([2 * one[0]], [-2 * one[0]])) == 0.0
  assert float(gan.hinge_discriminator_loss([0 * one[0]], [0 * one[0]])) == 2.0
  assert float(gan.hinge_generator_loss([0 * one[0], 2 * one[0]])) == 1.0
  fmaps = [[jnp.zeros((2, 4)), jnp.zeros((2, 5, 1))], [jnp.zeros((1, 3))]]
  shifted = jax.tree.map(lambda a: a + 1.0, fmaps)
  assert float(gan.feature_matching_loss(fmaps, shifted)) == 3.0
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 1024)), jnp.float32)
  assert float(audio.multi_scale_mel_l1(x, x, 8000, (64, 128), (8, 16))) == 0.0
  assert float(audio.multi_resolution_stft_distance(x, x, (64,))) == 0.0


def test_silence_leakage_and_quiet_bin_lsd():
  fake = jnp.full((1, 1000), 0.01)
  silence = jnp.zeros((1, 1000)).at[:, :500].set(1.0)
  np.testing.assert_allclose(audio.silence_leakage_dbfs(fake, silence), -40.0, atol=1e-4)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 2048)), jnp.float32)
  quiet = x.at[:, 1024:].multiply(1e-3)
  assert float(audio.quiet_bin_lsd(quiet, quiet, 128, 32)) == 0.0
  assert float(audio.quiet_bin_lsd(quiet, x, 128, 32)) > 30.0  # quiet half played 60 dB too loud


def test_test_set_scores_pool_silence_over_batches_and_score_the_reference_as_perfect():
  """Outputs of any generator scored against the test set: the reference itself has zero distance
  and no leakage; outputs 0.003 inside the first batch's silences and 0.004 inside the second's leak
  the RMS pooled over every silent sample, not the mean of the two batches' levels."""
  config = tiny_config()
  config.eval.batch_size = 4
  data = phases.test_arrays(config)
  perfect = phases.test_set_scores(config, data["audio"])
  assert perfect["mel_distance"] == pytest.approx(0.0, abs=1e-6)
  assert perfect["silence_leakage_dbfs"] == pytest.approx(-200.0)
  levels = np.where(np.arange(len(data["audio"]))[:, None] < 4, 0.003, 0.004)
  leaky = np.where(data["silence"], levels, data["audio"]).astype(np.float32)
  counts = data["silence"][:4].sum(), data["silence"][4:].sum()
  expected = 10 * np.log10((counts[0] * 0.003**2 + counts[1] * 0.004**2) / sum(counts))
  scores = phases.test_set_scores(config, leaky)
  assert scores["silence_leakage_dbfs"] == pytest.approx(expected, abs=1e-3)
  assert scores["mel_distance"] > 0.0


def test_pesq_wideband_ranks_degradations():
  pytest.importorskip("pesq")
  ref = speech_like.segments(0, 0, 2, 8000, 8000)["audio"]  # 1 s at 8 kHz, resampled to 16 kHz
  noise = np.random.default_rng(0).standard_normal(ref.shape).astype(np.float32)
  clean = audio.pesq_wideband(ref, ref, 8000)
  slight = audio.pesq_wideband(ref, ref + 0.003 * noise, 8000)
  heavy = audio.pesq_wideband(ref, ref + 0.1 * noise, 8000)
  assert clean.shape == (2,) and np.all(clean > 4.0)
  assert np.all(clean > slight) and np.all(slight > heavy) and np.all(heavy >= 1.0)
  assert np.isnan(audio.pesq_wideband(ref[:1, :400], ref[:1, :400], 8000)).all()  # too short


# ---------------------------------------------------------------------------------------------------
# WAV files
# ---------------------------------------------------------------------------------------------------


def test_wav_round_trip_within_one_lsb_and_clipping(tmp_path):
  from scipy.io import wavfile

  x = np.random.default_rng(0).uniform(-1.2, 1.2, (2000, 2)).astype(np.float32)
  path = str(tmp_path / "x.wav")
  assert wav.write_wav(path, x, 8000) == int(np.sum(np.abs(x) > 1.0))
  back, rate = wav.read_wav(path)
  assert rate == 8000 and back.shape == x.shape
  assert np.max(np.abs(back - np.clip(x, -1, 1))) <= 1.0 / wav.FULL_SCALE
  assert np.all(np.abs(back[np.abs(x) > 1]) == 1.0)  # clipped to full scale, not wrapped
  scipy_rate, pcm = wavfile.read(path)  # a standard 16-bit PCM file
  assert scipy_rate == 8000 and pcm.dtype == np.int16
  np.testing.assert_array_equal(pcm, wav.to_pcm16(x)[0])
  wav.write_wav(path, x[:, 0], 16000)
  mono, _ = wav.read_wav(path)
  assert mono.shape == (2000,)
  with pytest.raises(ValueError, match="non-finite"):
    wav.write_wav(path, np.array([0.0, np.nan]), 8000)
  with pytest.raises(ValueError, match=r"\(2, 3, 4\)"):
    wav.write_wav(path, np.zeros((2, 3, 4)), 8000)


# ---------------------------------------------------------------------------------------------------
# The flow-matching objective and sampler (core/diffusion.py)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_steps", [1, 2, 4, 7])
def test_endpoint_sampler_with_the_exact_endpoint_returns_the_data(num_steps):
  data = jax.random.normal(jax.random.key(0), (3, 64))
  noise = 0.1 * jax.random.normal(jax.random.key(1), (3, 64))
  out = diffusion.sample(
    lambda x, t: data, noise, diffusion.rf_data_sampler(diffusion.rf_time_grid(num_steps))
  )
  np.testing.assert_allclose(out, data, atol=1e-5)
  straight = diffusion.sample(
    lambda x, t: diffusion.rf_velocity_target(data, noise),
    noise,
    diffusion.euler_sampler(diffusion.rf_time_grid(num_steps)),
  )
  np.testing.assert_allclose(straight, data, atol=1e-5)


def test_regression_loss_targets_and_the_existing_loss():
  x0 = jax.random.normal(jax.random.key(0), (4, 8))
  rng = jax.random.key(1)
  perfect = diffusion.rf_regression_loss(
    lambda x, t: x0, x0, rng, prediction="data", noise_scale=0.1
  )
  assert float(perfect) == 0.0
  model = lambda x, t: 0.5 * x  # noqa: E731
  chex.assert_trees_all_close(
    diffusion.rf_regression_loss(model, x0, rng), diffusion.rectified_flow_loss(model, x0, rng)
  )
  with pytest.raises(ValueError, match="prediction"):
    diffusion.rf_regression_loss(model, x0, rng, prediction="eps")


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------


def test_bias_norm_channel_scale_and_their_range_limits():
  x = jax.random.normal(jax.random.key(0), (2, 5, 16)) * 3.0 + 1.0
  norm = audio_convnext.BiasNorm()
  params = norm.init(jax.random.key(1), x)
  params = jax.tree.map(jnp.zeros_like, params)  # bias 0, log_scale 0
  y = norm.apply(params, x)
  np.testing.assert_allclose(jnp.sqrt(jnp.mean(y**2, -1)), 1.0, rtol=1e-5)
  grad = jax.grad(lambda v: jnp.sum(audio_convnext.limit_param_value(v, 0.5, 1.0) * 1.0))
  # d/dv of sum(v) is +1: descent lowers v, so below the range the sign flips to raise it
  np.testing.assert_array_equal(grad(jnp.array([0.2, 0.7, 1.3])), [-1.0, 1.0, 1.0])
  grad_neg = jax.grad(lambda v: -jnp.sum(audio_convnext.limit_param_value(v, 0.5, 1.0)))
  np.testing.assert_array_equal(grad_neg(jnp.array([0.2, 0.7, 1.3])), [-1.0, -1.0, 1.0])


def test_branch_dropout_zeroes_one_branch_and_rescales():
  w = audio_convnext.branch_dropout_weights(jax.random.key(0), (64, 3), 1.0)
  chex.assert_shape(w, (64, 3, 1))
  np.testing.assert_array_equal((w[..., 0] == 0).sum(1), 1)
  np.testing.assert_allclose(w.sum((1, 2)), 3.0, rtol=1e-6)
  assert np.all(audio_convnext.branch_dropout_weights(jax.random.key(0), (8, 3), 0.0) == 1)
  assert np.all(audio_convnext.branch_dropout_weights(jax.random.key(0), (8, 1), 1.0) == 1)


def test_multi_branch_generator_shapes_and_parameter_matched_single_branch_arm():
  config = tiny_config()
  config.model.update(n_ffts=(64, 32), hops=(32, 16), channels=(8, 8), num_blocks=(1, 1))
  x = jax.random.normal(jax.random.key(1), (3, config.data.segment_length))

  @jax.jit
  def init_and_generate(key, x):
    params = phases.init_generator(config, key)
    return phases.generate(config, params, phases.mel_features(config, x), x, 2)

  out = init_and_generate(jax.random.key(0), x)
  chex.assert_shape(out, (3, config.data.segment_length))
  chex.assert_type(out, jnp.float32)
  chex.assert_tree_all_finite(out)

  def count(c):
    shapes = jax.eval_shape(lambda: phases.init_generator(c, jax.random.key(0)))
    return sum(np.prod(s.shape) for s in jax.tree.leaves(shapes))

  arms = dict(study.study_arms(flow2gan_config.get_config("study")))
  three, one = count(arms["endpoint_scaled"]), count(arms["endpoint_scaled_1branch"])
  assert abs(one - three) / three < 0.05, (one, three)


# ---------------------------------------------------------------------------------------------------
# The GAN step
# ---------------------------------------------------------------------------------------------------


def _changed(before, after):
  return {
    k: not all(jax.tree.leaves(jax.tree.map(np.array_equal, before[k], after[k]))) for k in before
  }


@pytest.mark.slow
def test_discriminator_and_generator_updates_change_only_their_own_parameters():
  config = tiny_config()
  flow = phases.init_flow_state(config, jax.random.key(0))
  state = phases.init_gan_state(config, jax.random.key(1), {"flow": flow["ema"]})
  real = jnp.asarray(phases.train_arrays(config)["audio"][:4])
  mel = phases.mel_features(config, real)
  d_update = jax.jit(functools.partial(phases.discriminator_update, config, 1))
  after_d, _ = d_update(state, real, mel, jax.random.key(2))
  changed = _changed(state, after_d)
  assert changed["disc"] and changed["disc_opt"] and not changed["gen"] and not changed["gen_opt"]
  g_update = jax.jit(functools.partial(phases.generator_update, config, 1))
  after_g, losses = g_update(state, real, mel, jax.random.key(3))
  changed = _changed(state, after_g)
  assert changed["gen"] and changed["gen_opt"] and not changed["disc"] and not changed["disc_opt"]
  assert set(losses) == {"adv_mpd", "adv_mrd", "fm_mpd", "fm_mrd", "mel", "total"}


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


def test_procedural_segments_are_seeded_with_exact_silence_and_peak_levels():
  a = speech_like.segments(3, 10, 6, 4096, 8000)
  b = speech_like.segments(3, 10, 6, 4096, 8000)
  np.testing.assert_array_equal(a["audio"], b["audio"])
  assert a["audio"].dtype == np.float32 and a["audio"].shape == (6, 4096)
  assert np.all(a["audio"][a["silence"]] == 0.0) and np.all(a["silence"].sum(1) >= 320)
  peak_db = 20 * np.log10(np.abs(a["audio"]).max(1))
  assert np.all((peak_db > -6.01) & (peak_db < -0.99))


def test_gpu_variant_needs_its_data_dir():
  config = flow2gan_config.get_config("gpu")
  with pytest.raises(ConfigError, match="config.data.data_dir: not set"):
    loop.validate(config, data_devices=1)


def _gpu_reader_config():
  config = flow2gan_config.get_config("gpu")
  config.data.update(data_dir="/nonexistent", segment_length=2048, num_test=3)
  return config


def _check_libritts_batches(config):
  phases.test_arrays.cache_clear()
  batch = phases.data_source(config, 2).batch(0)
  test = phases.test_arrays(config)
  assert batch["audio"].shape == (2, 2048) and batch["audio"].dtype == np.float32
  assert test["audio"].shape == (3, 2048) and np.abs(test["audio"]).max() <= 1.0
  return batch, test


def test_libritts_reader_crops_and_normalises_records(monkeypatch):
  """The reader on records shaped as tfds's LibriTTS ones (int16-valued `speech`), one shorter than
  a crop (zero-padded, its padding marked as silence)."""
  rng = np.random.default_rng(0)
  records = [{"speech": rng.integers(-9000, 9000, size=n)} for n in (5000, 1500, 3000, 2600)]
  monkeypatch.setattr(speech_like, "libritts_source", lambda split, data_dir: records)
  batch, test = _check_libritts_batches(_gpu_reader_config())
  peaks = 20 * np.log10(np.abs(test["audio"]).max(1))
  assert np.all((peaks > -6.01) & (peaks < -0.99))
  assert test["silence"][1, 1500:].all() and not test["silence"][1, :1500].any()
  again = phases.data_source(_gpu_reader_config(), 2).batch(0)
  np.testing.assert_array_equal(batch["audio"], again["audio"])


def test_libritts_through_tfds_mock_data():
  pytest.importorskip("tensorflow")  # tfds's LibriTTS builder imports TensorFlow
  import tensorflow_datasets as tfds

  with tfds.testing.mock_data(num_examples=4):
    _check_libritts_batches(_gpu_reader_config())


# ---------------------------------------------------------------------------------------------------
# Validation, study, a run through the loop
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("flow.prediction", "eps", "config.flow.prediction"),
    ("model.hops", (60, 16), "config.model.hops"),
    ("data.segment_length", 1000, "config.data.segment_length"),
    ("gan.disc_only_steps", 99, "config.gan.disc_only_steps"),
    ("eval.headline_fm_steps", 3, "config.eval.headline_fm_steps"),
    ("gan.weights", (1.0, 1.0), "config.gan.weights"),
  ],
)
def test_bad_config_names_the_field(field, value, message):
  config = tiny_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ConfigError, match=message):
    loop.validate(config, data_devices=1)


def test_study_arms_cover_the_ablations():
  config = flow2gan_config.get_config("study")
  arms = dict(study.study_arms(config))
  assert list(arms) == [
    "endpoint_scaled",
    "velocity_scaled",
    "endpoint_unscaled",
    "endpoint_scaled_1branch",
    "velocity_unscaled",
  ]
  assert tuple(arms["endpoint_scaled"].gan.generator_steps) == (1, 2)
  assert arms["velocity_scaled"].flow.prediction == "velocity"
  assert not arms["endpoint_unscaled"].flow.spectral_scaling
  for arm in arms.values():
    loop.validate(arm, data_devices=1)


def test_report_rows_summary_and_figure():
  config = flow2gan_config.get_config("study")
  fm = [f"fm_{n}step" for n in config.eval.fm_steps]
  gens = {
    "endpoint_scaled": [*fm, "gan_1step", "gan_2step"],
    "velocity_scaled": [*fm, "gan_1step"],
    "endpoint_unscaled": fm,
    "endpoint_scaled_1branch": fm,
    "velocity_unscaled": fm,
  }
  metrics = (*study.METRICS, "real_time_factor")
  results = {
    arm: {f"{g}/{m}": float(i + j) for j, g in enumerate(names) for m in metrics}
    for i, (arm, names) in enumerate(gens.items())
  }
  results["endpoint_scaled"]["gan_1step/pesq"] = 3.5  # present where `pesq` was installed
  report = study.report(config, results)
  assert len(report.rows) == sum(len(v) for v in gens.values())
  pesq_rows = [r for r in report.rows if "pesq" in r]
  assert [(r["arm"], r["generator"], r["pesq"]) for r in pesq_rows] == [
    ("endpoint_scaled", "gan 1step", 3.5)
  ]
  assert report.summary["gan_1step_pesq"] == 3.5
  # endpoint arm index 0, velocity arm index 1: every FM-step difference is -1
  assert report.summary["mel_endpoint_minus_velocity_4step"] == -1.0
  assert report.summary["gan1_mel_from_endpoint_minus_from_velocity"] == -1.0
  assert "flow2gan_study" in report.figures


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("flow2gan")
  return loop.run(tiny_config(), str(workdir)), workdir


def test_tiny_run_through_the_loop_writes_the_headline_keys(tiny_run):
  summary, workdir = tiny_run
  r = summary.results
  for key in ("mel_distance", "silence_leakage_dbfs", "quiet_bin_lsd", "real_time_factor"):
    assert np.isfinite(r[key]), key
    assert r[key] == r[f"gan_1step/{key}"]
  assert {"fm_1step/mel_distance", "fm_2step/mel_distance", "flow_validation_loss"} <= set(r)
  assert summary.step_traces == {"flow": 1, "gan_1step": 1, "benchmark": 0}
  assert (workdir / "spectrograms.png").exists()
  names = {p.name for p in (workdir / "examples").iterdir()}
  n = phases.WAV_EXAMPLES
  for generator in ("reference", "fm_1step", "fm_2step", "gan_1step"):
    assert {f"{generator}_{i}.wav" for i in range(n)} <= names
  reference, rate = wav.read_wav(str(workdir / "examples" / "reference_0.wav"))
  assert rate == 8000
  test_audio = phases.test_arrays(tiny_config())["audio"][0]
  assert np.max(np.abs(reference - test_audio)) <= 1.0 / wav.FULL_SCALE
  assert ("pesq" in r) == audio.PESQ_AVAILABLE
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  gan_rows = {r["step"]: r for r in rows if r["phase"] == "gan_1step" and "gan_total" in r}
  # gan.disc_only_steps = 1: the first phase step updates the discriminator only
  assert gan_rows[1]["gan_total"] == 0.0 and gan_rows[2]["gan_total"] > 0.0


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_results(tiny_run, tmp_path):
  config = tiny_config()
  with pytest.raises(loop.Interrupted):
    loop.run(
      config, str(tmp_path), should_stop=lambda phase, step: phase == "gan_1step" and step == 1
    )
  resumed = loop.run(config, str(tmp_path)).results
  whole = tiny_run[0].results
  for key in ("flow_validation_loss", "gan_1step/mel_distance", "fm_2step/quiet_bin_lsd"):
    np.testing.assert_allclose(resumed[key], whole[key], rtol=1e-5)


def test_examples_from_a_finished_runs_checkpoints(tiny_run):
  """A finished run's generators restored from its benchmark checkpoint with the benchmark's noise:
  the same metrics as its results and the same WAV files as the benchmark wrote."""
  summary, workdir = tiny_run
  written = {p.name: p.read_bytes() for p in (workdir / "examples").glob("*.wav")}
  metrics = examples.from_checkpoints(tiny_config(), str(workdir))
  for key in ("fm_1step/mel_distance", "gan_1step/quiet_bin_lsd", "fm_2step/silence_leakage_dbfs"):
    np.testing.assert_allclose(metrics[key], summary.results[key], rtol=1e-6)
  again = {p.name: p.read_bytes() for p in (workdir / "examples").glob("*.wav")}
  assert again == written
  np.testing.assert_equal(json.loads((workdir / "examples" / "quality.json").read_text()), metrics)


# ---------------------------------------------------------------------------------------------------
# Token conditioning (methods/flow2gan/tokens.py)
# ---------------------------------------------------------------------------------------------------


def tiny_token_config():
  """`tiny_config` conditioned on the tokens of a 3-codebook codec of hop 32 (the branch hop)."""
  config = tiny_config()
  config.model.condition = "tokens"
  config.codec.update(
    steps=3,
    batch_size=4,
    warmup_steps=1,
    num_filters=4,
    ratios=(4, 4, 2),
    dimension=8,
    codebook_size=16,
    num_quantizers=3,
    quantizers=2,
    kmeans_iters=2,
  )
  return config


@pytest.mark.slow
def test_token_condition_shapes_and_dtypes():
  config = tiny_token_config()
  state = phases.tokens.init_codec_state(config, jax.random.key(0))
  books = jax.random.normal(jax.random.key(1), state["rvq"]["embed"].shape)
  codec = {"encoder": state["params"]["encoder"], "codebooks": books}
  real = jnp.asarray(phases.train_arrays(config)["audio"][:3])
  codes = phases.tokens.tokens(config, codec, real)
  chex.assert_shape(codes, (3, 1024 // 32, 2))
  chex.assert_type(codes, jnp.int32)
  features = phases.condition_features(config, codec, real)
  chex.assert_shape(features, (3, 1024 // 32, 8))
  chex.assert_type(features, jnp.float32)
  # the condition is the sum of the used codebooks' codewords of the tokens
  want = books[0][codes[..., 0]] + books[1][codes[..., 1]]
  np.testing.assert_allclose(features, want, atol=1e-6)
  params = jax.eval_shape(lambda: phases.init_generator(config, jax.random.key(2)))
  assert params["params"]["encoder"]["Conv_0"]["kernel"].shape == (3, 8, 8)  # codewords in
  out = jax.eval_shape(lambda p: phases.generate(config, p, features, real, 2), params)
  assert out.shape == (3, 1024) and out.dtype == jnp.float32
  names = [p.name for p in phases.phases(config)]
  assert names == ["codec", "flow", "gan_1step", "benchmark"]
  assert np.isclose(phases.tokens.bitrate_kbps(config), 2 * 4 * 8000 / 32 / 1e3)


@pytest.mark.parametrize(
  "changes, message",
  [
    (dict(model__condition="text"), "config.model.condition"),
    (dict(codec__quantizers=4), "config.codec.quantizers"),
    (dict(codec__ratios=(4, 3)), "config.model.hops"),  # hop 12 is no multiple of 32
    (dict(codec__codebook_size=12), "config.codec.codebook_size"),
    (dict(codec__ema_decay=1.0), "config.codec.ema_decay"),
    (dict(model__codec_checkpoint="/nonexistent/e.npz"), "config.model.codec_checkpoint"),
  ],
)
def test_bad_token_config_names_the_field(changes, message):
  from methods.base import with_changes

  config = with_changes(tiny_token_config(), **changes)
  with pytest.raises(ConfigError, match=message):
    loop.validate(config, data_devices=1)


@pytest.mark.slow
def test_tiny_token_run_through_the_loop(tmp_path):
  """codec -> flow -> 1-step GAN -> benchmark on tokens; the examples restore the codec too."""
  config = tiny_token_config()
  summary = loop.run(config, str(tmp_path))
  r = summary.results
  assert summary.step_traces == {"codec": 1, "flow": 1, "gan_1step": 1, "benchmark": 0}
  for key in ("codec_mel_distance", "codec_perplexity", "fm_1step/mel_distance", "mel_distance"):
    assert np.isfinite(r[key]), key
  assert r["codec_kbps"] == phases.tokens.bitrate_kbps(config)
  metrics = examples.from_checkpoints(config, str(tmp_path))
  np.testing.assert_allclose(
    metrics["gan_1step/mel_distance"], r["gan_1step/mel_distance"], rtol=1e-6
  )


def test_token_study_arms_and_report():
  config = flow2gan_config.get_config("tokens")
  arms = dict(study.study_arms(config))
  assert list(arms) == ["mel", "tokens_8q", "tokens_2q"]
  assert arms["mel"].model.condition == "mel"
  assert [arms[f"tokens_{n}q"].codec.quantizers for n in (8, 2)] == [8, 2]
  for arm in arms.values():
    assert tuple(arm.gan.generator_steps) == (1,)
    loop.validate(arm, data_devices=1)
  names = [*(f"fm_{n}step" for n in config.eval.fm_steps), "gan_1step"]
  metrics = (*study.METRICS, "real_time_factor")
  results = {
    arm: {f"{g}/{m}": float(i + j) for j, g in enumerate(names) for m in metrics}
    for i, arm in enumerate(arms)
  }
  results["tokens_2q"]["codec_kbps"] = 1.0
  report = study.report(config, results)
  assert len(report.rows) == 3 * len(names) and "flow2gan_tokens" in report.figures
  s = report.summary  # arm index i adds i: tokens_8q is mel + 1, tokens_2q is mel + 2
  assert s["mel_distance_gan_1step_tokens8q_minus_mel"] == 1.0
  assert s["mel_distance_fm_1step_low_minus_high_bitrate"] == 1.0
  assert s["tokens_2q_codec_kbps"] == 1.0
