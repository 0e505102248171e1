"""The release overlay's probe, run as ``python -m atlas.probe`` in a child whose PYTHONPATH puts one
release's files first (and ``lab/`` last): the plugin's own structure check on that release, printed
as one ``PROBE:`` JSON line (the release, the verdict and why)."""

from __future__ import annotations

import importlib
import json

from vllm_staging_plugin._engine import compat


def verdict() -> dict[str, str | None]:
    """``supported`` or ``refused`` as the plugin decides in a worker; ``error`` if the release does not
    even import here (a missing package names itself in ``why``)."""
    out: dict[str, str | None] = {"version": compat.installed_versions()["vllm"]}
    try:
        compat.manager_class(importlib.import_module(compat.CUDAGRAPH_MODULE))
        out["verdict"], out["why"] = "supported", "structure present"
    except compat.IncompatibleVllm as exc:
        out["verdict"], out["why"] = "refused", str(exc)
    except Exception as exc:
        out["verdict"], out["why"] = "error", f"{type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    print("PROBE:" + json.dumps(verdict()))
