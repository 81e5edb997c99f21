"""Several files, one job: each file read by its framework, stated values over other files' defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigJob
from tunecost.workload.frameworks.registry import merge_configs, runnable_strategies


def _job(path: str, options: dict, assumptions: tuple[str, ...] = ()) -> ConfigJob:
    return ConfigJob(framework=path.split(".")[0], path=path, options=options, assumptions=assumptions)


def test_a_stated_value_wins_over_another_files_default() -> None:
    args = _job("args.json", {"dtype": "fp32", "batch_size": 2}, ("dtype fp32: the Trainer's default",))
    accelerate = _job("accelerate.yaml", {"dtype": "bf16", "num_gpus": 2})
    merged = merge_configs([args, accelerate])
    assert merged.options == {"dtype": "bf16", "batch_size": 2, "num_gpus": 2}
    assert "dtype fp32: the Trainer's default" not in merged.assumptions  # overridden, so not assumed


def test_lora_beside_4bit_is_qlora_and_two_stated_values_clash() -> None:
    assert merge_configs([_job("a.json", {"method": "lora"}), _job("b.json", {"method": "qlora"})]).options == {
        "method": "qlora"
    }
    with pytest.raises(TunecostError, match=r"b.json: lora_rank is 16 but a.json says 8"):
        merge_configs([_job("a.json", {"lora_rank": 8}), _job("b.json", {"lora_rank": 16})])


def test_the_line_asking_for_the_deepspeed_file_goes_once_it_is_given() -> None:
    """Once a DeepSpeed file is given the line asking for it goes; given under another name than the config's, the
    merge says which is priced (axolotl's zero2.json beside a zero3 file passed by hand)."""
    asking = _job("lf.yaml", {"method": "full"}, ("deepspeed config ds_z3.json: pass it too with --config",))
    assert merge_configs([asking]).assumptions == asking.assumptions
    given = ConfigJob(framework="deepspeed", path="configs/ds_z3.json", options={"strategy": "zero3"})
    assert merge_configs([asking, given]).assumptions == ()
    other = ConfigJob(framework="deepspeed", path="zero2.json", options={"strategy": "zero2"})
    assert merge_configs([asking, other]).assumptions == (
        "strategy: lf.yaml names DeepSpeed file ds_z3.json; zero2.json is priced instead",
    )


def test_the_deepspeed_file_a_config_names_is_read_where_it_is(tmp_path: Path, monkeypatch) -> None:
    """LLaMA-Factory's `deepspeed: examples/deepspeed/ds_z3_config.json`, relative to the folder it is launched from
    (else to the config's), is read with the config; a file given beside it, or none found, is left as it was."""
    from tunecost.workload.frameworks.registry import read_configs

    (tmp_path / "examples" / "deepspeed").mkdir(parents=True)
    (tmp_path / "examples" / "deepspeed" / "ds_z3_config.json").write_text('{"zero_optimization": {"stage": 3}}')
    lf = "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: full\n"
    (tmp_path / "lf.yaml").write_text(lf + "deepspeed: examples/deepspeed/ds_z3_config.json\n")
    monkeypatch.chdir(tmp_path)
    job = read_configs(["lf.yaml"])
    assert job.framework == "llamafactory+deepspeed" and job.options["strategy"] == "zero3"
    assert "deepspeed config examples/deepspeed/ds_z3_config.json: read" in job.assumptions
    assert not any("upcasts" in a for a in job.assumptions)  # ZeRO-3 keeps no fp32 upcast (model/adapter.py)
    monkeypatch.chdir(tmp_path / "examples")  # beside the config, not where it is launched from
    assert read_configs([tmp_path / "lf.yaml"]).options["strategy"] == "zero3"
    (tmp_path / "my ds").mkdir()
    (tmp_path / "my ds" / "z2.json").write_text('{"zero_optimization": {"stage": 2}}')
    (tmp_path / "lf.yaml").write_text(lf + 'deepspeed: "my ds/z2.json"\n')
    assert read_configs([tmp_path / "lf.yaml"]).options["strategy"] == "zero2"
    (tmp_path / "my ds" / "z2.json").write_text("{not json")
    with pytest.raises(TunecostError, match=r"lf.yaml names DeepSpeed file my ds/z2.json: .*z2.json"):
        read_configs([tmp_path / "lf.yaml"])
    (tmp_path / "lf.yaml").write_text(lf + "deepspeed: missing.json\n")
    alone = read_configs([tmp_path / "lf.yaml"])
    assert "strategy" not in alone.options and alone.framework == "llamafactory"
    assert "deepspeed config missing.json: pass it too with --config" in alone.assumptions
    # a DeepSpeed engine, whatever its stage, casts the module back to bf16: LLaMA-Factory's upcast does not stand
    assert "fp32_params" not in alone.options and not any("upcasts" in a for a in alone.assumptions)


def test_llamafactorys_fp32_parameters_stand_without_deepspeed(tmp_path: Path) -> None:
    """model/adapter.py upcasts a full fine-tune's parameters unless under ZeRO-3, and DeepSpeed's engine casts its
    module to its dtype: a DeepSpeed file beside the config drops `fp32_params`; an accelerate FSDP file keeps them
    (fp32 shards, layers gathered in bf16), and so does TRL's LoRA over its fp32 frozen weights."""
    from tunecost.workload.frameworks.registry import read_configs

    lf = tmp_path / "lf.yaml"
    lf.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: full\nbf16: true\n")
    assert read_configs([lf]).options["fp32_params"] is True
    ddp = tmp_path / "ddp.yaml"
    ddp.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: bf16\n")
    assert read_configs([lf, ddp]).options["fp32_params"] is True
    fsdp = tmp_path / "fsdp.yaml"
    fsdp.write_text(
        "distributed_type: FSDP\nnum_processes: 2\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n"
    )
    job = read_configs([lf, fsdp])
    assert job.options["fp32_params"] is True and job.options["strategy"] == "fsdp2"
    assert any("upcasts" in a for a in job.assumptions)
    ds = tmp_path / "z2.json"
    ds.write_text('{"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}}')
    job = read_configs([lf, ds])
    assert "fp32_params" not in job.options and not any("upcasts" in a for a in job.assumptions)
    assert not any("sharded by" in a for a in job.assumptions)
    trl = tmp_path / "trl.yaml"
    trl.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 2\noutput_dir: out\nuse_peft: true\n"
    )
    assert read_configs([trl]).options["fp32_params"] is True
    job = read_configs([trl, fsdp])
    assert job.options["fp32_params"] is True and job.options["method"] == "lora"
    assert read_configs([trl, ds]).options.get("fp32_params") is None


