"""tunecost.distributed: fine-tuning on several GPUs.

- `plan.ParallelPlan`: number of GPUs, GPUs per node, strategy, expert-parallel degree (validated).
- `sharded_step.simulate_fsdp_rank(job, world_size=N)`: one rank's step under PyTorch's real FSDP2
  (`fully_shard`) on fake tensors in a fake process group: per-rank peak memory by category and every collective.
- `measure.measure_fsdp_ranks(job)`: the same step on real CPU ranks over gloo (tiny models), for validation.
- `launch.launch_local_ranks(fn, args, nproc=N)`: N ranks on this machine, started as torchrun starts them.
- `ddp`: per-rank memory under DDP (one replica per rank plus gradient buckets) and its all-reduce buckets.
- `comm`: collective times from nccl-tests' bus-bandwidth definitions; `catalog.interconnects` has the links.
- `rank_memory`: memory per rank under ddp, zero1/2/3, fsdp2 (full shard, shard-grad-op) and hsdp, derived from
  the single-GPU simulated step (`single_step.SingleGpuStep`; checked against `sharded_step` on tiny models);
  `rank_reserve`: the rank's caching-allocator reserve, replayed per CUDA stream over the rank's allocations.
- `setups`: step time with exposed communication, throughput and cost per (GPU, strategy, number of GPUs); the
  fewest GPUs that fit and the cheapest setup (`tunecost estimate --gpus N|auto --strategy S`).

The FSDP2 fake run supports full fine-tuning and LoRA (frozen base weights are sharded too), not QLoRA (it needs
bitsandbytes' float quant storage for the 4-bit weights: `plan.check_fsdp2_method`); `rank_memory` derives QLoRA
as well.
"""
