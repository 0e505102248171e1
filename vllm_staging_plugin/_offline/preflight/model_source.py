"""Where the model's config.json comes from: a local folder (it must exist) or the Hugging Face hub (it
must be cached or reachable), checked before vLLM spends seconds failing on it."""

from __future__ import annotations

from collections.abc import Sequence

from ..text import json_kind
from .refusals import BadArguments, CannotCheckHere

HUB_TIMEOUT = 3.0  # seconds to wait for the hub's address before saying it cannot be reached


def check_model(model: str, revision: str | None, role: str = "model") -> None:
    """A missing or mistyped folder, or one whose config.json is no JSON object (exit 2), a hub name
    neither cached nor reachable (exit 3): one line. ``role`` names it ("speculative model": the drafter,
    which vLLM's hub client would otherwise report as an invalid repository id, after retries)."""
    _model_folder_exists(model, role)
    _config_is_an_object(model, role)
    _hub_model_reachable(model, revision, role)


def draft_model(speculative_config: object) -> tuple[str, str | None] | None:
    """The drafter ``--speculative-config`` names (``model``) and its ``revision``, when vLLM loads that
    name as a model (``seams.loads_drafter``; vLLM is imported by then: its parser read the option)."""
    from .. import seams

    if not isinstance(speculative_config, dict):
        return None
    model, revision = speculative_config.get("model"), speculative_config.get("revision")
    if not isinstance(model, str) or not seams.loads_drafter(speculative_config.get("method"), model):
        return None
    return model, revision if isinstance(revision, str) else None


def check_model_early(argv: Sequence[str]) -> str | None:
    """:func:`check_model` before vLLM is imported (seconds sooner), for the usual form where the model
    comes first and no ``--revision`` is given; returns the model it checked, else None."""
    if not argv or argv[0].startswith("-") or any(w.startswith("--revision") for w in argv):
        return None
    check_model(argv[0], None)
    return argv[0]


def _model_folder_exists(model: str, role: str) -> None:
    """A model written as a path (``/``, ``./``, ``../``, ``~``) must be a folder: say so in one line.

    Without this, vLLM's hub client reports a missing folder as an invalid repository id.
    """
    import os

    path = os.path.expanduser(model)
    if model.startswith(("/", "./", "../", "~")) and not os.path.isdir(path):
        what = "a file, not a model folder"
        if not os.path.exists(path):
            _typo_of_a_folder(model, role)  # raises where a folder beside it is close to the name
            what = "no such folder"
        raise BadArguments(f"{role} {model!r}: {what} (a local model is a folder holding its config.json)")


def _config_is_an_object(model: str, role: str) -> None:
    """A local folder's config.json must hold one JSON object (vLLM would fail on it with a bare
    ``AttributeError`` or a decoder error)."""
    import json
    import os

    path = os.path.join(os.path.expanduser(model), "config.json")
    if not os.path.isfile(path):
        return  # not a local folder, or one in another format: vLLM's to answer
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadArguments(f"{role} {model!r}: its config.json cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict):
        kind = json_kind(config)
        raise BadArguments(f"{role} {model!r}: its config.json holds a JSON {kind}, not an object") from None


def _typo_of_a_folder(model: str, role: str) -> None:
    """A name that is no folder but close to one beside it is a mistyped folder (exit 2), not a hub name."""
    import difflib
    import os

    parent, name = os.path.split(os.path.expanduser(model))
    try:
        folders = [e.name for e in os.scandir(parent or ".") if e.is_dir()]
    except OSError:
        return
    close = difflib.get_close_matches(name, folders, n=1, cutoff=0.8)
    if close:  # written as the operator wrote the rest of it (``~``, ``./``)
        guess = os.path.join(os.path.dirname(model), close[0])
        raise BadArguments(f"{role} {model!r}: no such folder; did you mean {guess!r}?")


def _hub_model_reachable(model: str, revision: str | None, role: str) -> None:
    """A hub name needs its config.json from the cache or the hub: when neither can give it, say so at
    once (exit 3) instead of letting the hub client retry for half a minute."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.path.isdir(os.path.expanduser(model)) or os.environ.get("VLLM_USE_MODELSCOPE", "").lower() in (
        "1",
        "true",
    ):
        return
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import ENDPOINT, HF_HUB_OFFLINE
    except ImportError:
        return
    try:
        cached = try_to_load_from_cache(model, "config.json", revision=revision)
    except Exception:  # not a valid repository id, so not a hub model: a folder that is not there
        _typo_of_a_folder(model, role)
        raise BadArguments(
            f"{role} {model!r}: no such folder, and not a Hugging Face repository id (a local model is a "
            "folder holding its config.json)"
        ) from None
    if isinstance(cached, str):
        return
    _typo_of_a_folder(model, role)
    fix = (
        f"put its config.json in a folder and give that folder (./{model.rsplit('/', 1)[-1]}), or run "
        "where the hub is reachable"
    )
    if HF_HUB_OFFLINE:
        raise CannotCheckHere(
            f"{role} {model!r} is not a local folder, not in the Hugging Face cache, and HF_HUB_OFFLINE is "
            f"set (unset it to fetch the config): {fix}"
        )
    host = urlparse(ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=HUB_TIMEOUT).close()
    except OSError as exc:
        raise CannotCheckHere(
            f"{role} {model!r} is not a local folder and the hub ({host}) cannot be reached from this "
            f"machine ({exc}): {fix}"
        ) from None
