"""tunecost.distributed: fine-tuning on several GPUs.

- `plan.ParallelPlan`: number of GPUs, GPUs per node, strategy, expert-parallel degree (validated).
- `sharded_step.simulate_fsdp_rank(job, world_size=N)`: one rank's step under PyTorch's real FSDP2
  (`fully_shard`) on fake tensors in a fake process group: per-rank peak memory by category and every collective.
- `measure.measure_fsdp_ranks(job)`: the same step on real CPU ranks over gloo (tiny models), for validation.
- `ddp`: per-rank memory under DDP (one replica per rank plus gradient buckets) and its all-reduce buckets.
- `comm`: collective times from nccl-tests' bus-bandwidth definitions; `catalog.interconnects` has the links.

Supported: full fine-tuning and LoRA (frozen base weights are sharded under FSDP2 too). QLoRA under FSDP2 is not
supported (it needs bitsandbytes' float quant storage for the 4-bit weights).
"""
