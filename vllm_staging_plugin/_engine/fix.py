"""The one base of every runtime fix, as OpenTelemetry's ``BaseInstrumentor``: a subclass names a vLLM
module, class and methods and builds its wrappers; the base installs them when vLLM imports the module,
never breaks that import, restores only its own wrappers, and is strict or warns once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from .import_hook import PostImportHook, when_imported
from .settings import ENV_STRICT, Settings

if TYPE_CHECKING:
    from .policies import PolicyRegistry

logger = logging.getLogger("vllm.staging_plugin")

INHERITED: Any = object()  # what a class held for a method it inherits: restoring deletes the wrapper
Notify = Callable[[str], None]
# Events a fix reports (``notify``) and others retire on (``retired_by``): what this worker turned out to be.
V2_MANAGER_BUILT = "v2-manager-built"  # it runs Model Runner V2: no V1 runner, its KV-cache specs are taken
V1_RUNNER_BUILT = "v1-runner-built"  # it runs the V1 runner: it builds no graph manager


class Once:
    """True the first time it is asked, then False: what a fix says once per process (its INFO line, its
    warning), each thing its own ``Once``."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked == 1


class ClassWrap:
    """One class's replaced methods: what its ``__dict__`` held, what a call reached, the wrappers."""

    def __init__(self, cls: type, names: tuple[str, ...]) -> None:
        self.cls = cls
        self.saved = {name: cls.__dict__.get(name, INHERITED) for name in names}
        self.original = {name: getattr(cls, name) for name in names}
        self.replacements: dict[str, Any] | None = None
        self._parked: dict[str, Any] | None = None

    @property
    def live(self) -> bool:
        """Applied and not restored: otherwise the wrappers pass every call through."""
        return self.replacements is not None

    def apply(self, replacements: Mapping[str, Any]) -> None:
        self.replacements = dict(replacements)
        for name, function in self.replacements.items():
            setattr(self.cls, name, function)

    def suspend(self) -> None:
        """Put back what the class held, keeping the wrappers for :meth:`resume` (unless another tool
        wrapped on top since)."""
        replacements = self.replacements
        if not self.restore():
            self._parked = replacements

    def resume(self) -> None:
        """The same wrappers back in the class."""
        parked, self._parked = self._parked, None
        if parked is not None:
            self.apply(parked)

    def restore(self) -> list[str]:
        """Put back what the class held; returns ``Class.name`` of each method another tool wrapped since."""
        replacements, self.replacements = self.replacements, None
        if replacements is None:
            return []
        foreign = []
        for name, before in self.saved.items():
            if self.cls.__dict__.get(name) is not replacements[name]:
                foreign.append(f"{self.cls.__qualname__}.{name}")
            elif before is INHERITED:
                delattr(self.cls, name)
            else:
                setattr(self.cls, name, before)
        return foreign


class RuntimeFix:
    """A change to one vLLM class. Subclasses set ``module``, ``target``, ``methods`` and ``error`` (what
    strict mode raises) and write :meth:`wrappers`; ``retired_by`` names the events that make it needless.
    """

    module: ClassVar[str]
    target: ClassVar[str]
    methods: ClassVar[tuple[str, ...]]
    error: ClassVar[type[Exception]] = RuntimeError
    retired_by: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self, settings: Settings, notify: Notify | None = None, policies: PolicyRegistry | None = None
    ) -> None:
        self.settings = settings
        self.notify: Notify = notify or (lambda event: None)
        self.policies = policies
        self.wrap: ClassWrap | None = None
        self.suspended = False
        self._pending: ModuleType | None = None  # imported while suspended: installed on resume
        self._hook: PostImportHook | None = None
        self.refused = Once()  # the refusal's warning

    @classmethod
    def enabled(cls, settings: Settings) -> bool:
        """Whether the settings ask for this fix at all."""
        return True

    def find(self, module: ModuleType) -> type | None:
        """The class to wrap (None: nothing to do); raises to refuse."""
        cls = getattr(module, self.target, None)
        if not isinstance(cls, type):
            raise self.error(f"{module.__name__}.{self.target} is missing")
        return cls

    def check(self) -> None:
        """Raises when this process's platform is not one the fix was written for."""

    def wrappers(self, wrap: ClassWrap) -> dict[str, Callable[..., Any]]:
        """The replacement of each method; each passes through unless ``wrap.live``."""
        raise NotImplementedError

    def refusal(self, reason: str) -> str:
        """The one warning when the fix stays out of this process."""
        name = type(self).__name__
        return f"vllm-staging-plugin: {name} is inactive: {reason}. Set {ENV_STRICT}=1 to fail instead."

    def start(self) -> None:
        """Install now if vLLM imported the module, else right after it does."""
        if self._hook is None:
            self._hook = when_imported(self.module, self.install)

    def install(self, module: ModuleType) -> None:
        """Wrap the class of ``module``, never breaking vLLM's import of it (strict mode raises)."""
        if self.suspended:
            self._pending = module
            return
        try:
            cls = self.find(module)
            if cls is None:
                return
            self.check()
            self.apply(cls)
        except Exception as exc:
            self.refuse(str(exc) if isinstance(exc, self.error) else f"{type(exc).__name__}: {exc}")

    def apply(self, cls: type) -> bool:
        """Wrap ``cls``'s methods; False if this fix already holds a class."""
        if self.wrap is not None:
            return False
        wrap = ClassWrap(cls, self.methods)
        wrap.apply(self.wrappers(wrap))
        self.wrap = wrap
        return True

    def suspend(self) -> None:
        """vLLM's class as before this fix, until :meth:`resume` (an offline tool's block)."""
        self.suspended = True
        if self.wrap is not None:
            self.wrap.suspend()

    def resume(self) -> None:
        """The same wrappers back, or installed now if vLLM imported the module meanwhile."""
        self.suspended = False
        if self.wrap is not None:
            self.wrap.resume()
        pending, self._pending = self._pending, None
        if pending is not None:
            self.install(pending)

    def retire(self) -> None:
        """The module no longer matters in this process: its hook goes."""
        self._drop_hook()

    def uninstall(self) -> list[str]:
        """The hook and the wrappers go; returns the methods another tool wrapped on top (left alone)."""
        self._drop_hook()
        wrap, self.wrap = self.wrap, None
        return wrap.restore() if wrap is not None else []

    def _drop_hook(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()

    def refuse(self, reason: str, warning: str | None = None, once: Once | None = None) -> None:
        """Leave vLLM as it is with one warning (per ``once``, else per refusal), or raise in strict mode."""
        if self.settings.strict:
            raise self.error(f"vllm-staging-plugin (strict mode): {reason}")
        if (self.refused if once is None else once)():
            logger.warning(warning or self.refusal(reason))
