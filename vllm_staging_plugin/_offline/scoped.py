"""Change a process for one block and put it back exactly, also when the block raises.

``seams/platform.py`` undoes its two platform changes by hand (docs/design.md, "Layout: which code runs
where").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

_ABSENT = object()


@contextlib.contextmanager
def attributes(target: Any, values: Mapping[str, Any]) -> Iterator[None]:
    """``values`` set on ``target`` (a module, a class, an object) for the block. After it, each name
    holds again exactly what ``target`` itself held (its ``__dict__`` entry, not a bound or inherited
    value); a name it did not hold itself is deleted, so an inherited one shows through again."""
    own = vars(target)
    saved = {name: own.get(name, _ABSENT) for name in values}
    try:
        for name, value in values.items():
            setattr(target, name, value)
        yield
    finally:
        for name, old in saved.items():
            if old is _ABSENT:
                if name in vars(target):
                    delattr(target, name)
            else:
                setattr(target, name, old)


@contextlib.contextmanager
def items(mapping: MutableMapping[str, Any], values: Mapping[str, Any | None]) -> Iterator[None]:
    """``values`` put in ``mapping`` (``os.environ``, ``sys.modules``) for the block, None meaning "not
    there"; after it, each key holds what it held before, or is gone if it was not there."""
    saved = {key: mapping.get(key, _ABSENT) for key in values}
    try:
        for key, value in values.items():
            _put(mapping, key, _ABSENT if value is None else value)
        yield
    finally:
        for key, old in saved.items():
            _put(mapping, key, old)


@contextlib.contextmanager
def kept(mapping: MutableMapping[str, Any]) -> Iterator[None]:
    """Whatever the block writes to ``mapping`` (``os.environ``: vLLM sets variables while it builds a
    config), undone after it: keys it added are removed, keys it changed or removed are put back."""
    saved = dict(mapping)
    try:
        yield
    finally:
        for key in set(mapping) - set(saved):
            del mapping[key]
        for key, value in saved.items():
            if mapping.get(key, _ABSENT) is not value:
                mapping[key] = value


def _put(mapping: MutableMapping[str, Any], key: str, value: Any) -> None:
    if value is _ABSENT:
        mapping.pop(key, None)
    else:
        mapping[key] = value
