"""The report's figures: each a pure function from run records to a matplotlib figure and a caption, or
the reason it cannot be drawn (the section is then omitted with that line, never filled with placeholders).

Figure numbers refer to Xia et al., IISWC 2024.
"""

from __future__ import annotations

from tunecost.report.base import (  # re-exported: the figure API in one place
    LEGACY_NUM_EXPERTS,
    REQUIRED,
    FigureResult,
    Section,
    _config_labels,
    is_dense,
    routing_label,
)
from tunecost.report.costs import cost_chart
from tunecost.report.fig_multigpu import fig_cost_vs_gpus, fig_ranks
from tunecost.report.fig_plan import fig_plan
from tunecost.report.fig_profile import fig_counters, fig_expert_load, fig_kernels, fig_layers, fig_stages
from tunecost.report.fig_throughput import fig_max_batch, fig_throughput, fig_throughput_fit
from tunecost.report.fig_validation import fig_validation
from tunecost.report.fig_workload import fig_lengths, fig_trainability
from tunecost.report.run_dir import RunRecords


def table_costs(records: RunRecords) -> FigureResult | str:
    return cost_chart(records)


SECTIONS: tuple[Section, ...] = (
    Section("lengths", "Fig. 2 — Sequence lengths", fig_lengths),
    Section("trainability", "Fig. 3 — Accuracy per epoch, dense vs sparse", fig_trainability),
    Section("stages", "Fig. 4 — Forward / backward / optimizer", fig_stages),
    Section("layers", "Fig. 5 — Per-layer breakdown", fig_layers),
    Section("kernels", "Fig. 6 — MoE kernel breakdown", fig_kernels),
    Section("throughput", "Fig. 8 — Throughput vs batch size", fig_throughput),
    Section("counters", "Figs. 9 and 10 — SM and DRAM utilization", fig_counters),
    Section("expert_load", "Fig. 11 — Tokens per expert", fig_expert_load),
    Section("max_batch", "Fig. 13 and Table III — Maximum batch size", fig_max_batch),
    Section("fit", "Fig. 14 — Eq. (2) fitted to measured throughput", fig_throughput_fit),
    Section("costs", "Table IV — Cost per GPU and provider", table_costs),
    Section("validation", "Accuracy against published measurements", fig_validation),
    Section("multi_gpu", "Several GPUs — memory per rank and cost vs number of GPUs", fig_cost_vs_gpus),
    Section("ranks", "Several ranks — measured step and communication per rank", fig_ranks),
    Section("plan", "Plan — cost vs hours of every setup weighed, and the Pareto front", fig_plan),
)


__all__ = [
    "LEGACY_NUM_EXPERTS",
    "REQUIRED",
    "SECTIONS",
    "FigureResult",
    "Section",
    "_config_labels",
    "is_dense",
    "routing_label",
    "table_costs",
]
