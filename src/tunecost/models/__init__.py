"""Model implementations and builders (tiny random models for CPU, full-size ones on meta/GPU)."""
