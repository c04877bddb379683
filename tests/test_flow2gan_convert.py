"""The official Flow2GAN generator's weights in `MultiBranchGenerator`: the converted model against a
NumPy forward written from the torch layout.

The state dict is random, laid out as k2-fsa/Flow2GAN's `MelAudioGenerator.state_dict()` stores it
(`flow2gan/models/{generator,modules}.py`: Conv1d weights [out, in, k], Linear [out, in], PReLU
`weight`, ChannelScale `scale` [C, 1], BiasNorm `bias` / `log_scale`, the STFT window buffers and the
training loss's spectrogram buffers). The reference forward below reads those arrays directly in the
reference's (batch, channels, time) layout, with torch.stft / torch.istft semantics written in NumPy, so
nothing in it comes from the converter or from `core/nn/audio_convnext.py`.
"""

import functools
import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import flow2gan as flow2gan_config
from core.nn import audio_convnext_convert as convert
from core.nn.audio_convnext import MultiBranchGenerator
from experiments import loop
from methods.base import ConfigError

phases = importlib.import_module("methods.flow2gan.phases")

N_MELS, MEL_HOP, T = 10, 16, 256
N_FFTS, HOPS, CHANNELS, BLOCKS = (32, 16), (16, 8), (8, 6), (2, 1)
COND, COND_BLOCKS, TIME, HF, K = 8, 2, 8, 3, 7


def model() -> MultiBranchGenerator:
  return MultiBranchGenerator(
    n_ffts=N_FFTS,
    hops=HOPS,
    channels=CHANNELS,
    num_blocks=BLOCKS,
    cond_channels=COND,
    cond_blocks=COND_BLOCKS,
    cond_hop=MEL_HOP,
    time_dim=TIME,
    hidden_factor=HF,
    kernel_size=K,
  )


@functools.lru_cache(maxsize=1)
def expected_shapes():
  x, mel = jnp.zeros((1, T)), jnp.zeros((1, 1 + T // MEL_HOP, N_MELS))
  return jax.eval_shape(
    lambda: model().init(jax.random.key(0), x, mel, jnp.zeros((1,)), method=model().full)
  )


def _hann(n):
  return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)).astype(np.float32)


def official_state_dict(seed: int = 0, scale: float = 0.3) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)

  def r(*shape):
    return (scale * rng.standard_normal(shape)).astype(np.float32)

  def norm(prefix, c):
    return {f"{prefix}.bias": r(c), f"{prefix}.log_scale": np.float32(rng.uniform(-0.5, 0.5))}

  def block(prefix, c, cond=False, time=False):
    sd = {f"{prefix}.dwconv.weight": r(c, 1, K), f"{prefix}.dwconv.bias": r(c)}
    sd |= norm(f"{prefix}.norm", c)
    sd |= {f"{prefix}.pwconv1.weight": r(HF * c, c, 1), f"{prefix}.pwconv1.bias": r(HF * c)}
    sd |= {f"{prefix}.act.weight": r(HF * c), f"{prefix}.pwconv2.weight": r(c, HF * c, 1)}
    sd |= {f"{prefix}.pwconv2.bias": r(c)}
    sd[f"{prefix}.residual_scale.scale"] = rng.uniform(0.5, 1.0, (c, 1)).astype(np.float32)
    if cond:
      sd |= {f"{prefix}.cond_proj.weight": r(c, COND, 1), f"{prefix}.cond_proj.bias": r(c)}
    if time:
      sd |= {f"{prefix}.time_embed_proj.weight": r(c, TIME)}
      sd |= {f"{prefix}.time_embed_proj.bias": r(c)}
    return sd

  sd = {"cond_encoder.in_proj.weight": r(COND, N_MELS, 3), "cond_encoder.in_proj.bias": r(COND)}
  sd |= norm("cond_encoder.in_norm", COND)
  for j in range(COND_BLOCKS):
    sd |= block(f"cond_encoder.blocks.{j}", COND)
  for i, (n_fft, c, blocks) in enumerate(zip(N_FFTS, CHANNELS, BLOCKS, strict=True)):
    e, d = f"estimators.{i}", f"estimators.{i}.decoder"
    sd |= {f"{e}.fft.window": _hann(n_fft), f"{e}.ifft.window": _hann(n_fft)}
    sd |= {f"{d}.in_proj.weight": r(c, n_fft + 2, 1), f"{d}.in_proj.bias": r(c)}
    sd |= norm(f"{d}.in_norm", c)
    sd |= {f"{d}.time_mlp.0.weight": r(HF * TIME, TIME), f"{d}.time_mlp.0.bias": r(HF * TIME)}
    sd |= {f"{d}.time_mlp.2.weight": r(TIME, HF * TIME), f"{d}.time_mlp.2.bias": r(TIME)}
    sd |= {f"{d}.cond_mlp.0.weight": r(HF * COND, COND, 1), f"{d}.cond_mlp.0.bias": r(HF * COND)}
    sd |= {f"{d}.cond_mlp.1.weight": r(HF * COND)}
    sd |= {f"{d}.cond_mlp.2.weight": r(COND, HF * COND, 1), f"{d}.cond_mlp.2.bias": r(COND)}
    for j in range(blocks):
      sd |= block(f"{d}.blocks.{j}", c, cond=True, time=True)
    sd |= {f"{d}.out_proj.weight": r(n_fft + 2, c, 1), f"{d}.out_proj.bias": r(n_fft + 2)}
  sd |= {"loss_spec.spectrogram.window": _hann(64), "loss_spec.fb": r(33, 16)}
  return sd


