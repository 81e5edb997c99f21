"""The Llama-style names of a decoder layer's attention and dense-MLP projections (PEFT's `target_modules`)."""

PROJECTIONS: dict[str, tuple[str, ...]] = {
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}
