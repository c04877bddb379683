"""CLIP's byte-level BPE tokenizer, read from the `vocab.json` and `merges.txt` of its tokenizer folder.

The tokenizer of CLIP (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language
Supervision", ICML 2021, Sec. 2.4; github.com/openai/CLIP `clip/simple_tokenizer.py`) as transformers'
`CLIPTokenizer` builds it (`transformers/models/clip/tokenization_clip.py`) and as Stable Diffusion 1.5's
pipelines call it (`padding="max_length", max_length=77, truncation=True`), without the `tokenizers`
or `ftfy` packages. The folder is SD-1.5's `tokenizer/` or openai/clip-vit-large-patch14's.

  1. `<|startoftext|>` / `<|endoftext|>` written in the text are split out as their own ids.
  2. Normalise: NFC, every run of whitespace -> one space, lower-case.
  3. Words: the matches of CLIP's pattern `'s|'t|'re|'ve|'m|'ll|'d|\\p{L}+|\\p{N}|[^\\s\\p{L}\\p{N}]+`
     (runs of letters, single digits, runs of other non-space characters); whitespace is dropped.
  4. Each word's UTF-8 bytes in GPT-2's printable byte alphabet, the last symbol marked with `</w>`,
     merged by BPE (the lowest-ranked adjacent pair of `merges.txt` first, leftmost among equals,
     until none applies). A symbol not in the vocabulary becomes `<|endoftext|>` (the unknown
     token), which never happens with CLIP's own vocabulary (it holds every byte with and without
     `</w>`).
  5. Rows: `<|startoftext|>`, the first `length - 2` ids, `<|endoftext|>`, padded to `length` (77)
     with `<|endoftext|>`, SD-1.5's pad token.

`ftfy.fix_text` and HTML unescaping, which OpenAI's tokenizer applies first, are not applied, as in
transformers 5's `CLIPTokenizer` (the ids are tested against it); transformers 4's slow tokenizer,
which SD pipelines of that time loaded, applied them when `ftfy` was installed and otherwise spaced
out CJK characters, so such texts may differ from it. The pattern needs the `regex` package.
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np

from core.data.tokenizers import bytes_to_unicode

BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"  # also the pad and unknown token of SD-1.5's tokenizer
END_OF_WORD = "</w>"
CONTEXT_LENGTH = 77
WORD_PATTERN = (
  r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
)


class CLIPTokenizer:
  """`encode(texts) -> int32 [N, 77]` with CLIP's vocabulary (module docstring)."""

  def __init__(self, vocab: Mapping[str, int], merges: Sequence[str]):
    import regex

    self.vocab = dict(vocab)
    for token in (BOS_TOKEN, EOS_TOKEN):
      if token not in self.vocab:
        raise ValueError(f"CLIPTokenizer: vocab.json has no {token!r}")
    self.bos_id, self.eos_id = self.vocab[BOS_TOKEN], self.vocab[EOS_TOKEN]
    self.pad_id = self.unk_id = self.eos_id
    self.ranks: dict[tuple[str, str], int] = {}
    for rank, line in enumerate(merges):
      pair = tuple(line.split())
      if len(pair) != 2:
        raise ValueError(f"CLIPTokenizer: merges.txt line {rank + 1} is not a pair: {line!r}")
      self.ranks.setdefault(pair, rank)
    self._words = regex.compile(WORD_PATTERN)
    self._space = regex.compile(r"\s+")
    self._special = regex.compile(f"({regex.escape(BOS_TOKEN)}|{regex.escape(EOS_TOKEN)})")
    self._byte_chars = bytes_to_unicode()
    self._cache: dict[str, list[int]] = {}

  @classmethod
  def from_files(cls, path: str, merges_path: str | None = None) -> CLIPTokenizer:
    """From a tokenizer folder holding `vocab.json` and `merges.txt`, or from the two files'
    paths (`from_files(vocab_json, merges_txt)`); a `#version` first line of merges.txt is skipped."""
    if merges_path is None:
      vocab_path, merges_path = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
    else:
      vocab_path = path
    for file in (vocab_path, merges_path):
      if not os.path.isfile(file):
        raise FileNotFoundError(f"CLIPTokenizer: no such file {file!r}")
    with open(vocab_path, encoding="utf-8") as file:
      vocab = json.load(file)
    with open(merges_path, encoding="utf-8") as file:
      lines = [line.rstrip("\n") for line in file]
    merges = [line for line in lines if line.strip() and not line.startswith("#version")]
    return cls(vocab, merges)

  @property
  def vocab_size(self) -> int:
    return max(self.vocab.values()) + 1

  def tokenize(self, text: str) -> list[int]:
    """The ids of `text` without `<|startoftext|>` / `<|endoftext|>` around it."""
    ids = []
    for piece in self._special.split(text):
      if piece in (BOS_TOKEN, EOS_TOKEN):
        ids.append(self.vocab[piece])
        continue
      normal = self._space.sub(" ", unicodedata.normalize("NFC", piece)).lower()
      for word in self._words.findall(normal):
        ids.extend(self._bpe(word))
    return ids

  def encode(self, texts: Sequence[str], length: int = CONTEXT_LENGTH) -> np.ndarray:
    """`int32 [len(texts), length]`: BOS, the first `length - 2` ids, EOS, then EOS padding."""
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
      raise TypeError("CLIPTokenizer.encode: texts must be a list of strings")
    if length < 2:
      raise ValueError(f"CLIPTokenizer.encode: length must be >= 2, got {length}")
    out = np.full((len(texts), length), self.pad_id, np.int32)
    for row, text in enumerate(texts):
      ids = [self.bos_id, *self.tokenize(text)[: length - 2], self.eos_id]
      out[row, : len(ids)] = ids
    return out

  def _bpe(self, word: str) -> list[int]:
    if word in self._cache:
      return self._cache[word]
    symbols = [self._byte_chars[b] for b in word.encode("utf-8")]
    symbols[-1] += END_OF_WORD
    while len(symbols) > 1:
      ranked = [
        (self.ranks[pair], i)
        for i, pair in enumerate(zip(symbols, symbols[1:], strict=False))
        if pair in self.ranks
      ]
      if not ranked:
        break
      _, i = min(ranked)
      symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    ids = [self.vocab.get(symbol, self.unk_id) for symbol in symbols]
    self._cache[word] = ids
    return ids
