"""Flow2GAN's study: the ablations of the paper at CPU scale, each arm a full run (flow matching, GAN
fine-tuning where the arm has it, the side-by-side benchmark).

Arms (`study_arms`):
  endpoint_scaled          the paper's flow matching (endpoint target, spectral scaling, 3 branches),
                           then GAN fine-tuning of the 1-step and the `study.second_gan_steps`-step
                           generator;
  velocity_scaled          velocity target, spectral scaling, then the 1-step GAN: GAN from a
                           standard-FM init (the paper's key ablation);
  endpoint_unscaled        endpoint target, mean-squared waveform error (FM only);
  endpoint_scaled_1branch  one branch (n_fft 128) of about the same parameter count (FM only);
  velocity_unscaled        standard flow matching (FM only).
Every arm benchmarks FM at `eval.fm_steps`; the headline arm also times its GAN generators against them
in the same process.

Token arms (the `tokens` variant, `token_arms`), each FM at `eval.fm_steps` and the 1-step GAN:
  mel                      the paper's mel-conditioned model (the reference arm);
  tokens_<N>q              conditioned on the tokens of the codec trained in the arm's `codec` phase,
                           with `codec.quantizers` N = 8 and 2 codebooks (two bitrates of one codec:
                           the codec phase is the same computation in both arms, quantizer dropout
                           trains it for every count).
"""

from __future__ import annotations

from collections.abc import Mapping

from methods.base import Report, figure_grid, with_changes

METRICS = ("mel_distance", "mr_stft_distance", "silence_leakage_dbfs", "quiet_bin_lsd")
METRICS_PLOTTED = ("mel_distance", "silence_leakage_dbfs", "quiet_bin_lsd")


TOKEN_QUANTIZERS = (8, 2)


def token_arms(config):
  arms = [("mel", with_changes(config, model__condition="mel", gan__generator_steps=(1,)))]
  for n in TOKEN_QUANTIZERS:
    arms.append(
      (
        f"tokens_{n}q",
        with_changes(
          config, model__condition="tokens", codec__quantizers=n, gan__generator_steps=(1,)
        ),
      )
    )
  return arms


def study_arms(config):
  if config.variant == "tokens":
    return token_arms(config)
  first = config.gan.generator_steps[0] if config.gan.generator_steps else 1
  both = (first, config.study.second_gan_steps)
  single = dict(
    model__n_ffts=(config.model.n_ffts[0],),
    model__hops=(config.model.hops[0],),
    model__channels=(config.study.single_branch_channels,),
    model__num_blocks=(config.model.num_blocks[0],),
  )
  return [
    ("endpoint_scaled", with_changes(config, gan__generator_steps=both)),
    (
      "velocity_scaled",
      with_changes(config, flow__prediction="velocity", gan__generator_steps=(first,)),
    ),
    (
      "endpoint_unscaled",
      with_changes(config, flow__spectral_scaling=False, gan__generator_steps=()),
    ),
    ("endpoint_scaled_1branch", with_changes(config, gan__generator_steps=(), **single)),
    (
      "velocity_unscaled",
      with_changes(
        config,
        flow__prediction="velocity",
        flow__spectral_scaling=False,
        gan__generator_steps=(),
      ),
    ),
  ]


def _generator_names(results: Mapping[str, float]) -> list[str]:
  names = {key.split("/")[0] for key in results if "/" in key}
  return sorted(names, key=lambda n: (not n.startswith("fm"), int(n.split("_")[1][:-4])))


def _rows(results: Mapping[str, Mapping[str, float]]) -> list[dict]:
  rows = []
  for arm, r in results.items():
    for name in _generator_names(r):
      row = {"arm": arm, "generator": name.replace("_", " ")}
      row.update({m: r[f"{name}/{m}"] for m in METRICS})
      if f"{name}/pesq" in r:  # only with the optional `pesq` package
        row["pesq"] = r[f"{name}/pesq"]
      row["real_time_factor"] = r[f"{name}/real_time_factor"]
      rows.append(row)
  return rows


