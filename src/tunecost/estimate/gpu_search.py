"""The GPU-count search: a job priced on every GPU x count x layout asked for, each at the largest micro-batch
that fits (`setups.evaluate_setup`). Derivations: docs/multi-gpu.md, section `tunecost.estimate.setups`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tunecost.catalog.gpus import GPU
from tunecost.catalog.prices import Price, price_catalog, prices_for
from tunecost.distributed import deepspeed_estimator
from tunecost.distributed.expert_parallel import EP_STRATEGIES, searched_degrees
from tunecost.distributed.layouts import check_model_parallel, checked_counts, layout_plans, model_parallel_choices
from tunecost.distributed.rank_memory import STORED_SHARDED
from tunecost.distributed.timing import Links, cpu_optimizer_note, default_links
from tunecost.errors import TunecostError
from tunecost.estimate.rank_needs import RankNeeds
from tunecost.estimate.setups import COST_NOTE, MultiGpuEstimate, Setup, evaluate_setup
from tunecost.estimate.simulated import Throughput
from tunecost.limits import MAX_BATCH_SIZE
from tunecost.models.catalog import resolve_model
from tunecost.models.params import ParamCounts, count_parameters
from tunecost.simulate.batch import default_margin_fraction, fit_verdict, margin_note
from tunecost.workload.frameworks.registry import runnable_plans
from tunecost.workload.job import FineTuneJob, fp32_strategies
from tunecost.workload.parallel import (
    DEFAULT_MAX_GPUS,
    NOT_WITH_PIPELINE,
    ModelParallel,
    ParallelPlan,
    check_pipeline_strategy,
)


def estimate_multi_gpu(
    job: FineTuneJob,
    *,
    gpus: Sequence[GPU],
    strategies: Sequence[str],
    num_gpus: int | Mapping[str, int] | None = None,
    gpus_per_node: int = 8,
    max_gpus: int = DEFAULT_MAX_GPUS,
    node_link: str | None = None,
    expert_degree: int = 1,
    offload: str = "none",
    provider: str | None = None,
    prices_file=None,
    num_queries: float | None = None,
    epochs: float | None = None,
    micro_batch: int | None = None,
    margin_fraction: float | None = None,
    steady_state: bool = False,
    behaviour=None,
    more_gpus: bool = False,
    needs: RankNeeds | None = None,
    require_fit: bool = True,
    model_parallel: ModelParallel | None = None,
    global_batch: int | None = None,
) -> MultiGpuEstimate:
    """Evaluate `job` on each GPU x layout: `num_gpus` GPUs (one count, or a count per GPU name), or every valid
    count up to `max_gpus` (the counts the expert-parallel degree divides). Each setup runs `micro_batch` per rank,
    or the largest that fits with the safety margin (up to a rank's share of a kept `global_batch`); with no
    `num_gpus`, only the fewest GPUs that fit per GPU and strategy are searched and costed (`more_gpus`: and that
    count doubled, up to `max_gpus`), and fitting nothing is an error unless not `require_fit`. `needs`: the job's
    rank memory and throughputs already computed (the same job with another offload or count). `model_parallel`:
    the TP/PP/CP degrees (None: data parallelism, or, searching, `layouts.model_parallel_choices`)."""
    strategies, int8_note = _holding_strategies(job, strategies, model_parallel, offload)
    degree = model_parallel.degree if model_parallel is not None else 1
    counts_by_gpu, spec = checked_counts(
        job.model, gpus, strategies, num_gpus, gpus_per_node, max_gpus, expert_degree, offload, degree
    )
    mp_notes = check_model_parallel(spec, job.worst_case_seq_len, model_parallel, counts_by_gpu, liger=job.liger_kernel)
    needs = needs or RankNeeds(job.with_(batch_size=1), behaviour)
    links_by_gpu = {g.name: default_links(g, gpus_per_node, node_link, needs.host_cpu) for g in gpus}  # before tracing
    choices = model_parallel_choices(spec, job, given=model_parallel, searching=num_gpus is None,
                                     gpus_per_node=gpus_per_node, framework=needs.framework)  # fmt: skip
    param_counts = count_parameters(spec, job.experts_per_token) if {"zero2", "zero3"} & set(strategies) else None
    search = _Search(
        needs=needs,
        strategies=strategies,
        searching=num_gpus is None,
        gpus_per_node=gpus_per_node,
        expert_degree=expert_degree,
        offload=offload,
        micro_batch=micro_batch,
        more_gpus=more_gpus,
        margin=default_margin_fraction() if margin_fraction is None else margin_fraction,
        steady_state=steady_state,
        num_queries=num_queries,
        epochs=epochs,
        param_counts=param_counts,
        model_parallel=choices,
        grad_accum=job.grad_accum,
        global_batch=global_batch,
    )
    prices = price_catalog(prices_file)
    setups = _gpu_setups(search, gpus, counts_by_gpu, links_by_gpu, prices, provider)
    if model_parallel is None and _model_parallel_fallback(search, spec, job, setups):
        setups = _gpu_setups(search, gpus, counts_by_gpu, links_by_gpu, prices, provider)
    needs.flush()
    if num_gpus is None and require_fit and not any(s.fits for s in setups):
        raise _fits_nothing(spec.name, job.method, max_gpus, gpus, strategies)
    notes = [*search.notes, *mp_notes, *int8_note, COST_NOTE]
    notes += [deepspeed_estimator.ASSUMPTION] if param_counts else []
    notes += [cpu_optimizer_note(g, links_by_gpu[g.name], needs.host_cpu) for g in gpus if offload != "none"]
    return MultiGpuEstimate(
        model=spec.name,
        method=job.method,
        batch_size=micro_batch or 0,
        seq_len=job.worst_case_seq_len,
        setups=tuple(setups),
        notes=tuple(notes),
        assumptions=(*setups[0].memory.assumptions, margin_note(search.margin)) if setups else (),
    )


def searched_expert_degrees(job: FineTuneJob, *, offload: str, max_gpus: int) -> list[int]:
    """The expert-parallel degrees a search of GPU counts prices beside none: an MoE model's
    (`expert_parallel.searched_degrees`) without CPU offload (not modelled with it); none for a dense model."""
    return searched_degrees(resolve_model(job.model).num_experts, max_gpus) if offload == "none" else []


def expert_strategies(strategies: Sequence[str], expert_degree: int) -> list[str]:
    """The strategies of `strategies` that take `expert_degree` (all of them at 1)."""
    return [s for s in strategies if expert_degree == 1 or s in EP_STRATEGIES]


def merged_estimates(
    answers: Sequence[MultiGpuEstimate], *, strategies: Sequence[str], max_gpus: int, gpus: Sequence[GPU]
) -> MultiGpuEstimate:
    """One answer from the searches of one job at several expert-parallel degrees (the first's assumptions;
    fitting nothing at all is an error, as one search's is)."""
    setups = tuple(s for a in answers for s in a.setups)
    first = answers[0]
    if not any(s.fits for s in setups):
        raise _fits_nothing(first.model, first.method, max_gpus, gpus, strategies)
    degrees = sorted({s.plan.expert_parallel for s in setups} - {1})
    searched = (
        f"expert-parallel layouts searched too: degree {', '.join(map(str, degrees))} (--expert-parallel sets one)"
    )
    per_gpu = tuple(f"{g.name}: " for g in gpus)  # each GPU's links and first throughput: the first search's
    later = (n for a in answers[1:] for n in a.notes if not n.startswith(per_gpu))
    notes = tuple(dict.fromkeys((*first.notes, *later)))
    return dataclasses.replace(first, setups=setups, notes=(searched, *notes))


def _fits_nothing(model: str, method: str, max_gpus: int, gpus: Sequence[GPU], strategies: Sequence[str]):
    return TunecostError(
        f"{model} ({method}) fits no setup of up to {max_gpus} GPUs ({', '.join(g.name for g in gpus)}; "
        f"{', '.join(strategies)}); raise the limit or change the job"
    )


def _holding_strategies(
    job: FineTuneJob, strategies: Sequence[str], model_parallel: ModelParallel | None, offload: str
) -> tuple[list[str], list[str]]:
    """`strategies_holding`, none of them an error; one of them runs beside the layout's pipeline."""
    kept, note = strategies_holding(job, strategies, offload)
    if not kept and job.fp32_params and offload != "none":
        raise TunecostError(f"{note[0]}; drop --offload or --fp32-params")
    if not kept and job.fp32_params:
        held = " or ".join(fp32_strategies(job.method)[1:])
        raise TunecostError(
            f"--strategy {', '.join(strategies)} with --fp32-params: use {held} (or drop --fp32-params)"
        )
    if not kept:
        raise TunecostError(
            f"--strategy {', '.join(strategies)}: 8-bit (LLM.int8) base weights cannot be sharded; "
            "use ddp, zero1 or zero2"
        )
    if model_parallel is not None and set(kept) <= set(NOT_WITH_PIPELINE):
        check_pipeline_strategy(kept[0], model_parallel.pp)
    return kept, note


def strategies_holding(
    job: FineTuneJob, strategies: Sequence[str], offload: str = "none"
) -> tuple[list[str], list[str]]:
    """The strategies of `strategies` that can hold `job`'s weights under `offload`, and a note on those left out:
    fp32 weights run on one GPU or DDP under autocast or under FSDP's mixed precision (`fp32_strategies`), none
    offloaded (not modelled); LLM.int8 weights cannot be stored as shards (FSDP flattens or shards float
    parameters; ZeRO-3 partitions them without bitsandbytes' row scales)."""
    if job.fp32_params and offload != "none":
        return [], [f"--offload {offload}: CPU offload of fp32 parameters is not modelled"]
    held = fp32_strategies(job.method)
    if job.fp32_params and set(strategies) - set(held):
        dropped = ", ".join(s for s in strategies if s not in held)
        note = f"{dropped}: not searched, --fp32-params is one GPU, DDP or FSDP (DeepSpeed keeps its own fp32 copy)"
        return [s for s in strategies if s in held], [note]
    if job.base_quant != "int8" or not set(strategies) & set(STORED_SHARDED):
        return list(strategies), []
    dropped = ", ".join(s for s in strategies if s in STORED_SHARDED)
    note = f"{dropped}: not searched, 8-bit (LLM.int8) base weights cannot be sharded"
    return [s for s in strategies if s not in STORED_SHARDED], [note]


def _model_parallel_fallback(search: _Search, spec, job: FineTuneJob, setups: list[Setup]) -> bool:
    """Whether to search the job again over tensor- and pipeline-parallel layouts: no data-parallel layout holds
    it (`setups`), and its model has TP/PP layouts that shard its weights (`layouts.model_parallel_choices`), which
    `search` then takes. Searching GPU counts, a full fine-tune's were searched already and a LoRA job's come now;
    at the counts given, those of either."""
    if any(s.fits for s in setups) or (search.searching and job.method != "lora"):
        return False
    lora = job.method == "lora"
    choices = model_parallel_choices(spec, job, given=None, searching=True, gpus_per_node=search.gpus_per_node,
                                     lora=lora, framework=search.needs.framework)  # fmt: skip
    if len(choices) == 1:
        return False
    search.model_parallel = choices
    where = "" if search.searching else " on the GPUs given (--tp, --pp, --cp name one)"
    search.notes.append(f"no data-parallel layout fits: tensor- and pipeline-parallel layouts searched{where}")
    return True


def _gpu_setups(search: _Search, gpus: Sequence[GPU], counts_by_gpu, links_by_gpu, prices, provider) -> list[Setup]:
    """Every setup `search` evaluates on each GPU at its provider's prices, with a note per GPU on its links."""
    setups: list[Setup] = []
    for gpu in gpus:
        links, gpu_prices = links_by_gpu[gpu.name], prices_for(gpu.name, prices, provider, whole_nodes=True)
        if not gpu_prices:
            search.note(f"no price for {gpu.name}" + (f" from {provider}" if provider else "") + " in the catalog")
        setups += search.gpu_setups(gpu, counts_by_gpu[gpu.name], links, gpu_prices)
        search.note(f"{gpu.name}: links {links.node.name} in a node, {links.nics_per_node} x {links.network.name}")
    return setups


def _layout_key(plan: ParallelPlan) -> tuple:
    """A layout whatever its GPU count: the model-parallel degrees and the data-parallel strategy."""
    return (plan.tp, plan.sequence_parallel, plan.tp_impl, plan.pp, plan.cp, plan.strategy)


@dataclass(kw_only=True)
class _Search:
    """What the setups of one `estimate_multi_gpu` share: the job's rank needs, the layouts asked for, and the
    notes gathered on the way."""

    needs: RankNeeds
    strategies: Sequence[str]
    searching: bool  # no GPU count given: the fewest GPUs that fit per GPU and strategy
    gpus_per_node: int
    expert_degree: int
    offload: str
    micro_batch: int | None
    more_gpus: bool
    margin: float
    steady_state: bool
    num_queries: float | None
    epochs: float | None
    param_counts: ParamCounts | None
    model_parallel: Sequence[ModelParallel] = (ModelParallel(),)
    grad_accum: int = 1  # the job's, which `needs` (shared by jobs that differ in it) may not have
    global_batch: int | None = None  # kept by the caller (`plan`): a rank runs at most its share
    notes: list[str] = field(default_factory=list)
    noted: set[str] = field(default_factory=set)

    def note(self, text: str) -> None:
        """Add `text` to the notes once (a search of a LoRA job's TP/PP layouts visits each GPU again)."""
        if text not in self.notes:
            self.notes.append(text)

    def gpu_setups(self, gpu: GPU, counts: list[int], links: Links, prices: list[Price]) -> list[Setup]:
        """Every layout of each count of `gpu`, each at its micro-batch (the largest that fits unless given)."""
        throughputs = self.needs.throughputs.setdefault((gpu.name, self.steady_state), {})
        setups: list[Setup] = []
        found: dict[tuple, int] = {}  # layout -> its fewest GPUs that fit (no num_gpus)
        for n in counts:
            if n == 1 and not self.searching and self.offload == "none" and self.expert_degree == 1:
                asked = [s for s in self.strategies if s != "single"]
                if asked and len(asked) == len(self.strategies):
                    self.note(f"one GPU: {', '.join(asked)} shard and replicate nothing there; priced as one GPU alone")
            plans, dropped = runnable_plans(
                layout_plans(
                    n,
                    self.strategies,
                    gpus_per_node=self.gpus_per_node,
                    expert_degree=self.expert_degree,
                    offload=self.offload,
                    model_parallel=self.model_parallel,
                ),
                self.needs.framework,
            )
            for line in dropped:
                self.note(line)
            for plan in plans:
                first = self.needs.memory(plan, 1)
                fits_one = fit_verdict(first.nvidia_smi_bytes, gpu.usable_memory_bytes, self.margin) == "yes"
                fewest = found.get(_layout_key(plan))
                wanted = fewest is None or (self.more_gpus and n % fewest == 0 and (n // fewest).bit_count() == 1)
                if self.micro_batch is not None:
                    setups.append(self.evaluate(gpu, links, prices, throughputs, plan, self.micro_batch, 0))
                elif self.searching and (not wanted or not fits_one):
                    why = f"not timed: this layout fits on fewer GPUs ({fewest}); the search prices that count"
                    why += " and its power-of-two multiples" if self.more_gpus else ""
                    not_timed = why if fits_one else ""
                    setups.append(
                        Setup(gpu=gpu, plan=plan, memory=first, margin_fraction=self.margin, not_timed=not_timed)
                    )
                else:
                    lo, border = self.needs.largest_micro_batch(plan, gpu, self.margin, self.most_micro_batch(plan))
                    batch = self.within_epoch(plan, max(lo, 1))
                    setups.append(self.evaluate(gpu, links, prices, throughputs, plan, batch, border))
                    if lo and fewest is None:  # one GPU fitting stands for every strategy's
                        single = plan.strategy == "single"
                        same = [dataclasses.replace(plan, strategy=s) for s in self.strategies] if single else [plan]
                        found.update(dict.fromkeys(map(_layout_key, same), n))
        return setups

    def most_micro_batch(self, plan: ParallelPlan) -> int:
        """The largest micro-batch worth searching: a rank's share of the kept global batch (per pipeline
        micro-batch), at least 1; the search's own limit without one."""
        if self.global_batch is None:
            return MAX_BATCH_SIZE
        return max(1, self.global_batch // plan.micro_batch_slots)

    def within_epoch(self, plan: ParallelPlan, batch: int) -> int:
        """`batch`, cut to the most one optimizer step of `plan` can take from an epoch's queries (micro-batch x
        accumulation x data-parallel ranks x pipeline micro-batches at most the epoch): a larger one never runs."""
        if not self.num_queries:
            return batch
        per_step = plan.dp * self.grad_accum * (plan.num_micro_batches if plan.pp > 1 else 1)
        most = max(1, math.ceil(self.num_queries / per_step))
        if most < batch:
            self.note(
                f"micro-batch cut where one optimizer step would take more than an epoch's {self.num_queries:g} queries"
            )
        return min(batch, most)

    def evaluate(
        self,
        gpu: GPU,
        links: Links,
        prices: list[Price],
        throughputs: dict[tuple[int, int | None], tuple[Throughput, str]],
        plan: ParallelPlan,
        batch: int,
        border: int,
    ) -> Setup:
        """The setup of `plan` on `gpu` at micro-batch `batch`: step time, throughput and cost."""
        # a pipeline's micro-batches are its accumulation: the optimizer runs once per step, not per micro-batch
        key = (batch, plan.num_micro_batches if plan.pp > 1 else self.grad_accum)
        if key not in throughputs:
            throughputs[key] = self.needs.throughput(batch, gpu, self.steady_state, grad_accum=key[1])
        tp, note = throughputs[key]
        if gpu.name not in self.noted:  # the first micro-batch's, once per GPU
            self.noted.add(gpu.name)
            self.notes.append(note)
        qps = tp.queries_per_s
        ratio = (tp.interval[0] / qps, tp.interval[1] / qps) if tp.interval and qps else None
        outside = tuple(n.removeprefix("extrapolation: ") for n in tp.notes if n.startswith("extrapolation: "))
        setup = evaluate_setup(
            self.needs.rank_step(plan, batch),
            self.needs.job_at(batch).with_(grad_accum=self.grad_accum),
            gpu,
            plan,
            single_gpu_queries_per_s=qps,
            links=links,
            prices=prices,
            num_queries=self.num_queries,
            epochs=self.epochs,
            param_counts=self.param_counts,
            memory=self.needs.memory(plan, batch),
            startup_s=tp.startup_s,
            borderline_micro_batch=border,
            margin_fraction=self.margin,
            queries_per_row=tp.queries_per_row,
            fused_adamw=self.needs.fused_adamw,
            optimizer_fraction=tp.optimizer_fraction,
        )
        return dataclasses.replace(setup, interval_ratio=ratio, extrapolation=outside)
