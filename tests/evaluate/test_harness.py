from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tunecost.evaluate.generation import continuation_logprobs, greedy_generate
from tunecost.evaluate.harness import evaluate_model
from tunecost.models.tiny import build_tiny_mixtral
from tunecost.workload.datasets import load_dataset
from tunecost.workload.templates import template_by_name
from tunecost.workload.tokenizers import tokenizer_by_name

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


@pytest.fixture(scope="module")
def model(one_layer_mixtral):
    return one_layer_mixtral().eval()


@pytest.fixture(scope="module")
def tok():
    return tokenizer_by_name("mistral")


def test_batched_greedy_generation_matches_one_by_one(model, tok):
    prompts = [
        [tok.bos_id, *tok.encode("Tom has 3 apples.")],
        [tok.bos_id, *tok.encode("Hi")],
        [tok.bos_id, *tok.encode("A much longer prompt, with several more words in it.")],
    ]
    batched = greedy_generate(model, prompts, pad_id=tok.pad_id, eos_id=tok.eos_id, max_new_tokens=5, batch_size=3)
    single = [greedy_generate(model, [p], pad_id=tok.pad_id, eos_id=tok.eos_id, max_new_tokens=5)[0] for p in prompts]
    assert batched == single  # left padding must not change what a row generates
    assert all(0 < len(row) <= 5 for row in batched)


def test_continuation_logprobs_match_a_manual_forward(model, tok):
    contexts = [[tok.bos_id, *tok.encode("The cat")], [tok.bos_id, *tok.encode("A much longer context here")]]
    conts = [tok.encode(" sat down"), tok.encode(" ends")]
    got = continuation_logprobs(model, contexts, conts, pad_id=tok.pad_id, batch_size=2)
    for (ctx, cont), (logprob, n) in zip(zip(contexts, conts), got):
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]
        manual = sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))
        assert n == len(cont) and logprob == pytest.approx(manual, abs=1e-4)


def test_evaluate_model_generation_and_loglik(model, tok):
    math_ds = load_dataset(str(FIXTURES / "llm_adapters_math.json"))
    result = evaluate_model(
        model,
        tok,
        math_ds,
        template=template_by_name("mistral"),
        model_name="small",
        limit=2,
        max_new_tokens=4,
        batch_size=2,
    )
    assert (result.num_eval, result.scorer, result.tokenizer) == (2, "number", tok.name)
    assert 0.0 <= result.accuracy <= 1.0 and len(result.predictions) == 2
    hs = load_dataset(str(FIXTURES / "hellaswag.jsonl"))
    result = evaluate_model(model, tok, hs, template=template_by_name("none"), batch_size=4)
    assert result.scorer == "loglik" and result.num_eval == 3
    assert all(p.prediction in {"0", "1", "2", "3"} for p in result.predictions)


def test_cli_eval_tiny_mixtral(cli_json, cli_runner):
    from tunecost.cli.main import app

    payload = cli_json(
        "eval", model="tiny-mixtral", dataset=FIXTURES / "llm_adapters_boolq.json", limit=2, max_new_tokens=3
    )
    assert payload["num_eval"] == 2 and payload["scorer"] == "choice:boolean" and "mistral" in payload["tokenizer"]
    assert "predictions" not in payload
    missing = cli_runner.invoke(app, ["eval", "--model", "tiny-mixtral", "--dataset", "no_such_dataset_xyz"])
    assert missing.exit_code == 2


def test_load_eval_model_names(tmp_path):
    """A catalog name loads its hub id (cache only: here that is a one-line error naming it), an unknown name
    lists the catalog, and a BlackMamba checkpoint folder loads with tunecost's loader."""
    from tunecost.errors import TunecostError
    from tunecost.evaluate.harness import load_eval_model
    from tunecost.models.blackmamba import build_blackmamba, save_blackmamba, tiny_blackmamba_config

    with pytest.raises(TunecostError, match="mistralai/Mixtral-8x7B-v0.1"):
        load_eval_model("mixtral-8x7b")
    with pytest.raises(TunecostError, match="unknown model 'no-such-model'. Valid choices: .*mixtral-8x7b"):
        load_eval_model("no-such-model")
    saved = build_blackmamba(tiny_blackmamba_config(vocab_size=256), seed=2)
    save_blackmamba(saved, tmp_path / "bm")
    net, tokenizer = load_eval_model(str(tmp_path / "bm"), tokenizer="mistral")
    assert not net.training and "mistral" in tokenizer.name
    assert all(torch.equal(net.state_dict()[k], v) for k, v in saved.state_dict().items())


def test_eval_adapter_from_a_local_folder_and_a_missing_one(tmp_path):
    """`--adapter` loads a PEFT adapter folder onto the model; a name that is neither a folder nor cached is one
    line (PEFT alone would ask the hub, with retries, although downloads are off)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from tunecost.errors import TunecostError
    from tunecost.evaluate.harness import load_eval_model

    trained = get_peft_model(build_tiny_mixtral(seed=0), LoraConfig(r=4, target_modules=["q_proj"]))
    for name, param in trained.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param)  # a non-zero adapter, so loading it changes the model
    trained.save_pretrained(tmp_path / "adapter")
    net, _ = load_eval_model("tiny-mixtral", adapter=str(tmp_path / "adapter"))
    assert isinstance(net, PeftModel)
    loaded = dict(net.named_parameters())
    for name, param in trained.named_parameters():
        if "lora_" in name:
            assert torch.equal(loaded[name], param), name
    for missing in ("no/such-adapter", "runs/no/such/adapter"):  # a hub id, and a path no hub id can be
        with pytest.raises(TunecostError, match="neither a local folder nor a hub id in the local Hugging Face"):
            load_eval_model("tiny-mixtral", adapter=missing)


@pytest.mark.parametrize(
    ("option", "message"),
    [("--max-new-tokens", "max new tokens must be >= 1, got 0"), ("--batch-size", "batch size must be positive")],
)
def test_zero_generation_settings_are_errors(cli_error, option, message):
    line = cli_error(
        ["eval", "--model", "tiny-mixtral", "--dataset", "synthetic-arith-test", "--limit", "2", option, "0"]
    )
    assert message in line
