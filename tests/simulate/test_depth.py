"""A segment's bytes at full depth from two traced depths (`simulate.depth`): linear, except a pass's
temporaries, which are the deeper trace's."""

from __future__ import annotations

from pathlib import Path

from tiny_models import write_llama_config

from tunecost.distributed.single_step import trace_single_gpu_step
from tunecost.simulate.depth import depth_scaled
from tunecost.workload.job import FineTuneJob, LoraConfig

TINY_LLAMA_4L = Path(__file__).parents[1] / "fixtures" / "distributed" / "tiny-llama-4l.json"


def test_pass_temporaries_are_the_deeper_traces_and_the_rest_linear() -> None:
    one, two = {"activations": 10, "temporaries": 5}, {"activations": 20, "temporaries": 7}
    assert depth_scaled("forward:unit_last", one, two, 3.0) == {"activations": 40, "temporaries": 7}
    assert depth_scaled("backward:pre", one, two, 3.0, fixed=("activations", "temporaries")) == {
        "activations": 20,
        "temporaries": 7,
    }
    # AdamW's foreach temporaries span every parameter: linear in the depth
    assert depth_scaled("optimizer:opt", one, two, 3.0) == {"activations": 40, "temporaries": 11}


def test_scaled_step_equals_the_full_depth_trace() -> None:
    """The tiny Llama with LoRA, 4 layers: traced at 1 and 2 and scaled = traced at 4, segment by segment. The
    one-layer model's last-layer forward holds fewer temporaries (98,816 bytes against 115,200 at 2, 3 and 4
    layers), which extrapolating would have put at 147,968."""
    job = FineTuneJob(
        model=str(TINY_LLAMA_4L),
        method="lora",
        lora=LoraConfig(rank=8, targets=("attention",)),
        batch_size=2,
        seq_len=64,
        gradient_checkpointing=False,
    )
    scaled = trace_single_gpu_step(job, 1)
    full = trace_single_gpu_step(job, 1, full_depth=True)
    assert scaled.segments["forward:unit_last"]["temporaries"] == 115_200
    assert {k: full.segments[k] for k in scaled.segments} == scaled.segments


def test_a_layers_gradient_accumulation_is_in_its_layers_backward(tmp_path) -> None:
    """A parameter's AccumulateGrad runs inside its layer's backward, where the unit's segment holds the deeper
    layers' activations. Filed under `backward:pre` (the embedding's backward, after every layer), its moment
    took that segment's peak at two units but not at one, and scaling mixed the two (tied embeddings, a large
    vocabulary: Qwen2.5-0.5B full at batch 24 scaled to 17.5 GB against 13.0 GB traced whole)."""
    shape = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 6, "num_attention_heads": 4}
    shape |= {"num_key_value_heads": 2, "vocab_size": 12000, "tie_word_embeddings": True}
    path = write_llama_config(tmp_path / "llama.json", **shape)
    job = FineTuneJob(model=str(path), method="full", batch_size=2, seq_len=300, gradient_checkpointing=False)
    scaled = trace_single_gpu_step(job, 1)
    full = trace_single_gpu_step(job, 1, full_depth=True)
    assert {k: full.segments[k] for k in scaled.segments} == scaled.segments


def test_a_segment_lists_its_categories_in_one_order() -> None:
    """Sorted, not in a set's order (which moves with PYTHONHASHSEED): the JSON output is the same run to run."""
    from tunecost.simulate.depth import depth_scaled

    assert list(depth_scaled("forward:post", {"temporaries": 1, "activations": 2}, {"gradients": 3}, 0.5)) == [
        "activations",
        "gradients",
        "temporaries",
    ]
