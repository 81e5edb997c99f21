"""Evaluate a causal LM on a dataset: batched greedy generation + answer parsing, or HellaSwag log-likelihood.

`score_generations` is the pure part (texts in, accuracy out) so parsers can be checked against reference answers;
`evaluate_model` runs a model; `load_eval_model` loads ``tiny-mixtral``, a catalog model (its hub id, e.g.
``mixtral-8x7b``), a local folder (ours, a transformers checkpoint or a BlackMamba checkpoint in Zyphra's layout)
or a hub id, plus an optional PEFT adapter.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError
from tunecost.evaluate.generation import continuation_logprobs, greedy_generate
from tunecost.evaluate.scoring import DEFAULT_MAX_NEW_TOKENS, Scorer, scorer_for
from tunecost.models.build import default_tokenizer, load_pretrained
from tunecost.models.catalog import ModelSpec, resolve_model
from tunecost.models.hub import cached_hub_file
from tunecost.models.tiny import build_tiny_mixtral
from tunecost.workload.datasets import Dataset
from tunecost.workload.templates import Template, common_prefix_len, encode_prompt
from tunecost.workload.tokenizers import SubsetTokenizer, Tokenizer, tokenizer_by_name

ProgressFn = Callable[[int, int, str], None]
TOKENIZER_FILE = "tunecost_tokenizer.json"  # written next to checkpoints we save: which tokenizer they use


@dataclass(frozen=True, kw_only=True)
class Prediction:
    index: int
    generation: str
    prediction: str
    reference: str
    correct: bool


@dataclass(frozen=True, kw_only=True)
class EvalResult:
    model: str
    dataset: str
    tokenizer: str
    template: str
    scorer: str
    num_eval: int
    num_correct: int
    accuracy: float
    seconds: float
    predictions: tuple[Prediction, ...] = ()


def score_generations(
    dataset: Dataset, generations: Sequence[str], scorer: Scorer | None = None
) -> tuple[Prediction, ...]:
    """Score one generation per example (the first len(generations) examples)."""
    scorer = scorer or scorer_for(dataset)
    if scorer.kind == "loglik":
        raise TunecostError("log-likelihood datasets are scored from model scores, not generations")
    if len(generations) > len(dataset):
        raise TunecostError(f"{len(generations)} generations for {len(dataset)} examples")
    return tuple(
        Prediction(
            index=i,
            generation=text,
            prediction=scorer.parse(text),
            reference=ex.answer,
            correct=scorer.is_correct(text, ex),
        )
        for i, (text, ex) in enumerate(zip(generations, dataset.examples))
    )


def _loglik_predictions(
    model: Any, tokenizer: Tokenizer, dataset: Dataset, template: Template, batch_size: int
) -> tuple[Prediction, ...]:
    contexts, conts, owners = [], [], []
    bos = [tokenizer.bos_id] if template.add_bos and tokenizer.bos_id is not None else []
    for i, ex in enumerate(dataset.examples):
        prompt_text = template.render_prompt(ex.prompt)
        prompt_ids = tokenizer.encode(prompt_text)
        for choice in ex.choices:
            if template.name == "chat":
                contexts.append(encode_prompt(template, tokenizer, ex.prompt))
                conts.append(tokenizer.encode(choice))
            else:
                # Tokenize context + ending as one text (as lm-eval does): an ending encoded on its own would
                # start with a spurious "▁" piece. The context is the part shared with the prompt alone.
                full = tokenizer.encode(prompt_text + choice)
                shared = _common_prefix_len(prompt_ids, full)
                contexts.append(bos + full[:shared])
                conts.append(full[shared:])
            owners.append(i)
    scores = continuation_logprobs(model, contexts, conts, pad_id=tokenizer.pad_id, batch_size=batch_size)
    per_example: dict[int, list[float]] = {}
    for owner, (logprob, n) in zip(owners, scores):
        # lm-eval's acc_norm-style length normalisation (per token) keeps long endings from losing by default.
        per_example.setdefault(owner, []).append(logprob / max(1, n))
    out = []
    for i, ex in enumerate(dataset.examples):
        values = per_example[i]
        best = max(range(len(values)), key=values.__getitem__)
        out.append(
            Prediction(index=i, generation="", prediction=str(best), reference=str(ex.label), correct=best == ex.label)
        )
    return tuple(out)


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    return common_prefix_len(a, b)


def evaluate_model(
    model: Any,
    tokenizer: Tokenizer,
    dataset: Dataset,
    *,
    template: Template,
    model_name: str = "",
    limit: int | None = None,
    batch_size: int = 16,
    max_new_tokens: int | None = None,
    on_progress: ProgressFn | None = None,
) -> EvalResult:
    """Accuracy of `model` on (the first `limit` examples of) `dataset`."""
    data = dataset.head(limit)
    scorer = scorer_for(data)
    start = time.perf_counter()
    if scorer.kind == "loglik":
        predictions = _loglik_predictions(model, tokenizer, data, template, batch_size)
    else:
        prompts = [encode_prompt(template, tokenizer, ex.prompt) for ex in data.examples]
        if max_new_tokens is not None and max_new_tokens < 1:  # None (not 0) means the scorer's default
            raise TunecostError(f"max new tokens must be >= 1, got {max_new_tokens}")
        new_tokens = max_new_tokens or DEFAULT_MAX_NEW_TOKENS[scorer.kind]
        generated = greedy_generate(
            model,
            prompts,
            pad_id=tokenizer.pad_id,
            eos_id=tokenizer.eos_id,
            max_new_tokens=new_tokens,
            batch_size=batch_size,
            on_progress=on_progress,
        )
        predictions = score_generations(data, [tokenizer.decode(ids) for ids in generated], scorer)
    seconds = time.perf_counter() - start
    num_correct = sum(p.correct for p in predictions)
    return EvalResult(
        model=model_name,
        dataset=data.name,
        tokenizer=tokenizer.name,
        template=template.name,
        scorer=scorer.name,
        num_eval=len(predictions),
        num_correct=num_correct,
        accuracy=num_correct / len(predictions),
        seconds=seconds,
        predictions=predictions,
    )


def load_eval_model(
    spec: str,
    *,
    adapter: str | None = None,
    tokenizer: str | None = None,
    allow_download: bool = False,
    seed: int = 0,
) -> tuple[Any, Tokenizer]:
    """(model in eval mode, tokenizer) for ``tiny-mixtral`` (random init), a catalog name, a local folder or a hub
    id; the tokenizer defaults to the model's own (`tunecost.models.build.default_tokenizer`)."""
    import torch

    if spec == "tiny-mixtral":
        model = build_tiny_mixtral(seed=seed)
        tok = tokenizer_by_name(tokenizer or "mistral", allow_download=allow_download)
    else:
        path = Path(spec).expanduser()
        model_spec = pretrained_spec(spec, allow_download)
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32  # bf16 matmuls crawl on CPU
        model = load_pretrained(
            model_spec,
            dtype=dtype,
            device="cuda" if torch.cuda.is_available() else "cpu",
            allow_download=allow_download,
        )
        saved = None if tokenizer else saved_tokenizer(path)
        tok = saved or tokenizer_by_name(tokenizer or default_tokenizer(model_spec), allow_download=allow_download)
    if adapter:
        where = adapter if allow_download else _local_adapter(adapter)
        try:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, where)
        except (OSError, ValueError) as exc:
            raise TunecostError(f"cannot load adapter {adapter!r}: {str(exc).splitlines()[0]}") from None
    model.eval()
    return model, tok