def test_the_trainers_bf16_runs_before_accelerates_fp8(tmp_path: Path) -> None:
    """TrainingArguments.__post_init__ sets the mixed precision from bf16 / fp16 (TRL's SFTConfig: bf16 unless fp16)
    before accelerate's fp8: beside them the run is not FP8; beside bf16 and fp16 false it is."""
    from tunecost.workload.frameworks.registry import read_configs

    accelerate = tmp_path / "acc.yaml"
    accelerate.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: fp8\n")
    for bf16, fp8 in (("true", None), ("false", "tensorwise")):
        args = tmp_path / f"args-{bf16}.yaml"
        args.write_text(f"output_dir: o\nper_device_train_batch_size: 2\nnum_train_epochs: 1\nbf16: {bf16}\n")
        job = read_configs([accelerate, args])
        assert job.options.get("fp8") == fp8 and job.options["dtype"] == "bf16"
        assert any(a.startswith("fp8 none:") for a in job.assumptions) == (fp8 is None)
    sft = tmp_path / "sft.yaml"
    sft.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\ndataset_name: trl-lib/Capybara\nfp16: true\n")
    job = read_configs([accelerate, sft])
    assert "fp8" not in job.options and job.options["dtype"] == "fp16"


def test_a_yaml_merge_key_may_be_overridden_and_a_repeated_key_may_not(tmp_path) -> None:
    from tunecost.errors import TunecostError
    from tunecost.workload.frameworks import parse_config_file

    merged = tmp_path / "merge.yaml"
    merged.write_text("base: &b\n  lr: 1\nrun:\n  <<: *b\n  lr: 2\n", encoding="utf-8")
    assert parse_config_file(merged) == {"base": {"lr": 1}, "run": {"lr": 2}}
    repeated = tmp_path / "repeated.yaml"
    repeated.write_text("run:\n  lr: 1\n  lr: 2\n", encoding="utf-8")
    with pytest.raises(TunecostError, match=r"key 'lr' is given twice in one mapping \(line 3\)"):
        parse_config_file(repeated)


