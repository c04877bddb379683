"""The LM demo end to end through the shared loop: results, resume, validation, tfds loading."""

import math
import os

import chex
import numpy as np
import pytest

from configs import lm as lm_config
from experiments import loop
from methods import lm
from methods.base import ConfigError

TIMINGS = ("tokens_per_second", "scoring_tokens_per_second")


def tiny_config():
  config = lm_config.get_config()
  config.data.update(seq_len=16, vocab_size=12)
  config.model.update(width=32, depth=1, num_heads=2, max_len=24)
  config.batch_size = 8
  config.steps = 6
  config.eval.update(batch_size=8, num_batches=2, num_samples=4, sample_length=8)
  config.loop.update(log_every=2, checkpoint_every=3)
  return config


def without_timings(results):
  return {k: v for k, v in results.items() if k not in TIMINGS}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """One uninterrupted run of `tiny_config()`, shared by the tests that read or compare it."""
  workdir = tmp_path_factory.mktemp("lm")
  return loop.run(tiny_config(), str(workdir)), workdir


def test_run_reports_losses_against_the_best_possible_and_samples(tiny_run):
  summary, workdir = tiny_run
  results = summary.results
  assert summary.step_traces == {"train": 1}
  positive = ("val_loss", "val_perplexity", "best_val_perplexity", "entropy_rate_perplexity")
  for key in positive + TIMINGS:
    assert math.isfinite(results[key]) and results[key] > 0, key
  assert results["val_perplexity"] == pytest.approx(math.exp(results["val_loss"]))
  best, val = results["best_val_perplexity"], results["val_perplexity"]
  assert results["entropy_rate_perplexity"] <= best < val
  assert np.shape(results["samples"]) == (4, 8) and len(results["val_loss_per_source"]) == 3
  assert os.path.exists(workdir / "samples.png")


def test_interrupted_run_resumes_to_the_same_results(tiny_run, tmp_path):
  whole = tiny_run[0].results
  with pytest.raises(loop.Interrupted):
    loop.run(tiny_config(), str(tmp_path / "cut"), should_stop=lambda phase, step: step == 4)
  resumed = loop.run(tiny_config(), str(tmp_path / "cut")).results
  chex.assert_trees_all_close(without_timings(resumed), without_timings(whole), rtol=1e-5)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("model.num_heads", 3, "config.model.num_heads: 3 must divide width 32"),
    ("model.num_kv_heads", 3, "config.model.num_kv_heads: 3 must divide num_heads 2"),
    ("model.max_len", 8, "config.model.max_len: 8 is shorter than data.seq_len 16"),
    ("eval.sample_length", 30, "config.eval.sample_length: prompt_length 1 \\+ sample_length 30"),
    ("model.mlp", "relu", "config.model.mlp: must be one of"),
    ("model.attention", "flash", "config.model.attention: must be one of"),
    ("data.entropy_fractions", (0.5, 1.5), "config.data.entropy_fractions: each must be in"),
    (
      "data.name",
      "tiny_shakespeare",
      "config.data.data_dir: not set; this variant reads tfds 'tiny_shakespeare'",
    ),
  ],
)
def test_bad_fields_are_named(field, value, message):
  config = tiny_config()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ConfigError, match=message):
    loop.validate(config, data_devices=1)


def tfds_config():
  config = lm_config.get_config("gpu")
  config.data.update(seq_len=8, data_dir="")
  config.batch_size = 4
  config.eval.update(batch_size=2, num_batches=2, prompt_length=2, sample_length=4)
  return config


def test_gpu_variant_reads_tfds_text_without_downloading():
  import tensorflow_datasets as tfds

  with tfds.testing.mock_data(num_examples=6):
    corpus = lm.tfds_corpus(tfds_config())
  batch = corpus.train.batch(3)
  assert batch["tokens"].shape == (4, 9) and batch["tokens"].dtype == np.int32
  np.testing.assert_array_equal(batch["tokens"], corpus.train.batch(3)["tokens"])
  assert corpus.val_tokens.shape == (4, 9)
  assert isinstance(corpus.tokenizer, lm.tokenizers.CharTokenizer)
  assert corpus.tokenizer.decode(batch["tokens"][0])  # decodes to text


def test_unprepared_tfds_data_names_the_data_dir(tmp_path):
  config = tfds_config()
  config.data.data_dir = str(tmp_path)
  with pytest.raises(ConfigError, match="config.data.data_dir: tfds dataset 'tiny_shakespeare'"):
    lm.tfds_corpus(config)
