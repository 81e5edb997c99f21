"""Steps read off a batch line (`simulate.batch_line`) equal the steps traced at those batch sizes, field by field;
batch 1, sizes outside the traced range, too few or non-coprime points, and steps whose sizes are not affine in the
batch (an uneven split of tokens over experts, Liger's power-of-two chunks) are traced instead."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tiny_models import write_llama_config

from tunecost.simulate.batch_line import BatchLine
from tunecost.simulate.prepare import build_prepared
from tunecost.simulate.recorder import LayerPlan, StorageRecord, _OpCounter
from tunecost.simulate.trace import trace_step
from tunecost.workload.job import FineTuneJob, LoraConfig

FIELDS = (
    "segments",
    "weight_bytes",
    "flops",
    "bytes",
    "flops_by_group",
    "peak_reserved_bytes",
    "allocations",
    "num_ops",
    "num_units",
    "num_layers",
)
ORDER = (2, 3, 5, 4)  # after 2, 3 and 5 the line answers 4
MIXED = LoraConfig(rank=4, alpha=8, targets=("attention", "mlp"))


def _fields(result) -> dict:
    return {k: getattr(result, k) for k in FIELDS}


def _compare(job: FineTuneJob, stack: str, order=ORDER) -> tuple[int, BatchLine]:
    """Trace `job` at each batch size of `order` with lines on, and again fresh; return how many steps the line
    answered and the line, after asserting every step equals the fresh trace."""
    seq = int(job.seq_len)
    lined = build_prepared(job.with_(stack=stack), num_units=1)
    fresh = build_prepared(job.with_(stack=stack), num_units=1)
    read = 0
    for b in order:
        line = lined.batch_lines.get((seq, 512))
        read += line is not None and line.step_at(b) is not None
        got = trace_step(lined, b, seq)
        fresh.batch_lines = {}
        assert _fields(got) == _fields(trace_step(fresh, b, seq)), f"batch {b}"
    return read, lined.batch_lines[(seq, 512)]


@pytest.mark.parametrize(
    ("name", "method", "stack", "lora"),
    [
        ("tiny-mixtral-2l", "qlora", "tunecost", None),  # 4-bit grouped experts
        ("tiny-qwen2-moe", "lora", "hf-peft", None),  # shared expert
        ("tiny-deepseek-v3", "full", "hf-peft", None),  # MLA, sigmoid router
        ("tiny-gpt-oss", "lora", "hf-peft", None),  # sinks, sliding window
        ("tiny-granite-hybrid", "lora", "hf-peft", None),  # Mamba2 layers
        ("tiny-qwen3_5", "lora", "hf-peft", MIXED),  # gated DeltaNet layers
        ("tiny-blackmamba", "full", "hf-peft", None),  # Mamba + MoE
    ],
)
def test_steps_read_off_the_line_equal_traced_steps(config_path, name, method, stack, lora) -> None:
    job = FineTuneJob(model=config_path(name), method=method, seq_len=32, batch_size=1, stack=stack)
    if lora is not None:
        job = FineTuneJob(model=config_path(name), method=method, seq_len=32, batch_size=1, stack=stack, lora=lora)
    read, line = _compare(job, stack)
    assert not line.broken and read == 1 and sorted(line.raw) == [2, 3, 5]


def test_batch_one_and_sizes_off_the_range_are_traced(config_path) -> None:
    job = FineTuneJob(model=config_path("tiny-mixtral-2l"), method="qlora", seq_len=32, batch_size=1, stack="tunecost")
    read, line = _compare(job, "tunecost", order=(1, 2, 3, 5, 4, 7, 6))
    assert read == 2 and sorted(line.raw) == [2, 3, 5, 7]  # 4 and 6 read; 1 never observed


def test_a_dense_model_under_full_fine_tuning(tmp_path) -> None:
    path = write_llama_config(
        tmp_path / "llama.json", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
    )  # fmt: skip
    read, line = _compare(FineTuneJob(model=str(path), method="full", seq_len=24, batch_size=1), "hf-peft")
    assert read == 1 and not line.broken


def test_an_uneven_split_of_tokens_over_experts_is_always_traced(config_path) -> None:
    """30 tokens x top-2 over the fixture's experts leave a remainder at odd batch sizes: each step traced."""
    job = FineTuneJob(model=config_path("tiny-mixtral-2l"), method="qlora", seq_len=30, batch_size=1, stack="hf-2024")
    read, line = _compare(job, "hf-2024", order=(2, 3, 5, 4))
    assert line.broken and read == 0