def test_a_yaml_config_cannot_build_python_objects(tmp_path) -> None:
    """The duplicate-key loader is yaml's safe loader: a python tag is an error, never a constructed object."""
    from tunecost.errors import TunecostError
    from tunecost.workload.frameworks import parse_config_file

    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("run: !!python/object/apply:os.system ['true']\n", encoding="utf-8")
    with pytest.raises(TunecostError, match="not valid YAML"):
        parse_config_file(unsafe)


def test_a_framework_that_runs_some_strategies_keeps_those() -> None:
    """torchtune's distributed recipes run FSDP2 only, torchtitan FSDP2's degrees, NeMo Megatron Core's DDP and
    distributed optimizer or FSDP1, Megatron-LM those or FSDP2, litgpt FSDP; other frameworks (and files read
    together with neither) keep every strategy; one GPU always stays."""
    every = ["single", "ddp", "fsdp1", "fsdp2", "hsdp", "zero3"]
    kept, dropped = runnable_strategies(every, "torchtune")
    assert kept == ["single", "fsdp2"]
    assert dropped == ["ddp, fsdp1, hsdp, zero3: not searched, torchtune's distributed recipes shard with FSDP2 "
                       "(fully_shard)"]  # fmt: skip
    assert runnable_strategies(every, "torchtitan")[0] == ["single", "ddp", "fsdp2", "hsdp"]
    assert runnable_strategies(every, "hf-training-args+torchtitan")[0] == ["single", "ddp", "fsdp2", "hsdp"]
    assert runnable_strategies([*every, "zero1"], "nemo")[0] == ["single", "ddp", "fsdp1", "zero1"]
    assert runnable_strategies([*every, "zero1"], "megatron-lm")[0] == ["single", "ddp", "fsdp2", "zero1"]
    assert runnable_strategies(every, "litgpt")[0] == ["single", "fsdp1", "fsdp2"]
    for other in ("llamafactory", "axolotl", "hf-training-args+deepspeed", None):
        assert runnable_strategies(every, other) == (every, [])


def test_a_framework_searches_only_the_model_parallel_dimensions_it_runs() -> None:
    """torchtune has TP and CP but no pipeline (full_finetune_distributed.py's parallel dims), litgpt's scripts
    neither; a framework that runs every dimension, or none named, keeps every searched layout."""
    from tunecost.workload.frameworks.registry import runnable_layouts
    from tunecost.workload.parallel import ModelParallel

    searched = [ModelParallel(), ModelParallel(tp=2), ModelParallel(pp=2), ModelParallel(tp=2, cp=2)]
    assert runnable_layouts(searched, "torchtune") == [searched[0], searched[1], searched[3]]
    assert runnable_layouts(searched, "litgpt") == [ModelParallel()]
    assert runnable_layouts(searched, "torchtitan") == runnable_layouts(searched, None) == searched


