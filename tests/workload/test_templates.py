from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.templates import (
    TEMPLATES,
    encode_prompt,
    encode_queries,
    encode_query,
    template_by_name,
)
from tunecost.workload.tokenizers import tokenizer_by_name

PROMPT = "Tom has 3 apples and buys 4 more. How many apples does Tom have?"
RESPONSE = "\nA: 3 + 4 = 7. The answer is 7."


@pytest.fixture(scope="module")
def tok():
    return tokenizer_by_name("mistral")


def test_none_is_plain_text_with_bos_and_no_eos(tok):
    q = encode_query(template_by_name("none"), tok, PROMPT, RESPONSE)
    assert list(q.ids) == [tok.bos_id, *tok.encode(PROMPT + RESPONSE)]
    assert q.ids[-1] != tok.eos_id
    assert q.num_prompt_tokens == 1 + len(tok.encode(PROMPT))
    assert list(q.ids[: q.num_prompt_tokens]) == encode_prompt(template_by_name("none"), tok, PROMPT)


def test_mistral_is_llama_factory_layout(tok):
    # LLaMA-Factory 'mistral': BOS + "[INST] {prompt} [/INST]" + "{response}" + EOS, slots tokenized separately.
    q = encode_query(template_by_name("mistral"), tok, PROMPT, RESPONSE)
    prompt_ids = tok.encode(f"[INST] {PROMPT} [/INST]")
    assert list(q.ids) == [tok.bos_id, *prompt_ids, *tok.encode(RESPONSE), tok.eos_id]
    assert q.num_prompt_tokens == 1 + len(prompt_ids)
    assert list(q.ids[: q.num_prompt_tokens]) == encode_prompt(template_by_name("mistral"), tok, PROMPT)


def test_alpaca_wraps_the_instruction(tok):
    t = template_by_name("alpaca")
    text = t.render_prompt(PROMPT)
    assert text.startswith("Below is an instruction") and text.endswith("### Response:\n") and PROMPT in text
    q = encode_query(t, tok, PROMPT, RESPONSE)
    assert q.ids[0] == tok.bos_id and q.ids[-1] == tok.eos_id


def test_batch_encoding_matches_single(tok):
    for name in ("none", "mistral", "alpaca"):
        t = template_by_name(name)
        prompts, responses = [PROMPT, "Hi"], [RESPONSE, " there"]
        assert encode_queries(t, tok, prompts, responses) == [
            encode_query(t, tok, p, r) for p, r in zip(prompts, responses)
        ]


def test_chat_needs_a_chat_template_and_unknown_names_fail(tok):
    with pytest.raises(TunecostError, match="chat template"):
        encode_query(template_by_name("chat"), tok, PROMPT, RESPONSE)
    with pytest.raises(TunecostError, match="Did you mean 'mistral'"):
        template_by_name("mistrall")
    assert set(TEMPLATES) == {"none", "mistral", "alpaca", "chat"}
