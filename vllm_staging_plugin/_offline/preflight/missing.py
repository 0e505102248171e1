"""A Python module vLLM could not import while the check built its configuration or inspected the model:
which distribution provides it and the command that installs it, read from the import error and the
installed vLLM's own requirements (its metadata), not from a list of the plugin's."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class Missing:
    module: str  # the top-level module that is missing, e.g. compressed_tensors
    requirement: str | None  # vLLM's requirement that provides it, e.g. compressed-tensors==0.17.0

    @property
    def advice(self) -> str:
        if self.requirement is None:
            return (
                f"the Python module '{self.module}' is not installed here, and vLLM's requirements name "
                f"no distribution for it: install the one that provides '{self.module}'"
            )
        return (
            f"the Python module '{self.module}' is not installed here; vLLM requires it "
            f"({self.requirement}): pip install '{self.requirement}'"
        )


def missing_module(exc: BaseException | None) -> Missing | None:
    """The missing module behind ``exc`` (its cause and context chain too), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            module = exc.name.split(".")[0]
            if module != "vllm":  # a vLLM submodule this build lacks is no package to install
                return Missing(module, vllm_requirement(module))
        exc = exc.__cause__ or exc.__context__
    return None


def missing_behind(exc: BaseException, architectures: Iterable[str]) -> Missing | None:
    """The missing module behind ``exc``, else behind importing each architecture's model class here
    (vLLM's registry reports that failure as a sentence, without the import error)."""
    from .. import seams

    found = missing_module(exc)
    for architecture in architectures:
        found = found or missing_module(seams.model_import_error(architecture))
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def vllm_requirement(module: str) -> str | None:
    """The installed vLLM's requirement whose distribution is named like ``module`` (``-`` for ``_``),
    without its environment marker; None if none is (or vLLM's metadata is not there)."""
    try:
        requirements = metadata.requires("vllm") or []
    except metadata.PackageNotFoundError:
        return None
    for line in requirements:
        spec, _, marker = line.partition(";")
        if "extra ==" in marker:
            continue
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if name and _normal(name.group(1)) == _normal(module):
            return spec.strip().replace(" ", "")
    return None
