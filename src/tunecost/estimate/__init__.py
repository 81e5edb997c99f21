"""tunecost.estimate: estimators of the largest batch and the throughput, and the cost tables built on them."""

# The estimator `tunecost estimate` uses unless told: the one that answers for every catalog GPU
# (docs/throughput-model.md compares it with the paper's eq. (2), which answers only where it was fitted).
DEFAULT_ESTIMATOR = "calibrated"
