#!/usr/bin/env bash
# Patched arm: the upstream test against a copy of the installed vLLM with presize-staging-buffers.patch
# applied. The copy is a symlink tree of the installed package in a temporary folder, cudagraph_utils.py
# made a real file and patched there; the installed vLLM is not touched and nothing is left behind.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
site=$("$python" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cp -rs "$site" "$tmp/vllm"
target=v1/worker/gpu/cudagraph_utils.py
rm "$tmp/vllm/$target"
rm -f "$tmp/vllm/v1/worker/gpu/__pycache__/"cudagraph_utils.*.pyc
cp "$site/$target" "$tmp/vllm/$target"
patch -d "$tmp" -p1 --fuzz=0 --forward --batch --no-backup-if-mismatch <upstream/presize-staging-buffers.patch

export PYTHONPATH="$tmp${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 VLLM_PLUGINS=none
found=$("$python" -c 'import importlib.util as u; print(u.find_spec("vllm").origin)')
[[ $found == "$tmp/vllm/__init__.py" ]] || { echo "run-patched: imports vllm from $found" >&2; exit 1; }
"$python" -m pytest -p no:cacheprovider -q -W ignore::DeprecationWarning upstream/test_cudagraph_presize.py
