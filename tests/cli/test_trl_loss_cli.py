"""TRL's chunked_nll end to end: a TRL SFT config without loss_type (TRL >= 1.7's default) is simulated with the
chunked loss, as `--stack hf-peft --chunked-loss` is; loss_type nll keeps the full logits."""

from __future__ import annotations

SFT = (
    "model_name_or_path: Qwen/Qwen2.5-0.5B\nlearning_rate: 2.0e-4\nper_device_train_batch_size: 4\nmax_length: 1024\n"
    "gradient_checkpointing: true\nuse_peft: true\nlora_r: 16\nlora_target_modules: [q_proj, v_proj]\nbf16: true\n"
)


def test_trls_default_loss_keeps_no_logits(cli_json, tmp_path) -> None:
    peaks = {}
    for name, extra in (("default", ""), ("nll", "loss_type: nll\n")):
        config = tmp_path / f"sft_{name}.yaml"
        config.write_text(SFT + extra)
        out = cli_json("memory", config=str(config))
        peaks[name] = out["peak_bytes"]
        assert any("trl-chunked-nll" in a for a in out["assumptions"]) is (name == "default")
    assert peaks["nll"] - peaks["default"] > 4 * 1024 * 151936 * 4  # the fp32 logits at least
    flags = {"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 1024, "batch_size": 4, "stack": "hf-peft"}
    assert cli_json("memory", **flags, chunked_loss=True)["peak_bytes"] < cli_json("memory", **flags)["peak_bytes"]
