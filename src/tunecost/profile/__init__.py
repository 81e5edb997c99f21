"""tunecost.profile: measure real MoE fine-tuning (paper §IV-B: Figs. 4, 5, 6, 8, 11, Table III).

Sources and derivations: docs/profiling.md, section `tunecost.profile`.
"""