def _local_adapter(adapter: str) -> str:
    """A local adapter folder, or the cached snapshot folder of a hub id: PEFT itself would ask the hub (with
    retries) even when the files are not wanted from there."""
    if Path(adapter).expanduser().is_dir():
        return str(Path(adapter).expanduser())
    if "/" in adapter and not adapter.startswith((".", "/")):
        cached = cached_hub_file(adapter, "adapter_config.json")
        if cached is not None:
            return str(cached.parent)
    raise TunecostError(
        f"adapter {adapter!r} is neither a local folder nor a hub id in the local Hugging Face cache "
        "(downloads are off: --allow-download)"
    )


def pretrained_spec(name: str, allow_download: bool) -> Any:
    """The catalog entry, local folder or cached hub id `name` names (a catalog name loads its hub id, e.g.
    mixtral-8x7b -> mistralai/Mixtral-8x7B-v0.1); with downloads on, any hub id (its architecture is read from
    the download). An unknown name is an error that lists the catalog."""
    try:
        return resolve_model(name)
    except TunecostError:
        if allow_download and "/" in name and not name.startswith((".", "/")):
            return ModelSpec(name=name, family="", config={}, hub_id=name)
        raise


def saved_template(folder: str | Path) -> str | None:
    """The template recorded next to a checkpoint tunecost saved, or None."""
    marker = Path(folder).expanduser() / TOKENIZER_FILE
    if not marker.is_file():
        return None
    return json.loads(marker.read_text(encoding="utf-8")).get("template")


def saved_tokenizer(folder: Path) -> Tokenizer | None:
    """The tokenizer recorded next to a checkpoint tunecost saved (`TOKENIZER_FILE`), or None."""
    marker = folder / TOKENIZER_FILE
    if not marker.is_file():
        return None
    info = json.loads(marker.read_text(encoding="utf-8"))
    base = tokenizer_by_name(info["tokenizer"])
    ids = info.get("subset_base_ids")
    if not ids:
        return base

    return SubsetTokenizer(base, tuple(int(i) for i in ids), name=f"{base.name} subset ({len(ids)} pieces)")
