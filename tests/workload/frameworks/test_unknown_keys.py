"""A key the framework itself does not know (a typo, another framework's key) is one error naming the file, the key
and the closest key; a key the framework knows but tunecost does not model stays among the keys not modelled."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import KEYS_DIR, KnownKeys, dotted_keys, framework_keys
from tunecost.workload.frameworks.registry import frameworks, read_config

LLAMAFACTORY = """\
model_name_or_path: Qwen/Qwen2.5-0.5B
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 16
cutoff_len: 1024
per_device_train_batch_size: 2
learning_rate: 1.0e-4
"""
LLAMAFACTORY_V1 = """\
model: Qwen/Qwen2.5-0.5B
peft_config:
  name: lora
  lora_alpha: 32
micro_batch_size: 2
cutoff_len: 1024
learning_rate: 1.0e-4
"""
AXOLOTL = """\
base_model: Qwen/Qwen2.5-0.5B
adapter: lora
lora_r: 16
lora_alpha: 32
sequence_len: 1024
micro_batch_size: 2
learning_rate: 0.0002
datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
"""
TORCHTUNE = """\
model:
  _component_: torchtune.models.qwen2_5.lora_qwen2_5_0_5b
  lora_attn_modules: [q_proj, v_proj]
  lora_rank: 16
dtype: bf16
batch_size: 2
log_every_n_steps: 1
optimizer:
  _component_: torch.optim.AdamW
  lr: 3e-4
"""
LITGPT = """\
checkpoint_dir: checkpoints/Qwen/Qwen2.5-0.5B
precision: bf16-true
lora_r: 16
seed: 1337
data:
  class_path: litgpt.data.JSON
  init_args:
    json_path: data/train.json
    anything_the_data_module_takes: 1
train:
  micro_batch_size: 2
  max_seq_length: 1024
"""
TORCHTITAN = """\
[metrics]
log_freq = 10

[model]
name = "llama3"
flavor = "8B"

[training]
local_batch_size = 2
seq_len = 4096
"""
TRAINER = {"output_dir": "out", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True,
           "dataloader_num_workers": 4}  # fmt: skip
SFT = """\
model_name_or_path: Qwen/Qwen2.5-0.5B
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
max_length: 1024
dataloader_num_workers: 4
"""
WORKERS = "dataloader_num_workers"  # known to the Trainer, no cost tunecost models
PEFT = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32, "init_lora_weights": True}
INIT = "init_lora_weights"  # known to PEFT, no cost to model
BNB = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
ACCELERATE = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
enable_cpu_affinity: true
fsdp_config:
  fsdp_offload_params: false
  fsdp_version: 2
mixed_precision: bf16
num_machines: 1
num_processes: 8
"""
DEEPSPEED = {
    "train_micro_batch_size_per_gpu": 2,
    "steps_per_print": 10,
    "gradient_clipping": 1.0,
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
        "stage3_max_live_parameters": 1e9,
    },
    "bf16": {"enabled": True},
}