def _summary(results) -> dict:
  """The comparisons the paper's claims rest on, as differences (negative: the first is better)."""
  e, v = results["endpoint_scaled"], results["velocity_scaled"]
  eu = results["endpoint_unscaled"]
  one = results["endpoint_scaled_1branch"]
  out = {}
  for n in (1, 2, 4):
    key = f"fm_{n}step"
    out[f"mel_endpoint_minus_velocity_{n}step"] = (
      e[f"{key}/mel_distance"] - v[f"{key}/mel_distance"]
    )
    out[f"leak_endpoint_minus_velocity_{n}step"] = (
      e[f"{key}/silence_leakage_dbfs"] - v[f"{key}/silence_leakage_dbfs"]
    )
  for n in (2, 4, 8):
    key = f"fm_{n}step"
    out[f"quiet_lsd_scaled_minus_unscaled_{n}step"] = (
      e[f"{key}/quiet_bin_lsd"] - eu[f"{key}/quiet_bin_lsd"]
    )
    if "velocity_unscaled" in results:
      vu = results["velocity_unscaled"]
      out[f"quiet_lsd_velocity_scaled_minus_unscaled_{n}step"] = (
        v[f"{key}/quiet_bin_lsd"] - vu[f"{key}/quiet_bin_lsd"]
      )
  out["mel_3branch_minus_1branch_4step"] = e["fm_4step/mel_distance"] - one["fm_4step/mel_distance"]
  gans = [n for n in _generator_names(e) if n.startswith("gan")]
  if gans and "gan_1step/mel_distance" in v:
    out["gan1_mel_from_endpoint_minus_from_velocity"] = (
      e["gan_1step/mel_distance"] - v["gan_1step/mel_distance"]
    )
  for name in gans:
    if f"{name}/pesq" in e:
      out[f"{name}_pesq"] = e[f"{name}/pesq"]
    out[f"{name}_mel_distance"] = e[f"{name}/mel_distance"]
    out[f"{name}_real_time_factor"] = e[f"{name}/real_time_factor"]
  for n in (1, 4, 8):
    out[f"fm_{n}step_mel_distance"] = e[f"fm_{n}step/mel_distance"]
    out[f"fm_{n}step_real_time_factor"] = e[f"fm_{n}step/real_time_factor"]
  return out


def _token_summary(results) -> dict:
  """Token arms against the mel arm and the low bitrate against the high one (positive: worse)."""
  mel = results["mel"]
  high, low = (results[f"tokens_{n}q"] for n in TOKEN_QUANTIZERS)
  out = {}
  for name in _generator_names(mel):
    for metric in ("mel_distance", "mr_stft_distance"):
      key = f"{name}/{metric}"
      out[f"{metric}_{name}_tokens{TOKEN_QUANTIZERS[0]}q_minus_mel"] = high[key] - mel[key]
      out[f"{metric}_{name}_tokens{TOKEN_QUANTIZERS[1]}q_minus_mel"] = low[key] - mel[key]
      out[f"{metric}_{name}_low_minus_high_bitrate"] = low[key] - high[key]
  for n, arm in zip(TOKEN_QUANTIZERS, (high, low), strict=True):
    for key in ("codec_kbps", "codec_mel_distance", "codec_perplexity"):
      if key in arm:
        out[f"tokens_{n}q_{key}"] = arm[key]
  return out


def report(config, results: Mapping[str, Mapping[str, float]]) -> Report:
  if config.variant == "tokens":
    return Report(
      rows=_rows(results),
      summary=_token_summary(results),
      figures={"flow2gan_tokens": _figure(config, results)},
      notes=(
        "Token arms: the generator conditioned on the summed codewords of the tokens of a codec "
        "trained in the arm (codec_* keys: its own resynthesis at that bitrate); mel arm: the "
        "log-mel condition. Same generator, flow matching, GAN phase and test set."
      ),
    )
  return Report(
    rows=_rows(results),
    summary=_summary(results),
    figures={"flow2gan_study": _figure(config, results)},
    notes=(
      "Each arm's folder holds its benchmark's spectrograms.png and WAV examples (examples/: the "
      "reference and every generator on the first test segments). PESQ (wideband, after resampling "
      "to 16 kHz) is tabulated where the optional `pesq` package was installed for the benchmark, "
      "or added to a finished arm by `python experiments/flow2gan_examples.py --merge_pesq`."
    ),
  )


def _figure(config, results):
  """Mel distance, silence leakage and quiet-bin LSD against sampler steps for every arm's FM
  (lines) and the GAN generators (stars), and mel distance against real-time factor."""
  fig, axes = figure_grid(1, 4, panel_size=(3.6, 3.0))
  axes = axes[0]
  for i, (arm, r) in enumerate(results.items()):
    steps = list(config.eval.fm_steps)
    for ax, metric in zip(axes[:3], METRICS_PLOTTED, strict=True):
      ax.plot(
        steps, [r[f"fm_{n}step/{metric}"] for n in steps], marker="o", color=f"C{i}", label=arm
      )
      for name in _generator_names(r):
        if name.startswith("gan"):
          n = int(name.split("_")[1][:-4])
          ax.plot([n], [r[f"{name}/{metric}"]], marker="*", ms=12, color=f"C{i}", ls="none")
    rtf = [r[f"{n}/real_time_factor"] for n in _generator_names(r)]
    mel = [r[f"{n}/mel_distance"] for n in _generator_names(r)]
    axes[3].scatter(rtf, mel, color=f"C{i}", s=18)
  labels = ("mel distance", "silence leakage (dBFS)", "quiet-bin LSD (dB)", "mel distance")
  for ax, label in zip(axes, labels, strict=True):
    ax.set_ylabel(label)
  for ax in axes[:3]:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sampler steps (stars: GAN)")
  axes[3].set_xlabel("real-time factor (CPU, loaded machine)")
  axes[0].legend(fontsize=6)
  fig.tight_layout()
  return fig
