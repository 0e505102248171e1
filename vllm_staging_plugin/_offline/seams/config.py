"""Seams into vLLM's configuration code: the grid it derives, the model class it resolves, what its
failures mean and which drafter names it loads as a model."""

from __future__ import annotations

from typing import Any


def split_capture_sizes(vllm_config: Any, decode_query_len: int) -> None:
    """Have vLLM split ``cudagraph_capture_sizes`` into the prefill and decode sizes its manager reads, as
    its ``__post_init__`` does for an operator's grid; nothing on a release without the split. Private:
    ``VllmConfig._split_cudagraph_capture_sizes``; re-signed, TypeError. ``legacy_sizes=False``: vLLM's
    deprecation warning is for the operator's grid, not the replay's."""
    split = getattr(vllm_config, "_split_cudagraph_capture_sizes", None)
    if split is not None:
        split(False, vllm_config.get_decode_cudagraph_query_lens(decode_query_len))


def inspect_architecture(architecture: str) -> None:
    """Have vLLM's registry inspect ``architecture`` now. Private: ``ModelRegistry._try_inspect_model_cls``;
    without it the configuration build inspects it instead."""
    from vllm.model_executor.models.registry import ModelRegistry

    if architecture in ModelRegistry.models:
        inspect = getattr(ModelRegistry, "_try_inspect_model_cls", None)
        if inspect is not None:
            inspect(architecture)


def model_import_error(architecture: str) -> ImportError | None:
    """Why the module of ``architecture``'s model class does not import here (None: it does, or the
    registry cannot say). Private: the lazy entry's ``module_name``; gone, vLLM's own error stands."""
    import importlib

    from vllm.model_executor.models.registry import ModelRegistry

    module = getattr(ModelRegistry.models.get(architecture), "module_name", None)
    if not isinstance(module, str):
        return None
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return exc
    return None


def model_class(vllm_config: Any) -> Any:
    """The model class vLLM resolves for the configuration (``ModelRegistry.resolve_model_cls``); changed,
    it raises and the serving check reports that it could not be made."""
    from vllm.model_executor.models import ModelRegistry

    model_config = vllm_config.model_config
    cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config)
    return cls


def config_failure(exc: BaseException) -> tuple[str, str]:
    """What a failed ``create_engine_config`` means, and its text: ``kernel-library`` (a query to
    ``torch.ops._C``, absent without CUDA), ``inspection`` (known but not inspectable here),
    ``unknown-architecture`` (the text stops before vLLM's list of architectures), ``unknown-model-type``
    (Transformers knows no config class for ``model_type``) or ``refusal`` (vLLM's own). Privates: the
    sentences vLLM's registry, Transformers and torch raise; a changed one reads as ``refusal``."""
    text = f"{type(exc).__name__}: {exc}"
    if "'_OpNamespace'" in text:
        return "kernel-library", text
    if "failed to be inspected" in text:
        return "inspection", text
    if "are not supported for now" in text:
        return "unknown-architecture", text.split(". Supported architectures")[0]
    if "Transformers does not recognize this architecture" in text:
        return "unknown-model-type", text
    return "refusal", text


# --speculative-config methods whose ``model`` vLLM loads as a model (vllm/config/speculative.py), besides
# any "*_mtp"; for every other method vLLM's own answer stands.
LOADS_A_MODEL = frozenset({"draft_model", "eagle", "eagle3", "dflash", "dspark", "mtp"})


def loads_drafter(method: object, model: str) -> bool:
    """Whether vLLM loads ``--speculative-config``'s ``model`` as a model for ``method`` (None: inferred
    as vLLM does)."""
    if method is None:
        return model not in ("ngram", "[ngram]") and not proposer_class_path(model)
    return isinstance(method, str) and (method in LOADS_A_MODEL or method.endswith("_mtp"))


def proposer_class_path(model: str) -> bool:
    """Whether this vLLM reads a speculative ``model`` with no ``method`` as a proposer class's import
    path. Private: ``SpeculativeConfig._is_custom_proposer_path``; where it is gone, False, so the drafter
    is checked as the model vLLM then loads."""
    from vllm.config.speculative import SpeculativeConfig

    rule = getattr(SpeculativeConfig, "_is_custom_proposer_path", None)
    return bool(rule(model)) if callable(rule) else False