TRAINER_TITLE = "transformers' TrainingArguments or TRL's SFTConfig"
GA, DS = "gradient_accumulation_steps", json.dumps(DEEPSPEED)
# (file name, text, the key as written, the typo written instead, a key known but not modelled, the error's title)
FORMATS = {
    "llamafactory": ("lf.yaml", LLAMAFACTORY, "lora_rank", "lora_rnak", "learning_rate", "LLaMA-Factory's config"),
    "llamafactory_v1": ("lf1.yaml", LLAMAFACTORY_V1, "micro_batch_size", "micro_batch_sise", "learning_rate",
                        "LLaMA-Factory v1's config"),
    "axolotl": ("ax.yaml", AXOLOTL, "micro_batch_size", "micro_batch_sise", "learning_rate", "axolotl's config"),
    "torchtune": ("tt.yaml", TORCHTUNE, "batch_size", "bach_size", "log_every_n_steps", "torchtune's recipe configs"),
    "litgpt": ("lit.yaml", LITGPT, "  micro_batch_size", "  micro_batch_sise", "seed", "litgpt's config"),
    "torchtitan": ("titan.toml", TORCHTITAN, "seq_len", "seq_lenght", "metrics.log_freq", "torchtitan's JobConfig"),
    "trainer": ("args.json", json.dumps(TRAINER), GA, "gradient_acumulation_steps", WORKERS, TRAINER_TITLE),
    "sft": ("sft.yaml", SFT, "max_length", "max_lenght", WORKERS, TRAINER_TITLE),
    "peft": ("adapter_config.json", json.dumps(PEFT), "lora_alpha", "lora_alpah", INIT, "PEFT's LoraConfig"),
    "bnb": ("bnb.json", json.dumps(BNB), "bnb_4bit_quant_type", "bnb_4bit_quant_typ", "", "BitsAndBytesConfig"),
    "accelerate": ("acc.yaml", ACCELERATE, "num_processes", "num_procs", "enable_cpu_affinity", "accelerate's config"),
    "deepspeed": ("ds.json", DS, "gradient_clipping", "grad_clipping", "steps_per_print", "DeepSpeed's config"),
}  # fmt: skip
NESTED = {  # what the error names: the dotted path of the key
    "litgpt": ("train.micro_batch_sise", "train.micro_batch_size"),
    "torchtitan": ("training.seq_lenght", "training.seq_len"),
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# axolotl's pydantic schema ignores keys it lacks, DeepSpeed the top-level keys it does not read: the run goes ahead
# without them
DROPS_UNKNOWN = ("axolotl", "deepspeed")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in DROPS_UNKNOWN])
def test_a_typo_is_one_error_naming_the_file_the_key_and_the_closest_key(tmp_path: Path, fmt: str) -> None:
    name, text, key, typo, _, title = FORMATS[fmt]
    assert read_config(_write(tmp_path, name, text))  # the file as written is read
    path = _write(tmp_path, f"typo-{name}", text.replace(key, typo, 1))
    written, meant = NESTED.get(fmt, (typo, key))
    with pytest.raises(TunecostError) as error:
        read_config(path)
    assert str(error.value) == f"{path}: {written}: not a key of {title} (did you mean {meant.strip()}?)"
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("fmt", DROPS_UNKNOWN)
def test_a_typo_the_framework_drops_is_dropped_with_a_note_naming_the_closest_key(tmp_path: Path, fmt: str) -> None:
    name, text, key, typo, _, title = FORMATS[fmt]
    job = read_config(_write(tmp_path, f"typo-{name}", text.replace(key, typo, 1)))
    assert any(line.startswith(f"{typo}: not a key of {title} (did you mean {key}?)") for line in job.assumptions)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if FORMATS[f][4]])
def test_a_key_the_framework_knows_but_tunecost_does_not_model_stays_a_warning(tmp_path: Path, fmt: str) -> None:
    name, text, _, _, unmodelled, _ = FORMATS[fmt]
    job = read_config(_write(tmp_path, name, text))
    assert unmodelled.split(".")[0] in job.not_modelled or unmodelled in job.not_modelled


def test_bnb_keeps_its_unmodelled_storage_type_as_a_warning(tmp_path: Path) -> None:
    job = read_config(_write(tmp_path, "bnb.json", json.dumps({**BNB, "bnb_4bit_quant_storage": "bfloat16"})))
    assert job.not_modelled == ("bnb_4bit_quant_storage",)


def test_another_frameworks_key_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "lf.yaml", LLAMAFACTORY + "micro_batch_size: 2\n")  # axolotl's name for the batch size
    with pytest.raises(TunecostError, match=r"lf\.yaml: micro_batch_size: not a key of LLaMA-Factory's config"):
        read_config(path)


