"""The two ways a pre-flight refuses before replaying anything: arguments vLLM rejects (exit 2) and what
this machine cannot check (exit 3)."""

from __future__ import annotations

GPU_HOST = "run the check on the GPU host, where vLLM's own CUDA platform answers"


class BadArguments(Exception):
    """vLLM rejected the ``vllm serve`` arguments; the message is vLLM's own."""


class CannotCheckHere(Exception):
    """vLLM itself cannot inspect this configuration on this machine."""
