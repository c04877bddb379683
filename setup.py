"""Installs the codebase: `pip install -e .` makes core, methods, kernels, experiments importable."""

import setuptools

# tfds's audio features import TensorFlow; the CPU build where PyPI has one
_TENSORFLOW = [
  "tensorflow-cpu>=2.20; platform_machine == 'x86_64'",
  "tensorflow>=2.20; platform_machine != 'x86_64'",
]

setuptools.setup(
  name="iclr26-jax",
  version="0.1.0",
  description="JAX implementations of nineteen ICLR 2026 methods behind one launcher.",
  python_requires=">=3.11",
  packages=setuptools.find_packages(
    include=["core*", "methods*", "kernels*", "experiments*", "configs*"]
  ),
  install_requires=[
    "jax>=0.10.2,<0.13",
    "flax>=0.12",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12",
    "chex>=0.1.92",
    "ml-collections>=1.1",
    "absl-py>=2.5",
    "tensorflow-datasets>=4.9.10",
    "array-record>=0.8",
    "numpy>=1.26",
    "scikit-learn>=1.4",  # ships the digits data of the default configs
    "matplotlib>=3.8",  # study figures and sample grids
    "tensorboardX>=2.6",  # TensorBoard event files without TensorFlow
    "gymnax>=1.0.1,<1.1",  # jittable, vmappable CartPole/Acrobot for the RL methods
    "safetensors>=0.4",  # reads converted Latte checkpoints (bwcache's gpu variant)
    "dm-pix>=0.4.5",  # PSNR and SSIM of generated images and videos
    "rlax>=0.1.8",  # the clipped surrogate of PPO
    "ott-jax>=0.6.0,<0.7",  # unbalanced Sinkhorn of the multimodal distribution-coherence loss
    "h5py>=3.10",  # reads the Spiking Heidelberg Digits files (dgn_snn's gpu variant)
    "scipy>=1.11",  # sparse graph algorithms (fgl), special functions
    "regex>=2023.0",  # Unicode classes of tokenizer.json pre-tokenizers (token_guard's gpu variant)
    "bm25s>=0.3.16",  # BM25 first-stage tutorial retrieval (rwom)
  ],
  extras_require={
    # librosa: the reference of the mel filterbank test (flow2gan). TensorFlow: tfds's Audio feature
    # needs it to build the LibriTTS reader of flow2gan's gpu variant, whose mock-data test runs with it
    # PyAV: writes and reads the small mp4 of marc's video-reader tests. pytest-xdist: the default
    # suite runs one worker per core (pyproject.toml), each test file in one worker
    "test": ["pytest>=8", "pytest-xdist>=3.5", "librosa>=0.10", "av>=14", *_TENSORFLOW],
    # reads video files (FFmpeg through PyAV: marc's gpu variant, core/data/video_files.py)
    "video": ["av>=14"],
    # reads tfds audio datasets (LibriTTS: flow2gan's gpu variant)
    "audio_data": _TENSORFLOW,
    # PESQ of flow2gan's benchmark (skipped without it; builds a C extension from its sdist)
    "audio_metrics": ["pesq>=0.0.4"],
    # Side by side with the implementations the field uses, never needed by the package itself:
    # experiments/bench_peers.py and tests/test_peers.py (the shared transformer beside Hugging Face
    # transformers on the same Llama-layout model), experiments/peers/ (the papers' official code from
    # a checkout: LightGBM and PyYAML for RegMix's regression and mixture synthesis)
    "peers": ["torch>=2.4", "transformers>=4.45", "lightgbm>=4.7", "pyyaml>=6"],
    # Front-door study's external baselines and the parity check with the author's package.
    "frontdoor": ["econml==0.17.0", "doubleml==0.11.4", "fd-cate==0.1.1"],
  },
)