@pytest.mark.parametrize(
    ("text", "key", "meant"),
    [
        (TORCHTITAN.replace("[training]", "[trainig]"), "trainig", "training"),
        (TORCHTITAN + "[training.dataloader]\nnum_worker = 2\n", "training.dataloader.num_worker", None),
    ],
)
def test_torchtitan_names_the_first_unknown_part_of_a_nested_key(
    tmp_path: Path, text: str, key: str, meant: str | None
) -> None:
    meant = meant or f"{key}s"
    with pytest.raises(
        TunecostError, match=rf": {re.escape(key)}: not a key of torchtitan's JobConfig \(did you mean {meant}\?\)"
    ):
        read_config(_write(tmp_path, "titan.toml", text))


def test_torchtitan_with_a_custom_config_module_is_not_checked(tmp_path: Path) -> None:
    text = '[job]\ncustom_config_module = "torchtitan.models.flux.job_config"\n' + TORCHTITAN + "[encoder]\nx = 1\n"
    assert "encoder" in read_config(_write(tmp_path, "flux.toml", text)).not_modelled


def test_axolotl_with_a_plugin_from_outside_axolotl_is_not_checked(tmp_path: Path) -> None:
    ours = AXOLOTL + "plugins:\n  - axolotl.integrations.liger.LigerPlugin\nliger_rms_norm: true\n"
    assert "liger_rms_norm" in read_config(_write(tmp_path, "ax.yaml", ours)).not_modelled  # a bundled plugin's key
    theirs = AXOLOTL + "plugins:\n  - my_org.plugins.MyPlugin\nmy_plugin_option: 3\n"
    assert "my_plugin_option" in read_config(_write(tmp_path, "ax2.yaml", theirs)).not_modelled


def test_a_components_arguments_are_not_checked(tmp_path: Path) -> None:
    """torchtune's model/optimizer kwargs and litgpt's data init_args belong to the class they instantiate."""
    assert read_config(_write(tmp_path, "tt.yaml", TORCHTUNE.replace("lr: 3e-4", "a_kwarg_of_adamw: 1")))
    assert read_config(_write(tmp_path, "lit.yaml", LITGPT))  # data.init_args.anything_the_data_module_takes


def test_accelerate_checks_fsdp_config_with_the_prefix_launch_adds(tmp_path: Path) -> None:
    bare = ACCELERATE.replace("fsdp_offload_params", "offload_params")  # `accelerate launch` reads it as fsdp_...
    assert not any("not a key" in line for line in read_config(_write(tmp_path, "acc.yaml", bare)).assumptions)
    job = read_config(_write(tmp_path, "typo.yaml", ACCELERATE.replace("fsdp_offload_params", "ofload_params")))
    expected = (
        "fsdp_config.ofload_params: not a key of accelerate's config (did you mean fsdp_config.fsdp_offload_params?); "
        "ignored, as `accelerate launch` ignores it"
    )
    assert expected in job.assumptions


def test_accelerate_notes_a_section_key_it_ignores_and_refuses_a_top_level_one(tmp_path: Path) -> None:
    text = ACCELERATE.replace("distributed_type: FSDP", "distributed_type: DEEPSPEED")
    job = read_config(_write(tmp_path, "acc.yaml", text + "deepspeed_config:\n  zero_stag: 3\n"))
    assert any(line.startswith("deepspeed_config.zero_stag: not a key of accelerate's config (did you mean "
                               "deepspeed_config.zero_stage?); ignored") for line in job.assumptions)  # fmt: skip
    assert job.options["strategy"] == "zero2"  # the plugin's default stage: the misspelt one is not read
    with pytest.raises(TunecostError, match=r"acc2\.yaml: zero_stag: not a key of accelerate's config"):
        read_config(_write(tmp_path, "acc2.yaml", text + "zero_stag: 3\n"))


