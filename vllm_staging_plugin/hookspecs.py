"""pluggy hook specifications for capture-order policies.

A policy package registers an object or module with ``@hookimpl`` functions under the entry-point group
``vllm_staging_plugin.order_policies`` (docs/configuration.md, "Writing an order policy"). The plugin asks a
package only about the names it declared; built-in names are reserved, and a name two packages declare
belongs to the one loaded first. A policy is a pure function of its inputs (no unseeded RNG, no clock, no
per-rank reading): coupled ranks must capture in the same order.
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
    """Raise when ``argument`` is not valid for ``policy`` (optional; otherwise the start-up check calls
    ``staging_capture_sequence``, else ``staging_capture_order``, with no descriptors)."""


@hookspec
def staging_capture_order(  # type: ignore[empty-body]
    policy: str, argument: str | None, mode: str, descriptors: tuple[Any, ...]
) -> Sequence[Any]:
    """Return ``descriptors`` (one mode's list, in vLLM's descending order) in capture order: a permutation.
    ``mode`` is ``PIECEWISE``, ``FULL``, or ``validation`` for the start-up call with no descriptors."""


@hookspec
def staging_capture_sequence(
    policy: str, argument: str | None, descriptors: Mapping[str, tuple[Any, ...]]
) -> Sequence[Any] | None:
    """Return every descriptor (mode name -> that mode's list, PIECEWISE then FULL) in one capture
    sequence, a permutation of them all, or None to order each mode through ``staging_capture_order``
    (optional; never called for vLLM's profiling pass)."""
