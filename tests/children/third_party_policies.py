"""A third-party order-policy package (tests/test_subprocess.py installs this file as ``my_policies``
through an entry point beside the child): ``evens-first``, and a claim on the built-in name ``max-first``."""

from __future__ import annotations

from typing import Any

from vllm_staging_plugin.hookspecs import hookimpl


@hookimpl
def staging_order_policies() -> list[str]:
    return ["max-first", "evens-first"]  # max-first is a built-in name: the built-in keeps it


@hookimpl
def staging_capture_order(policy: str, argument: str | None, mode: str, descriptors: list[Any]) -> list[Any]:
    if policy == "max-first":  # never asked: would keep vLLM's descending order
        return list(descriptors)
    evens = [d for d in descriptors if d.num_tokens % 2 == 0]
    return evens + [d for d in descriptors if d.num_tokens % 2]
