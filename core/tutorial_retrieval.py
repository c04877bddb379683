"""Reasoning-aware tutorial retrieval of R-WoM (Mei et al., ICLR 2026, Sec. 3, Eq. 9): first-stage
lexical retrieval of top-k chunks, query rewriting, and reranking.

  LexicalIndex    Okapi BM25 (Robertson & Zaragoza 2009) over whitespace tokens, `bm25s`
                  (Lucene variant: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), term score
                  idf * tf / (tf + k1 (1 - b + b |d| / avgdl)), k1 = 1.5, b = 0.75 its defaults);
                  ties broken by document index.
  rewrite_query   the paper's de-contextualising rewrite, here a table from the user's words to the
                  corpus's canonical names (words it does not know stay as they are).
  rerank          the paper's listwise LLM reranker E = f_rank(C_k, q), here a re-scoring of the
                  first stage's top-k by exact match of the query's key fields (app, version, setting)
                  in each chunk, ties broken by the BM25 score.
  recall_at       Recall@k of a ranking against gold documents (paper Fig. 3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import bm25s
import numpy as np


class LexicalIndex:
  """A `bm25s` BM25 index over whitespace-tokenised `documents`; `scores(query)` is
  `[num_documents]`."""

  def __init__(self, documents: Sequence[str], k1: float = 1.5, b: float = 0.75):
    if not documents:
      raise ValueError("LexicalIndex: documents must not be empty")
    self.num_documents = len(documents)
    self.index = bm25s.BM25(k1=k1, b=b, method="lucene")
    self.index.index([doc.split() for doc in documents], show_progress=False)

  def scores(self, query: str) -> np.ndarray:
    return np.asarray(self.index.get_scores(query.split()), np.float32)

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
