"""The official-code drivers' own logic (experiments/peers/), without the official checkouts or the
`peers` extra: reading released settings from a notebook, the notebook's selection rule, the
synthesis statistics; Flow2GAN's flags, checkout check, table and torchaudio stand-in; the AR-buffer
driver's flags, its checkout check, the official training prefixes and its dense stand-in for
flex_attention (the torch parts only where torch is installed)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from experiments.peers import ar_buffer, regmix
from experiments.peers import flow2gan as flow2gan_peer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _notebook(tmp_path, cells):
  folder = tmp_path / "regression_fitting"
  folder.mkdir()
  book = {"cells": [{"cell_type": "code", "source": [c]} for c in cells]}
  (folder / "regression.ipynb").write_text(json.dumps(book))
  return str(tmp_path)


def test_hyper_params_are_read_from_the_notebook_cell_that_defines_them(tmp_path):
  repo = _notebook(
    tmp_path,
    [
      "import lightgbm as lgb",
      "hyper_params = {\n 'objective': 'regression',\n 'num_iterations': 7,\n}\n\n"
      "np.random.seed(42)\nfor i in range(3):\n  raise RuntimeError('the fitting loop must not run')",
    ],
  )
  assert regmix.official_hyper_params(repo) == {"objective": "regression", "num_iterations": 7}


def test_a_checkout_without_the_notebook_is_named(tmp_path):
  with pytest.raises(SystemExit, match="regression.ipynb not found"):
    regmix.official_hyper_params(str(tmp_path))


def test_notebook_selection_averages_the_best_predicted_draws():
  prior = np.array([0.5, 0.3, 0.2])
  point = np.array([0.1, 0.1, 0.8])
  chosen = regmix.notebook_selection(lambda x: np.abs(x - point).sum(-1), prior, seed=0)
  assert np.abs(chosen - point).sum() < 0.15  # the 128 of 100,000 draws nearest the point
  assert np.isclose(chosen.sum(), 1.0)


def test_synthesis_stats_count_draws_above_the_usage_bound():
  prior = np.array([0.9, 0.1])
  mixtures = np.array([[0.9, 0.1], [0.0, 1.0], [0.5, 0.5]])
  stats = regmix.synthesis_stats(mixtures, prior, max_usage=4.0)
  assert stats["above_usage_bound"] == pytest.approx(2 / 3)  # 1.0 and 0.5 exceed 4 x 0.1
  assert stats["mean_l1_to_prior"] == pytest.approx((0 + 1.8 + 0.8) / 3)


def _flow2gan_flags(argv):
  values = flags.FlagValues()
  flow2gan_peer.define_flags(values)
  values(["flow2gan.py", *argv])
  return values


def test_flow2gan_flags_parse_and_the_checkout_flag_is_required():
  values = _flow2gan_flags(["--official_repo=/somewhere", "--seeds=0,1", "--gan_steps=0"])
  assert values.official_repo == "/somewhere"
  assert values.seeds == ["0", "1"] and values.gan_steps == 0 and values.flow_steps == 600
  with pytest.raises(flags.IllegalFlagValueError, match="official_repo"):
    _flow2gan_flags(["--seeds=0"])


def test_flow2gan_driver_rejects_a_path_that_is_not_a_checkout_in_one_line(tmp_path):
  script = os.path.join(os.path.dirname(flow2gan_peer.__file__), "flow2gan.py")
  run = subprocess.run(
    [sys.executable, script, f"--official_repo={tmp_path}"], capture_output=True, text=True
  )
  assert run.returncode != 0
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1 and "--official_repo" in lines[0] and str(tmp_path) in lines[0]
  (tmp_path / "flow2gan" / "models").mkdir(parents=True)
  (tmp_path / "flow2gan" / "models" / "generator.py").write_text("")
  assert flow2gan_peer.check_checkout(str(tmp_path)) == str(tmp_path)


def _side(mel, speed):
  row = {"mel_distance": mel, "silence_leakage_dbfs": -50.0, "quiet_bin_lsd": 15.0}
  return {"generators": {"fm_1step": {**row, "mr_stft_distance": 5.0, "samples_per_second": speed}}}


def test_flow2gan_table_gives_means_and_the_speed_ratio_per_seed():
  seeds = [
    {"official": _side(20.0, 1000.0), "ours": _side(21.0, 3000.0)},
    {"official": _side(22.0, 2000.0), "ours": _side(23.0, 6000.0)},
  ]
  table = flow2gan_peer.markdown(seeds)
  assert "| fm_1step | official | 21.00 ± 12.71 |" in table  # t(0.975, 1) * 1.414 / 1.414
  assert "| fm_1step | 3.00 ± 0.00 |" in table  # the ratio of each seed, then their mean
  assert "1.50 ± 6.35k" in table  # official samples/s in thousands


def test_flow2gan_torchaudio_stand_in_matches_our_filterbanks_and_spectrogram():
  torch = pytest.importorskip("torch")
  from core import audio

  stand_in = flow2gan_peer._torchaudio_stand_in()
  for sr, n_fft, n_mels in ((8000, 256, 32), (24000, 1024, 100)):
    mel = stand_in.functional.melscale_fbanks(n_fft // 2 + 1, 0.0, sr / 2, n_mels, sr).numpy()
    np.testing.assert_allclose(mel, audio.mel_filterbank(sr, n_fft, n_mels), atol=1e-5)
    lin = stand_in.functional.linear_fbanks(n_fft // 2 + 1, 0.0, sr / 2, 64, sr).numpy()
    np.testing.assert_allclose(lin, audio.linear_filterbank(sr, n_fft, 64), atol=1e-5)
  x = np.random.default_rng(0).normal(size=(2, 1000)).astype(np.float32)
  spec = stand_in.transforms.Spectrogram(n_fft=128, hop_length=32, power=None)(torch.tensor(x))
  np.testing.assert_allclose(  # ours is (frames, bins), torchaudio's (bins, frames)
    spec.numpy().transpose(0, 2, 1), np.asarray(audio.stft(x, 128, 32)), atol=2e-4
  )
  mel = stand_in.transforms.MelSpectrogram(8000, 256, hop_length=64, n_mels=32, power=1)
  np.testing.assert_allclose(
    mel(torch.tensor(x)).numpy().transpose(0, 2, 1),
    np.asarray(audio.mel_spectrogram(x, 8000, 256, 64, 32)),
    rtol=1e-3,
    atol=1e-4,
  )


def _ar_buffer_flags(argv):
  flag_values = flags.FlagValues()
  ar_buffer.define_flags(flag_values)
  flag_values(["ar_buffer.py", *argv])
  return flag_values


def test_ar_buffer_flags_parse_and_require_the_checkout(tmp_path):
  values = _ar_buffer_flags(
    [f"--official_repo={tmp_path}", "--seeds=3,4", "--steps=7", "--context_sizes=64,128"]
  )
  assert (values.seeds, values.steps, values.context_sizes) == (["3", "4"], 7, ["64", "128"])
  assert values.official_repo == str(tmp_path) and values.ours_visible == "ours"
  with pytest.raises(flags.IllegalFlagValueError, match="official_repo"):
    _ar_buffer_flags(["--steps=7"])


def test_ar_buffer_driver_names_official_repo_in_one_line_when_the_path_is_no_checkout(tmp_path):
  (tmp_path / "ar_tabpfn" / "model").mkdir(parents=True)
  (tmp_path / "ar_tabpfn" / "model" / "model.py").write_text("")
  run = subprocess.run(
    [sys.executable, "experiments/peers/ar_buffer.py", f"--official_repo={tmp_path}"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  message = run.stderr.strip()
  assert run.returncode != 0 and "\n" not in message, run.stderr
  assert message.startswith("error: --official_repo: ")
  assert "no ar_tabpfn/model/inference.py" in message  # the first file the partial checkout lacks


def test_ar_buffer_sizes_the_official_mask_cannot_take_are_named():
  values = _ar_buffer_flags(["--official_repo=x", "--num_targets=24", "--buffer_size=16"])
  with pytest.raises(
    SystemExit, match="--num_targets=24 must be a multiple of 2 \\* --buffer_size"
  ):
    ar_buffer.validate(values)


def test_official_visible_prefixes_follow_the_chunked_row_mask():
  # create_row_mask: target chunks of K = 2; the first half (4 of 8 targets) see buffer <= offset
  visible = ar_buffer.official_visible(batch=3, num_targets=8, num_buffer=2)
  assert visible.shape == (3, 8)
  np.testing.assert_array_equal(visible[1], [1, 2, 1, 2, 0, 0, 0, 0])


@pytest.mark.slow  # compiles torch's flex_attention on the CPU: minutes
def test_dense_flex_attention_matches_flex_attention_on_the_buffer_pattern():
  torch = pytest.importorskip("torch")
  flex = pytest.importorskip("torch.nn.attention.flex_attention")
  n_ctx, length = 5, 13

  def mask_mod(b, h, q_idx, kv_idx):  # context for all, then causal (a buffer-like pattern)
    return (kv_idx < n_ctx) | ((q_idx >= kv_idx) & (q_idx >= n_ctx))

  block_mask = flex.create_block_mask(mask_mod, None, None, length, length, device="cpu")
  q, k, v = torch.randn(3, 2, 2, length, 8, generator=torch.Generator().manual_seed(0))
  dense = ar_buffer.dense_flex_attention(q, k, v, block_mask=block_mask)
  expected = flex.flex_attention(q, k, v, block_mask=block_mask)
  torch.testing.assert_close(dense, expected, atol=1e-5, rtol=1e-5)
  unmasked = ar_buffer.dense_flex_attention(q, k, v)
  assert (unmasked - expected).abs().max() > 1e-2  # the mask matters on these inputs
