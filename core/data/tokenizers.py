"""Word- and character-level tokenizers with special tokens, batch encoding and a JSON form.

Ids 0..4 are the special tokens `<pad>`, `<bos>`, `<eos>`, `<unk>`, `<mask>` (in that order, for every
tokenizer); the vocabulary follows. Unknown words or characters map to `<unk>`.

  WordTokenizer  splits on whitespace, joins with one space (optionally lower-cases first).
  CharTokenizer  one token per Unicode character, joined with nothing.

`ByteLevelBPETokenizer` (below) is of another kind: a pretrained model's own byte-level BPE read from
its Hugging Face `tokenizer.json`, with that file's ids and special tokens (not the five above).

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


# ---------------------------------------------------------------------------------------------------
# Byte-level BPE from a Hugging Face `tokenizer.json`
# ---------------------------------------------------------------------------------------------------

# The GPT-2 pre-tokenizer pattern (`ByteLevel` with `use_regex: true`).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's reversible map from the 256 byte values to printable characters (the alphabet of
  every byte-level BPE vocabulary: a space is `Ġ`, a newline `Ċ`)."""
  printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
  printable += list(range(ord("®"), ord("ÿ") + 1))
  chars, extra = {}, 0
  for byte in range(256):
    if byte in printable:
      chars[byte] = chr(byte)
    else:
      chars[byte] = chr(256 + extra)
      extra += 1
  return chars


class BPEFormatError(ValueError):
  """A `tokenizer.json` this reader does not cover; the message names the part."""


