"""`tunecost calibrate-gpu`: microbenchmarks of this device, written as a GPU profile for the throughput model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunecost import __version__
from tunecost.cli.common import cli_errors, err_console, print_json, print_table
from tunecost.cli.options import Device, Force, JsonOut, opt
from tunecost.errors import TunecostError


def _si(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("FLOP/s", "bytes/s"):
        return f"{value / 1e12:.2f} T{unit}" if value >= 1e11 else f"{value / 1e9:.2f} G{unit}"
    if unit == "s":
        return f"{value * 1e6:.1f} µs"
    return f"{value:.1f} {unit}"


@cli_errors
def calibrate_gpu(
    out: Annotated[Path, opt("--out", "GPU profile to write (JSON); an existing file needs --force.")],
    device: Device = "auto",
    quick: Annotated[bool, opt("--quick", "Smaller shapes and fewer repeats (seconds; for tests).")] = False,
    force: Force = False,
    json_out: JsonOut = False,
) -> None:
    """Measure what this device achieves (about a minute on a GPU) and write a GPU profile.

    GEMMs (a large square one for the peak; the expert loop's small-M shapes, Mixtral-8x7B's K=4096, N=14336 on
    CUDA), fp32 GEMM, NF4 de-quantization (bitsandbytes), element-wise bandwidth, kernel-launch host time and the
    host time of an empty training step. bf16 on CUDA, fp32 on CPU (smaller shapes). The throughput model uses the
    profile instead of the catalog's datasheet values.
    """
    from tunecost.estimate.throughput.gpu_profile import profile_document, write_gpu_profile
    from tunecost.profile.gpu_bench import run_gpu_bench
    from tunecost.results.meta import command_line, device_info, run_metadata

    if out.exists() and not force:  # before a minute of measuring, not after
        raise TunecostError(f"{out} already exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)

    def progress(label: str) -> None:
        err_console.print(f"calibrate-gpu: {label}", highlight=False)

    result = run_gpu_bench(device, quick=quick, on_progress=progress)
    meta = {
        "created": run_metadata(device=result.device)["created"],
        "device": device_info(result.device),
        "tool_version": __version__,
        "command": command_line(),
        "methods": {k: m.method for k, m in result.values.items()},
        "gemms": [
            {"rows": g.rows, "k": g.k, "n": g.n, "seconds": g.seconds, "flops_per_s": g.flops_per_s}
            for g in result.gemms
        ],
        "quick": quick,
    }
    terms = result.terms(source=f"profile: {out.name} measured {meta['created']} on {result.device_name}")
    write_gpu_profile(out, terms, meta, overwrite=force)
    err_console.print(f"calibrate-gpu: wrote {out} ({result.seconds:.1f} s)", highlight=False)
    if json_out:
        print_json(profile_document(terms, meta))
        return
    print_table(
        f"GPU profile of {result.device_name} ({result.device}, GEMMs in {result.dtype})",
        ["term", "value", "how"],
        [(k, _si(m.value, m.unit), m.method) for k, m in result.values.items()],
        caption=f"written to {out}; FLOP/s and bytes/s in SI units (T = 10^12, G = 10^9)",
    )


def register(app: typer.Typer) -> None:
    app.command("calibrate-gpu")(calibrate_gpu)
