"""A neural audio codec in EnCodec's layout, for Flow2GAN's token conditioning ("Flow2GAN: Hybrid Flow
Matching and GAN with Multi-Resolution Network for Few-step Audio Generation", ICLR 2026, generates audio
"from Mel-spectrograms or discrete audio tokens"; its tokens are EnCodec's: Défossez et al., "High
Fidelity Neural Audio Compression", 2022). Flax linen, channels last.

- `SEANetEncoder`: EnCodec's encoder: conv (k7) -> per stride [residual blocks, ELU, strided conv
  (kernel 2 * stride)] -> optional skip-LSTM -> ELU -> conv (k7) to `dimension`; every conv padded
  EnCodec's way (`pad_for_conv`: causal, reflect, with the extra right padding that makes the frame
  count `ceil(T / hop)`). Submodules are named `layers_<i>` after the index of the torch module in
  transformers' `EncodecEncoder.layers` (ELUs take an index and hold no parameters), so a released
  state dict converts by index (`core/nn/encodec_convert.py`).
- `SEANetDecoder`: the mirror image with transposed convs (causal trim), trained here only.
- Residual vector quantizer, as functions of a `(num_quantizers, codebook_size, dimension)` codebook
  array (codebooks are state updated by moving averages, not gradient parameters):
  `rvq_encode` (greedy nearest codeword per stage on the running residual, EnCodec's
  `ResidualVectorQuantizer.encode`), `rvq_decode` / `embed_tokens` (the sum over codebooks of each
  token's codeword), `kmeans` (the lazy initialisation of a codebook on its first batch),
  `ema_update` (EnCodec's `EuclideanCodebook` moving averages of cluster sizes and sums, Laplace
  smoothed), `expire_dead_codes` (codewords used less than a threshold are reset to batch vectors) and
  `rvq_train` (all of it for one training batch, with straight-through output and commitment loss).
  One departure from EnCodec's code: after k-means the moving sum starts at `centroid * count` (EnCodec
  copies the centroid itself, so the first update divides every codeword by its cluster size and the
  codebook takes hundreds of steps to grow back; equal once the averages have forgotten the start).

The EnCodec training losses other than reconstruction and commitment (the multi-scale STFT
discriminator and its feature matching, the loss balancer) are not used: the codec here only has to
give tokens, and its decoder exists to train the encoder and codebooks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

# ---------------------------------------------------------------------------------------------------
# Padded convolutions
# ---------------------------------------------------------------------------------------------------


def _pad1d(x: jax.Array, left: int, right: int, mode: str) -> jax.Array:
  """Pads the time axis of `(B, T, C)`; reflect padding longer than the signal first zero-pads the
  right as torch's EnCodec `_pad1d` does (reflection of a short input would be undefined)."""
  if mode != "reflect":
    return jnp.pad(x, ((0, 0), (left, right), (0, 0)))
  length, extra = x.shape[1], 0
  if length <= max(left, right):
    extra = max(left, right) - length + 1
    x = jnp.pad(x, ((0, 0), (0, extra), (0, 0)))
  x = jnp.pad(x, ((0, 0), (left, right), (0, 0)), mode="reflect")
  return x[:, : x.shape[1] - extra]


def pad_for_conv(x, kernel: int, stride: int, dilation: int, causal: bool, mode: str):
  """EnCodec's `EncodecConv1d` padding: `k_eff - stride` in total (all on the left when causal,
  split with the extra sample on the left otherwise) plus the right padding that completes the last
  frame, so a stride-`s` conv yields `ceil(T / s)` frames."""
  k_eff = (kernel - 1) * dilation + 1
  total = k_eff - stride
  length = x.shape[1]
  frames = math.ceil((length - k_eff + total) / stride + 1) - 1
  extra = frames * stride + k_eff - total - length
  if causal:
    return _pad1d(x, total, extra, mode)
  right = total // 2
  return _pad1d(x, total - right, right + extra, mode)


class CodecConv(nn.Module):
  """A 1-D conv with EnCodec's padding; the weight is the weight-normalised one already folded."""

  features: int
  kernel: int
  stride: int = 1
  dilation: int = 1
  causal: bool = True
  pad_mode: str = "reflect"

  @nn.compact
  def __call__(self, x):
    x = pad_for_conv(x, self.kernel, self.stride, self.dilation, self.causal, self.pad_mode)
    conv = nn.Conv(
      self.features,
      (self.kernel,),
      strides=(self.stride,),
      kernel_dilation=(self.dilation,),
      padding="VALID",
      name="conv",
    )
    return conv(x)


