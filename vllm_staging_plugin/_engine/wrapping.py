"""Replacing functions in a class's ``__dict__`` and putting back exactly what was there.

Each patch (:mod:`.patch`, :mod:`.runner_guard`) owns one :class:`ClassWrap` per class it changes. Its
wrappers call vLLM's own functions (:func:`stock`: any plugin wrapper underneath is skipped), so an
offline tool that wraps a class the process's installer already wrapped runs one plugin layer, not two.
Restoring puts back only the wrap's own entries: one another tool has since wrapped is left in place,
and the wrap's ``live`` flag turns the inner wrapper into a pass-through. Several wraps of one class (two
installers) stay independent: a wrapper tells the plugin layers it skips what it saw
(:meth:`ClassWrap.signal`), a later wrap on top is not "another tool", and restoring never puts back a
layer whose wrap is gone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

MARK = "__vllm_staging_wrapper__"
OWNER = "__vllm_staging_wrap__"  # on each applied replacement: the ClassWrap that applied it
_F = TypeVar("_F", bound=Callable[..., Any])
INHERITED: Any = object()  # ClassWrap.saved for a name the class inherits: restoring deletes the wrapper


def is_plugin_wrapper(function: Any) -> bool:
    """The mark holds the wrapper itself: a foreign ``functools.wraps`` copies it, and so fails this test."""
    return function is not None and getattr(function, MARK, None) is function


def stock(function: Any) -> Any:
    """``function`` without the plugin wrappers on top of it (vLLM's own, unless another tool wrapped)."""
    while is_plugin_wrapper(function):
        function = function.__wrapped__
    return function


def plugin_wrapper(original: Callable[..., Any]) -> Callable[[_F], _F]:
    """``functools.wraps`` plus the mark :func:`stock` looks for."""

    def decorate(wrapper: _F) -> _F:
        functools.update_wrapper(wrapper, original)
        setattr(wrapper, MARK, wrapper)
        return wrapper

    return decorate


def owner(function: Any) -> ClassWrap | None:
    """The wrap that applied ``function``, when it is a plugin wrapper (a foreign copy has none)."""
    return getattr(function, OWNER, None) if is_plugin_wrapper(function) else None


class ClassWrap:
    """One class's replaced functions: what ``cls.__dict__`` held, vLLM's own, and what replaced them.

    ``signals``: per name, what to call when a wrapper on top skips this wrap's (:meth:`signal`).
    """

    def __init__(
        self, cls: type, names: tuple[str, ...], signals: Mapping[str, Callable[[], None]] | None = None
    ) -> None:
        self.cls = cls
        # What the class's own __dict__ held; INHERITED when the class had no entry (restoring removes
        # the wrapper, and the inherited function is vLLM's own).
        self.saved = {name: cls.__dict__.get(name, INHERITED) for name in names}
        self.stock = {name: stock(getattr(cls, name)) for name in names}
        self.signals = dict(signals or {})
        self.replacements: dict[str, Any] | None = None  # set while applied

    @property
    def live(self) -> bool:
        """Applied and not restored: the wrappers act; otherwise they pass every call to vLLM."""
        return self.replacements is not None

    def apply(self, replacements: Mapping[str, Any]) -> None:
        self.replacements = dict(replacements)
        for name, function in self.replacements.items():
            if is_plugin_wrapper(function):  # vLLM's own functions (an offline stock arm) stay unmarked
                setattr(function, OWNER, self)
            setattr(self.cls, name, function)

    def signal(self, name: str) -> None:
        """A wrapper of this wrap ran ``name``: the live plugin layers underneath, which it skips to call
        vLLM's own, hear of it too (each installer learns that its worker built a manager)."""
        below = owner(self.saved.get(name))
        while below is not None:
            if below.live and name in below.signals:
                below.signals[name]()
            below = owner(below.saved.get(name))

    def restore(self) -> list[str]:
        """Put back what the class held; returns ``Class.name`` of each function another tool wrapped
        meanwhile (left alone). Nothing to do when not applied.

        A later plugin wrap on top is no other tool: it is left to put back what it found, and it skips
        this wrap's layer by then. What is put back is never a plugin layer whose wrap was restored
        (uninstalled out of order): its own ``saved`` is put back instead.
        """
        replacements, self.replacements = self.replacements, None
        if replacements is None:
            return []
        foreign = []
        for name, before in self.saved.items():
            current = self.cls.__dict__.get(name)
            if current is replacements.get(name):
                dead = owner(before)
                while dead is not None and not dead.live:
                    before = dead.saved[name]
                    dead = owner(before)
                if before is INHERITED:
                    delattr(self.cls, name)
                else:
                    setattr(self.cls, name, before)
            elif owner(current) is None:
                foreign.append(f"{self.cls.__qualname__}.{name}")
        return foreign
