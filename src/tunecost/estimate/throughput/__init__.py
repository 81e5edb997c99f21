"""tunecost.estimate.throughput: the cross-GPU throughput model.

Counts per op class, roofline step time, calibration and validation.
"""