class ResnetBlock(nn.Module):
  """SEANet residual block: ELU -> conv (k3, dilated, to `dim / compress`) -> ELU -> conv (k1) plus a
  1x1 conv shortcut (`use_conv_shortcut`). Submodules `block_1`, `block_3`, `shortcut` (torch indices)."""

  dim: int
  dilation: int
  kernel: int = 3
  compress: int = 2
  causal: bool = True
  pad_mode: str = "reflect"

  @nn.compact
  def __call__(self, x):
    hidden = self.dim // self.compress
    h = CodecConv(
      hidden, self.kernel, 1, self.dilation, self.causal, self.pad_mode, name="block_1"
    )(nn.elu(x))
    h = CodecConv(self.dim, 1, 1, 1, self.causal, self.pad_mode, name="block_3")(nn.elu(h))
    shortcut = CodecConv(self.dim, 1, 1, 1, self.causal, self.pad_mode, name="shortcut")(x)
    return shortcut + h


class SkipLSTM(nn.Module):
  """`nn.LSTM(C, C, num_layers)` over time plus its input (EnCodec's `EncodecLSTM`). Parameters per
  layer `l`: `kernel_ih_l`, `kernel_hh_l` `[C, 4C]` (torch's `weight_ih_l<l>`, `weight_hh_l<l>`
  transposed), `bias_ih_l`, `bias_hh_l` `[4C]`; gates in torch's order i, f, g, o; zero initial
  state."""

  num_layers: int

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    init = nn.initializers.uniform(2.0 / math.sqrt(c))
    h = x
    for layer in range(self.num_layers):
      w_ih = self.param(f"kernel_ih_{layer}", init, (c, 4 * c))
      w_hh = self.param(f"kernel_hh_{layer}", init, (c, 4 * c))
      b_ih = self.param(f"bias_ih_{layer}", init, (4 * c,))
      b_hh = self.param(f"bias_hh_{layer}", init, (4 * c,))
      h = _lstm_layer(h, w_ih, w_hh, b_ih + b_hh)
    return h + x


def _lstm_layer(x, w_ih, w_hh, bias):
  batch, c = x.shape[0], x.shape[-1]
  inputs = jnp.swapaxes(x @ w_ih + bias, 0, 1)  # (T, B, 4C)

  def step(carry, gates_x):
    h, cell = carry
    gates = gates_x + h @ w_hh
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    cell = jax.nn.sigmoid(f) * cell + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(cell)
    return (h, cell), h

  zeros = jnp.zeros((batch, c), x.dtype)
  _, out = jax.lax.scan(step, (zeros, zeros), inputs)
  return jnp.swapaxes(out, 0, 1)


# ---------------------------------------------------------------------------------------------------
# Encoder and decoder
# ---------------------------------------------------------------------------------------------------


class SEANetEncoder(nn.Module):
  """`(B, T) -> (B, ceil(T / hop), dimension)`, `hop = prod(ratios)`.

  Attributes (transformers' `EncodecConfig` names in brackets; EnCodec 24 kHz values after "="):
    num_filters [num_filters = 32], ratios [upsampling_ratios = (8, 5, 4, 2); the encoder strides
    are these reversed], dimension [hidden_size = 128], num_residual_layers [= 1], lstm_layers
    [num_lstm_layers = 2; 0 drops the LSTM], kernel_size / last_kernel_size [= 7],
    residual_kernel_size [= 3], dilation_growth_rate [= 2], compress [= 2], causal
    [use_causal_conv = True], pad_mode [= "reflect"].
  """

  num_filters: int
  ratios: Sequence[int]
  dimension: int
  num_residual_layers: int = 1
  lstm_layers: int = 2
  kernel_size: int = 7
  last_kernel_size: int = 7
  residual_kernel_size: int = 3
  dilation_growth_rate: int = 2
  compress: int = 2
  causal: bool = True
  pad_mode: str = "reflect"

  @nn.compact
  def __call__(self, waveform):
    conv = dict(causal=self.causal, pad_mode=self.pad_mode)
    h = CodecConv(self.num_filters, self.kernel_size, name="layers_0", **conv)(waveform[..., None])
    index, scale = 1, 1
    for ratio in reversed(tuple(self.ratios)):
      dim = scale * self.num_filters
      for j in range(self.num_residual_layers):
        h = ResnetBlock(
          dim,
          self.dilation_growth_rate**j,
          self.residual_kernel_size,
          self.compress,
          name=f"layers_{index}",
          **conv,
        )(h)
        index += 1
      h = CodecConv(2 * dim, 2 * ratio, ratio, name=f"layers_{index + 1}", **conv)(nn.elu(h))
      index += 2
      scale *= 2
    if self.lstm_layers:
      h = SkipLSTM(self.lstm_layers, name=f"layers_{index}")(h)
      index += 1
    return CodecConv(self.dimension, self.last_kernel_size, name=f"layers_{index + 1}", **conv)(
      nn.elu(h)
    )


