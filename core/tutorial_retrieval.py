"""Reasoning-aware tutorial retrieval of R-WoM (Mei et al., ICLR 2026, Sec. 3, Eq. 9): first-stage
lexical retrieval of top-k chunks, query rewriting, and reranking.

  Bm25            Okapi BM25 (Robertson & Zaragoza 2009) over whitespace tokens in numpy: the Lucene /
                  bm25s form, idf = ln(1 + (N - df + 0.5) / (df + 0.5)), term score
                  idf * tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl)), k1 = 1.5, b = 0.75 (bm25s'
                  defaults). Written here because `bm25s` is not a dependency of this repository.
  rewrite_query   the paper's de-contextualising rewrite, here a table from the user's words to the
                  corpus's canonical names (words it does not know stay as they are).
  rerank          the paper's listwise LLM reranker E = f_rank(C_k, q), here a re-scoring of the
                  first stage's top-k by exact match of the query's key fields (app, version, setting)
                  in each chunk, ties broken by the BM25 score.
  recall_at       Recall@k of a ranking against gold documents (paper Fig. 3).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

import numpy as np


class Bm25:
  """A BM25 index over `documents`; `scores(query)` is `[num_documents]`."""

  def __init__(self, documents: Sequence[str], k1: float = 1.5, b: float = 0.75):
    if not documents:
      raise ValueError("Bm25: documents must not be empty")
    self.k1, self.b = k1, b
    counts = [collections.Counter(doc.split()) for doc in documents]
    self.vocab = {w: i for i, w in enumerate(sorted({w for c in counts for w in c}))}
    tf = np.zeros((len(documents), len(self.vocab)), np.float32)
    for row, c in enumerate(counts):
      for word, n in c.items():
        tf[row, self.vocab[word]] = n
    lengths = tf.sum(1, keepdims=True)
    df = (tf > 0).sum(0)
    n = len(documents)
    self.idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5)).astype(np.float32)
    norm = k1 * (1.0 - b + b * lengths / lengths.mean())
    self.weights = self.idf * tf * (k1 + 1.0) / (tf + norm)  # [D, V]

  def scores(self, query: str) -> np.ndarray:
    ids = [self.vocab[w] for w in query.split() if w in self.vocab]
    return self.weights[:, ids].sum(1) if ids else np.zeros(len(self.weights), np.float32)

  def top_k(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and scores of the `k` best documents (stable: ties by index)."""
    scores = self.scores(query)
    order = np.argsort(-scores, kind="stable")[:k]
    return order, scores[order]


def rewrite_query(query: str, table: Mapping[str, str]) -> str:
  """Each word of `query` replaced by `table[word]` when the table knows it."""
  return " ".join(table.get(word, word) for word in query.split())


def rerank(
  candidates: np.ndarray,
  first_stage: np.ndarray,
  documents: Sequence[str],
  keys: Sequence[str],
) -> np.ndarray:
  """`candidates` reordered by how many of the query's `keys` each document contains (all its words
  are matched exactly), then by the first-stage score."""
  hits = np.array([sum(k in documents[c].split() for k in keys) for c in candidates], np.float32)
  order = np.lexsort((-np.asarray(first_stage), -hits))
  return np.asarray(candidates)[order]


def recall_at(rankings: np.ndarray, gold: np.ndarray, k: int) -> float:
  """Share of rows whose gold document is among the first `k` of its ranking `[N, >= k]`."""
  return float(np.mean(np.any(np.asarray(rankings)[:, :k] == np.asarray(gold)[:, None], axis=1)))
