"""`tunecost.validate`: corpus columns, per-row mapping and skip reasons, predictions from the simulator, summary."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunecost.cli.main import app
from tunecost.errors import TunecostError
from tunecost.results.records import read_records
from tunecost.units import BYTES_PER_GIB
from tunecost.validate import OUTPUT_COLUMNS, read_corpus, summarize, validate_rows
from tunecost.validate.corpus import DEFAULT_CORPUS_PATH, REQUIRED_COLUMNS
from tunecost.validate.mapping import PEAK_MEMORY_QUANTITIES, Skip, lora_targets, map_row, modules_to_save
from tunecost.validate.run import predicted_bytes
from tunecost.validate.stacks import STACKS, stack_for
from tunecost.validate.summary import memory_totals

FIXTURE = Path(__file__).parents[1] / "fixtures" / "validation" / "small.csv"
TINY_LLAMA = {  # GQA (4 query heads, 2 key/value heads) and tied embeddings
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "tie_word_embeddings": True,
}


@pytest.fixture
def corpus(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TINY_LLAMA), encoding="utf-8")
    path = tmp_path / "small.csv"
    path.write_text(FIXTURE.read_text(encoding="utf-8").replace("{tiny}", str(config)), encoding="utf-8")
    return path


def _by_id(rows):
    return {r.id: r for r in rows}


def test_a_repeated_id_and_quantity_is_named_and_a_quoted_line_break_stays_in_its_cell(corpus, tmp_path) -> None:
    lines = corpus.read_text(encoding="utf-8").splitlines()
    header, first = lines[0], lines[1]
    path = tmp_path / "twice.csv"
    path.write_text("\n".join([header, first, first]) + "\n", encoding="utf-8")
    with pytest.raises(TunecostError, match=r"twice.csv: row 3: id '[^']+' with quantity '[^']+' repeats .* row 2"):
        read_corpus([path])
    column = header.split(",").index("notes")
    cells = first.split(",")
    cells[column] = '"a note\nover two lines\u2028and a line separator"'
    path.write_text("\n".join([header, ",".join(cells)]) + "\n", encoding="utf-8")
    (row,) = read_corpus([path])
    assert row.get("notes") == "a note\nover two lines\u2028and a line separator"


def test_missing_columns_are_named(tmp_path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,model,value\nx,y,1\n", encoding="utf-8")
    with pytest.raises(TunecostError) as exc:
        read_corpus([path])
    for column in ("quantity", "stack", "num_gpus", "seq_len"):
        assert column in str(exc.value)
    assert "value" not in str(exc.value).split("missing column(s):")[1].split(", ")


def test_shipped_corpus_has_every_column() -> None:
    rows = read_corpus()
    assert rows and all(set(REQUIRED_COLUMNS) <= set(r.cells) for r in rows)
    assert DEFAULT_CORPUS_PATH.with_name("README.md").is_file()


def test_skip_reasons(corpus) -> None:
    fake = SimpleNamespace(peak_bytes=BYTES_PER_GIB, device_overhead_bytes=0)
    rows = _by_id(validate_rows(read_corpus([corpus]), simulate=lambda m: fake))
    expected = {
        "t-unknown-model": "not in the catalog",
        "t-unknown-stack": "unknown stack",
        "t-unknown-quantity": "unsupported quantity",
        "t-gptq": "gptq-int4",
        "t-bad-batch": "batch_size_per_gpu",
    }
    for row_id, words in expected.items():
        assert rows[row_id].status == "skipped" and words in rows[row_id].reason, rows[row_id]
        assert rows[row_id].predicted is None
    # the only throughput row of its (stack, GPU) is predicted with its family's prior; the tiny model's step is
    # all host time (launches and the trainer loop), so no efficiency reproduces it, and the reason says so
    # (tests/validate/test_throughput.py covers rows that calibrate and a calibration at its bound)
    speed = rows["t-speed"]
    assert speed.status == "ok" and speed.prior and speed.error is not None
    assert speed.reason.startswith("stack prior") and "slower than the counts" in speed.reason


def test_an_fsdp_row_is_one_rank_of_fsdp1(corpus) -> None:
    """A memory row on 2 GPUs under FSDP (accelerate's plugin: torch FSDP1) is predicted by the per-rank
    derivation; other layouts are skipped with their reason."""
    from tunecost.distributed.rank_memory import rank_memory, single_gpu_step
    from tunecost.validate.corpus import CorpusRow
    from tunecost.workload.parallel import ParallelPlan

    multi = next(r for r in read_corpus([corpus]) if r.id == "t-multi")
    mapped = map_row(multi)
    assert (mapped.num_gpus, mapped.strategy) == (2, "fsdp1")
    job = mapped.job.with_(stack="hf-peft")
    rank = rank_memory(single_gpu_step(job), job, ParallelPlan(num_gpus=2, gpus_per_node=2, strategy="fsdp1"))
    row = _by_id(validate_rows([multi]))["t-multi"]
    assert (row.status, row.predicted) == ("ok", round(rank.peak_bytes / BYTES_PER_GIB, 3))
    for cells, words in (
        ({"parallelism": "hybrid sharding"}, "not modelled"),
        ({"parallelism": "deepspeed"}, "not modelled"),
        ({"parallelism": ""}, "unstated"),
    ):
        with pytest.raises(Skip, match=words):
            map_row(CorpusRow(path=multi.path, line=multi.line, cells={**multi.cells, **cells}))


def test_an_fsdp_rows_nvidia_smi_is_the_ranks_replayed_reserve(corpus) -> None:
    """nvidia-smi on a multi-GPU row: the rank's replayed reserve (`distributed.rank_reserve`), above its
    allocated peak, plus the CUDA context and NCCL's memory."""
    from tunecost.distributed.rank_memory import rank_memory, single_gpu_step
    from tunecost.validate.corpus import CorpusRow
    from tunecost.workload.parallel import ParallelPlan

    multi = next(r for r in read_corpus([corpus]) if r.id == "t-multi")
    smi = CorpusRow(path=multi.path, line=multi.line, cells={**multi.cells, "quantity": "nvidia_smi_gib"})
    job = map_row(smi).job.with_(stack="hf-peft")
    rank = rank_memory(single_gpu_step(job), job, ParallelPlan(num_gpus=2, gpus_per_node=2, strategy="fsdp1"))
    assert rank.peak_reserved_bytes > rank.peak_bytes
    row = _by_id(validate_rows([smi]))["t-multi"]
    expected = rank.peak_reserved_bytes + rank.device_overhead_bytes + rank.nccl_bytes
    assert (row.status, row.predicted) == ("ok", round(expected / BYTES_PER_GIB, 3))


def test_lora_target_names() -> None:
    assert lora_targets("q_proj;v_proj") == ("q_proj", "v_proj")  # PEFT's default for Llama: two projections
    assert lora_targets("q_proj;k_proj;v_proj;o_proj") == lora_targets("query_key_value") == ("attention",)
    assert lora_targets("c_attn;c_proj;w1;w2") == ("attention", "mlp")  # Qwen's c_proj: attention and MLP out
    assert lora_targets("gate_proj;up_proj;down_proj") == ("mlp",)
    # NeMo 1 (MLPerf's `target_modules: ['attention']`) and Megatron Core names
    assert lora_targets("attention") == lora_targets("attention_qkv;attention_dense") == ("attention",)
    assert lora_targets("linear_qkv;linear_proj;linear_fc1;linear_fc2") == ("attention", "mlp")
    assert lora_targets("linear_qkv") == lora_targets("attention_qkv") == ("k_proj", "q_proj", "v_proj")  # fused qkv
    # the separators sources use: a comma, a Python list, spaces
    assert lora_targets("linear_qkv,linear_proj") == lora_targets("['linear_qkv', 'linear_proj']") == ("attention",)
    assert lora_targets("q_proj v_proj") == lora_targets("q_proj;v_proj")
    for bad in ("", "wte;lm_head (trained fully)", "frobnicate"):
        with pytest.raises(Skip):
            lora_targets(bad)


def test_whole_modules_beside_lora_are_modules_to_save() -> None:
    """Qwen's finetune.py trains wte and lm_head beside LoRA on a base model (PEFT modules_to_save)."""
    cell = "c_attn;c_proj;w1;w2;wte;lm_head (trained fully)"
    assert lora_targets(cell) == ("attention", "mlp")
    assert modules_to_save(cell) == ("embed_tokens", "lm_head")
    assert modules_to_save("q_proj;v_proj") == ()
    with pytest.raises(Skip, match="norm"):
        modules_to_save("q_proj;norm (trained fully)")


def test_gptq_rows_map_to_the_checkpoint_and_kernel() -> None:
    """A GPTQ checkpoint row: the base model's architecture, its quantize_config group size, the stack's kernel."""
    from tunecost.validate.corpus import CorpusRow

    rows = {r.id: r for r in read_corpus()}
    fms = map_row(rows["fms-132"]).job  # TheBloke/Mistral-7B-v0.1-GPTQ, accelerated-peft-autogptq
    assert (fms.model, fms.method, fms.quant_type, fms.gptq_group_size, fms.gptq_kernel) == (
        "mistral-7b-v0.1",
        "qlora",
        "gptq",
        128,
        "triton-v2",
    )
    qwen = map_row(rows["qwen-73"]).job  # Qwen/Qwen-7B-Chat-Int4 under Qwen's finetune.py
    assert (qwen.model, qwen.gptq_group_size, qwen.gptq_kernel, qwen.compute_dtype) == ("qwen-7b", 128, "torch", "fp16")
    emb = map_row(rows["qwen-61"]).job  # Qwen/Qwen-7B LoRA with wte and lm_head trained
    assert (emb.method, emb.modules_to_save) == ("lora", ("embed_tokens", "lm_head"))
    row = rows["fms-132"]
    with pytest.raises(Skip, match="kernel it loads"):
        map_row(
            CorpusRow(path=row.path, line=row.line, cells={**row.cells, "stack": "hf-transformers+peft+accelerate"})
        )


def test_corpus_stacks_are_named_stacks() -> None:
    assert stack_for("hf-transformers+peft+accelerate").name == "hf-trainer"
    assert stack_for("hf-transformers+peft+accelerate", "bnb-nf4").name == "hf-trainer-bnb"
    assert stack_for("hf-transformers+peft+accelerate", "bnb-nf4", "baseline-peft-bnb").name == "trl-sft-bnb"
    assert stack_for("hf-transformers+peft+accelerate (accelerated-peft-bnb plugin)").name == "hf-trainer-bnb"
    assert stack_for("hf-transformers+peft (Qwen finetune.py)").name == "qwen-finetune"
    assert stack_for("torchtune").simulator_stack == "torchtune"
    assert stack_for("unsloth").simulator_stack is None
    assert stack_for("acme-trainer") is None
    for stack in STACKS.values():
        assert stack.kept_for_backward and stack.loss and stack.adapters and stack.allocator


def test_qwen_qlora_rows_run_deepspeed_zero2_fp16() -> None:
    """Qwen's finetune_qlora_single_gpu.sh runs finetune.py with --fp16 and finetune/ds_config_zero2.json
    (reduce_bucket_size 2e8, overlap_comm true, an AdamW optimizer section) on one GPU: DeepSpeed's fp16 engine
    without autocast, so the loss stays in fp16, and DeepSpeed's FusedAdam; its LoRA script runs the Trainer's
    bf16 autocast and torch AdamW without DeepSpeed."""
    from tunecost.simulate.behaviour import (
        ADAMW_FUSED,
        ADAMW_TORCH_20,
        LOSS_MODEL_SHIFTED,
        LOSS_MODEL_SHIFTED_NO_AUTOCAST,
    )

    rows = {r.id: r for r in read_corpus()}
    qlora = map_row(rows["qwen-25"]).behaviour  # Qwen/Qwen-1_8B-Chat-Int4, Q-LoRA
    assert (qlora.loss_code, qlora.adamw_impl) == (LOSS_MODEL_SHIFTED_NO_AUTOCAST, ADAMW_FUSED)  # FusedAdam
    assert qlora.deepspeed_zero2 is not None and qlora.deepspeed_zero2.bucket_bytes() == 2 * 200_000_000 * 2
    for lora_id in ("qwen-01", "qwen-13"):  # LoRA, LoRA (emb): the Trainer's adamw_torch on PyTorch 2.0
        lora = map_row(rows[lora_id]).behaviour
        assert (lora.loss_code, lora.deepspeed_zero2, lora.adamw_impl) == (LOSS_MODEL_SHIFTED, None, ADAMW_TORCH_20)
    # another stack's GPTQ rows (fms-acceleration's accelerated-peft-autogptq) are not DeepSpeed
    assert map_row(rows["fms-132"]).behaviour.deepspeed_zero2 is None


def test_qwen_full_parameter_rows_are_one_rank_of_deepspeed_zero2() -> None:
    """Qwen's finetune_ds.sh (full parameters) runs finetune.py with --bf16 and finetune/ds_config_zero2.json on
    each GPU: a single-GPU row is one rank of the zero2 strategy with that file's buckets (2e8 elements, overlap_comm:
    two), DeepSpeed's bf16 engine without autocast (the loss in bf16); its prediction is that rank's memory."""
    from tunecost.distributed.rank_memory import rank_memory
    from tunecost.simulate.behaviour import LOSS_MODEL_SHIFTED_NO_AUTOCAST
    from tunecost.validate.run import _simulate, validate_row
    from tunecost.validate.throughput import rank_step

    rows = {r.id: r for r in read_corpus()}
    mapped = map_row(rows["qwen-37"])  # Qwen/Qwen-1_8B, full, 1 x 256 tokens, A100-SXM4-80GB
    plan = mapped.plan()
    assert (plan.num_gpus, plan.strategy, plan.reduce_bucket_elements, plan.overlap_comm) == (1, "zero2", 2e8, True)
    assert mapped.behaviour.loss_code == LOSS_MODEL_SHIFTED_NO_AUTOCAST and mapped.behaviour.deepspeed_zero2 is None
    rank = _simulate(mapped)
    assert rank.peak_bytes == rank_memory(rank_step(mapped), mapped.simulator_job, plan).peak_bytes
    assert rank.nccl_bytes == 0  # one rank: no communicator
    assert validate_row(rows["qwen-37"]).status == "ok"
    assert validate_row(rows["qwen-38"]).status == "skipped"  # its throughput: DeepSpeed's own step, not modelled


def test_rows_pick_their_stack_behaviours(corpus) -> None:
    """fms-acceleration's baseline QLoRA goes through TRL's SFTTrainer (fp32 norms on one GPU; FSDP skips the
    preparation), its accelerated-peft-bnb plugin does not; the loss code follows the row's transformers version,
    and Qwen (1.0) models run their own remote code."""
    from tunecost.simulate.behaviour import (
        LOSS_MODEL_SHIFTED,
        LOSS_TRANSFORMERS_5,
        LOSS_TRANSFORMERS_440,
        LOSS_TRANSFORMERS_446,
    )
    from tunecost.validate.corpus import CorpusRow
    from tunecost.validate.stack_behaviour import loss_code_for

    fms = "torch 2.4.1; transformers 4.48.1; peft 0.13.2"
    assert loss_code_for("mistralai/Mistral-7B-v0.1", fms) == LOSS_TRANSFORMERS_446
    assert loss_code_for("mistralai/Mistral-7B-v0.1", "transformers 4.40.0") == LOSS_TRANSFORMERS_440
    # the 2023 stacks (read in the 4.31.0, 4.36.2 and 4.39.3 wheels): the forward upcasts the logits as 4.40 does;
    # before 4.31 (4.30.2) Llama shifts the compute-dtype logits
    assert loss_code_for("meta-llama/Llama-2-7b-hf", "transformers 4.31.0; peft 0.4.0") == LOSS_TRANSFORMERS_440
    assert loss_code_for("mistralai/Mistral-7B-v0.1", "transformers 4.36.2") == LOSS_TRANSFORMERS_440
    assert loss_code_for("huggyllama/llama-7b", "transformers 4.30.2") == LOSS_MODEL_SHIFTED
    assert loss_code_for("mistralai/Mistral-7B-v0.1", "transformers 4.49.0") == LOSS_TRANSFORMERS_5
    assert loss_code_for("mistralai/Mistral-7B-v0.1", "") == LOSS_TRANSFORMERS_5
    assert loss_code_for("Qwen/Qwen-7B-Chat", "torch 2.1.1") == LOSS_MODEL_SHIFTED
    assert loss_code_for("Qwen/Qwen1.5-7B", "") == LOSS_TRANSFORMERS_5  # in transformers since 4.37
    # GPTBigCode's forward computes its own loss up to 4.48 (read in the 4.48.1 wheel), not via loss_function
    assert loss_code_for("bigcode/gpt_bigcode-santacoder", fms, "gpt_bigcode") == LOSS_MODEL_SHIFTED
    assert loss_code_for("bigcode/gpt_bigcode-santacoder", "transformers 4.49.0", "gpt_bigcode") == LOSS_TRANSFORMERS_5

    base = next(r for r in read_corpus([corpus]) if r.id == "t-alloc")
    qlora = {"method": "qlora", "quantization": "bnb-nf4", "stack_versions": fms}
    for cells, stack, kbit, loss in (
        ({**qlora, "notes": "framework baseline-peft-bnb; 100 steps"}, "trl-sft-bnb", True, LOSS_TRANSFORMERS_446),
        ({**qlora, "notes": "framework accelerated-peft-bnb"}, "hf-trainer-bnb", False, LOSS_TRANSFORMERS_446),
        ({**qlora, "notes": ""}, "hf-trainer-bnb", False, LOSS_TRANSFORMERS_446),
        ({"stack_versions": ""}, "hf-trainer", False, LOSS_TRANSFORMERS_5),
    ):
        mapped = map_row(CorpusRow(path=base.path, line=base.line, cells={**base.cells, **cells}))
        assert (mapped.stack.name, mapped.behaviour.kbit_fp32_norms, mapped.behaviour.loss_code) == (stack, kbit, loss)
        assert mapped.strategy is None  # one GPU
    multi = next(r for r in read_corpus([corpus]) if r.id == "t-multi")
    for framework, stack in (("baseline-peft-bnb", "trl-sft-bnb"), ("accelerated-peft-bnb", "hf-trainer-bnb")):
        cells = {**multi.cells, **qlora, "notes": f"framework {framework}"}
        mapped = map_row(CorpusRow(path=multi.path, line=multi.line, cells=cells))
        assert mapped.stack.name == stack and not mapped.behaviour.kbit_fp32_norms  # FSDP: not prepared
        assert mapped.strategy == "fsdp1"  # accelerate's FSDP is torch FSDP1


def test_predictions_come_from_the_simulator(corpus) -> None:
    from tunecost.simulate import simulate_step

    rows = read_corpus([corpus])
    out = _by_id(validate_rows(rows))
    for row_id, quantity in (("t-alloc", "peak_allocated_gib"), ("t-smi", "nvidia_smi_gib")):
        mapped = map_row(next(r for r in rows if r.id == row_id))
        sim = simulate_step(mapped.job.with_(stack=mapped.stack.simulator_stack), behaviour=mapped.behaviour)
        got = out[row_id]
        assert got.status == "ok", got
        assert got.predicted == pytest.approx(predicted_bytes(quantity, sim) / BYTES_PER_GIB, abs=1e-3)
        assert got.error == pytest.approx((got.predicted - got.measured) / got.measured * 100, abs=0.01)
    # nvidia-smi: the replayed allocator's reserve plus the stated device overhead (the CUDA context)
    smi = map_row(next(r for r in rows if r.id == "t-smi"))
    sim = simulate_step(smi.job.with_(stack=smi.stack.simulator_stack), behaviour=smi.behaviour)
    assert sim.peak_reserved_bytes >= sim.peak_bytes
    assert predicted_bytes("nvidia_smi_gib", sim) == sim.peak_reserved_bytes + sim.device_overhead_bytes
    # a tiny model fits an 80 GB card: predicted 0 where the row says it ran out of memory -> wrong (error -1)
    assert out["t-oom"].predicted == 0.0 and out["t-oom"].error == -1.0


def test_oom_prediction_compares_with_gpu_memory(corpus) -> None:
    rows = [r for r in read_corpus([corpus]) if r.id == "t-oom"]
    huge = SimpleNamespace(peak_bytes=81 * BYTES_PER_GIB, device_overhead_bytes=BYTES_PER_GIB)
    small = SimpleNamespace(peak_bytes=BYTES_PER_GIB, device_overhead_bytes=BYTES_PER_GIB)
    assert validate_rows(rows, simulate=lambda m: huge)[0].predicted == 1.0
    assert validate_rows(rows, simulate=lambda m: small)[0].predicted == 0.0


def test_reserved_is_capped_by_what_the_gpu_leaves_the_allocator() -> None:
    """Before it fails, the allocator releases its cached segments and retries: the reserve never exceeds the
    GPU's memory less what the allocator does not manage, and never falls below the allocated peak."""
    sim = SimpleNamespace(
        peak_bytes=30 * BYTES_PER_GIB,
        peak_reserved_bytes=50 * BYTES_PER_GIB,
        device_overhead_bytes=BYTES_PER_GIB,
        nccl_bytes=0,
    )
    assert predicted_bytes("peak_reserved_gib", sim) == 50 * BYTES_PER_GIB
    assert predicted_bytes("peak_reserved_gib", sim, 40 * BYTES_PER_GIB) == 39 * BYTES_PER_GIB
    assert predicted_bytes("nvidia_smi_gib", sim, 40 * BYTES_PER_GIB) == 40 * BYTES_PER_GIB
    assert (
        predicted_bytes("peak_reserved_gib", sim, 20 * BYTES_PER_GIB) == 30 * BYTES_PER_GIB
    )  # does not fit at all: allocated
    rank = SimpleNamespace(
        peak_bytes=30 * BYTES_PER_GIB, device_overhead_bytes=BYTES_PER_GIB, nccl_bytes=BYTES_PER_GIB
    )  # no replayed reserve
    assert predicted_bytes("nvidia_smi_gib", rank) == 32 * BYTES_PER_GIB


def test_simulation_failure_is_a_skipped_row(corpus) -> None:
    rows = [r for r in read_corpus([corpus]) if r.id == "t-alloc"]

    def boom(mapped):
        raise RuntimeError("fake tensors disagree\nsecond line")

    (row,) = validate_rows(rows, simulate=boom)
    assert row.status == "skipped" and row.reason == "simulation failed: fake tensors disagree"


def test_summary_per_quantity_and_stack(corpus) -> None:
    fake = SimpleNamespace(peak_bytes=int(0.011 * BYTES_PER_GIB), device_overhead_bytes=0)
    rows = validate_rows(read_corpus([corpus]), simulate=lambda m: fake)
    by_key = {(s.quantity, s.stack): s for s in summarize(rows)}
    alloc = by_key[("peak_allocated_gib", "all")]
    assert alloc.rows == 6 and alloc.modelled == 2  # t-alloc and the 2-GPU FSDP row t-multi
    # t-alloc: 0.011 vs 0.01 GiB (+10 %); t-multi: 0.011 vs 1.0 GiB (-98.9 %); median of the two
    assert alloc.median_abs_pct_error == pytest.approx((10.0 + 98.9) / 2, abs=0.05)
    assert by_key[("oom", "hf-trainer")].right == 0
    totals = memory_totals(rows)
    assert totals["peak_rows_modelled"] == 3 and totals["oom_rows_modelled"] == 1


@pytest.mark.parametrize(("peak_gib", "fits_right", "oom_right"), [(0.011, 3, 0), (1000.0, 0, 1)])
def test_fits_verdict_counts_peak_rows_that_ran_and_oom_rows(corpus, peak_gib, fits_right, oom_right) -> None:
    """A peak-memory row ran, so it fit its GPU: the verdict on its setting is right when tunecost says it fits.
    The fits/out-of-memory accuracy counts those rows beside the oom rows, with the same verdict."""
    fake = SimpleNamespace(peak_bytes=int(peak_gib * BYTES_PER_GIB), device_overhead_bytes=0)
    rows = validate_rows(read_corpus([corpus]), simulate=lambda m: fake)
    peak = [r for r in rows if r.status == "ok" and r.quantity in PEAK_MEMORY_QUANTITIES]
    assert all(r.fits is (peak_gib < 1.0) for r in peak)
    totals = memory_totals(rows)
    assert totals["ran_rows_modelled"] == 3 and totals["fits_right"] == fits_right
    assert totals["oom_right"] == oom_right
    assert totals["verdict_rows"] == 4 and totals["verdict_right"] == fits_right + oom_right


@pytest.mark.parametrize(("peak_gib", "fit"), [(0.011, "yes"), (1000.0, "no")])
def test_the_commands_verdict_with_the_margin(corpus, peak_gib, fit) -> None:
    """Each row also carries the verdict `memory` and `estimate` give (reserve + CUDA context, with the safety
    margin); the totals count out-of-memory rows called a fit and runs called out of memory."""
    fake = SimpleNamespace(peak_bytes=int(peak_gib * BYTES_PER_GIB), device_overhead_bytes=0)
    rows = validate_rows(read_corpus([corpus]), simulate=lambda m: fake)
    judged = [r for r in rows if r.status == "ok" and r.fit is not None]
    assert judged and all(r.fit == fit for r in judged)
    totals = memory_totals(rows)
    assert totals["oom_fit_with_margin"] == (1 if fit == "yes" else 0)
    assert totals["ran_not_fit_with_margin"] == (0 if fit == "yes" else 3)
    assert 0 < totals["margin_fraction"] < 1


def test_cli_json_rows_and_out(corpus, cli_runner, tmp_path) -> None:
    out = tmp_path / "run"
    result = cli_runner.invoke(app, ["validate", str(corpus), "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 10 and all(tuple(r) == OUTPUT_COLUMNS for r in rows)
    csv_lines = (out / "validation.csv").read_text(encoding="utf-8").splitlines()
    assert csv_lines[0] == ",".join(OUTPUT_COLUMNS) and len(csv_lines) == 1 + len(rows)
    records = read_records(out / "validation.jsonl")
    assert [(r["kind"], r["id"], r["quantity"]) for r in records] == [
        ("validation", r["id"], r["quantity"]) for r in rows
    ]
    again = cli_runner.invoke(app, ["validate", str(corpus), "--json", "--out", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    forced = cli_runner.invoke(app, ["validate", str(corpus), "--json", "--out", str(out), "--force"])
    assert forced.exit_code == 0 and len(read_records(out / "validation.jsonl")) == len(rows)


def test_report_draws_the_validation_records(corpus, cli_runner, tmp_path) -> None:
    run = tmp_path / "run"
    assert cli_runner.invoke(app, ["validate", str(corpus), "--out", str(run)]).exit_code == 0
    result = cli_runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    html = (run / "report.html").read_text(encoding="utf-8")
    assert "Accuracy against published measurements" in html and "median |error| %" in html
    assert "inside 95 %" in html and "95 % intervals (held out)" in html  # coverage beside the error


def test_cli_table_output_has_no_error_line(corpus, cli_runner) -> None:
    """A run that succeeds prints its tables and legend; no line reads as an error (`error:` starts only the one
    line of a failed command)."""
    result = cli_runner.invoke(app, ["validate", str(corpus)])
    assert result.exit_code == 0, result.output
    assert "error column: signed %" in result.output
    assert not [line for line in result.output.splitlines() if line.startswith("error:")]


def test_cli_says_when_no_row_is_skipped(tmp_path, cli_runner, corpus) -> None:
    rows = [line for line in corpus.read_text(encoding="utf-8").splitlines()]
    modelled = {r.id for r in validate_rows(read_corpus([corpus])) if r.status == "ok"}
    kept = [rows[0]] + [line for line in rows[1:] if line.split(",", 1)[0] in modelled]
    path = tmp_path / "modelled.csv"
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    result = cli_runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "Rows skipped: none" in result.output


def test_cli_names_the_skipped_rows(cli_runner, corpus) -> None:
    """The skipped table gives a few ids per reason beside the count (every one with --json or --out)."""
    skipped = [r for r in validate_rows(read_corpus([corpus])) if r.status == "skipped"]
    assert skipped
    result = cli_runner.invoke(app, ["validate", str(corpus)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "Rows skipped" in text and skipped[0].id in text


def test_memory_units_in_any_case() -> None:
    """GB, G and MB are read as GiB and MiB (the sources' G/M labels on binary figures), in any case."""
    from tunecost.validate.run import unit_bytes

    assert [unit_bytes(u) for u in ("GiB", "gb", " GB ", "G", "MiB", "mb")] == [
        BYTES_PER_GIB,
        BYTES_PER_GIB,
        BYTES_PER_GIB,
        BYTES_PER_GIB,
        2**20,
        2**20,
    ]
    assert unit_bytes("bytes") == 1
    assert unit_bytes("TB") is None and unit_bytes("") is None


def test_cli_missing_columns_one_line(cli_runner, tmp_path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,value\n", encoding="utf-8")
    result = cli_runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "missing column(s)" in result.output and "Traceback" not in result.output


def test_hf_peft_stack_keeps_the_cast_input(tmp_path, monkeypatch) -> None:
    """PEFT's LoRA casts the input to fp32 and autocast casts it back: the bf16 copy is kept for backward, so
    the same job needs more memory than tunecost's own LoRA, which reuses the base matmul's saved input."""
    from tunecost.simulate import simulate_step
    from tunecost.workload.job import FineTuneJob, LoraConfig

    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA), encoding="utf-8")
    job = FineTuneJob(
        model=str(config),
        method="lora",
        lora=LoraConfig(rank=4, alpha=8, targets=("attention",)),
        gradient_checkpointing=False,
        batch_size=2,
        seq_len=64,
    )
    lean = simulate_step(job.with_(stack="tunecost"))
    peft = simulate_step(job.with_(stack="hf-peft"))
    # at least one bf16 copy of a layer input (2 x 64 tokens x 64 hidden x 2 bytes) more is alive at the peak
    assert peft.peak_bytes - lean.peak_bytes >= 2 * 64 * 64 * 2


def test_report_summary_states_the_validated_memory_error(corpus, cli_runner, tmp_path) -> None:
    from statistics import median

    from tunecost.report.run_dir import load_run
    from tunecost.report.summary import summary_lines

    run = tmp_path / "run"
    assert cli_runner.invoke(app, ["validate", str(corpus), "--out", str(run)]).exit_code == 0
    records = read_records(run / "validation.jsonl")
    memory = [abs(r["error"]) for r in records if r["status"] == "ok" and r["quantity"] in PEAK_MEMORY_QUANTITIES]
    line = summary_lines(load_run(run))[-1]
    assert f"Against {len(records)} published measurements" in line
    assert f"within {round(median(memory), 2):.1f} %" in line and f"{len(memory)} rows modelled" in line


@pytest.mark.parametrize(
    ("cell", "quantization", "expected"),
    [
        ("LLaMA-Factory 0.9 (transformers 4.46, peft 0.12)", "none", "hf-trainer"),
        ("LLaMA-Factory 0.9", "bnb-nf4", "hf-trainer-bnb"),  # no fp32 norms unless upcast_layernorm
        ("axolotl 0.4", "bnb-nf4", "hf-trainer-bnb"),  # norms back to the compute dtype after the preparation
        ("axolotl (trl installed)", "bnb-nf4", "hf-trainer-bnb"),  # axolotl's own trainer, not TRL's
        ("hf-transformers+peft+trl", "bnb-nf4", "trl-sft-bnb"),  # TRL's SFTTrainer prepares the 4-bit model
        ("TRL SFTTrainer", "none", "hf-trainer"),
        ("transformers Trainer + PEFT", "bnb-nf4", "hf-trainer-bnb"),
        ("LLaMA-Factory (unsloth)", "bnb-nf4", "unsloth"),
        ("unsloth 2024.8", "none", "unsloth"),
        ("ctrl-trainer", "none", None),  # "trl" inside a word names no TRL
        ("HF", "none", "hf-trainer"),
        ("Trainer", "none", "hf-trainer"),
        ("FastChat", "none", "hf-trainer"),  # transformers' Trainer
        ("M-Core", "none", "nemo"),  # Megatron Core
    ],
)
def test_frameworks_built_on_the_hf_trainer_are_its_stacks(cell, quantization, expected) -> None:
    from tunecost.validate.stacks import stack_for

    stack = stack_for(cell, quantization)
    assert (stack.name if stack else None) == expected


def test_an_unsloth_row_is_skipped_with_its_reason(corpus) -> None:
    from tunecost.validate.corpus import CorpusRow

    row = next(r for r in read_corpus([corpus]) if r.get("quantity") == "peak_allocated_gib")
    with pytest.raises(Skip, match="stack unsloth not modelled"):
        map_row(CorpusRow(path=row.path, line=row.line, cells={**row.cells, "stack": "unsloth"}))


@pytest.mark.parametrize(
    ("cell", "layout"),
    [
        ("fsdp (FULL_SHARD)", ("fsdp1", "none")),
        ("FSDP", ("fsdp1", "none")),
        ("fsdp + cpu offload", ("fsdp1", "params")),
        ("FSDP2 (fully_shard)", ("fsdp2", "none")),
        ("fsdp (SHARD_GRAD_OP)", ("fsdp2-shard-grad-op", "none")),
        ("ddp", ("ddp", "none")),
        ("DeepSpeed ZeRO-2", ("zero2", "none")),
        ("deepspeed zero stage 3", ("zero3", "none")),
        ("deepspeed zero2 + offload", ("zero2", "optimizer")),
        ("deepspeed zero3 + cpu offload", ("zero3", "params")),
        ("deepspeed zero3 (offload optimizer)", ("zero3", "optimizer")),
        ("zero3 offload_param + offload_optimizer", ("zero3", "params")),
        ("zero_stage=3", ("zero3", "none")),
        ("ds_z3", ("zero3", "none")),
        ("ZeRO-3 (no offload)", ("zero3", "none")),
        ("zero2, offload: none", ("zero2", "none")),
        ("stage: 3", ("zero3", "none")),
        ("DeepSpeed Z3", ("zero3", "none")),
        ('"zero_optimization": {"stage": 3}', ("zero3", "none")),
        ("zero3_offload: none", ("zero3", "none")),
    ],
)
def test_a_multi_gpu_rows_parallelism_names_its_layout(corpus, cell, layout) -> None:
    from tunecost.validate.corpus import CorpusRow
    from tunecost.validate.model_parallel_cells import multi_gpu_layout

    multi = next(r for r in read_corpus([corpus]) if r.id == "t-multi")
    row = CorpusRow(path=multi.path, line=multi.line, cells={**multi.cells, "parallelism": cell})
    assert multi_gpu_layout(row) == layout
    mapped = map_row(row)
    assert (mapped.plan().strategy, mapped.plan().offload) == layout


def test_tensor_parallel_and_offload_under_ddp_are_skipped(corpus) -> None:
    from tunecost.validate.corpus import CorpusRow

    multi = next(r for r in read_corpus([corpus]) if r.id == "t-multi")
    for cell, words in (("ddp + cpu offload", "DDP has no CPU offload"), ("hybrid shard", "not modelled")):
        with pytest.raises(Skip, match=words):
            map_row(CorpusRow(path=multi.path, line=multi.line, cells={**multi.cells, "parallelism": cell}))


def test_all_linear_adapts_every_linear_but_the_output_layer() -> None:
    from tunecost.validate.mapping import lora_targets

    assert lora_targets("all-linear") == ("attention", "mlp")
    assert lora_targets("all-linear", is_moe=True) == ("attention", "experts", "router")
    assert lora_targets("all-linear;lm_head (trained fully)") == ("attention", "mlp")


def test_llama_factory_all_and_phi_dense_are_lora_targets() -> None:
    assert lora_targets("all") == lora_targets("all-linear") == ("attention", "mlp")
    assert lora_targets("q_proj;k_proj;v_proj;dense") == ("attention",)  # Phi's attention output


def test_optimizer_cell_names_the_simulated_optimizer() -> None:
    from tunecost.validate.mapping import optimizer_for

    for cell in (
        "",
        "adamw_torch",
        "AdamW",
        "adamw_torch_fused",
        "adamw_hf",
        "FusedAdam",
        "torch.optim.AdamW",
        "DeepSpeed FusedAdam",
    ):
        assert optimizer_for(cell) == ("adamw", ""), cell
    for cell in ("adamw_8bit", "adamw_bnb_8bit", "8-bit AdamW"):
        assert optimizer_for(cell) == ("adamw-8bit", ""), cell
    assert optimizer_for("sgd") == ("sgd", "")
    with pytest.raises(Skip, match="optimizer 'adafactor' not modelled"):
        optimizer_for("adafactor")
    # paged: the adapters' few MiB of states are read as unpaged, said in the note; a model's states are skipped
    for cell, name in (("paged_adamw_32bit", "adamw"), ("paged_adamw_8bit", "adamw-8bit"), ("PagedAdamW", "adamw")):
        optimizer, note = optimizer_for(cell, adapters_only=True)
        assert optimizer == name and "unified memory" in note, cell
    with pytest.raises(Skip, match="unified memory"):
        optimizer_for("paged_adamw_8bit")
    # DeepSpeed's CPU Adam: AdamW on the host where the optimizer is offloaded; named without offload, skipped
    for cell in ("cpu_adam", "DeepSpeedCPUAdam", "deepspeed.ops.adam.DeepSpeedCPUAdam"):
        optimizer, note = optimizer_for(cell, offloaded=True)
        assert optimizer == "adamw" and "on the host" in note, cell
        with pytest.raises(Skip, match="offloads no optimizer state"):
            optimizer_for(cell)


def test_attention_and_checkpointing_cells_in_the_spellings_sources_use() -> None:
    """FlashAttention written any way is the fused kernel; a cell tunecost does not know is a skip, not a guess."""
    from tunecost.validate.mapping import attention_for

    for cell in ("flash2", "fa2", "FA2", "flash_attention_2", "flash-attn 2", "FlashAttention-2", "fa3", "", "unknown"):
        assert attention_for(cell) == "flash", cell
    for cell in ("cuDNN FMHA", "TE fused attention", "Transformer Engine (cuDNN)"):  # NeMo's fused kernels
        assert attention_for(cell) == "flash", cell
    for cell, expected in (
        ("PyTorch SDPA", "sdpa"),
        ("attn_implementation=sdpa", "sdpa"),
        ("attn_implementation=eager", "eager"),
    ):
        assert attention_for(cell) == expected, cell
    for cell, expected in (("sdpa", "sdpa"), ("SDPA", "sdpa"), ("torch sdpa", "sdpa"), ("eager", "eager")):
        assert attention_for(cell) == expected, cell
    assert attention_for("ring attention") is None


@pytest.mark.parametrize(
    ("cell", "on"), [("on", True), ("True", True), ("yes", True), ("off", False), ("false", False)]
)
def test_gradient_checkpointing_cell_spellings(corpus, cell: str, on: bool) -> None:
    row = next(r for r in read_corpus([corpus]) if r.get("quantity") == "peak_allocated_gib")
    cells = {**row.cells, "grad_ckpt": cell, "attention": "flash_attention_2"}
    assert map_row(type(row)(row.path, row.line, cells)).job.gradient_checkpointing is on
    unknown = map_row(type(row)(row.path, row.line, {**cells, "grad_ckpt": "unknown"}))  # the Trainer's default
    assert not unknown.job.gradient_checkpointing and "TrainingArguments' default" in unknown.note


def test_a_full_fine_tune_row_is_simulated_with_its_optimizer(corpus) -> None:
    """The optimizer states of a full fine-tune follow the row's optimizer cell: bf16 AdamW keeps two states of
    2 bytes per parameter (the fused kernel without the multi-tensor path's temporaries), 8-bit AdamW two of 1 byte,
    SGD without momentum none; the rest of the step is alike.
    Its throughput under another optimizer than AdamW is skipped (the counts price AdamW's step)."""
    from tunecost.simulate.behaviour import ADAMW_FUSED
    from tunecost.validate.corpus import CorpusRow

    full = next(r for r in read_corpus([corpus]) if r.id == "t-oom")

    def predicted(optimizer: str, quantity: str = "peak_allocated_gib", seq_len: str = "64") -> object:
        cells = {**full.cells, "optimizer": optimizer, "quantity": quantity, "value": "1", "unit": "MiB"}
        cells["seq_len"] = seq_len
        return validate_rows([CorpusRow(path=full.path, line=full.line, cells=cells)])[0]

    adamw, adamw8, sgd = (predicted(o) for o in ("adamw_torch", "adamw_8bit", "sgd"))
    fused_row = CorpusRow(path=full.path, line=full.line, cells={**full.cells, "optimizer": "adamw_torch_fused"})
    assert map_row(fused_row).behaviour.adamw_impl == ADAMW_FUSED
    # one kernel, no multi-tensor temporaries: lower where the optimizer step is the peak (8 tokens)
    assert predicted("adamw_torch_fused", seq_len="8").predicted < predicted("adamw_torch", seq_len="8").predicted
    assert (
        map_row(CorpusRow(path=full.path, line=full.line, cells={**full.cells, "optimizer": "sgd"})).job.optimizer
        == "sgd"
    )
    assert adamw.predicted > adamw8.predicted > sgd.predicted
    skipped = predicted("adamw_8bit", "s_per_step")
    assert skipped.status == "skipped" and "counts price AdamW" in skipped.reason


def test_rows_of_other_stacks_gpus_and_layouts_are_predicted_or_skipped_with_their_reason(corpus) -> None:
    """A file like the published measurements tunecost has not seen: other frameworks, consumer GPUs, DDP,
    DeepSpeed ZeRO with offload, FSDP's CPU offload, PEFT's all-linear, the whole job's samples per second.
    Every row is predicted or skipped with its reason; none raises."""
    from tunecost.catalog.gpus import get_gpu
    from tunecost.validate import throughput as tp
    from tunecost.validate.corpus import CorpusRow

    multi = next(r for r in read_corpus([corpus]) if r.id == "t-multi")

    def row(i: str, **cells: str) -> CorpusRow:
        return CorpusRow(path=multi.path, line=multi.line, cells={**multi.cells, "id": i, **cells})

    one = {"num_gpus": "1", "parallelism": "single"}
    # throughput on a catalog model large enough for its GPU work to matter (the tiny model is host-bound); the
    # calibration row's measured speed is the model's own at GEMM efficiency 0.6, so that it calibrates
    speed = {"model": "Qwen/Qwen2-0.5B", "batch_size_per_gpu": "4", "seq_len": "2048"}
    calibration = row("one-gpu-speed", **speed, **one, quantity="tokens_per_s_per_gpu", unit="tokens/s", value="1")
    mapped = map_row(calibration)
    step_s = tp.step_seconds(tp.step_counts(mapped), tp.gpu_terms(get_gpu("A100-80GB-SXM")), 0.6)
    tokens = {**speed, "quantity": "tokens_per_s_per_gpu", "unit": "tokens/s"}
    rows = [
        row("axolotl", stack="axolotl 0.4", gpu="NVIDIA GeForce RTX 3090", **one),
        row("trl-4bit", stack="transformers + peft + trl", method="qlora", quantization="bnb-nf4", **one),
        row("llama-factory", stack="LLaMA-Factory", lora_targets="all-linear", gpu="RTX 4070 Ti", **one),
        row("unsloth", stack="unsloth", **one),
        row("unknown-stack", stack="my own loop", **one),
        row("ddp", parallelism="ddp", quantity="nvidia_smi_gib"),
        row("zero2-offload", parallelism="deepspeed zero2 + cpu offload", num_gpus="4"),
        row("zero3-offload", parallelism="DeepSpeed ZeRO-3 (offload)", num_gpus="8", method="full", lora_rank=""),
        row("fsdp-offload", parallelism="FSDP (FULL_SHARD) + CPU offload", quantity="oom", value="0", unit=""),
        row("tensor-parallel", parallelism="tensor parallel 2", method="qlora"),
        row("one-gpu-speed", **one, **tokens, value=str(8192 / step_s)),
        row("two-gpu-speed", **tokens, value=str(0.9 * 8192 / step_s)),
        row("sixteen-gpu-speed", num_gpus="16", **tokens, value=str(0.8 * 8192 / step_s)),
        row("job-samples", **speed, num_gpus="4", quantity="samples_per_s", unit="samples/s", value=str(14 / step_s)),
        row("ambiguous-gpu", gpu="NVIDIA GeForce RTX 2080", quantity="oom", value="0", unit="", **one),
        row("unknown-gpu", gpu="Gaudi2", quantity="oom", value="0", unit="", **one),
        row("paged-lora", optimizer="paged_adamw_32bit", **one),
    ]
    out = _by_id(validate_rows(rows))
    skipped = {
        "unsloth": "stack unsloth not modelled",
        "unknown-stack": "unknown stack",
        "tensor-parallel": "not modelled",
        "ambiguous-gpu": "ambiguous GPU 'NVIDIA GeForce RTX 2080': matches the RTX 2080 (8 GB, not in the catalog)",
        "unknown-gpu": "GPU 'Gaudi2' not in the GPU catalog (its memory decides out-of-memory)",
    }
    for row_id, result in out.items():
        if row_id in skipped:
            assert result.status == "skipped" and skipped[row_id] in result.reason, (row_id, result.reason)
        else:
            assert result.status == "ok" and result.predicted is not None, (row_id, result.reason)
    assert "read as its unpaged self" in out["paged-lora"].reason
    assert out["one-gpu-speed"].reason == "calibration row"
    assert {out[i].reason for i in ("two-gpu-speed", "sixteen-gpu-speed", "job-samples")} == {
        "gemm_efficiency " + out["two-gpu-speed"].reason.split()[1] + " from one-gpu-speed"
    }


def test_torchtune_rows_name_their_recipe_options(corpus) -> None:
    """torchtune rows run the torchtune simulator stack with the options their stack cells name; a memory row under
    torch.compile and one whose sequences come from an unnamed dataset up to seq_len are skipped with the reason."""
    from tunecost.simulate.behaviour import ADAMW_FUSED, LOSS_TORCHTUNE, LOSS_TORCHTUNE_CHUNKED
    from tunecost.validate.corpus import CorpusRow
    from tunecost.validate.stacks import torchtune_options

    both_options = ("chunked cross-entropy", "activation offload")
    assert torchtune_options("torchtune 0.4 ; torch 2.5") == ()
    assert torchtune_options("torchtune (chunked CE, activations offloaded)") == both_options
    assert torchtune_options("torchtune; chunked cross-entropy; activation offloading") == both_options
    assert torchtune_options("optimizer_in_bwd true") == ("optimizer in backward",)
    base = next(r for r in read_corpus([corpus]) if r.id == "t-alloc")

    def mapped(**cells):
        return map_row(CorpusRow(path=base.path, line=base.line, cells={**base.cells, **cells}))

    plain = mapped(stack="torchtune")
    assert (plain.stack.name, plain.simulator_job.stack) == ("torchtune", "torchtune")
    assert (plain.behaviour.loss_code, plain.behaviour.activation_offload) == (LOSS_TORCHTUNE, False)
    assert plain.behaviour.adamw_impl == ADAMW_FUSED  # the recipes' configs: torch AdamW, fused=True
    both = mapped(stack="torchtune 0.4 (chunked cross-entropy, activation offload)")
    assert (both.behaviour.loss_code, both.behaviour.activation_offload) == (LOSS_TORCHTUNE_CHUNKED, True)
    assert mapped(stack="torchtune", stack_versions="optimizer in backward").behaviour.optimizer_in_backward
    with pytest.raises(Skip, match="torch.compile not modelled for memory"):
        mapped(stack="torchtune", stack_versions="torch.compile on")
    with pytest.raises(Skip, match="dataset the row does not name"):
        mapped(seq_len_kind="max", dataset="")
    assert mapped(seq_len_kind="max", dataset="alpaca, longest 4096 tokens").job.seq_len == int(base.get("seq_len"))
    multi = next(r for r in read_corpus([corpus]) if r.id == "t-multi")
    for parallelism, strategy in (("FSDP", "fsdp2"), ("fsdp1 full shard", "fsdp1")):
        cells = {**multi.cells, "stack": "torchtune", "parallelism": parallelism}
        assert map_row(CorpusRow(path=multi.path, line=multi.line, cells=cells)).strategy == strategy


def test_grad_ckpt_cells_say_how_layers_are_recomputed(corpus) -> None:
    """A grad_ckpt cell that names re-entrance sets it for the row's stack (a Trainer's gradient_checkpointing_kwargs),
    which the simulation then runs and says."""
    from tunecost.simulate.checkpointing import reentrant_checkpointing
    from tunecost.validate.corpus import CorpusRow
    from tunecost.validate.mapping import grad_ckpt_for

    assert grad_ckpt_for("on") == ("on", None) and grad_ckpt_for("No") == ("off", None)
    for cell in ("non-reentrant", "Non_Reentrant", "on (use_reentrant=False)", "use_reentrant: false"):
        assert grad_ckpt_for(cell) == ("on", False), cell
    assert grad_ckpt_for("reentrant") == ("on", True)
    assert grad_ckpt_for("unknown") is None and grad_ckpt_for("") is None
    for cell, read in (
        ("\u2713", "on"),
        ("GC", "on"),
        ("recompute_num_layers=0", "off"),
        ("recompute_granularity=null", "off"),
    ):
        assert grad_ckpt_for(cell) == (read, None), cell
    base = next(r for r in read_corpus([corpus]) if r.id == "t-alloc")
    row = CorpusRow(path=base.path, line=base.line, cells={**base.cells, "grad_ckpt": "non-reentrant"})
    mapped = map_row(row)
    assert mapped.stack.simulator_stack == "hf-peft" and mapped.behaviour.reentrant_checkpointing is False
    assert reentrant_checkpointing(mapped.simulator_job)  # the stack's own default
    assert not reentrant_checkpointing(mapped.simulator_job, mapped.behaviour)
    # Megatron's selective recomputation: the core attention only, not the layer
    assert grad_ckpt_for("selective") == ("selective", None)
    job = map_row(CorpusRow(path=base.path, line=base.line, cells={**base.cells, "grad_ckpt": "selective"})).job
    assert job.selective_recompute and not job.gradient_checkpointing


def test_fp8_cells_say_the_recipe_and_whether_the_weights_are_fp8(corpus) -> None:
    """ "fp8" under Transformer Engine is delayed scaling; a cell naming FP8 primary weights (NeMo `fp8_params`,
    Megatron-LM `--fp8-param-gather`) keeps the linears' weights in FP8 only."""
    from tunecost.validate.cells import fp8_of, fp8_params_of
    from tunecost.validate.corpus import CorpusRow

    assert fp8_of("fp8 (TE)", "") == ("bf16", "te-delayed") and not fp8_params_of("fp8 (TE)")
    assert fp8_params_of("fp8, fp8_params") and fp8_params_of("FP8 (TE, param gather)")
    base = next(r for r in read_corpus([corpus]) if r.id == "t-alloc")
    for cell, params in (("fp8 (TE)", False), ("fp8 (TE, fp8 params)", True)):
        row = CorpusRow(path=base.path, line=base.line, cells={**base.cells, "compute_dtype": cell})
        job = map_row(row).job
        assert (job.fp8, job.fp8_params) == ("te-delayed", params), cell


def test_rows_that_name_liger_run_its_kernels(corpus) -> None:
    """A row whose stack, versions or notes name Liger is simulated and counted with its kernels; one that says it
    ran without them, or a torchtune row (no Liger), is not."""
    from tunecost.validate.corpus import CorpusRow

    base = next(r for r in read_corpus([corpus]) if r.id == "t-alloc")

    def mapped(**cells):
        return map_row(CorpusRow(path=base.path, line=base.line, cells={**base.cells, **cells}))

    assert mapped(stack="axolotl + Liger").job.liger_kernel
    assert mapped(stack_versions="liger-kernel 0.5.2").job.liger_kernel
    assert not mapped(notes="without Liger").job.liger_kernel
    assert not mapped().job.liger_kernel
    with pytest.raises(Skip, match="--liger-kernel"):
        mapped(stack="torchtune", notes="liger")


def test_a_memory_value_that_cannot_be_measured_and_a_fractional_count_are_skipped(corpus) -> None:
    """nan, inf, zero and negative memory values, and a sequence length or accumulation that is not whole, are
    skipped with their reason instead of entering the accuracy figures."""
    from tunecost.validate.corpus import CorpusRow

    multi = next(r for r in read_corpus([corpus]) if r.id == "t-multi")
    fake = SimpleNamespace(peak_bytes=BYTES_PER_GIB, device_overhead_bytes=0)
    rows = [
        CorpusRow(path=multi.path, line=multi.line, cells={**multi.cells, "id": f"v-{value}", "value": value})
        for value in ("nan", "inf", "0", "-5")
    ]
    rows += [
        CorpusRow(path=multi.path, line=multi.line, cells={**multi.cells, "id": f"c-{column}", column: "4096.5"})
        for column in ("seq_len", "grad_accum")
    ]
    for out in validate_rows(rows, simulate=lambda m: fake):
        expected = "finite number > 0" if out.id.startswith("v-") else "not a whole number"
        assert out.status == "skipped" and expected in out.reason, out


def test_out_never_replaces_a_file_the_user_had(corpus, cli_error, tmp_path) -> None:
    """A folder whose validation.csv has no validation.jsonl beside it, or whose meta.json tunecost did not write,
    is not a run folder: refused before any row is validated, the files untouched (even with --force)."""
    for name, text in (("validation.csv", "my,own,data\n"), ("meta.json", '{"my": "meta"}')):
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).write_text(text, encoding="utf-8")
        line = cli_error(["validate", str(corpus), "--out", str(folder)])
        assert line.startswith("error: --out") and "give another folder" in line
        assert (folder / name).read_text(encoding="utf-8") == text and not (folder / "validation.jsonl").exists()