class SEANetDecoder(nn.Module):
  """`(B, F, dimension) -> (B, F * hop)`: EnCodec's decoder (conv, optional skip-LSTM, per ratio
  [ELU, transposed conv of kernel 2 * ratio trimmed causally, residual blocks], ELU, conv to 1)."""

  num_filters: int
  ratios: Sequence[int]
  dimension: int
  num_residual_layers: int = 1
  lstm_layers: int = 2
  kernel_size: int = 7
  last_kernel_size: int = 7
  residual_kernel_size: int = 3
  dilation_growth_rate: int = 2
  compress: int = 2
  causal: bool = True
  pad_mode: str = "reflect"

  @nn.compact
  def __call__(self, latent):
    conv = dict(causal=self.causal, pad_mode=self.pad_mode)
    scale = 2 ** len(self.ratios)
    h = CodecConv(scale * self.num_filters, self.kernel_size, **conv)(latent)
    if self.lstm_layers:
      h = SkipLSTM(self.lstm_layers)(h)
    for ratio in self.ratios:
      dim = scale * self.num_filters // 2
      h = nn.ConvTranspose(dim, (2 * ratio,), strides=(ratio,), padding="VALID")(nn.elu(h))
      h = h[:, : h.shape[1] - ratio]  # causal trim of kernel - stride samples on the right
      for j in range(self.num_residual_layers):
        h = ResnetBlock(
          dim, self.dilation_growth_rate**j, self.residual_kernel_size, self.compress, **conv
        )(h)
      scale //= 2
    return CodecConv(1, self.last_kernel_size, **conv)(nn.elu(h))[..., 0]


# ---------------------------------------------------------------------------------------------------
# Residual vector quantization
# ---------------------------------------------------------------------------------------------------


def nearest(x: jax.Array, codebook: jax.Array) -> jax.Array:
  """Index of the nearest codeword (`(..., D)`, `(K, D)` -> int32 `(...)`), by the expression of
  EnCodec's `EuclideanCodebook.quantize` (`argmax -(|x|^2 - 2 x.e + |e|^2)`, first index on ties)."""
  dist = -(
    jnp.sum(jnp.square(x), -1, keepdims=True)
    - 2.0 * x @ codebook.T
    + jnp.sum(jnp.square(codebook), -1)
  )
  return jnp.argmax(dist, axis=-1).astype(jnp.int32)


def rvq_encode(x: jax.Array, codebooks: jax.Array, num: int) -> tuple[jax.Array, jax.Array]:
  """Tokens `(..., num)` of `x (..., D)` with the first `num` codebooks: each stage quantizes what the
  earlier stages left; also returns the quantized sum `(..., D)`."""
  residual, codes = x, []
  for i in range(num):
    idx = nearest(residual, codebooks[i])
    residual = residual - codebooks[i][idx]
    codes.append(idx)
  codes = jnp.stack(codes, axis=-1)
  return codes, rvq_decode(codes, codebooks)


def rvq_decode(codes: jax.Array, codebooks: jax.Array) -> jax.Array:
  """`sum_i codebooks[i][codes[..., i]]`: the quantized latent of tokens `(..., n)`."""
  return sum(codebooks[i][codes[..., i]] for i in range(codes.shape[-1]))


def embed_tokens(codes: jax.Array, codebooks: jax.Array) -> jax.Array:
  """Flow2GAN's token condition: the sum over codebooks of each token's codeword (the codec's own
  codebook vectors, as EnCodec-conditioned vocoders such as Vocos embed EnCodec tokens); the same
  vectors as `rvq_decode`, kept out of the gradient (the codebooks belong to the codec)."""
  return jax.lax.stop_gradient(rvq_decode(codes, codebooks))


