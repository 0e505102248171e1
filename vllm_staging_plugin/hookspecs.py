"""pluggy hook specifications for capture-order policies.

A policy is a pure function of (policy name, argument, mode, descriptors): every tensor-, pipeline- and
data-parallel rank calls it with the same inputs and so captures in the same order. No RNG without a
seed, no clock, no per-rank memory readings. Third-party packages register an object or module with
``@hookimpl`` functions under the entry-point group ``vllm_staging_plugin.order_policies``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pluggy

PROJECT_NAME = "vllm_staging_plugin"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def staging_order_policies() -> list[str]:  # type: ignore[empty-body]
    """Names of the policies this plugin implements (for validation and ``--help`` listings)."""


@hookspec(firstresult=True)
def staging_capture_order(  # type: ignore[empty-body]
    policy: str, argument: str | None, mode: str, descriptors: tuple[Any, ...]
) -> Sequence[Any] | None:
    """Return ``descriptors`` (one mode's list, in vLLM's descending order) in capture order.

    Return None when ``policy`` is not yours. Raise ValueError for a bad ``argument``; it is
    reported against ``STAGING_PLUGIN_ORDER``. The result must be a permutation of ``descriptors``.
    """
