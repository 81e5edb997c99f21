"""tunecost.distributed: fine-tuning on several GPUs.

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed`.
"""
