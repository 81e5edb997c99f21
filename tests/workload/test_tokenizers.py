from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.tokenizers import (
    SentencePieceTokenizer,
    mistral_v1_model_path,
    subset_tokenizer,
    tokenizer_by_name,
)


@pytest.fixture(scope="module")
def mistral():
    return tokenizer_by_name("mistral")


def test_mistral_is_the_real_mixtral_sentencepiece(mistral):
    assert mistral.vocab_size == 32000
    assert (mistral.bos_id, mistral.eos_id) == (1, 2)  # <s>, </s> as in Mixtral-8x7B's tokenizer
    assert mistral.pad_id == mistral.eos_id  # pad = EOS, as LLaMA-Factory sets it for Mistral
    assert "mistral" in mistral.name.lower() and "32000" in mistral.name
    # Hand-checked pieces: "▁Tom" "▁has" "▁" "3" -- Mistral splits digits and puts "▁" before them.
    assert mistral.encode("Tom has 3") == [4660, 659, 28705, 28770]
    assert mistral.encode("Tom has 3") == mistral.encode_batch(["Tom has 3"])[0]  # encode adds no BOS/EOS


def test_decode_round_trip_and_special_tokens_dropped(mistral):
    text = "Weng earns $12 an hour.\nThe answer is 10."
    ids = mistral.encode(text)
    assert mistral.decode(ids) == text
    assert mistral.decode([mistral.bos_id, *ids, mistral.eos_id]) == text


def test_aliases_and_model_file_path(mistral):
    assert tokenizer_by_name("Mixtral") is mistral
    assert tokenizer_by_name("tiny-mixtral") is mistral
    from_file = tokenizer_by_name(str(mistral_v1_model_path()))
    assert isinstance(from_file, SentencePieceTokenizer)
    assert from_file.encode("hello world") == mistral.encode("hello world")


def test_unknown_tokenizer_is_a_clear_error_without_network(tmp_path):
    with pytest.raises(TunecostError, match="cannot load tokenizer"):
        tokenizer_by_name("no-such-org/no-such-tokenizer-xyz")
    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("hi")
    with pytest.raises(TunecostError, match="not a SentencePiece"):
        tokenizer_by_name(str(not_a_model))
    with pytest.raises(TunecostError):
        tokenizer_by_name("  ")


def test_subset_tokenizer_keeps_the_segmentation(mistral):
    texts = ["Tom has 3 apples.", "The answer is 7."]
    sub = subset_tokenizer(mistral, texts)
    assert sub.vocab_size < 40
    assert sub.base_ids[0] == 0 and sub.bos_id is not None and sub.eos_id is not None
    for text in texts:
        ids = sub.encode(text)
        assert [sub.base_ids[i] for i in ids] == mistral.encode(text)
        assert sub.decode(ids) == text
    assert 0 in sub.encode("Zebra")  # pieces outside the subset become UNK (id 0)
    assert sub.encode_batch(texts) == [sub.encode(t) for t in texts]