@pytest.mark.parametrize(
    ("section", "key", "meant"),
    [
        ("zero_optimization", {"stage": 3, "overlap_com": True}, "zero_optimization.overlap_comm"),
        (
            "zero_optimization",
            {"stage": 3, "offload_param": {"devise": "cpu"}},
            "zero_optimization.offload_param.device",
        ),
        ("bf16", {"enable": True}, "bf16.enabled"),
    ],
)
def test_deepspeed_checks_the_sections_it_validates(tmp_path: Path, section: str, key: dict, meant: str) -> None:
    path = _write(tmp_path, "ds.json", json.dumps({**DEEPSPEED, section: key}))
    with pytest.raises(
        TunecostError, match=rf"ds\.json: {section}\..*: not a key of DeepSpeed's config \(did you mean {meant}\?\)"
    ):
        read_config(path)


def test_deepspeed_ignores_top_level_keys_it_does_not_read_and_says_so(tmp_path: Path) -> None:
    """LLaMA-Factory's shipped DeepSpeed files carry a `_comment` and sections DeepSpeed does not read
    (`comms_config`, `monitor_config`); DeepSpeed runs without them, and the job is read as it runs."""
    extra = {"_comment": "supported models: ...", "comms_config": {"verbose": False}, "monitor_config": {"on": 1}}
    job = read_config(_write(tmp_path, "ds.json", json.dumps({**DEEPSPEED, **extra})))
    assert job.options == read_config(_write(tmp_path, "plain.json", DS)).options
    notes = [line for line in job.assumptions if "ignored, as DeepSpeed ignores it" in line]
    assert [line.split(":")[0] for line in notes] == list(extra)
    assert "(did you mean comms_logger?)" in notes[1] and not set(extra) & set(job.not_modelled)


def test_deepspeed_does_not_check_an_optimizers_params(tmp_path: Path) -> None:
    optimizer = {"type": "AdamW", "params": {"lr": "auto", "any_param_of_the_optimizer": 1}}
    assert read_config(_write(tmp_path, "ds.json", json.dumps({**DEEPSPEED, "optimizer": optimizer})))


def test_an_unknown_key_without_a_close_one_has_no_suggestion() -> None:
    keys = KnownKeys("DeepSpeed's config", ("deepspeed",))
    assert keys.unknown("zzzz") == "zzzz" and keys.not_a_key("zzzz") == "not a key of DeepSpeed's config"
    assert keys.unknown("optimizer.params.lr") is None and keys.unknown("zero_optimization") is None


def test_dotted_keys_name_nested_keys_by_their_path() -> None:
    data = {"a": 1, "b": {"c": {"d": 2}, "e": {}}, "f": None}
    assert dotted_keys(data) == ["a", "b.c.d", "b.e", "f"]


def test_every_reader_names_key_lists_that_exist_with_their_source() -> None:
    files = sorted(KEYS_DIR.glob("*.txt"))
    assert len(files) >= 11
    for path in files:
        header = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
        text = " ".join(header)
        assert re.search(r"@[0-9a-f]{40}|\d+\.\d+\.\d+ \(installed\)|transformers \d", text), path.name
        assert re.search(r"(read|on) \d{4}-\d{2}-\d{2}", text), path.name  # the date the list was read
        assert len(framework_keys(path.stem)) >= 5, path.name
    assert framework_keys("torchtitan") is framework_keys("torchtitan")  # read once


def test_the_key_lists_are_package_data() -> None:
    pyproject = (Path(__file__).parents[3] / "pyproject.toml").read_text(encoding="utf-8")
    assert '"workload/frameworks/keys/*"' in pyproject
    assert all(f.title for f in frameworks())


def test_the_generated_key_lists_match_the_installed_libraries() -> None:
    """benchmarks/framework_keys.py --check: rerun it (without --check) after upgrading transformers, peft or
    accelerate."""
    script = Path(__file__).parents[3] / "benchmarks" / "framework_keys.py"
    spec = importlib.util.spec_from_file_location("framework_keys", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0