def kmeans(x: jax.Array, k: int, iters: int, rng: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Lloyd's k-means of `x (N, D)`: `k` centroids drawn from the points (with replacement when
  `N < k`), `iters` rounds of assign-and-average (an empty cluster keeps its centroid); returns the
  centroids and their cluster sizes (EnCodec's `kmeans`, the codebook's lazy initialisation)."""
  n = x.shape[0]
  centroids = x[jax.random.choice(rng, n, (k,), replace=n < k)]

  def round_(centroids, _):
    onehot = jax.nn.one_hot(nearest(x, centroids), k, dtype=x.dtype)
    counts = onehot.sum(0)
    means = (onehot.T @ x) / jnp.maximum(counts, 1.0)[:, None]
    return jnp.where(counts[:, None] > 0, means, centroids), counts

  centroids, counts = jax.lax.scan(round_, centroids, None, length=iters)
  return centroids, counts[-1]


def ema_update(layer: dict, x: jax.Array, idx: jax.Array, decay: float, eps: float) -> dict:
  """One EnCodec codebook update from the batch `x (N, D)` assigned to `idx (N,)`: moving averages of
  the cluster sizes and of the per-cluster sums, and the codewords as their Laplace-smoothed ratio
  (`(n_k + eps) / (n + K eps) * n`), so each codeword moves toward the mean of its points."""
  k = layer["embed"].shape[0]
  onehot = jax.nn.one_hot(idx, k, dtype=x.dtype)
  cluster_size = decay * layer["cluster_size"] + (1.0 - decay) * onehot.sum(0)
  embed_avg = decay * layer["embed_avg"] + (1.0 - decay) * (onehot.T @ x)
  total = cluster_size.sum()
  smoothed = (cluster_size + eps) / (total + k * eps) * total
  return {
    "embed": embed_avg / smoothed[:, None],
    "embed_avg": embed_avg,
    "cluster_size": cluster_size,
  }


def expire_dead_codes(layer: dict, x: jax.Array, threshold: float, rng: jax.Array) -> dict:
  """Codewords whose moving-average cluster size is below `threshold` become random vectors of the
  batch (EnCodec's `expire_codes_`), so unused codewords rejoin the data."""
  k = layer["embed"].shape[0]
  samples = x[jax.random.randint(rng, (k,), 0, x.shape[0])]
  dead = layer["cluster_size"] < threshold
  return {**layer, "embed": jnp.where(dead[:, None], samples, layer["embed"])}


def init_rvq(num_quantizers: int, codebook_size: int, dimension: int) -> dict:
  """Empty codebooks awaiting k-means on the first batch (`inited` False)."""
  shape = (num_quantizers, codebook_size, dimension)
  return {
    "embed": jnp.zeros(shape),
    "embed_avg": jnp.zeros(shape),
    "cluster_size": jnp.zeros(shape[:2]),
    "inited": jnp.zeros((), jnp.bool_),
  }


def rvq_train(
  rvq: dict,
  z: jax.Array,
  active: jax.Array,
  rng: jax.Array,
  *,
  decay: float,
  eps: float,
  dead_threshold: float,
  kmeans_iters: int,
) -> tuple[jax.Array, jax.Array, dict, jax.Array]:
  """One training batch through the quantizer (EnCodec's `ResidualVectorQuantization.forward`).

  `z (B, F, D)`; the first `active` stages are used (a traced count: quantizer dropout). Per stage:
  k-means initialisation on the first batch, dead-code expiry, nearest codeword, commitment
  `mean |r - sg(q)|^2`, moving-average update (inactive stages keep their state). Returns the
  straight-through quantized latent `z + sg(q - z)`, the commitment loss (mean over active stages),
  the new state and the codes `(B, F, N)`.
  """
  num, k, _ = rvq["embed"].shape
  flat = jax.lax.stop_gradient(z.reshape(-1, z.shape[-1]))
  residual, quantized, commit, codes = flat, jnp.zeros_like(flat), 0.0, []
  new = {name: [] for name in ("embed", "embed_avg", "cluster_size")}
  init_rng, dead_rng = jax.random.split(rng)
  for i in range(num):
    layer = {name: rvq[name][i] for name in new}

    def init(layer, r=residual, i=i):
      embed, counts = kmeans(r, k, kmeans_iters, jax.random.fold_in(init_rng, i))
      return {"embed": embed, "embed_avg": embed * counts[:, None], "cluster_size": counts}

    layer = jax.lax.cond(rvq["inited"], lambda layer: layer, init, layer)
    layer = expire_dead_codes(layer, residual, dead_threshold, jax.random.fold_in(dead_rng, i))
    idx = nearest(residual, layer["embed"])
    q = layer["embed"][idx]
    on = i < active
    commit = commit + jnp.where(
      on, jnp.mean(jnp.square(z.reshape(flat.shape) - quantized - q)), 0.0
    )
    updated = ema_update(layer, residual, idx, decay, eps)
    for name in new:
      new[name].append(jnp.where(on, updated[name], layer[name]))
    quantized = quantized + jnp.where(on, q, 0.0)
    residual = residual - q
    codes.append(idx)
  state = {name: jnp.stack(v) for name, v in new.items()}
  state["inited"] = jnp.ones((), jnp.bool_)
  out = z + jax.lax.stop_gradient(quantized.reshape(z.shape) - z)
  codes = jnp.stack(codes, -1).reshape(*z.shape[:-1], num)
  return out, commit / active, state, codes
