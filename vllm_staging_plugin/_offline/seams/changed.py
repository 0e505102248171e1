"""The one error a seam raises for a private that changed shape."""

from __future__ import annotations


class SeamChanged(Exception):
    """The installed vLLM no longer has a private a seam relies on; the message names it."""
