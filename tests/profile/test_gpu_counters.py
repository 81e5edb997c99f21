"""`tunecost gpu-counters` without a GPU: the clear error, the ncu command line, the fallbacks and result files
(child processes faked), the MoE instrumentation it relies on (tunecost.profile.nvtx), and the torch.profiler
fallback's classification of a tiny model's CPU ops."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tunecost.cli.main import app
from tunecost.errors import TunecostError
from tunecost.profile import counters_child as C
from tunecost.profile import gpu_counters as G
from tunecost.profile import instrument
from tunecost.profile import kernels as K
from tunecost.profile import nvtx as N
from tunecost.workload.job import FineTuneJob

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ncu"


# --- the command and the job ----------------------------------------------------------------------------------


def test_cli_without_gpu_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["gpu-counters", "--out", str(tmp_path / "run"), "--batch-sizes", "1,32"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: no CUDA GPU: gpu-counters needs an NVIDIA GPU and Nsight Compute")
    assert "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "qlra"], "unsupported method 'qlra'; did you mean 'qlora'?"),
        (["--batch-sizes", "1,x"], "bad batch size 'x'"),
        (["--batch-sizes", "0"], "batch sizes must be positive"),
        (["--layers", "-1"], "layers must be non-negative"),
        (["--model", "tiny-mixtrl"], "unknown model 'tiny-mixtrl'"),
    ],
)
def test_cli_bad_input(tmp_path, args, message):
    result = CliRunner().invoke(app, ["gpu-counters", "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_ncu_command_line(tmp_path):
    finetune = FineTuneJob(model="tiny-mixtral", method="full", experts_per_token=8, seq_len=128)
    job = G.GpuCountersJob(job=finetune, batch_sizes=(1, 32), layers=(0, 1))
    child = G.child_command(job, 32, mode="steps")
    assert child[1:3] == ["-m", "tunecost.profile.counters_child"]
    spec = json.loads(child[-1])
    assert spec["batch_size"] == 32 and spec["counters"]["layers"] == [0, 1]
    assert spec["counters"]["job"]["experts_per_token"] == 8
    assert G.GpuCountersJob.from_dict(spec["counters"]) == job  # the child reads back the job it was given
    cmd = G.build_ncu_command(child, log_file=tmp_path / "x.csv", ncu="/opt/ncu", launch_count=500)
    assert cmd[0] == "/opt/ncu"
    assert cmd[cmd.index("--clock-control") + 1] == "none"  # never lock or change the GPU's clocks
    assert cmd[cmd.index("--nvtx-include") + 1] == "tunecost.moe/"
    assert cmd[cmd.index("--nvtx-exclude") + 1] == "tunecost.recompute]"  # attention re-run in a MoE backward
    assert "--nvtx" in cmd and "--target-processes" in cmd
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert "gpu__time_duration.sum" in metrics and "sm__throughput.avg.pct_of_peak_sustained_elapsed" in metrics
    assert "dram__throughput.avg.pct_of_peak_sustained_elapsed" in metrics
    assert cmd[cmd.index("--page") + 1] == "raw" and "--csv" in cmd
    assert cmd[cmd.index("--print-units") + 1] == "base"
    assert cmd[cmd.index("--launch-count") + 1] == "500"
    assert cmd[-len(child) :] == child  # the application comes last
    assert G.counters_not_permitted("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access ...")


# --- the orchestration, with the child processes faked ----------------------------------------------------------


def _fake_gpu(monkeypatch, ncu: str | None):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Fake GPU")
    monkeypatch.setattr(G, "find_ncu", lambda: ncu)
    calls: list[list[str]] = []
    return calls


def _fallback_rows(batch: int) -> str:
    kernels = [  # (name, class, NVTX ranges, seconds): what the torch.profiler child reports
        ("sm90_xmma_gemm", K.MATMUL_W2_DOWN, (N.MOE_BLOCK, N.W2), 3e-6),
        ("softmax", K.SOFTMAX, (N.MOE_BLOCK, N.ROUTER), 1e-6),
    ]
    rows = [C.profiler_row(name, cls, ranges, seconds, batch) for name, cls, ranges, seconds in kernels]
    return "".join(json.dumps(r.to_dict()) + "\n" for r in rows)


def _fake_run(calls, *, ncu_output: str = "", oom_batch: int | None = None):
    def run(cmd, timeout_s):
        calls.append(list(cmd))
        spec = json.loads(cmd[-1])  # the child's spec comes last, under ncu too
        batch = spec["batch_size"]
        if batch == oom_batch:
            return subprocess.CompletedProcess(cmd, 1, "", "torch.OutOfMemoryError: CUDA out of memory.")
        if "rows_out" in spec:  # the torch.profiler child
            Path(spec["rows_out"]).write_text(_fallback_rows(batch))
            return subprocess.CompletedProcess(cmd, 0, "", "")
        if "ERR_NVGPUCTRPERM" in ncu_output:
            return subprocess.CompletedProcess(cmd, 1, "", ncu_output)
        Path(cmd[cmd.index("--log-file") + 1]).write_text((FIXTURES / "raw_moe.csv").read_text())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_no_ncu_falls_back_to_torch_profiler_and_writes_results(tmp_path, monkeypatch):
    calls = _fake_gpu(monkeypatch, ncu=None)
    monkeypatch.setattr(G, "_run", _fake_run(calls))
    other_job = {"point_id": "some other job", "kind": "counters", "kernel_class": "softmax"}
    (tmp_path / "counters.jsonl").write_text(json.dumps(other_job) + "\n")
    job = G.GpuCountersJob(batch_sizes=(1, 4))
    result = G.run_gpu_counters(job, tmp_path)
    assert result.source == "torch.profiler"
    assert any("ncu not found" in n for n in result.notes)
    assert all(json.loads(c[-1])["mode"] == "torch-profiler" for c in calls)
    records = [json.loads(line) for line in (tmp_path / "counters.jsonl").read_text().splitlines()]
    assert records[0] == other_job  # rows of another job in the same folder are kept
    records = records[1:]
    assert len(records) == 4
    assert {r["kind"] for r in records} == {"counters"} and {r["device"] for r in records} == {"Fake GPU"}
    assert all(r["sm_pct"] is None and r["source"] == "torch.profiler" for r in records)
    utilization = json.loads((tmp_path / "utilization.json").read_text())
    share = {(c["batch_size"], c["kernel_class"]): c["time_share"] for c in utilization["classes"]}
    assert share[(4, K.MATMUL_W2_DOWN)] == pytest.approx(0.75)

    # rerun: finished batch sizes are kept, not measured again
    calls.clear()
    again = G.run_gpu_counters(G.GpuCountersJob(batch_sizes=(1, 4, 8)), tmp_path)
    assert [json.loads(c[-1])["batch_size"] for c in calls] == [8]
    assert sorted({r.batch_size for r in again.rows}) == [1, 4, 8]


def test_ncu_rows_are_parsed_and_non_moe_kernels_left_out(tmp_path, monkeypatch):
    calls = _fake_gpu(monkeypatch, ncu="/opt/ncu")
    monkeypatch.setattr(G, "_run", _fake_run(calls, oom_batch=64))
    result = G.run_gpu_counters(G.GpuCountersJob(batch_sizes=(32, 64)), tmp_path)
    assert calls[0][0] == "/opt/ncu" and len(calls) == 2
    assert result.source == "ncu"
    assert {r.batch_size for r in result.rows} == {32}
    assert len(result.rows) == 10  # 11 usable launches in the fixture, one outside any MoE range left out
    assert any("left out 1 kernels" in n for n in result.notes)
    assert any("batch size 64: out of GPU memory" in n for n in result.notes)
    assert any("line 15: expected 17 fields" in n for n in result.notes)
    utilization = json.loads((tmp_path / "utilization.json").read_text())
    gate_up = next(c for c in utilization["classes"] if c["kernel_class"] == K.MATMUL_W1W3_GATE_UP)
    assert gate_up["sm_pct"] == pytest.approx(65.0)


def test_counters_not_permitted_falls_back(tmp_path, monkeypatch):
    calls = _fake_gpu(monkeypatch, ncu="/opt/ncu")
    monkeypatch.setattr(G, "_run", _fake_run(calls, ncu_output="==ERROR== ERR_NVGPUCTRPERM - The user does not ..."))
    result = G.run_gpu_counters(G.GpuCountersJob(batch_sizes=(1, 2)), tmp_path)
    assert result.source == "torch.profiler"
    assert any("ERR_NVGPUCTRPERM" in n for n in result.notes)
    assert len(calls) == 3  # ncu tried once, then the torch.profiler child for both batch sizes
    assert calls[0][0] == "/opt/ncu" and all(c[0] != "/opt/ncu" for c in calls[1:])


def test_cli_json_with_a_fake_gpu(tmp_path, monkeypatch):
    calls = _fake_gpu(monkeypatch, ncu="/opt/ncu")
    monkeypatch.setattr(G, "_run", _fake_run(calls))
    result = CliRunner().invoke(app, ["gpu-counters", "--out", str(tmp_path), "--batch-sizes", "32", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["source"] == "ncu" and data["num_kernels"] == 10
    by_class = {u["kernel_class"]: u for u in data["utilization"]}
    assert by_class[K.MATMUL_W1W3_GATE_UP]["sm_pct"] == pytest.approx(65.0)
    table = CliRunner().invoke(app, ["gpu-counters", "--out", str(tmp_path / "t"), "--batch-sizes", "32"])
    assert table.exit_code == 0, table.output
    assert "matmul_w1w3_gate_up" in table.stdout and "65.0" in table.stdout


# --- the instrumentation (tunecost.profile.nvtx) -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(small_mixtral):
    """Two layers, hidden 64 in 8 heads of 8 (4 key-value heads), 8 experts of width 96, 128-token vocabulary."""
    return small_mixtral(64, 8, num_hidden_layers=2, intermediate_size=96, vocab_size=128)


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_instrumentation_changes_no_numbers_and_is_removable(tiny):
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    loss, grads = _loss_and_grads(tiny, ids)
    handle = instrument.instrument_model(tiny, layers=[1])
    assert "forward" in vars(tiny.model.layers[1].mlp) and "forward" not in vars(tiny.model.layers[0].mlp)
    loss2, grads2 = _loss_and_grads(tiny, ids)
    handle.remove()
    assert not any("forward" in vars(m) for m in tiny.modules())
    assert torch.equal(loss, loss2)
    assert grads.keys() == grads2.keys() and all(torch.equal(grads[k], grads2[k]) for k in grads)
    # an instance-level forward set by another tool is wrapped and put back; instrumenting twice is refused
    block = tiny.model.layers[0].mlp
    block.forward = other = block.forward
    with instrument.instrument_model(tiny, layers=[0]):
        with pytest.raises(TunecostError, match="already instrumented"):
            instrument.instrument_moe_block(block)
    assert vars(block)["forward"] is other
    del block.forward
    with pytest.raises(TunecostError, match=r"no MoE block in layer\(s\) \[5\]"):
        instrument.instrument_model(tiny, layers=[5])


@pytest.mark.parametrize("checkpointing", [False, True])
def test_nvtx_ranges_balanced_forward_and_backward(tiny, monkeypatch, checkpointing):
    """With CUDA faked, every NVTX push has its pop, backward ranges included (checkpoint recompute too)."""
    stack: list[str] = []
    pushed: list[str] = []

    def push(name):
        stack.append(name)
        pushed.append(name)

    def pop():
        assert stack, "pop without push"
        stack.pop()

    monkeypatch.setattr(N, "_nvtx_enabled", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", push)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", pop)
    if checkpointing:
        tiny.activation_checkpointing_enable()
    try:
        with instrument.instrument_model(tiny, layers=[0, 1]):
            ids = torch.randint(0, 128, (2, 12))
            tiny(input_ids=ids, labels=ids).loss.backward()
    finally:
        tiny.activation_checkpointing_disable()
    assert stack == []
    runs = 2 if checkpointing else 1  # forward, plus the recomputed forward inside the backward
    for name in (N.MOE_BLOCK, N.ROUTER, N.EXPERTS, N.W1W3, N.W2):
        assert pushed.count(name) == 2 * (runs + 1), name  # 2 layers x (forward(s) + backward)
    assert (N.RECOMPUTE in pushed) == checkpointing


def test_per_expert_modules_and_lora_get_their_ranges():
    """Experts built of per-expert w1/w3/w2 modules with LoRA factors (the paper's QLoRA layout)."""
    from torch import nn

    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w3, self.w2 = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x):
            return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))

    class LoraGate(nn.Module):
        def __init__(self):
            super().__init__()
            self.base_layer, self.lora_A, self.lora_B = nn.Linear(8, 4), nn.Linear(8, 2), nn.Linear(2, 4)

        def forward(self, x):
            return self.base_layer(x) + self.lora_B(self.lora_A(x))

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList([Expert(), Expert()])

        def forward(self, x, weights):
            return sum(e(x) * weights[:, i : i + 1] for i, e in enumerate(self.experts))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.experts = LoraGate(), Experts()

        def forward(self, x):
            return self.experts(x, self.gate(x)[:, :2].softmax(-1))

    block = Block()
    x = torch.randn(5, 8, requires_grad=True)
    from torch.profiler import profile

    with instrument.instrument_moe_block(block), profile() as prof:
        block(x).sum().backward()
    counts: dict[str, int] = {}
    for event in prof.events():
        if event.name.startswith(N.RANGE_PREFIX):
            counts[event.name] = counts.get(event.name, 0) + 1
    # forward + backward each: 2 experts x one w1, w3, w2; LoRA A and B on the router
    assert counts == {N.MOE_BLOCK: 2, N.ROUTER: 2, N.EXPERTS: 2, N.W1: 4, N.W3: 4, N.W2: 4, N.LORA: 4}
    assert not any("forward" in vars(m) for m in block.modules())


