"""A module vLLM cannot import while the check configures or inspects: the distribution that provides it
(from the installed vLLM's own requirements) and the command that installs it, in place of the GPU-host
advice; the serving question it leaves open makes the exit code 5."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from vllm_staging_plugin._offline import seams
from vllm_staging_plugin._offline.preflight import configure, missing
from vllm_staging_plugin._offline.preflight.missing import Missing, missing_module, vllm_requirement
from vllm_staging_plugin._offline.preflight.refusals import CannotCheckHere


def gone(name: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"No module named '{name}'", name=name)


def test_the_requirement_comes_from_vllms_metadata() -> None:
    assert vllm_requirement("compressed_tensors") == "compressed-tensors==0.17.0"  # vLLM 0.33.0's pin
    assert vllm_requirement("no_such_thing") is None
    assert vllm_requirement("zentorch") is None  # only under an extra: not a requirement of every install


def test_the_missing_module_is_found_through_the_cause_chain() -> None:
    try:
        try:
            raise gone("compressed_tensors.quantization")
        except ImportError as inner:
            raise ValueError(
                "Model architectures ['KimiLinearForCausalLM'] failed to be inspected"
            ) from inner
    except ValueError as outer:
        found = missing_module(outer)
    assert found == Missing("compressed_tensors", "compressed-tensors==0.17.0")
    assert found.advice == (
        "the Python module 'compressed_tensors' is not installed here; vLLM requires it "
        "(compressed-tensors==0.17.0): pip install 'compressed-tensors==0.17.0'"
    )
    assert missing_module(gone("vllm._C")) is None  # a part of vLLM's own build: nothing to pip install
    assert missing_module(ValueError("x")) is None and missing_module(None) is None
    assert "vLLM's requirements name no distribution for it" in Missing("cv2", None).advice


def test_the_metadata_of_no_vllm_names_no_requirement(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> None:
        raise missing.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(missing.metadata, "requires", absent)
    assert vllm_requirement("compressed_tensors") is None


@pytest.mark.parametrize("where", ["import", "inspection"])
def test_the_configuration_refusal_says_what_to_install(
    where: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    (tmp_path / "config.json").write_text('{"architectures": ["KimiLinearForCausalLM"]}')

    def fails(args: Any) -> None:
        if where == "import":
            raise gone("compressed_tensors")
        raise ValueError("Model architectures ['KimiLinearForCausalLM'] failed to be inspected. Please check")

    monkeypatch.setattr(AsyncEngineArgs, "from_cli_args", staticmethod(fails))
    monkeypatch.setattr(seams, "model_import_error", lambda architecture: gone("compressed_tensors"))
    with pytest.raises(CannotCheckHere) as refused:
        configure.create_engine_config(argparse.Namespace(model=str(tmp_path)))
    said = str(refused.value)
    assert said.endswith("pip install 'compressed-tensors==0.17.0'") and "GPU host" not in said


def test_the_model_class_import_is_asked_of_vllms_registry() -> None:
    assert seams.model_import_error("KimiLinearForCausalLM") is None  # it imports in this environment
    assert seams.model_import_error("NoSuchArchitecture") is None  # the registry knows no such entry
