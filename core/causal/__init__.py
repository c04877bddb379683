"""Causal estimators.

- `nuisance`: weighted nuisance learners (logistic, RFF ridge, linear ridge) and the nuisance cache.
- `frontdoor`: cross-fitted front-door learners FD-PI, FD-DR and FD-R with bootstrap intervals, and
  the user-facing `FrontDoorLearner` (Jung, ICLR 2026, arXiv 2509.22531).
"""