# --- the torch.profiler fallback on a tiny model's CPU ops ------------------------------------------------------


def test_child_spec_errors_are_one_line(capsys):
    assert C.main(["--model", "tiny-mixtral"]) == 2
    assert C.main(['{"batch_size": 1, "colour": "red"}']) == 2
    assert C.main(['{"batch_size": 1, "counters": {"job": {"model": "tiny-mixtral", "rank": 4}}}']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
    assert "unknown spec keys ['colour']" in err[1]
    assert "unknown job field(s) rank" in err[2]


def test_torch_profiler_rows_on_cpu_ops():
    job = G.GpuCountersJob(
        job=FineTuneJob(model="tiny-mixtral", method="full", seq_len=16), steps=1, warmup_steps=0, layers=(0,)
    )
    rows = C.run_child(job, 2, mode="torch-profiler", device="cpu")
    assert rows and all(r.source == "torch.profiler" and r.sm_pct is None and r.batch_size == 2 for r in rows)
    assert all(N.is_moe_work(r.nvtx_ranges) for r in rows)  # the recomputed attention is not MoE work
    seconds: dict[str, float] = {}
    for r in rows:
        seconds[r.kernel_class] = seconds.get(r.kernel_class, 0.0) + r.duration_s
    for cls in (K.MATMUL_W1W3_GATE_UP, K.MATMUL_W2_DOWN, K.ROUTER, K.SOFTMAX, K.TOPK, K.ELEMENTWISE):
        assert seconds.get(cls, 0) > 0, cls
    assert K.MATMUL_EXPERTS not in seconds  # every expert matmul was attributed to its weight
    names = {r.kernel_name for r in rows if r.kernel_class in (K.MATMUL_W1W3_GATE_UP, K.MATMUL_W2_DOWN)}
    assert names & {"aten::mm", "aten::_grouped_mm", "aten::bmm"}  # CPU op names, not CUDA kernels
