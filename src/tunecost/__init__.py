"""tunecost: what will fine-tuning a large language model cost, and where does the time go.

Data flow: catalog (GPUs, prices, models) -> workload (the job) -> simulate / profile (memory, FLOPs,
time) -> estimate (fitted and analytical cost models) -> results (tidy records) -> report.
The CLI (`tunecost.cli`) is a thin layer over these modules.
"""

__version__ = "0.1.0"
