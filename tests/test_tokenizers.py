"""Word- and character-level tokenizers, and the Markov-text corpus they read."""

import json
import math

import numpy as np
import pytest

from core.data import text, tokenizers

TEXTS = ["the cat sat on the mat", "the dog sat", "a cat and a dog"]


def test_special_tokens_come_first_in_every_tokenizer():
  for tokenizer in (tokenizers.WordTokenizer.fit(TEXTS), tokenizers.CharTokenizer.fit(TEXTS)):
    assert tokenizer.tokens[:5] == ["<pad>", "<bos>", "<eos>", "<unk>", "<mask>"]
    ids = [
      tokenizer.pad_id,
      tokenizer.bos_id,
      tokenizer.eos_id,
      tokenizer.unk_id,
      tokenizer.mask_id,
    ]
    assert ids == [0, 1, 2, 3, 4]


def test_word_and_char_round_trips():
  words = tokenizers.WordTokenizer.fit(TEXTS)
  chars = tokenizers.CharTokenizer.fit(TEXTS)
  for t in TEXTS:
    assert words.decode(words.encode(t, add_bos=True, add_eos=True)) == t
    assert chars.decode(chars.encode(t)) == t
  assert words.tokens[5] == "the"  # most frequent first
  assert words.encode("the zebra") == [words.ids["the"], tokenizers.UNK_ID]
  assert words.decode([1, 5, 2, 5]) == "the"  # skips specials, stops at <eos>
  assert words.decode([1, 5, 2, 5], skip_special=False, stop_at_eos=False) == "<bos> the <eos> the"
  assert tokenizers.WordTokenizer.fit(["A a"], lowercase=True).vocab_size == 6


def test_batches_are_right_padded_and_truncated():
  chars = tokenizers.CharTokenizer.fit(TEXTS)
  ids, lengths = chars.encode_batch(["ac", "the cat"], length=5, add_bos=True)
  assert ids.shape == (2, 5) and ids.dtype == np.int32
  np.testing.assert_array_equal(lengths, [3, 5])
  assert ids[0, 0] == tokenizers.BOS_ID and list(ids[0, 3:]) == [0, 0]
  assert chars.decode_batch(ids, lengths) == ["ac", "the "]
  with pytest.raises(ValueError, match="length must be positive"):
    chars.encode_batch(["a"], length=0)
  with pytest.raises(ValueError, match=r"ids must have shape \[batch, length\]"):
    chars.decode_batch(np.zeros(3, np.int32))
  with pytest.raises(ValueError, match="id 99 is outside the vocabulary"):
    chars.decode([99])


def test_json_round_trip_rebuilds_the_same_tokenizer():
  for tokenizer in (
    tokenizers.WordTokenizer.fit(TEXTS, lowercase=True),
    tokenizers.CharTokenizer.fit(TEXTS),
  ):
    payload = json.loads(json.dumps(tokenizer.to_json()))
    restored = tokenizers.from_json(payload)
    assert restored == tokenizer and type(restored) is type(tokenizer)
    assert restored.encode(TEXTS[0]) == tokenizer.encode(TEXTS[0])
  with pytest.raises(ValueError, match="kind must be one of \\['char', 'word'\\], got 'bpe'"):
    tokenizers.from_json({"kind": "bpe", "vocabulary": []})


def test_markov_chains_hit_their_entropy_and_batches_are_pure_functions_of_the_step():
  sources = text.markov_sources(16, (0.2, 0.6), seed=1)
  np.testing.assert_allclose(
    sources.entropy_rates, [0.2 * math.log(16), 0.6 * math.log(16)], rtol=1e-6
  )
  for s in range(2):
    pi = sources.stationary[s]
    np.testing.assert_allclose(pi @ sources.transitions[s], pi, atol=1e-10)
  data = text.MarkovText(sources, length=20, global_batch_size=8, seed=3)
  batch = data.batch(5)
  np.testing.assert_array_equal(batch["tokens"], data.batch(5)["tokens"])
  assert batch["tokens"].shape == (8, 21) and np.all(batch["tokens"][:, 0] == tokenizers.BOS_ID)
  assert not np.array_equal(batch["tokens"], data.batch(6)["tokens"])
  np.testing.assert_array_equal(data.batch(5, 1, 2)["tokens"], batch["tokens"][4:])
  words = tokenizers.WordTokenizer(text.symbol_words(16))
  line = " ".join(text.symbol_words(16)[s] for s in data.symbols(batch["tokens"])[0])
  np.testing.assert_array_equal(words.encode(line), batch["tokens"][0, 1:])


def test_mixture_likelihood_approaches_the_entropy_rate_on_long_sequences():
  sources = text.markov_sources(8, (0.3, 0.8), seed=0)
  long = text.MarkovText(sources, 2000, 64, seed=0).generate(0)
  per_token = -sources.mixture_log_likelihood(long["tokens"][:, 1:] - 5).mean() / 2000
  assert per_token == pytest.approx(sources.mixture_entropy_rate, rel=0.02)
