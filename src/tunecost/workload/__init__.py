"""What job: the fine-tuning workload (model, method, batch shape) and the data it runs on."""

from tunecost.workload.job import FineTuneJob, LoraConfig

__all__ = ["FineTuneJob", "LoraConfig"]
