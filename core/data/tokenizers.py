"""Word- and character-level tokenizers with special tokens, batch encoding and a JSON form.

Ids 0..4 are the special tokens `<pad>`, `<bos>`, `<eos>`, `<unk>`, `<mask>` (in that order, for every
tokenizer); the vocabulary follows. Unknown words or characters map to `<unk>`.

  WordTokenizer  splits on whitespace, joins with one space (optionally lower-cases first).
  CharTokenizer  one token per Unicode character, joined with nothing.

`encode_batch` pads on the RIGHT with `<pad>` and truncates to `length` (keeping the first tokens, as
`core/decoding.py` expects right-padded prompts) and returns the ids with each row's length. A
tokenizer is stored beside a checkpoint through `to_json()`, a JSON-serialisable dict (this module
writes no files), and read back with `from_json(dict)`.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence

import numpy as np

PAD, BOS, EOS, UNK, MASK = "<pad>", "<bos>", "<eos>", "<unk>", "<mask>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, MASK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID = range(len(SPECIAL_TOKENS))


class Tokenizer:
  """Shared behaviour; subclasses define `kind`, `split` and `join`."""

  kind = ""

  def __init__(self, vocabulary: Sequence[str]):
    vocabulary = [token for token in vocabulary if token not in SPECIAL_TOKENS]
    if len(set(vocabulary)) != len(vocabulary):
      raise ValueError("tokenizer: vocabulary has repeated tokens")
    self.tokens = list(SPECIAL_TOKENS) + vocabulary
    self.ids = {token: i for i, token in enumerate(self.tokens)}

  # -- what subclasses define ----------------------------------------------------------------------
  def split(self, text: str) -> list[str]:
    raise NotImplementedError

  def join(self, tokens: Sequence[str]) -> str:
    raise NotImplementedError

  def _options(self) -> dict:
    return {}

  # -- vocabulary -----------------------------------------------------------------------------------
  @classmethod
  def fit(cls, texts: Iterable[str], max_size: int | None = None, min_count: int = 1, **options):
    """A tokenizer over the tokens of `texts`: the `max_size` most frequent (ties by first
    appearance) with at least `min_count` occurrences."""
    probe = cls([], **options)
    counts = collections.Counter(token for text in texts for token in probe.split(text))
    vocabulary = [token for token, count in counts.most_common(max_size) if count >= min_count]
    return cls(vocabulary, **options)

  @property
  def vocab_size(self) -> int:
    return len(self.tokens)

  pad_id, bos_id, eos_id, unk_id, mask_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID

  # -- encoding -------------------------------------------------------------------------------------
  def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    ids = [self.ids.get(token, UNK_ID) for token in self.split(text)]
    return ([BOS_ID] if add_bos else []) + ids + ([EOS_ID] if add_eos else [])

  def decode(self, ids: Iterable[int], skip_special: bool = True, stop_at_eos: bool = True) -> str:
    """Text of `ids`; special tokens dropped (`skip_special`), nothing after the first `<eos>`."""
    tokens = []
    for i in ids:
      i = int(i)
      if not 0 <= i < len(self.tokens):
        raise ValueError(f"tokenizer: id {i} is outside the vocabulary of {len(self.tokens)}")
      if stop_at_eos and i == EOS_ID:
        break
      if skip_special and i < len(SPECIAL_TOKENS):
        continue
      tokens.append(self.tokens[i])
    return self.join(tokens)

  def encode_batch(
    self, texts: Sequence[str], length: int, add_bos: bool = False, add_eos: bool = False
  ) -> tuple[np.ndarray, np.ndarray]:
    """`(ids int32 [N, length], lengths int32 [N])`: right-padded with `<pad>`, truncated to `length`."""
    if length <= 0:
      raise ValueError(f"tokenizer: length must be positive, got {length}")
    ids = np.full((len(texts), length), PAD_ID, np.int32)
    lengths = np.zeros((len(texts),), np.int32)
    for row, text in enumerate(texts):
      encoded = self.encode(text, add_bos, add_eos)[:length]
      ids[row, : len(encoded)] = encoded
      lengths[row] = len(encoded)
    return ids, lengths

  def decode_batch(self, ids, lengths=None, skip_special: bool = True) -> list[str]:
    """Texts of the rows of `ids [N, L]`, each cut at its length (default: the whole row)."""
    ids = np.asarray(ids)
    if ids.ndim != 2:
      raise ValueError(f"tokenizer: ids must have shape [batch, length], got {ids.shape}")
    lengths = np.full(len(ids), ids.shape[1]) if lengths is None else np.asarray(lengths)
    return [self.decode(row[:n], skip_special) for row, n in zip(ids, lengths, strict=True)]

  # -- storage --------------------------------------------------------------------------------------
  def to_json(self) -> dict:
    """A JSON-serialisable description (store it beside a checkpoint; `from_json` reads it)."""
    return {
      "kind": self.kind,
      "special_tokens": list(SPECIAL_TOKENS),
      "vocabulary": self.tokens[len(SPECIAL_TOKENS) :],
      **self._options(),
    }

  def __eq__(self, other) -> bool:
    return isinstance(other, Tokenizer) and self.to_json() == other.to_json()

  def __repr__(self) -> str:
    return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class WordTokenizer(Tokenizer):
  """Whitespace-separated words."""

  kind = "word"

  def __init__(self, vocabulary: Sequence[str], lowercase: bool = False):
    self.lowercase = lowercase
    super().__init__(vocabulary)

  def split(self, text: str) -> list[str]:
    return (text.lower() if self.lowercase else text).split()

  def join(self, tokens: Sequence[str]) -> str:
    return " ".join(tokens)

  def _options(self) -> dict:
    return {"lowercase": self.lowercase}


class CharTokenizer(Tokenizer):
  """One token per character."""

  kind = "char"

  def split(self, text: str) -> list[str]:
    return list(text)

  def join(self, tokens: Sequence[str]) -> str:
    return "".join(tokens)


_KINDS = {cls.kind: cls for cls in (WordTokenizer, CharTokenizer)}


def from_json(payload: dict) -> Tokenizer:
  """The tokenizer that `to_json()` described."""
  kind = payload.get("kind")
  if kind not in _KINDS:
    raise ValueError(f"tokenizer: kind must be one of {sorted(_KINDS)}, got {kind!r}")
  if tuple(payload.get("special_tokens", SPECIAL_TOKENS)) != SPECIAL_TOKENS:
    raise ValueError(
      f"tokenizer: special_tokens must be {list(SPECIAL_TOKENS)}, got {payload['special_tokens']}"
    )
  options = {k: v for k, v in payload.items() if k not in ("kind", "special_tokens", "vocabulary")}
  return _KINDS[kind](payload["vocabulary"], **options)