def test_the_hf_stack_searches_tp_without_sequence_parallelism_and_no_pipeline() -> None:
    """transformers' tp_plan and DeepSpeed AutoTP shard no norms; none of the HF-stack readers runs a pipeline;
    LLaMA-Factory's Trainer backend has TP through DeepSpeed AutoTP only, its v1 no TP (Ulysses cp is not modelled)."""
    from tunecost.workload.frameworks.registry import runnable_layouts
    from tunecost.workload.parallel import ModelParallel

    tp_sp, tp = ModelParallel(tp=2, sequence_parallel=True), ModelParallel(tp=2)
    searched = [ModelParallel(), tp_sp, ModelParallel(pp=2), ModelParallel(tp=2, cp=2, sequence_parallel=True)]
    hf = [ModelParallel(), tp, ModelParallel(tp=2, cp=2)]
    for framework in ("hf-training-args", "accelerate", "axolotl", "axolotl+deepspeed"):
        assert runnable_layouts(searched, framework) == hf
    assert runnable_layouts(searched, "llamafactory") == runnable_layouts(searched, "deepspeed") == hf[:2]
    assert runnable_layouts(searched, "llamafactory-v1") == [ModelParallel()]
    assert runnable_layouts(searched, "llamafactory-megatron") == searched  # Megatron Core runs them all
    assert runnable_layouts([tp_sp, tp], "accelerate") == [tp]  # one layout, not two alike


def test_the_hf_stack_runs_tp_beside_fsdp2_and_zero_0_to_2_only() -> None:
    """DeepSpeed AutoTP trains with ZeRO stages 0 to 2; accelerate's ParallelismConfig shards with FSDP2: no TP
    beside FSDP1 or ZeRO-3 for the HF stack, any beside them for the frameworks that run every layout."""
    from tunecost.workload.frameworks.registry import runnable_plans
    from tunecost.workload.parallel import ParallelPlan

    plans = [ParallelPlan(num_gpus=8, strategy=s, tp=t) for t in (1, 2) for s in ("fsdp1", "fsdp2", "zero2", "zero3")]
    kept, notes = runnable_plans(plans, "hf-training-args")
    assert [(p.tp, p.strategy) for p in kept] == [(1, s) for s in ("fsdp1", "fsdp2", "zero2", "zero3")] + [
        (2, "fsdp2"),
        (2, "zero2"),
    ]
    assert notes == [
        "TP beside other strategies: not searched, transformers TrainingArguments / TRL SFTConfig's TP runs beside "
        "single, ddp, fsdp2, fsdp2-shard-grad-op, hsdp, zero1, zero2 only"
    ]
    assert [p.strategy for p in runnable_plans(plans, "deepspeed")[0] if p.tp == 2] == ["zero2"]
    assert [p.strategy for p in runnable_plans(plans, "accelerate")[0] if p.tp == 2] == ["fsdp2"]
    assert runnable_plans(plans, "torchtitan") == runnable_plans(plans, None) == (plans, [])


def test_llamafactory_checkpoints_without_reentrance_under_accelerates_fsdp2(tmp_path: Path) -> None:
    """model_utils/checkpointing.py sets use_reentrant_gc false when accelerate runs FSDP version 2."""
    from tunecost.workload.frameworks.registry import read_configs

    lf = tmp_path / "train.yaml"
    lf.write_text("model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\ncutoff_len: 512\n")
    accelerate = tmp_path / "fsdp.yaml"
    text = "distributed_type: FSDP\nnum_processes: 2\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: {}\n"
    accelerate.write_text(text.format(2))
    job = read_configs([lf, accelerate])
    assert job.options["reentrant"] is False and not any(a.startswith("reentrant on") for a in job.assumptions)
    assert any(a.startswith("reentrant off: LLaMA-Factory sets use_reentrant_gc false") for a in job.assumptions)
    accelerate.write_text(text.format(1))
    assert read_configs([lf, accelerate]).options["reentrant"] is True  # its default under FSDP1
