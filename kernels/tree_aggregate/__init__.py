"""Linear-time all-pairs aggregation over rooted trees (FGL's tree aggregator, Theorem 1 and Eq. 7-8).

`tree_aggregate(x, parent, weight_up, weight_down=None, *, normalize=False, implementation=None)`;
implementations "xla" (level-synchronous), "sequential" and "pallas"; `reference.py` holds the dense
O(n^2) path-product reference and `bench.py` the linear-vs-quadratic timing.
"""

from kernels.tree_aggregate.api import IMPLEMENTATIONS, default_implementation, tree_aggregate

__all__ = ["IMPLEMENTATIONS", "default_implementation", "tree_aggregate"]
