"""One door for each private: no engine module but ``_engine/compat.py``, and no offline module outside
``_offline/seams/``, reaches a vLLM or torch private.

Read from the source (no import): a private is a ``_name`` attribute, ``getattr``-family or string name
that the plugin does not define itself (a function, class, variable, argument, or ``self._name``), an
attribute of a module imported from vLLM or torch, or an import of a private vLLM or torch name or module.
The doors are scanned too, to show the rule sees the reaches it exists to confine.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "vllm_staging_plugin"
ENGINE = PACKAGE / "_engine"
COMPAT = ENGINE / "compat.py"
OFFLINE = PACKAGE / "_offline"
SEAMS = OFFLINE / "seams"
# The plugin's own attribute on vLLM's manager (staging.STATE_ATTR): a string no definition above names.
OWN_ATTRIBUTES = {"_vllm_staging"}
GETTERS = {"getattr", "hasattr", "setattr", "delattr"}


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_vllm(module: str) -> bool:
    """vLLM's modules, and torch's, whose privates the engine reaches too."""
    return any(module == root or module.startswith(f"{root}.") for root in ("vllm", "torch"))


def own_names(package: Path = PACKAGE) -> set[str]:
    """Every name the plugin defines: vLLM's privates it only reads or writes on vLLM's objects are not."""
    names: set[str] = set(OWN_ATTRIBUTES)
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
                names.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return names


def reaches(source: str, ours: set[str]) -> Iterator[str]:
    """``line: what`` for each reach into a vLLM private in ``source``."""
    tree = ast.parse(source)
    vllm_modules: set[str] = set()  # local names bound to vLLM modules or objects
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_vllm(alias.name):
                    vllm_modules.add((alias.asname or alias.name).split(".")[0])
                    if any(private(part) for part in alias.name.split(".")):
                        yield f"{node.lineno}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_vllm(node.module or ""):
            module = node.module or ""
            if any(private(part) for part in module.split(".")):
                yield f"{node.lineno}: from {module} import"
            for alias in node.names:
                vllm_modules.add(alias.asname or alias.name)
                if private(alias.name):
                    yield f"{node.lineno}: from {module} import {alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            receiver = node.value
            if (isinstance(receiver, ast.Name) and receiver.id in vllm_modules) or node.attr not in ours:
                yield f"{node.lineno}: .{node.attr}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"_[A-Za-z]\w*", node.value) and node.value not in ours:
                yield f"{node.lineno}: {node.value!r}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in GETTERS
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private(node.args[1].value)
            and node.args[1].value not in ours
        ):
            yield f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})"


def offline_modules() -> list[Path]:
    return sorted(p for p in OFFLINE.rglob("*.py") if SEAMS not in p.parents)


def engine_modules() -> list[Path]:
    """The engine and the package root (``register``, the hook specifications), but the door."""
    modules = [*ENGINE.glob("*.py"), PACKAGE / "__init__.py", PACKAGE / "hookspecs.py"]
    return sorted(p for p in modules if p != COMPAT)


def found_in(modules: list[Path]) -> dict[str, list[str]]:
    ours = own_names()
    return {
        str(path.relative_to(PACKAGE)): hits
        for path in modules
        if (hits := sorted(set(reaches(path.read_text(), ours))))
    }


def test_no_offline_module_outside_the_seams_reaches_a_private() -> None:
    assert len(offline_modules()) > 20 and found_in(offline_modules()) == {}


def test_no_engine_module_but_compat_reaches_a_private() -> None:
    assert len(engine_modules()) > 10 and found_in(engine_modules()) == {}


def test_the_doors_are_where_the_reaches_are() -> None:
    ours = own_names()
    seams = {hit.split(": ", 1)[1] for path in SEAMS.glob("*.py") for hit in reaches(path.read_text(), ours)}
    compat = {hit.split(": ", 1)[1] for hit in reaches(COMPAT.read_text(), ours)}
    assert {"'_global_graph_pool'", "import vllm._custom_ops"} <= seams
    assert {"'_capture_descs'", "'_max_full_descs_to_capture'", "._get_default_store"} <= compat


def test_the_offline_seams_spell_no_engine_private_again() -> None:
    """A private both rooms touch is named in compat only: the seams import it from there."""
    ours = own_names()
    compat = {hit.split(": ", 1)[1] for hit in reaches(COMPAT.read_text(), ours)}
    seams = {hit.split(": ", 1)[1] for path in SEAMS.glob("*.py") for hit in reaches(path.read_text(), ours)}
    spelled = {hit.strip("'.") for hit in compat} & {hit.strip("'.") for hit in seams}
    assert spelled == set()


def test_each_shape_of_reach_is_caught() -> None:
    source = """
import vllm.v1.worker._private_mod
from vllm.v1.worker.gpu import cudagraph_utils as cu
from vllm.config import _helper
from vllm.v1._internal import anything

def f(manager, config):
    manager._capture_descs
    getattr(config, "_private_field")
    cu.__doc__
    cu._ours_by_name
    return vars(manager)["_graph_pool"], manager._mine
"""
    hits = [hit.split(": ", 1)[1] for hit in reaches(source, ours={"_mine", "_ours_by_name"})]
    assert sorted(hits) == sorted(
        [
            "import vllm.v1.worker._private_mod",
            "from vllm.config import _helper",
            "from vllm.v1._internal import",
            "._capture_descs",
            "'_private_field'",
            "getattr(..., '_private_field')",
            "._ours_by_name",  # our name, but on a vLLM module
            "'_graph_pool'",
        ]
    )
