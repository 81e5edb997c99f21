"""Build the model a profile runs: load or randomly initialise it, set its top-k, and make it trainable by method.

Sources and derivations: docs/profiling.md, section `tunecost.profile.model_setup`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError, unknown_name_error
from tunecost.models.anatomy import decoder_layers, set_top_k
from tunecost.models.build import build_model, load_pretrained
from tunecost.models.catalog import ModelSpec, resolve_model
from tunecost.moe.spec import EXPERT_IMPLS, LoraSpec
from tunecost.workload.device import check_device
from tunecost.workload.job import METHODS, MOE_LORA_TARGETS, FineTuneJob, LoraConfig

DEFAULT_EXPERTS_IMPL = {"full": "stock", "lora": "peft-fused", "qlora": "qlora-linear4bit"}
_ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True, kw_only=True)
class ModelSetup:
    """What model to profile and how it trains.

    model: catalog name (e.g. tiny-mixtral, mixtral-8x7b), local folder / config.json, or cached hub id.
    method: full | lora | qlora.  experts_per_token: router top-k (None: the model's own; E: dense).
    experts_impl: one of tunecost.moe.EXPERT_IMPLS (None: the method's default, see DEFAULT_EXPERTS_IMPL).
    device: "cpu" or "cuda[:i]".  dtype: "bf16" | "fp32" | None (bf16 on CUDA, fp32 on CPU).
    random_weights: build from the config with random weights even where real weights exist.
    num_layers: keep only the first N decoder layers (a cut-down model for quick checks), None = all.
    """

    model: str
    method: str = "qlora"
    experts_per_token: int | None = None
    experts_impl: str | None = None
    device: str = "cpu"
    dtype: str | None = None
    random_weights: bool = False
    gradient_checkpointing: bool = True
    lora_rank: int = 16
    lora_alpha: float = 32.0
    quantize_attention: bool = True
    num_layers: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise unknown_name_error("method", self.method, METHODS)
        if self.dtype not in (None, "bf16", "fp32", "fp16"):
            raise TunecostError(f"unsupported dtype {self.dtype!r}; use bf16, fp16 or fp32")
        if self.experts_impl is not None and self.experts_impl not in EXPERT_IMPLS:
            raise unknown_name_error("experts implementation", self.experts_impl, EXPERT_IMPLS)
        if self.num_layers is not None and self.num_layers < 1:
            raise TunecostError(f"num_layers must be >= 1, got {self.num_layers}")

    @classmethod
    def from_job(cls, job: FineTuneJob, *, device: str = "cpu", **options: Any) -> ModelSetup:
        """The profiler's setup of `job` (model, method, top-k, checkpointing, LoRA rank and alpha) plus the
        profiler's own options (device, experts_impl, dtype, random_weights, num_layers, seed, ...)."""
        return cls(
            model=job.model,
            method=job.method,
            experts_per_token=job.experts_per_token,
            gradient_checkpointing=job.gradient_checkpointing,
            lora_rank=job.lora.rank,
            lora_alpha=job.lora.alpha,
            device=device,
            **options,
        )

    @property
    def resolved_dtype(self) -> str:
        return self.dtype or ("bf16" if self.device.startswith("cuda") else "fp32")

    @property
    def resolved_experts_impl(self) -> str:
        impl = self.experts_impl or DEFAULT_EXPERTS_IMPL[self.method]
        if self.method == "qlora" and impl == "fast":
            return "fast-4bit"
        return impl


@dataclass
class PreparedModel:
    """A model ready to train, with what was built."""

    model: Any
    spec: Any  # tunecost.models.catalog.ModelSpec
    num_experts: int
    experts_per_token: int
    experts_impl: str
    dtype: str
    weights: str  # "pretrained:<where>" | "random"
    trainable_params: int
    total_params: int
    notes: list[str] = field(default_factory=list)


def torch_dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def resolve_profile_model(name: str) -> Any:
    """`tunecost.models.catalog.resolve_model`, plus the built-in `tiny-blackmamba` (tunecost.models.blackmamba's
    tiny config: 4 layers Mamba/MoE alternating, 8 experts, top-2) while the catalog has no entry of that name."""
    try:
        return resolve_model(name)
    except TunecostError:
        if name.strip().lower() != "tiny-blackmamba":
            raise
    from tunecost.models.blackmamba.config import tiny_blackmamba_config

    config = tiny_blackmamba_config().to_dict()
    return ModelSpec(
        name="tiny-blackmamba",
        family="blackmamba",
        config=config,
        source="tunecost built-in (tunecost.models.blackmamba.tiny_blackmamba_config): random init",
    )


def find_weights(spec: Any) -> str | None:
    """Where real weights for `spec` are: a local folder with weight files, or a hub id cached locally."""
    weight_globs = ("*.safetensors", "pytorch_model*.bin", "model*.safetensors.index.json")
    if spec.local_path:
        folder = Path(spec.local_path)
        if any(any(folder.glob(g)) for g in weight_globs):
            return str(folder)
    if spec.hub_id:
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:  # pragma: no cover
            return None
        for filename in (
            "model.safetensors.index.json",
            "model.safetensors",
            "pytorch_model.bin.index.json",
            "pytorch_model.bin",
        ):
            if isinstance(try_to_load_from_cache(spec.hub_id, filename), str):
                return spec.hub_id
    return None


def is_builtin(spec: Any) -> bool:
    """Built-in tiny models have no weights anywhere: they are always randomly initialised."""
    return spec.hub_id is None and spec.local_path is None


def build_training_model(setup: ModelSetup, *, spec: Any = None) -> PreparedModel:
    """Load or build `setup.model`, set its top-k, apply the method; returns it in train mode on the device."""
    import torch

    check_device(setup.device)
    spec = spec or resolve_profile_model(setup.model)
    if not spec.is_moe:
        raise TunecostError(f"{spec.name} is not a mixture-of-experts model: tunecost profile needs MoE layers")
    k = spec.top_k(setup.experts_per_token)
    if not 1 <= k <= spec.num_experts:
        raise TunecostError(f"{spec.name}: experts per token must be between 1 and {spec.num_experts}, got {k}")
    dtype = torch_dtype(setup.resolved_dtype)
    impl = setup.resolved_experts_impl
    weights_at = None if (setup.random_weights or is_builtin(spec)) else find_weights(spec)
    if weights_at is None and not (setup.random_weights or is_builtin(spec)):
        raise TunecostError(
            f"no weights for {spec.name} ({spec.hub_id or spec.local_path}) on this machine (tunecost does not "
            "download); pass --random-weights to profile a randomly initialised model of the same architecture"
        )
    overrides: dict[str, Any] = {}
    if setup.num_layers is not None:
        overrides["num_hidden_layers"] = setup.num_layers
    torch.manual_seed(setup.seed)
    notes: list[str] = []
    streamed_4bit = setup.method == "qlora" and setup.device.startswith("cuda")
    if weights_at is not None and streamed_4bit:
        # bf16 weights go to CPU memory first; each layer then moves to the GPU and is quantized there
        model = _from_pretrained(spec, weights_at, dtype=dtype, device="cpu", overrides=overrides)
        _prepare_layer_by_layer(
            model, setup, bring=lambda modules, layer: layer.to(setup.device), bring_rest=lambda: model.to(setup.device)
        )
        weights = f"pretrained:{weights_at}"
        notes.append("loaded to CPU, then moved and quantized layer by layer on the GPU")
    elif weights_at is not None:
        model = _from_pretrained(spec, weights_at, dtype=dtype, device=setup.device, overrides=overrides)
        weights = f"pretrained:{weights_at}"
    elif setup.method == "qlora" and setup.device.startswith("cuda") and spec.family != "blackmamba":
        model = _random_streamed_4bit(spec, setup, dtype, overrides)
        weights = "random"
        notes.append("built layer by layer on the GPU and quantized as it went")
    else:
        model = build_model(spec, device=setup.device, dtype=dtype, seed=setup.seed, **overrides)
        weights = "random"
    if not getattr(model, "_tunecost_prepared", False):
        prepare_method(model, setup)
    set_top_k(model, k)
    model.train()
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == 0:
        raise TunecostError(f"{spec.name} with method {setup.method}: no trainable parameters")
    return PreparedModel(
        model=model,
        spec=spec,
        num_experts=spec.num_experts,
        experts_per_token=k,
        experts_impl=impl,
        dtype=setup.resolved_dtype,
        weights=weights,
        trainable_params=trainable,
        total_params=total,
        notes=notes,
    )


def _from_pretrained(spec: Any, where: str, *, dtype: Any, device: str, overrides: dict[str, Any]) -> Any:
    model = load_pretrained(spec, where, dtype=dtype, device=device, **overrides)
    return model.train()


def lora_spec(setup: ModelSetup) -> Any:
    return LoraSpec.from_config(LoraConfig(rank=setup.lora_rank, alpha=setup.lora_alpha, targets=MOE_LORA_TARGETS))


def prepare_method(model: Any, setup: ModelSetup, *, layers_only: Any = None) -> Any:
    """Make `model` train as `setup.method` says (the one place a method meets a model). In place; returns it."""
    from tunecost.moe import install_experts

    impl = setup.resolved_experts_impl
    target = layers_only if layers_only is not None else model
    if setup.method == "full":
        if impl in ("qlora-linear4bit", "fast-4bit"):
            raise TunecostError(f"--method full trains every weight; {impl} holds experts in 4-bit (use qlora)")
        if impl != "stock":
            install_experts(target, impl, None)
        for p in target.parameters():
            p.requires_grad_(True)
    elif setup.method == "lora":
        if impl in ("qlora-linear4bit", "fast-4bit"):
            raise TunecostError(f"{impl} holds experts in 4-bit: that is --method qlora")
        install_experts(target, impl, lora_spec(setup))
    else:  # qlora
        if impl in ("stock", "peft-fused"):
            raise TunecostError(
                f"{impl} cannot hold experts in 4-bit (transformers 5 does not quantize fused "
                "experts); use qlora-linear4bit or fast-4bit for --method qlora"
            )
        install_experts(
            target, "fast" if impl == "fast-4bit" else impl, lora_spec(setup), quantize_4bit=impl == "fast-4bit"
        )
        if setup.quantize_attention:
            quantize_attention_4bit(target)
    if layers_only is None:
        _enable_training_features(model, setup)
    return model


def _enable_training_features(model: Any, setup: ModelSetup) -> None:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = False
    if setup.gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
            model, "gradient_checkpointing_enable", None
        )
        if enable is None:
            raise TunecostError(
                f"{type(model).__name__} does not support gradient checkpointing (use --no-gradient-checkpointing)"
            )
        enable()  # transformers: non-reentrant torch.utils.checkpoint per decoder layer
    if setup.method != "full" and hasattr(model, "enable_input_require_grads"):
        # As PEFT / prepare_model_for_kbit_training do: the layers' inputs require grad even though the embedding
        # is frozen, so every layer's backward (and its timing) is defined.
        model.enable_input_require_grads()


def quantize_attention_4bit(model: Any) -> int:
    """Swap bias-free attention projections for frozen nf4 `Linear4bit`s (as `load_in_4bit` did). Returns how many."""
    import torch

    from tunecost.moe.linear4bit import make_linear4bit

    swapped = 0
    for _, module in list(model.named_modules()):
        for name in _ATTENTION_PROJECTIONS:
            child = getattr(module, name, None)
            if type(child) is torch.nn.Linear and child.bias is None and child.weight.device.type != "meta":
                setattr(module, name, make_linear4bit(child.weight.data))
                swapped += 1
    return swapped


# ------------------------------------------------------------------ full-size random QLoRA models on a GPU


def _random_streamed_4bit(spec: Any, setup: ModelSetup, dtype: Any, overrides: dict[str, Any]) -> Any:
    """Build on the meta device, then materialise each decoder layer on the GPU with random weights and quantize
    its experts and attention right away, so the bf16 model never exists whole."""
    import torch

    model = build_model(spec, device="meta", dtype=dtype, seed=None, **overrides)
    device = torch.device(setup.device)
    inside = {id(m) for layer in decoder_layers(model) for m in layer.modules()}
    torch.manual_seed(setup.seed)
    _prepare_layer_by_layer(
        model,
        setup,
        bring=lambda modules, layer: _materialize(model, modules, device),
        bring_rest=lambda: _materialize(model, (m for m in model.modules() if id(m) not in inside), device),
    )
    return model


def _prepare_layer_by_layer(model: Any, setup: ModelSetup, *, bring: Any, bring_rest: Any) -> None:
    """`bring(modules, layer)` each decoder layer onto the device and apply the method to it before the next,
    then `bring_rest()` (embeddings, final norm, head); the model ends up prepared (`_tunecost_prepared`)."""
    import torch

    for layer in decoder_layers(model):
        bring(layer.modules(), layer)
        prepare_method(model, setup, layers_only=layer)
        if torch.device(setup.device).type == "cuda":
            torch.cuda.empty_cache()
    bring_rest()
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    for name, p in model.named_parameters():  # the LoRA factors train, nothing else (as install_experts does)
        p.requires_grad_("lora_" in name)
    _enable_training_features(model, setup)
    model._tunecost_prepared = True


def _materialize(model: Any, modules: Any, device: Any) -> None:
    import torch

    with torch.no_grad():
        for module in modules:
            has_meta = any(
                t.device.type == "meta" for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            )
            if has_meta:
                module.to_empty(device=device, recurse=False)
                model._init_weights(module)
