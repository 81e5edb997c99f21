"""Prompt templates: how a query (prompt + ground-truth response) becomes token ids.

Sources and derivations: docs/datasets.md, section `tunecost.workload.templates`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tunecost.errors import TunecostError, unknown_name_error
from tunecost.workload.tokenizers import Tokenizer

ALPACA_HEADER = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
)


@dataclass(frozen=True, kw_only=True)
class Template:
    """A named way to lay out a prompt and a response."""

    name: str
    user_format: str  # with "{prompt}"
    assistant_format: str = "{response}"
    add_bos: bool = True
    add_eos: bool = True
    # True: tokenize the prompt slot and the response slot separately (LLaMA-Factory), so the boundary is exact.
    # False: tokenize the whole text at once (what `tokenizer(text)` gives, as TRL and chat templates do).
    split_slots: bool = True
    description: str = ""

    def render_prompt(self, prompt: str) -> str:
        return self.user_format.format(prompt=prompt)

    def render_response(self, response: str) -> str:
        return self.assistant_format.format(response=response)


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template(
            name="none",
            user_format="{prompt}",
            add_eos=False,
            split_slots=False,
            description="plain prompt + response, BOS counted, no EOS",
        ),
        Template(
            name="mistral",
            user_format="[INST] {prompt} [/INST]",
            description="LLaMA-Factory 'mistral' (the paper's): <s>[INST] {prompt} [/INST]{response}</s>",
        ),
        Template(
            name="alpaca",
            user_format=ALPACA_HEADER + "### Instruction:\n{prompt}\n\n### Response:\n",
            description="Alpaca / LLM-Adapters instruction prompt, EOS after the response",
        ),
        Template(
            name="chat",
            user_format="{prompt}",
            split_slots=False,
            description="the tokenizer's own chat template (transformers tokenizers only)",
        ),
    )
}


def template_by_name(name: str) -> Template:
    key = name.strip().lower()
    if key not in TEMPLATES:
        raise unknown_name_error("template", name, TEMPLATES)
    return TEMPLATES[key]


@dataclass(frozen=True, kw_only=True)
class EncodedQuery:
    ids: tuple[int, ...]
    num_prompt_tokens: int  # the first tokens that are the prompt (BOS included); the rest is the response


def _chat_texts(tokenizer: Tokenizer, prompt: str, response: str) -> tuple[str, str]:
    apply = getattr(tokenizer, "apply_chat_template", None)
    if apply is None or not tokenizer.chat_template:
        raise TunecostError(
            f"template 'chat' needs a tokenizer with a chat template; {tokenizer.name} has none "
            "(use --template mistral, alpaca or none)"
        )
    prompt_text = apply([{"role": "user", "content": prompt}], add_generation_prompt=True)
    full_text = apply(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], add_generation_prompt=False
    )
    return prompt_text, full_text


def encode_prompt(template: Template, tokenizer: Tokenizer, prompt: str) -> list[int]:
    """The ids a model is given to generate the response (BOS + prompt slot)."""
    if template.name == "chat":
        prompt_text, _ = _chat_texts(tokenizer, prompt, "")
        return tokenizer.encode(prompt_text)  # chat templates write their own BOS
    bos = [tokenizer.bos_id] if template.add_bos and tokenizer.bos_id is not None else []
    return bos + tokenizer.encode(template.render_prompt(prompt))


def encode_query(template: Template, tokenizer: Tokenizer, prompt: str, response: str) -> EncodedQuery:
    """The ids of a whole query and where its prompt ends."""
    return encode_queries(template, tokenizer, [prompt], [response])[0]


def encode_queries(
    template: Template, tokenizer: Tokenizer, prompts: list[str], responses: list[str]
) -> list[EncodedQuery]:
    """`encode_query` for many queries at once (batched tokenizer calls: 15k queries take about a second)."""
    if len(prompts) != len(responses):
        raise ValueError("prompts and responses differ in length")
    if template.name == "chat":
        pairs = [_chat_texts(tokenizer, p, r) for p, r in zip(prompts, responses)]
        prompt_ids = tokenizer.encode_batch([p for p, _ in pairs])
        full_ids = tokenizer.encode_batch([f for _, f in pairs])
        return [
            EncodedQuery(ids=tuple(f), num_prompt_tokens=common_prefix_len(p, f)) for p, f in zip(prompt_ids, full_ids)
        ]
    bos = [tokenizer.bos_id] if template.add_bos and tokenizer.bos_id is not None else []
    eos = [tokenizer.eos_id] if template.add_eos and tokenizer.eos_id is not None else []
    prompt_texts = [template.render_prompt(p) for p in prompts]
    response_texts = [template.render_response(r) for r in responses]
    prompt_ids = tokenizer.encode_batch(prompt_texts)
    if template.split_slots:
        response_ids = tokenizer.encode_batch(response_texts)
        return [
            EncodedQuery(ids=tuple(bos + p + r + eos), num_prompt_tokens=len(bos) + len(p))
            for p, r in zip(prompt_ids, response_ids)
        ]
    full_ids = tokenizer.encode_batch([p + r for p, r in zip(prompt_texts, response_texts)])
    # Tokenized as one text, a piece may straddle the boundary: the prompt is the common prefix.
    return [
        EncodedQuery(ids=tuple(bos + f + eos), num_prompt_tokens=len(bos) + common_prefix_len(p, f))
        for p, f in zip(prompt_ids, full_ids)
    ]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens two id sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
