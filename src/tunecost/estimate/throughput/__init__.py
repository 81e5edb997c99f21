"""tunecost.estimate.throughput: the cross-GPU throughput model (counts per op class, roofline step time, calibration, validation)."""
