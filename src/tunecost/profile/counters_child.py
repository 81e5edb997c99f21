"""The child process of `tunecost gpu-counters`: build the model, label its MoE blocks, train a few steps.

The parent (`tunecost.profile.gpu_counters`) starts one child per batch size, under ncu or alone, as
`python -m tunecost.profile.counters_child SPEC` where SPEC is one JSON object (`child_command`: the mode, the
batch size and the `GpuCountersJob`): this is a process boundary, not a command line for people (that is
`tunecost gpu-counters`). A child that fails prints one `error: ...` line on stderr and exits 2; in mode
"torch-profiler" it writes its kernel rows to `rows_out` (JSON lines).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from tunecost.errors import TunecostError
from tunecost.io import atomic_write_text
from tunecost.moe.ranges import RANGE_PREFIX, is_moe_work
from tunecost.profile.gpu_counters import CHILD_MODULE, GpuCountersJob
from tunecost.profile.instrument import instrument_model
from tunecost.profile.kernels import classify_cpu_op, classify_kernel
from tunecost.profile.model_setup import build_training_model
from tunecost.profile.ncu import KernelCounterRow

_SPEC_KEYS = frozenset({"counters", "batch_size", "mode", "device"})


# --- rows from torch.profiler (the fallback, and CPU runs) ----------------------------------------------------


def _range_stack(event: Any) -> tuple[str, ...]:
    names = []
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(RANGE_PREFIX):
            names.append(parent.name)
        parent = parent.cpu_parent
    return tuple(reversed(names))


def profiler_rows(events: Iterable[Any], *, batch_size: int | None, kernels: bool) -> list[KernelCounterRow]:
    """Kernel rows from torch.profiler events, restricted (like the ncu filter) to MoE work (`is_moe_work`).

    `kernels=True` (CUDA): one row per device kernel, attached to the CPU op that launched it, classified with
    `classify_kernel`. `kernels=False` (CPU): one row per CPU op with its self time (nested ops are not counted
    twice), classified with `classify_cpu_op`. Utilization is not measured here: sm_pct/dram_pct are None.
    """
    rows = []
    for event in events:
        if event.name.startswith(RANGE_PREFIX) or str(getattr(event, "device_type", "CPU")).split(".")[-1] != "CPU":
            continue
        stack = _range_stack(event)
        if not is_moe_work(stack):
            continue
        if kernels:
            for kernel in getattr(event, "kernels", ()):
                if kernel.name.startswith(RANGE_PREFIX) or kernel.duration <= 0:
                    continue
                rows.append(
                    profiler_row(
                        kernel.name, classify_kernel(kernel.name, stack), stack, kernel.duration * 1e-6, batch_size
                    )
                )
        elif event.self_cpu_time_total > 0:
            rows.append(
                profiler_row(
                    event.name, classify_cpu_op(event.name, stack), stack, event.self_cpu_time_total * 1e-6, batch_size
                )
            )
    return rows


def profiler_row(
    name: str, cls: str, stack: tuple[str, ...], seconds: float, batch_size: int | None
) -> KernelCounterRow:
    """A kernel (or CPU op) timed by torch.profiler: no utilization counters."""
    return KernelCounterRow(
        kernel_name=name,
        kernel_class=cls,
        nvtx_ranges=stack,
        duration_s=seconds,
        sm_pct=None,
        dram_pct=None,
        mem_pct=None,
        batch_size=batch_size,
        source="torch.profiler",
    )


# --- the child: build, label, train a few steps ----------------------------------------------------------------


def run_child(
    job: GpuCountersJob, batch_size: int, *, mode: str = "steps", device: str | None = None
) -> list[KernelCounterRow]:
    """Build the model (`GpuCountersJob.model_setup`), train `warmup_steps` unlabelled then `steps` labelled steps
    of `batch_size` random queries; with mode "torch-profiler", return the kernel rows."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    setup = job.model_setup(device=device)
    net = build_training_model(setup).model
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    vocab = net.config.vocab_size
    ids = torch.randint(0, vocab, (batch_size, job.job.worst_case_seq_len), device=device)

    def step() -> None:
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(job.warmup_steps):
        step()
    sync()
    with instrument_model(net, job.layers):
        if mode != "torch-profiler":
            for _ in range(job.steps):
                step()
            sync()
            return []
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        with profile(activities=activities) as prof:
            for _ in range(job.steps):
                step()
            sync()
    return profiler_rows(prof.events(), batch_size=batch_size, kernels=device.startswith("cuda"))


def main(argv: Sequence[str]) -> int:
    """Run the child described by the JSON spec in `argv` (see `child_command`); 0 on success, 2 on an error."""
    try:
        if len(argv) != 1:
            raise TunecostError(f"{CHILD_MODULE} takes one JSON spec; run `tunecost gpu-counters` instead")
        try:
            spec = json.loads(argv[0])
        except json.JSONDecodeError as exc:
            raise TunecostError(f"{CHILD_MODULE}: the spec is not JSON: {exc}") from None
        if not isinstance(spec, dict):
            raise TunecostError(f"{CHILD_MODULE}: the spec must be a JSON object")
        rows_out = spec.pop("rows_out", None)
        unknown = sorted(set(spec) - _SPEC_KEYS)
        if unknown:
            raise TunecostError(f"{CHILD_MODULE}: unknown spec keys {unknown}")
        job = GpuCountersJob.from_dict(spec.pop("counters", {}))
        rows = run_child(job, **spec)
    except (TunecostError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if rows_out:
        atomic_write_text(rows_out, "".join(json.dumps(r.to_dict()) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
