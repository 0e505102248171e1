"""pluggy hook specifications for capture-order policies.

A policy package registers an object or module with ``@hookimpl`` functions under the entry-point group
``vllm_staging_plugin.order_policies``. The contract:

* ``staging_order_policies`` declares the names the package implements. The plugin asks a package
  only about the names it declared: a hook that answers every name cannot take over another
  package's policy or a built-in. The built-in names (``descending``, ``ascending``, ``max-first``,
  ``shuffle``, ``full-first``, ``size-descending``, ``interleaved``) are reserved; a name two packages
  declare belongs to the one loaded first.
* ``staging_validate_order`` (optional) checks a policy's argument at start-up, before the model loads.
  Any exception it raises stops start-up as a ``ConfigError`` naming ``STAGING_PLUGIN_ORDER``, the
  policy, its package and the exception. Without it, ``staging_capture_sequence`` (where the package
  has it) is called once with no descriptors, else ``staging_capture_order`` with none and
  ``mode="validation"``.
* ``staging_capture_order`` returns one mode's descriptors in capture order: a permutation of its input.
* ``staging_capture_sequence`` (optional) returns the whole capture, every mode's descriptors in one
  sequence, for a policy that mixes the modes (vLLM captures every PIECEWISE graph, then every FULL
  one); returning None leaves the policy to ``staging_capture_order``, one mode at a time.

A policy is a pure function of (policy name, argument, mode or modes, descriptors): every tensor-,
pipeline- and data-parallel rank calls it with the same inputs and so captures in the same order. No
RNG without a seed, no clock, no per-rank memory readings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pluggy

PROJECT_NAME = "vllm_staging_plugin"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def staging_order_policies() -> list[str]:  # type: ignore[empty-body]
    """The policy names this package implements; it is asked about these names only."""


@hookspec
def staging_validate_order(policy: str, argument: str | None) -> None:
    """Raise (``ValueError`` is customary) when ``argument`` is not valid for ``policy``."""


@hookspec
def staging_capture_order(  # type: ignore[empty-body]
    policy: str, argument: str | None, mode: str, descriptors: tuple[Any, ...]
) -> Sequence[Any]:
    """Return ``descriptors`` (one mode's list, in vLLM's descending order) in capture order.

    Called only for a ``policy`` this package declared; ``mode`` is the mode's name (``PIECEWISE``,
    ``FULL``), or ``validation`` for the start-up call with no descriptors. The result must be a
    permutation of ``descriptors``.
    """


@hookspec
def staging_capture_sequence(
    policy: str, argument: str | None, descriptors: Mapping[str, tuple[Any, ...]]
) -> Sequence[Any] | None:
    """Return every descriptor of ``descriptors`` (mode name -> that mode's list, in vLLM's order:
    ``PIECEWISE`` then ``FULL``, each descending) in one capture sequence, or None to order each mode
    alone through ``staging_capture_order``.

    Called only for a ``policy`` this package declared: for the real capture (never vLLM's memory-
    profiling pass, which keeps vLLM's order), and once at start-up with no descriptors when the package
    has no ``staging_validate_order``. The result must be a permutation of all the descriptors; vLLM
    captures each one in its own mode whatever its place.
    """