def test_liger_chunks_are_always_traced(tmp_path) -> None:
    path = write_llama_config(
        tmp_path / "llama.json", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
    )  # fmt: skip
    job = FineTuneJob(model=str(path), method="full", seq_len=24, batch_size=1, liger_kernel=True)
    read, line = _compare(job, "hf-peft", order=(2, 3, 5, 4))
    assert line.broken and read == 0


def _rec(nbytes: list[int], flops: int):
    """A traced step of one structure: storages of `nbytes` bytes and `flops` forward FLOPs."""
    records = [
        StorageRecord(nbytes=n, t_alloc=i, phase="forward", group="layer", raw_nbytes=n) for i, n in enumerate(nbytes)
    ]
    counter = _OpCounter(flops={("forward", "gemm"): flops})
    plan = LayerPlan(prefix=0, period=1, num_units=1)
    return SimpleNamespace(
        records=records, counter=counter, plan=plan, t_end=len(nbytes), t_forward_end=len(nbytes),
        op_segments=[], op_layers=[], resized=False, not_affine=False,
    )  # fmt: skip


def test_the_line_answers_inside_coprime_points_only() -> None:
    line = BatchLine(round_bytes=512)
    for b in (2, 4, 6):
        line.observe(b, _rec([100 * b + 7], 10 * b))
    assert line.step_at(3) is None  # all even: an even split at 2, 4, 6 says nothing of odd sizes
    line.observe(9, _rec([907], 90))
    step = line.step_at(5)
    assert step is not None and step.records[0].nbytes == 512 and step.records[0].raw_nbytes == 507
    assert step.counter.flops == {("forward", "gemm"): 50}
    assert line.step_at(10) is None and line.step_at(1) is None  # outside the traced range


def test_a_point_off_the_line_breaks_it() -> None:
    line = BatchLine(round_bytes=1)
    for b in (2, 3):
        line.observe(b, _rec([b * b], b))
    line.observe(5, _rec([25], 5))  # 25 is not on the line through (2, 4) and (3, 9)
    assert line.broken and line.step_at(4) is None


def test_a_different_structure_breaks_it() -> None:
    line = BatchLine(round_bytes=1)
    line.observe(2, _rec([2], 2))
    line.observe(3, _rec([3, 1], 3))
    assert line.broken


def test_sizes_not_affine_in_the_rows_say_so(monkeypatch) -> None:
    """Liger's element-wise row blocks (ceil(rows / 16) rows each) and an uneven split of tokens over experts."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tunecost.simulate import counts, liger, quant4bit

    said: list[bool] = []
    monkeypatch.setattr(counts, "NOT_AFFINE_LISTENERS", [lambda: said.append(True)])
    liger._row_blocks(32)
    quant4bit.tokens_per_expert(torch.zeros(16, dtype=torch.long), 8)  # real routing: counted, not split
    with FakeTensorMode() as mode:
        quant4bit.tokens_per_expert(mode.from_tensor(torch.zeros(16, dtype=torch.long)), 8)
    assert not said
    liger._row_blocks(24)
    assert said == [True]
    with FakeTensorMode() as mode:
        quant4bit.tokens_per_expert(mode.from_tensor(torch.zeros(18, dtype=torch.long)), 8)
    assert said == [True, True]
