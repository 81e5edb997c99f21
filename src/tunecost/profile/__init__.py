"""tunecost.profile: measure real MoE fine-tuning (paper §IV-B: Figs. 4, 5, 6, 8, 11, Table III).

Modules (nothing is imported here, so `import tunecost.profile` stays cheap):
- `sweep`: `SweepSpec`, `InputSpec`, `run_sweep(spec, out_dir)`: resumable sweeps over experts per token x
  sequence lengths (or a dataset) x batch sizes; the API behind `tunecost profile`.
- `point`: `measure_point`, `MeasureOptions`, `Workload`: one point (throughput, stages, layers, kernels, expert
  loads, memory, overhead).
- `model_setup`: `ModelSetup`, `build_training_model`, `prepare_method`.
- `loop`: `train_step` (forward / backward / optimizer timed by a clock), `make_optimizer`, `forward_only`.
- `timers`: `PerfCounterClock`, `CudaEventClock`, `StepTimes`.  `layers`: `LayerTimer` (per-layer forward,
  backward, recompute).  `expert_load`: `ExpertLoadCounter`.  `kernel_breakdown`: `profile_kernels`.
  `memory`: `PeakMemoryMeter`.  `inputs`: `BatchSource` and its makers.  `records`: rows and resumable files.
- `maxbatch`: `find_max_batch_size` (measured on CUDA, simulated on CPU), `search_max_batch_size`.
- `callback`: `TunecostCallback` for a user's own transformers `Trainer` / TRL run.
- `kernels`, `ranges`, `nvtx`, `instrument`, `ncu`, `gpu_counters` (+ its child process `counters_child`): the
  kernel taxonomy, range names, NVTX labels, labelling MoE blocks, and Nsight Compute counters.
"""