class ByteLevelBPETokenizer:
  """The byte-level BPE of a Hugging Face `tokenizer.json` (Llama 3, GPT-2, Qwen2 and others), read
  without the `tokenizers` package and giving the same ids for what it accepts.

  Covered: `normalizer` null or NFC; `pre_tokenizer` a `ByteLevel` (with or without its GPT-2
  regex), a `Split` with a regex and behaviour `Isolated`, or a `Sequence` of them; `model` a `BPE`
  without dropout, byte fallback or word prefixes/suffixes (`ignore_merges` honoured, merges as
  "a b" strings or pairs); added tokens split out of the text first (longest match, with their
  `lstrip`/`rstrip`); the `TemplateProcessing` post-processor's special tokens around a single
  sequence. Anything else (e.g. SentencePiece-style `Metaspace` files) raises `BPEFormatError`.
  The regexes need the `regex` package (Unicode classes such as `\\p{L}`).

  Ids are the file's own: `pad_id` is the end token (these vocabularies have no pad token; rows are
  cut by their lengths).
  """

  def __init__(self, payload: dict, eos_token: str | None = None):
    import regex

    self._regex = regex
    model = payload.get("model") or {}
    _check(model.get("type") == "BPE", "model.type", model.get("type"), "'BPE'")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
      _check(not model.get(key), f"model.{key}", model.get(key), "null")
    _check(not model.get("byte_fallback"), "model.byte_fallback", True, "false")
    self.vocab: dict[str, int] = dict(model["vocab"])
    self.ignore_merges = bool(model.get("ignore_merges", False))
    self.ranks: dict[tuple[str, str], int] = {}
    for rank, merge in enumerate(model.get("merges", [])):
      pair = tuple(merge.split(" ", 1)) if isinstance(merge, str) else tuple(merge)
      self.ranks.setdefault(pair, rank)
    self.added = {}
    for token in payload.get("added_tokens") or []:
      _check(not token.get("single_word"), "added_tokens.single_word", True, "false")
      self.added[token["content"]] = token
    self.nfc = _normalizer(payload.get("normalizer"))
    self.splits = _pre_tokenizers(payload.get("pre_tokenizer"))
    self.prefix, self.suffix = _template(payload.get("post_processor"), self)
    self.byte_chars = bytes_to_unicode()
    self.char_bytes = {c: b for b, c in self.byte_chars.items()}
    self.tokens = {i: t for t, i in self.vocab.items()}
    self.tokens.update({token["id"]: content for content, token in self.added.items()})
    self.vocab_size = max(self.tokens) + 1
    self._added_pattern = (
      regex.compile("|".join(regex.escape(c) for c in sorted(self.added, key=len, reverse=True)))
      if self.added
      else None
    )
    self._cache: dict[str, list[int]] = {}
    self.eos_id = self.token_id(eos_token) if eos_token else None
    self.pad_id = self.eos_id if self.eos_id is not None else 0

  @classmethod
  def from_file(cls, path: str, eos_token: str | None = None) -> ByteLevelBPETokenizer:
    import json

    with open(path, encoding="utf-8") as file:
      return cls(json.load(file), eos_token)

  def with_eos(self, eos_token: str) -> ByteLevelBPETokenizer:
    """A copy (sharing the tables) whose end and pad token is `eos_token`."""
    import copy

    out = copy.copy(self)
    out.eos_id = out.pad_id = self.token_id(eos_token)
    return out

  def token_id(self, token: str) -> int:
    if token in self.added:
      return self.added[token]["id"]
    if token not in self.vocab:
      raise KeyError(f"tokenizer: {token!r} is not a token of this vocabulary")
    return self.vocab[token]

  # -- encoding -------------------------------------------------------------------------------------
  def encode(self, text: str, add_special: bool = False) -> list[int]:
    """Ids of `text`; added tokens written in the text are recognised; `add_special` wraps them in
    the post-processor's template (e.g. Llama 3's `<|begin_of_text|>`)."""
    ids = []
    for piece, is_added in self._split_added(text):
      if is_added:
        ids.append(self.added[piece]["id"])
        continue
      if self.nfc:
        import unicodedata

        piece = unicodedata.normalize("NFC", piece)
      for word in self._pre_tokenize(piece):
        ids.extend(self._bpe(word))
    return (self.prefix + ids + self.suffix) if add_special else ids

  def _split_added(self, text: str):
    """`(piece, is_added)` in order; an added token's `lstrip`/`rstrip` eat the whitespace beside it."""
    if self._added_pattern is None:
      yield text, False
      return
    start = 0
    spans = []
    for match in self._added_pattern.finditer(text):
      token = self.added[match.group()]
      begin, end = match.span()
      spans.append((begin, end, token))
    for begin, end, token in spans:
      left = text[start:begin]
      if token.get("lstrip"):
        left = left.rstrip()
      if left:
        yield left, False
      yield token["content"], True
      start = end
      if token.get("rstrip"):
        while start < len(text) and text[start].isspace():
          start += 1
    if start < len(text):
      yield text[start:], False

  def _pre_tokenize(self, text: str) -> list[str]:
    """The pre-tokenizer's words, mapped to the byte alphabet."""
    words = [text]
    for kind, pattern in self.splits:
      if kind == "prefix_space":
        words = [w if w.startswith(" ") else " " + w for w in words]
      elif kind == "split":
        words = [piece for w in words for piece in _isolate(self._regex, pattern, w)]
    return ["".join(self.byte_chars[b] for b in w.encode("utf-8")) for w in words if w]

  def _bpe(self, word: str) -> list[int]:
    """Merges the lowest-ranked adjacent pair (leftmost among equals) until none applies, as the
    `tokenizers` BPE model does."""
    if word in self._cache:
      return self._cache[word]
    if self.ignore_merges and word in self.vocab:
      ids = [self.vocab[word]]
    else:
      parts = list(word)
      while len(parts) > 1:
        ranked = [
          (self.ranks.get(pair, -1), i)
          for i, pair in enumerate(zip(parts, parts[1:], strict=False))
        ]
        ranked = [(rank, i) for rank, i in ranked if rank >= 0]
        if not ranked:
          break
        _, i = min(ranked)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
      missing = [p for p in parts if p not in self.vocab]
      if missing:
        raise BPEFormatError(f"tokenizer.json: symbol {missing[0]!r} is not in model.vocab")
      ids = [self.vocab[p] for p in parts]
    self._cache[word] = ids
    return ids

  def encode_batch(
    self, texts: Sequence[str], length: int, add_special: bool = False, keep: str = "first"
  ) -> tuple[np.ndarray, np.ndarray]:
    """`(ids int32 [N, length], lengths int32 [N])`, right-padded with `pad_id`; rows longer than
    `length` keep their first (`keep="first"`) or last (`keep="last"`) `length` ids."""
    if length <= 0:
      raise ValueError(f"tokenizer: length must be positive, got {length}")
    if keep not in ("first", "last"):
      raise ValueError(f"tokenizer: keep must be 'first' or 'last', got {keep!r}")
    ids = np.full((len(texts), length), self.pad_id, np.int32)
    lengths = np.zeros((len(texts),), np.int32)
    for row, text in enumerate(texts):
      encoded = self.encode(text, add_special)
      encoded = encoded[:length] if keep == "first" else encoded[-length:]
      ids[row, : len(encoded)] = encoded
      lengths[row] = len(encoded)
    return ids, lengths

  # -- decoding -------------------------------------------------------------------------------------
  def token_bytes(self, token_id: int) -> bytes:
    """The UTF-8 bytes one id stands for (an added token's content as text)."""
    token = self.tokens.get(int(token_id))
    if token is None:
      raise ValueError(f"tokenizer: id {token_id} is outside the vocabulary")
    if token in self.added:
      return token.encode("utf-8")
    return bytes(self.char_bytes[c] for c in token)

  def decode(self, ids: Iterable[int], skip_special: bool = True, stop_at_eos: bool = True) -> str:
    """Text of `ids` (the `ByteLevel` decoder); special added tokens dropped with `skip_special`."""
    out = b""
    for i in ids:
      i = int(i)
      if stop_at_eos and i == self.eos_id:
        break
      token = self.tokens.get(i)
      if skip_special and token in self.added and self.added[token].get("special"):
        continue
      out += self.token_bytes(i)
    return out.decode("utf-8", errors="replace")

  def ids_containing(self, text: str) -> tuple[int, ...]:
    """Every id whose text contains `text` (e.g. the ends of a reasoning step at "\\n")."""
    needle = text.encode("utf-8")
    return tuple(i for i in sorted(self.tokens) if needle in self.token_bytes(i))

  def __repr__(self) -> str:
    return f"ByteLevelBPETokenizer(vocab_size={self.vocab_size})"