# ---------------------------------------------------------------------------------------------------
# The reference's forward in NumPy, (batch, channels, time), from the torch-layout arrays
# ---------------------------------------------------------------------------------------------------


def _conv1d(x, w, b, groups=1):
  """torch Conv1d, padding k // 2, stride 1."""
  k = w.shape[-1]
  xp = np.pad(x, [(0, 0), (0, 0), (k // 2, k // 2)])
  windows = np.stack([xp[..., i : i + x.shape[-1]] for i in range(k)], -1)  # (B, C, T, k)
  if groups == 1:
    out = np.einsum("bctk,ock->bot", windows, w.astype(np.float64))
  else:
    out = np.einsum("bctk,ck->bct", windows, w[:, 0].astype(np.float64))
  return out + b[None, :, None]


def _pointwise(sd, name, x):
  return _conv1d(x, sd[name + ".weight"], sd[name + ".bias"])


def _linear(sd, name, x):
  return x @ sd[name + ".weight"].astype(np.float64).T + sd[name + ".bias"]


def _bias_norm(sd, name, x):
  centred = x - sd[name + ".bias"][None, :, None]
  return x * np.mean(centred**2, axis=1, keepdims=True) ** -0.5 * np.exp(sd[name + ".log_scale"])


def _prelu(weight, x):
  return np.where(x >= 0, x, weight[None, :, None] * x)


def ref_block(sd, p, x, cond=None, time_embed=None):
  h = _conv1d(x, sd[p + ".dwconv.weight"], sd[p + ".dwconv.bias"], groups=x.shape[1])
  h = _bias_norm(sd, p + ".norm", h)
  if cond is not None:
    h = h + _pointwise(sd, p + ".cond_proj", cond)
  if time_embed is not None:
    h = h * (1.0 + _linear(sd, p + ".time_embed_proj", time_embed)[:, :, None])
  h = _pointwise(
    sd, p + ".pwconv2", _prelu(sd[p + ".act.weight"], _pointwise(sd, p + ".pwconv1", h))
  )
  return h + sd[p + ".residual_scale.scale"][None] * x


def ref_cond_encoder(sd, mel):
  h = _bias_norm(sd, "cond_encoder.in_norm", _pointwise(sd, "cond_encoder.in_proj", mel))
  for j in range(COND_BLOCKS):
    h = ref_block(sd, f"cond_encoder.blocks.{j}", h)
  return h


def _sinusoidal(t, dim, scale=1000.0):
  half = dim // 2
  freqs = np.exp(-math.log(10000) / (half - 1) * np.arange(half))
  args = scale * t[:, None] * freqs[None]
  return np.concatenate([np.sin(args), np.cos(args)], axis=1)


def _convert_length(x, length):
  if x.shape[-1] >= length:
    return x[..., :length]
  return np.concatenate([x, np.zeros((*x.shape[:-1], length - x.shape[-1]))], axis=-1)


def _stft(x, n_fft, hop):
  """torch.stft(center=True, reflect, periodic Hann, onesided): (B, bins, frames)."""
  xp = np.pad(x, [(0, 0), (n_fft // 2, n_fft // 2)], mode="reflect")
  frames = 1 + x.shape[-1] // hop
  chunks = np.stack([xp[:, f * hop : f * hop + n_fft] for f in range(frames)], 1)  # (B, F, n_fft)
  return np.fft.rfft(chunks * _hann(n_fft), axis=-1).transpose(0, 2, 1)


def _istft(spec, n_fft, hop):
  """torch.istft(center=True): windowed overlap-add over the squared-window sum, centre trimmed."""
  window = _hann(n_fft).astype(np.float64)
  frames = np.fft.irfft(spec.transpose(0, 2, 1), n=n_fft, axis=-1) * window
  count = frames.shape[1]
  total = n_fft + hop * (count - 1)
  out, envelope = np.zeros((spec.shape[0], total)), np.zeros(total)
  for f in range(count):
    out[:, f * hop : f * hop + n_fft] += frames[:, f]
    envelope[f * hop : f * hop + n_fft] += window**2
  pad = n_fft // 2
  return out[:, pad : total - pad] / envelope[pad : total - pad]


def ref_branch(sd, i, audio, cond, t):
  """AudioConvNeXt.forward without lengths: STFT -> fft_to_real -> ConvNeXtDecoder -> ISTFT."""
  n_fft, hop, d = N_FFTS[i], HOPS[i], f"estimators.{i}.decoder"
  spec = _stft(audio, n_fft, hop)
  h = np.concatenate([spec.real, spec.imag], axis=1)  # view_as_real, permute, reshape
  cond = _convert_length(np.repeat(cond, MEL_HOP // hop, axis=-1), spec.shape[-1])
  h = _bias_norm(sd, d + ".in_norm", _pointwise(sd, d + ".in_proj", h))
  hidden = _linear(sd, d + ".time_mlp.0", _sinusoidal(t, TIME))
  time_embed = _linear(sd, d + ".time_mlp.2", hidden / (1.0 + np.exp(-hidden)))
  c = _prelu(sd[d + ".cond_mlp.1.weight"], _pointwise(sd, d + ".cond_mlp.0", cond))
  c = _pointwise(sd, d + ".cond_mlp.2", c)
  for j in range(BLOCKS[i]):
    h = ref_block(sd, f"{d}.blocks.{j}", h, c, time_embed)
  h = _pointwise(sd, d + ".out_proj", h)
  bins = n_fft // 2 + 1
  return _convert_length(_istft(h[:, :bins] + 1j * h[:, bins:], n_fft, hop), audio.shape[-1])


def ref_generator(sd, audio, mel, t):
  """BaseAudioGenerator.process_model in eval mode: the mean of the branches."""
  cond = ref_cond_encoder(sd, mel)
  return np.mean([ref_branch(sd, i, audio, cond, t) for i in range(len(N_FFTS))], axis=0)


# ---------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------


def _convert(sd):
  return convert.flow2gan_to_flax(sd, expected_shapes(), N_FFTS)


def test_converted_generator_matches_the_numpy_reference():
  sd = official_state_dict()
  params = _convert(sd)
  rng = np.random.default_rng(1)
  audio = 0.3 * rng.standard_normal((2, T))
  mel = rng.standard_normal((2, N_MELS, 1 + T // MEL_HOP))
  t = np.array([0.25, 0.8])
  net = model()

  @jax.jit
  def forward(params, audio, mel, t):
    cond = net.apply(params, mel, method=net.encode)
    return cond, net.apply(params, audio, cond, t)

  cond, out = forward(
    params, *(jnp.asarray(a, jnp.float32) for a in (audio, mel.swapaxes(1, 2), t))
  )
  want_cond = ref_cond_encoder(sd, mel)
  np.testing.assert_allclose(np.asarray(cond).transpose(0, 2, 1), want_cond, rtol=2e-4, atol=2e-4)
  want = ref_generator(sd, audio, mel, t)
  assert np.abs(want).max() > 0.1  # a non-trivial output, so the tolerance means something
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


def test_every_parameter_is_mapped_and_every_key_used():
  sd = official_state_dict()
  params = _convert(sd)
  expected = expected_shapes()
  assert jax.tree.structure(params) == jax.tree.structure(expected)
  assert jax.tree.map(np.shape, params) == jax.tree.map(lambda s: s.shape, expected)
  leaves = jax.tree_util.tree_flatten_with_path(expected)[0]
  keys = [convert.torch_key(tuple(p.key for p in path)[1:]) for path, _ in leaves]
  assert len(set(keys)) == len(keys)  # one torch key per parameter
  buffers = {k for k in sd if k.endswith("window") or k.startswith("loss_spec.")}
  assert set(keys) == set(sd) - buffers
  prefixed = convert.flow2gan_to_flax({f"module.{k}": v for k, v in sd.items()}, expected, N_FFTS)
  assert jax.tree.all(jax.tree.map(np.array_equal, prefixed, params))


@pytest.mark.parametrize(
  "change, message",
  [
    (("estimators.1.decoder.blocks.0.pwconv1.weight", np.zeros((5, 6, 1))), "blocks.0.pwconv1"),
    (("cond_encoder.in_proj.weight", np.zeros((8, 12, 3))), "cond_encoder.in_proj.weight"),
    (("estimators.0.fft.window", np.ones(32)), "estimators.0.fft.window: not the periodic Hann"),
    (("estimators.0.decoder.blocks.5.norm.bias", np.zeros(8)), "blocks.5.norm.bias: not a param"),
  ],
)
def test_a_key_that_does_not_fit_names_itself(change, message):
  sd = official_state_dict()
  sd[change[0]] = change[1]
  with pytest.raises(convert.CheckpointError, match=message.replace(".", r"\.")):
    _convert(sd)


def test_a_missing_key_names_itself():
  sd = official_state_dict()
  del sd["estimators.1.decoder.cond_mlp.1.weight"]
  with pytest.raises(convert.CheckpointError, match=r"cond_mlp\.1\.weight: missing"):
    _convert(sd)


def _gpu_config(path):
  config = flow2gan_config.get_config("gpu")
  config.data.source = "procedural"  # validation of the weights field, not of the data folder
  config.model.pretrained_checkpoint = path
  return config


def test_gpu_variant_checks_its_weights_file_in_one_line(tmp_path):
  assert flow2gan_config.get_config("gpu").model.pretrained_checkpoint == ""
  with pytest.raises(ConfigError, match="config.model.pretrained_checkpoint: no file at") as error:
    loop.validate(_gpu_config(str(tmp_path / "g.npz")), data_devices=1)
  assert "\n" not in str(error.value)
  (tmp_path / "g.pt").write_bytes(b"")
  with pytest.raises(ConfigError, match="config.model.pretrained_checkpoint: .* torch pickle"):
    loop.validate(_gpu_config(str(tmp_path / "g.pt")), data_devices=1)


def test_the_flow_phase_starts_from_the_converted_weights(tmp_path):
  config = flow2gan_config.get_config()
  config.data.update(segment_length=T)
  config.mel.update(n_mels=N_MELS, hop=MEL_HOP, n_fft=64)
  config.model.update(n_ffts=N_FFTS, hops=HOPS, channels=CHANNELS, num_blocks=BLOCKS)
  config.model.update(cond_channels=COND, cond_blocks=COND_BLOCKS, time_dim=TIME)
  sd = official_state_dict()
  path = str(tmp_path / "g.npz")
  np.savez(path, **sd)
  config.model.pretrained_checkpoint = path
  params = phases.init_generator(config, jax.random.key(0))
  assert jax.tree.all(jax.tree.map(np.array_equal, params, _convert(sd)))
  assert phases.phases(config)[0].num_steps == 0
  np.savez(path, **(sd | {"estimators.0.decoder.out_proj.bias": np.zeros(3)}))
  with pytest.raises(ConfigError, match=r"config.model.pretrained_checkpoint: .*out_proj\.bias"):
    phases.init_generator(config, jax.random.key(0))
