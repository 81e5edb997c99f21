"""tunecost.train: the trainability experiment (fine-tune, evaluate per epoch, dense vs sparse)."""