def _check(ok: bool, part: str, value, expected: str) -> None:
  if not ok:
    raise BPEFormatError(f"tokenizer.json: {part} is {value!r}; this reader needs {expected}")


def _normalizer(spec) -> bool:
  """True for NFC, False for none."""
  if spec is None:
    return False
  kind = spec.get("type")
  if kind == "Sequence" and not spec.get("normalizers"):
    return False
  _check(kind == "NFC", "normalizer.type", kind, "null or 'NFC'")
  return True


def _pre_tokenizers(spec) -> list[tuple[str, str | None]]:
  """The pre-tokenizer as steps `("prefix_space", None)` / `("split", pattern)`."""
  if spec is None:
    return []
  items = spec["pretokenizers"] if spec.get("type") == "Sequence" else [spec]
  steps = []
  for item in items:
    kind = item.get("type")
    if kind == "Split":
      _check(item.get("behavior") == "Isolated", "Split.behavior", item.get("behavior"), "Isolated")
      _check(not item.get("invert"), "Split.invert", item.get("invert"), "false")
      pattern = item.get("pattern", {})
      if "Regex" in pattern:
        steps.append(("split", pattern["Regex"]))
      else:
        import regex

        steps.append(("split", regex.escape(pattern["String"])))
    elif kind == "ByteLevel":
      if item.get("add_prefix_space"):
        steps.append(("prefix_space", None))
      if item.get("use_regex", True):
        steps.append(("split", GPT2_PATTERN))
    else:
      _check(False, "pre_tokenizer.type", kind, "'ByteLevel', 'Split' or a Sequence of them")
  return steps


def _isolate(regex, pattern: str, text: str) -> list[str]:
  """`Split` with behaviour `Isolated`: every match and every gap between matches is a piece."""
  pieces, start = [], 0
  for match in regex.finditer(pattern, text):
    if match.start() > start:
      pieces.append(text[start : match.start()])
    if match.end() > match.start():
      pieces.append(match.group())
    start = match.end()
  if start < len(text):
    pieces.append(text[start:])
  return pieces


def _template(spec, tokenizer) -> tuple[list[int], list[int]]:
  """The special-token ids before and after a single sequence (`TemplateProcessing`)."""
  if spec is None:
    return [], []
  items = spec["processors"] if spec.get("type") == "Sequence" else [spec]
  for item in items:
    if item.get("type") == "TemplateProcessing":
      before, after, seen = [], [], False
      for part in item["single"]:
        if "Sequence" in part:
          seen = True
        else:
          token = part["SpecialToken"]["id"]
          ids = item.get("special_tokens", {}).get(token, {}).get("ids") or [
            tokenizer.token_id(token)
          ]
          (after if seen else before).extend(ids)
      return before, after
    _check(
      item.get("type") in ("ByteLevel",),
      "post_processor.type",
      item.get("type"),
      "'ByteLevel', 'TemplateProcessing' or a Sequence of them",
    )
  return [], []
