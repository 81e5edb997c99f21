"""Speed of the chunked selective scan against sequential loops on CPU, measured side by side.

    .venv/bin/python benchmarks/bench_scan.py                 # L=512, batch 1, d_inner 256 (tiny BlackMamba), n 16
    .venv/bin/python benchmarks/bench_scan.py --batch 2 --d-inner 512 --threads 2

Three implementations, timed in the same process, interleaved repeat by repeat (so a load change hits all
three), warm-up excluded, median of the repeats:
  reference  `selective_scan_reference`: one Python step per position, written as mamba-ssm's
             `selective_scan_ref` (what Zyphra's BlackMamba code runs without CUDA). Its backward is slow
             beyond the Python steps: indexing position t of a (b, d, L, n) tensor makes autograd build a
             full-size gradient per step, O(L^2) memory traffic.
  loop       the same sequential loop written well (time-major, `unbind`, `addcmul`): what one step per
             position costs without that indexing penalty. Defined here only, as a fairer baseline.
  chunked    `selective_scan_chunked` (what tunecost runs on CPU): ~3*sqrt(L) Python steps.
Forward runs under no_grad; forward+backward backpropagates a sum. Wall-clock and process CPU time are both
printed: on a shared, busy CPU the wall clock also counts time spent waiting for a core, while with one
thread the CPU time stays close to what an idle machine's wall clock would show. Single-threaded by default:
on a shared CPU two threads spin-wait on each other (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from tunecost.models.blackmamba.scan import selective_scan_chunked, selective_scan_reference


def sequential_loop(u, delta, A, B, C, D, z=None, delta_bias=None, delta_softplus=True):
    """One step per position, without the reference's per-position indexing of 4-D tensors."""
    delta = delta + delta_bias[:, None] if delta_bias is not None else delta
    delta = F.softplus(delta) if delta_softplus else delta
    delta_t = delta.permute(2, 0, 1).unsqueeze(-1)  # (L, b, d, 1)
    decays = torch.exp(delta_t * A).unbind(0)
    drives = ((delta_t * u.permute(2, 0, 1).unsqueeze(-1)) * B.permute(2, 0, 1).unsqueeze(2)).unbind(0)
    readouts = C.permute(2, 0, 1).unsqueeze(-1).unbind(0)
    state = torch.zeros_like(drives[0])
    ys = []
    for decay, drive, readout in zip(decays, drives, readouts):
        state = torch.addcmul(drive, decay, state)
        ys.append(torch.matmul(state, readout).squeeze(-1))
    y = torch.stack(ys, dim=2) + u * D[:, None]
    return y * F.silu(z) if z is not None else y


IMPLEMENTATIONS = {"reference": selective_scan_reference, "loop": sequential_loop, "chunked": selective_scan_chunked}


def make_inputs(batch: int, d_inner: int, d_state: int, seqlen: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "u": torch.randn(batch, d_inner, seqlen, generator=g),
        "delta": torch.randn(batch, d_inner, seqlen, generator=g) * 0.5,
        "A": -torch.exp(torch.log(torch.arange(1, d_state + 1.0)).expand(d_inner, -1)),  # Mamba's S4D-real A
        "B": torch.randn(batch, d_state, seqlen, generator=g),
        "C": torch.randn(batch, d_state, seqlen, generator=g),
        "D": torch.ones(d_inner),
        "z": torch.randn(batch, d_inner, seqlen, generator=g),
        "delta_bias": torch.randn(d_inner, generator=g) * 0.5,
    }


def run_once_seconds(fn, inputs: dict[str, torch.Tensor], backward: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for one call."""
    args = {k: v.detach().requires_grad_(backward) for k, v in inputs.items()}
    wall, cpu = time.perf_counter(), time.process_time()
    with torch.set_grad_enabled(backward):
        out = fn(
            args["u"],
            args["delta"],
            args["A"],
            args["B"],
            args["C"],
            args["D"],
            z=args["z"],
            delta_bias=args["delta_bias"],
            delta_softplus=True,
        )
        if backward:
            out.sum().backward()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--d-inner", type=int, default=256)
    parser.add_argument("--d-state", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    inputs = make_inputs(args.batch, args.d_inner, args.d_state, args.seqlen)

    with torch.no_grad():  # sanity: all three compute the same thing
        outs = {
            name: fn(
                *(inputs[k] for k in ["u", "delta", "A", "B", "C", "D"]), z=inputs["z"], delta_bias=inputs["delta_bias"]
            )
            for name, fn in IMPLEMENTATIONS.items()
        }
    err = max((outs[name] - outs["reference"]).abs().max().item() for name in outs)

    print(
        f"selective scan on CPU: batch {args.batch}, d_inner {args.d_inner}, d_state {args.d_state}, "
        f"length {args.seqlen}; {args.threads} thread(s); load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs; median of {args.repeats} interleaved repeats after 1 warm-up; "
        f"max |difference| to the reference {err:.1e}"
    )
    header = f"{'reference':>11}{'loop':>11}{'chunked':>11}{'ref/chunked':>13}{'loop/chunked':>14}"
    print(f"{'pass':<18}{'clock':<7}{header}")
    for backward in (False, True):
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in IMPLEMENTATIONS}
        for repeat in range(args.repeats + 1):
            for name, fn in IMPLEMENTATIONS.items():
                seconds = run_once_seconds(fn, inputs, backward)
                if repeat:  # the first round is the warm-up
                    times[name].append(seconds)
        label = "forward+backward" if backward else "forward"
        for clock, index in (("wall", 0), ("cpu", 1)):
            med = {name: statistics.median(t[index] for t in ts) for name, ts in times.items()}
            print(
                f"{label:<18}{clock:<7}"
                + "".join(f"{med[n] * 1e3:>9.1f}ms" for n in IMPLEMENTATIONS)
                + f"{med['reference'] / med['chunked']:>12.1f}x{med['loop'] / med['chunked']:>13.1f}x"
            )


if __name__ == "__main__":
    main()
