"""`tunecost profile`: measure MoE fine-tuning (throughput, stages, layers, kernels, expert load, memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tunecost.catalog.datasets import get_dataset_facts
from tunecost.cli.commands.profile_ranks import RankRun, run_rank_profile
from tunecost.cli.common import (
    cli_errors,
    console,
    counted_columns,
    err_console,
    print_json,
    print_table,
    progress_bar,
    split_list,
)
from tunecost.cli.jobconfig import ConfigFiles, on_command_line
from tunecost.cli.options import (
    Device,
    ExpertsImpl,
    JsonOut,
    MaxLength,
    MethodName,
    ModelName,
    NoCheckpointing,
    RandomWeights,
    Template,
    Tokenizer,
    count_option,
    opt,
)
from tunecost.errors import TunecostError
from tunecost.limits import (
    MAX_BATCH_SIZE,
    MAX_LAYERS,
    MAX_NPROC_PER_NODE,
    MAX_QUERIES,
    MAX_SEQ_LEN,
    MAX_STEPS,
    check_count,
)
from tunecost.profile.threads import prepare_cpu_threads
from tunecost.units import BYTES_PER_GIB as _GIB
from tunecost.workload.known_datasets import canonical_name

TOP_K_HELP = "Top-k values to sweep, a comma list, e.g. 2,8 (sparse top-2 vs dense Mixtral); default: the model's."
SEQ_LEN_HELP = (
    "Comma list of sequence lengths of random-token queries (default 128, the paper's); 64,128,256,512,1024 is the "
    "§IV-B6 study."
)
NPROC_HELP = (
    "Ranks to launch on this machine (torchrun's launcher; NCCL on CUDA, gloo on CPU): one point trained with "
    "--strategy, per-rank step time, memory and collectives in OUT/ranks/."
)
STRATEGY_HELP = (
    "Profile through the ranks' launcher under fsdp2 (fully_shard; the default with --nproc-per-node) or ddp; "
    "with --nproc-per-node 1, one such rank."
)
OVERHEAD_HELP = "Skip the plain-vs-instrumented comparison (one instrumented step for the layer breakdown)."


def resolve_device(device: str) -> str:
    """--device: cpu or cuda[:i] as given (checked), auto: cuda when available."""
    if device != "auto":
        from tunecost.workload.device import check_device

        check_device(device)  # a typo is an error, not "auto"
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _batch_sizes(text: str, steps: int, warmup_steps: int) -> tuple[int, ...]:
    """--batch-sizes, each within what a GPU could hold, checked before any query is built."""
    sizes = tuple(split_list(text, int, "batch size"))
    for size in sizes:
        check_count("--batch-sizes", size, MAX_BATCH_SIZE)
    for option, value in (("--steps", steps), ("--warmup-steps", warmup_steps)):
        if value > MAX_STEPS:  # the lower bounds are the sweep's own checks
            raise TunecostError(f"{option} must be at most {MAX_STEPS}, got {value}")
    return sizes


def catalog_only(dataset: str, cutoff: object) -> bool:
    """Whether `dataset` is a catalog dataset with no copy here (no file, not a loadable name: a config's hub
    dataset), to be probed at the `cutoff` (said in a note) instead; without a cutoff, one error asking for one."""
    if Path(dataset).expanduser().exists() or canonical_name(dataset) is not None:
        return False
    try:
        name = get_dataset_facts(dataset).name
    except TunecostError:
        return False  # not the catalog's either: the loader's own error
    if cutoff is None:
        raise TunecostError(f"--dataset {dataset}: the catalog's {name} has no copy here; give --seq-len N (its "
                            "queries cut there) or a data file")  # fmt: skip
    err_console.print(f"note: {name} has no copy here: its longest queries cut at --seq-len {cutoff} stand in")
    return True


def inputs_spec(
    seq_len: str | None, dataset: str | None, tokenizer: str, template: str, max_length: int, dataset_limit: int | None
) -> Any:
    from tunecost.profile.sweep import InputSpec
    from tunecost.workload.templates import template_by_name

    seq_lens = tuple(split_list(seq_len, int, "sequence length"))
    for n in seq_lens:
        check_count("--seq-len", n, MAX_SEQ_LEN)
    check_count("--max-length", max_length, MAX_SEQ_LEN)
    check_count("--dataset-limit", dataset_limit, MAX_QUERIES)
    template_by_name(template)  # an unknown name is an error also where it would go unused
    if dataset is None:
        given = {"--tokenizer": tokenizer != "mistral", "--dataset-limit": dataset_limit is not None}
        given |= {"--template": on_command_line("template"), "--max-length": on_command_line("max_length")}
        unused = [o for o, said in given.items() if said]
        if unused:
            raise TunecostError(f"{unused[0]} applies to --dataset queries; give --dataset or leave it out")
    return InputSpec(
        seq_lens=seq_lens,
        dataset=dataset,
        tokenizer=tokenizer,
        template=template,
        max_length=max_length,
        dataset_limit=dataset_limit,
    )


def _fmt(value: Any, spec: str = ".3g", scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


@cli_errors
def profile(
    out: Annotated[Path, opt("--out", "Run folder for the records (resumable: rerun to continue).")],
    model: ModelName = "tiny-mixtral",
    method: MethodName = "qlora",
    experts_per_token: Annotated[str | None, opt("--experts-per-token", TOP_K_HELP)] = None,
    batch_sizes: Annotated[str, opt("--batch-sizes", "Comma list, e.g. 1,2,4.")] = "1",
    seq_len: Annotated[str | None, opt("--seq-len", SEQ_LEN_HELP)] = None,
    dataset: Annotated[str | None, opt("--dataset", "Train on a dataset instead (name or file; tokenized).")] = None,
    steps: Annotated[int, opt("--steps", "Timed steps per point.")] = 3,
    experts_impl: ExpertsImpl = None,
    no_overhead: Annotated[bool, opt("--no-instrumentation-overhead", OVERHEAD_HELP)] = False,
    no_kernels: Annotated[bool, opt("--no-kernels", "Skip the torch.profiler kernel breakdown.")] = False,
    warmup_steps: Annotated[int, opt("--warmup-steps", "Untimed steps before timing.")] = 1,
    device: Device = "auto",
    random_weights: RandomWeights = False,
    no_checkpointing: NoCheckpointing = False,
    num_layers: Annotated[
        int | None, count_option("--num-layers", "Keep the first N decoder layers.", MAX_LAYERS)
    ] = None,
    tokenizer: Tokenizer = "mistral",
    template: Template = "mistral",
    max_length: MaxLength = 1024,
    dataset_limit: Annotated[int | None, opt("--dataset-limit", "Use only the first N dataset queries.")] = None,
    nproc_per_node: Annotated[int, count_option("--nproc-per-node", NPROC_HELP, MAX_NPROC_PER_NODE)] = 1,
    strategy: Annotated[str | None, opt("--strategy", STRATEGY_HELP)] = None,
    config: ConfigFiles = None,
    json_out: JsonOut = False,
) -> None:
    """Profile MoE fine-tuning over experts-per-token x sequence lengths x batch sizes; writes tidy records."""
    from tunecost.outputs import check_output_folder
    from tunecost.profile.model_setup import ModelSetup

    check_output_folder(out)
    prepare_cpu_threads(device)
    setup = ModelSetup(  # the sweep sets each top-k
        model=model,
        method=method,
        experts_impl=experts_impl,
        device=resolve_device(device),
        random_weights=random_weights,
        gradient_checkpointing=not no_checkpointing,
        num_layers=num_layers,
    )
    top_ks = split_list(experts_per_token, int, "experts per token")
    sizes = _batch_sizes(batch_sizes, steps, warmup_steps)
    if dataset is not None and catalog_only(dataset, seq_len):
        dataset = None
    inputs = inputs_spec(seq_len, dataset, tokenizer, template, max_length, dataset_limit)
    if strategy is not None or nproc_per_node > 1:
        ranks = RankRun(nproc_per_node, strategy or "fsdp2", steps, warmup_steps, quiet=json_out)
        run_rank_profile(setup, ranks, out, top_ks=top_ks, batch_sizes=sizes, seq_lens=inputs.seq_lens, dataset=dataset)
        return
    from tunecost.profile.point import MeasureOptions
    from tunecost.profile.sweep import SweepSpec

    spec = SweepSpec(
        setup=setup,
        experts_per_token=tuple(top_ks),
        batch_sizes=sizes,
        inputs=inputs,
        options=MeasureOptions(
            steps=steps, warmup_steps=warmup_steps, instrumentation_overhead=not no_overhead, kernels=not no_kernels
        ),
    )
    result = _run_sweep(spec, out, json_out)
    if json_out:
        print_json(
            {
                "out_dir": str(result.out_dir),
                "measured": list(result.measured),
                "skipped": list(result.skipped),
                "oom": list(result.oom),
                "points": list(result.table),
            }
        )
        return
    _print_summary(result)


def _run_sweep(spec: Any, out: Path, quiet: bool) -> Any:
    """The sweep, with a progress bar unless `quiet`; an interrupt keeps the finished points and says so."""
    finished = [0]
    try:
        return _run_with_progress(spec, out, quiet, finished)
    except KeyboardInterrupt:
        err_console.print(
            f"interrupted: {finished[0]} finished point(s) are kept in {out}; rerun the same "
            "command to resume (finished points are skipped)"
        )
        raise typer.Exit(code=130) from None


def _run_with_progress(spec: Any, out: Path, quiet: bool, finished: list[int]) -> Any:
    from tunecost.profile.sweep import run_sweep

    def count(_: Any) -> None:
        finished[0] += 1

    if quiet:
        return run_sweep(spec, out, on_point=count)
    with progress_bar(*counted_columns()) as progress:
        points = progress.add_task("points", total=None)
        steps = progress.add_task("steps", total=None, visible=False)

        def on_progress(done: int, total: int, label: str) -> None:
            progress.update(points, completed=done, total=total, description=f"points ({label})")

        def on_step(done: int, total: int, label: str) -> None:
            progress.update(steps, completed=done, total=total, description=label, visible=True)

        return run_sweep(spec, out, on_progress=on_progress, on_step=on_step, on_point=count)


def _short(value: Any) -> str:
    """3 significant digits with a k/M suffix: tables stay narrow enough for an 80-column terminal."""
    if value is None:
        return "-"
    v = float(value)
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def _stage_split(r: dict[str, Any]) -> str:
    parts = [r.get(f"{s}_seconds") for s in ("forward", "backward", "optimizer")]
    values = [p for p in parts if p is not None]
    total = sum(values)
    if not total or len(values) != len(parts):
        return "-"
    return "/".join(f"{100 * p / total:.0f}" for p in values)


def _print_summary(result: Any) -> None:
    rows, loads = [], []
    for r in result.table:
        where = str(r["seq_len"]) if r.get("seq_len") else str(r.get("dataset"))
        point = [r["experts_per_token"], r["batch_size"], where]
        if r["status"] != "done":
            rows.append([*point, r["status"].upper()] + ["-"] * 6)
            continue
        rows.append(
            [
                *point,
                _short(r.get("queries_per_s")),
                _short(r.get("tokens_per_s")),
                _short(r.get("step_seconds")),
                _stage_split(r),
                _fmt(r.get("moe_share"), ".0%"),
                _fmt(r.get("peak_bytes"), ".2f", 1 / _GIB),
                _fmt(r.get("overhead_ratio"), ".2f"),
            ]
        )
        loads.append([*point, _short(r.get("load_variance_before")), _short(r.get("load_variance_after"))])
    first = result.table[0] if result.table else {}
    print_table(
        f"{first.get('model')} {first.get('method')} ({first.get('experts_impl')}) on {first.get('device')}",
        ["k", "bs", "seq", "q/s", "tok/s", "step s", "f/b/o %", "MoE", "GiB", "ovh"],
        rows,
        caption="k: experts per token; step s: median step; f/b/o: forward/backward/optimizer share; "
        "MoE: router + experts share of layer time; GiB: peak memory; ovh: instrumented / plain",
    )
    if loads:
        print_table("Tokens-per-expert variance (mean over layers)", ["k", "bs", "seq", "before", "after"], loads)
    console.print(
        f"measured {len(result.measured)} point(s), {len(result.skipped)} already finished"
        + (f", {len(result.oom)} out of memory (recorded as a boundary)" if result.oom else "")
    )
    console.print(
        f"records: {result.out_dir}/ (meta.json, points, throughput, stages, layers, kernels, "
        "expert_load, memory, overhead .jsonl)"
    )


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
