"""Seams into vLLM's configuration code: the capture grid it derives, the model class it resolves, and
which speculative ``model`` names it loads as a model."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..scoped import attributes


def derive_capture_sizes(vllm_config: Any) -> list[int]:
    """The capture grid vLLM derives for ``vllm_config`` (which holds no explicit sizes), set on its
    compilation config and returned. Private: ``VllmConfig._set_cudagraph_sizes`` (0.18.0-0.33.0), the
    method vLLM's own ``__post_init__`` calls; renamed or gone, AttributeError names it."""
    vllm_config._set_cudagraph_sizes()
    return list(vllm_config.compilation_config.cudagraph_capture_sizes)


def split_capture_sizes(vllm_config: Any, decode_query_len: int) -> bool:
    """Have vLLM split the compilation config's (deprecated, still honoured) ``cudagraph_capture_sizes``
    into the prefill token sizes and decode request sizes its graph manager reads, as its own
    ``__post_init__`` does for an operator-set grid; False on a release without the split (0.18.0-0.33.0
    read ``cudagraph_capture_sizes`` directly). Privates: ``VllmConfig._split_cudagraph_capture_sizes``
    ``(legacy_sizes, target_query_lens)`` and the public ``get_decode_cudagraph_query_lens`` (0.34.0);
    re-signed, TypeError, and the replay that asked reports it. ``legacy_sizes`` is passed False: with it
    True vLLM logs its deprecation warning for a grid the replay set, not the operator; the only other
    difference, data-centre Blackwell's wider default grids, needs that platform, never the replay's."""
    split = getattr(vllm_config, "_split_cudagraph_capture_sizes", None)
    if split is None:
        return False
    split(False, vllm_config.get_decode_cudagraph_query_lens(decode_query_len))
    return True


@contextlib.contextmanager
def capability_family(family: int) -> Iterator[None]:
    """For the block, the platform answers ``is_device_capability_family(family)`` with yes (e.g. 100:
    data-centre Blackwell, whose derived-grid ceiling is 1024 where others have 512). Private: the
    classmethod on the platform class of ``current_platform``, which ``_set_cudagraph_sizes`` asks
    (0.28.0-0.33.0); renamed, the question is no longer asked and the ceiling stays 512 (the per-release
    pin of tests/test_seams.py catches it)."""
    from vllm.platforms import current_platform

    answer = classmethod(lambda _, capability, device_id=0: capability // 10 == family // 10)
    with attributes(type(current_platform), {"is_device_capability_family": answer}):
        yield


def inspect_architecture(architecture: str) -> None:
    """Have vLLM's registry inspect ``architecture`` (its subprocess the first time, then its cache).
    Private: ``ModelRegistry._try_inspect_model_cls`` (0.18.0-0.33.0); the configuration build calls it
    anyway, so without it the inspection happens there instead."""
    from vllm.model_executor.models.registry import ModelRegistry

    if architecture in ModelRegistry.models:
        inspect = getattr(ModelRegistry, "_try_inspect_model_cls", None)
        if inspect is not None:
            inspect(architecture)


def model_import_error(architecture: str) -> ImportError | None:
    """Why the module of ``architecture``'s model class does not import in this process (None: it
    does, or vLLM's registry cannot say where it is). Private: the registry's lazy entry and its
    ``module_name`` (``_LazyRegisteredModel``, 0.18.0-0.33.0); gone, this answers None and the check
    keeps vLLM's own inspection error."""
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
    """The model class vLLM resolves for the configuration. Internal: ``ModelRegistry.resolve_model_cls``
    returning ``(class, architecture)`` (0.18.0-0.33.0); renamed or re-shaped, it raises (AttributeError,
    ValueError) and the pre-flight's serving check reports that it could not be made."""
    from vllm.model_executor.models import ModelRegistry

    model_config = vllm_config.model_config
    cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config)
    return cls


def config_failure(exc: BaseException) -> tuple[str, str]:
    """What a failed ``create_engine_config`` means, read from the sentence vLLM (or torch) raised, and its
    text: ``kernel-library``, a capability query to vLLM's CUDA kernel library (``torch.ops._C``), absent
    on a machine without CUDA; ``inspection``, vLLM's registry knows the architecture but could not
    inspect it here; ``unknown-architecture``, vLLM does not know it (the text stops before vLLM's
    11 KB list of supported architectures); ``refusal``, anything else: vLLM's own refusal of the
    arguments. Privates: the sentences of ``ModelRegistry._raise_for_unsupported`` and torch's
    ``_OpNamespace`` AttributeError (0.32.0-0.33.0); a changed sentence reads as ``refusal``, whose text
    is then vLLM's own."""
    text = f"{type(exc).__name__}: {exc}"
    if "'_OpNamespace'" in text:
        return "kernel-library", text
    if "failed to be inspected" in text:
        return "inspection", text
    if "are not supported for now" in text:
        return "unknown-architecture", text.split(". Supported architectures")[0]
    return "refusal", text


# --speculative-config methods whose ``model`` vLLM loads as a model (vllm/config/speculative.py, read on
# 0.33.0 and 0.34.0), besides any "*_mtp" (vLLM maps those to mtp). Not n-gram, suffix decoding, a proposer
# class, the hidden-state extractor, nor a method a package registers: vLLM's own answer stands for those.
LOADS_A_MODEL = frozenset({"draft_model", "eagle", "eagle3", "dflash", "dspark", "mtp"})


def loads_drafter(method: object, model: str) -> bool:
    """Whether vLLM loads ``--speculative-config``'s ``model`` as a model for ``method`` (None: vLLM infers
    it: n-gram for ``"ngram"`` / ``"[ngram]"``, a proposer class for a dotted path where it reads one
    (:func:`proposer_class_path`), else a draft model)."""
    if method is None:
        return model not in ("ngram", "[ngram]") and not proposer_class_path(model)
    return isinstance(method, str) and (method in LOADS_A_MODEL or method.endswith("_mtp"))


def proposer_class_path(model: str) -> bool:
    """Whether this vLLM reads a speculative ``model`` with no ``method`` as a proposer class's import path
    (``pkg.MyProposer``) rather than a model to load. Private: ``SpeculativeConfig._is_custom_proposer_path``
    (read on 0.29.0-0.33.0). 0.34.0 has none (it registers custom methods by name and loads a dotted
    ``model`` as a model): False there, and wherever the private is gone, so the drafter is checked as
    the model it then is."""
    from vllm.config.speculative import SpeculativeConfig

    rule = getattr(SpeculativeConfig, "_is_custom_proposer_path", None)
    return bool(rule(model)) if callable(rule) else False
