#!/usr/bin/env bash
# Patched arm: an upstream test against a copy of the installed vLLM with its patch applied.
#   bash lab/upstream/run-patched.sh presize   presize-staging-buffers.patch, test_cudagraph_presize.py
#   bash lab/upstream/run-patched.sh kda       kda-spec-state-slots.patch,   test_kda_spec_state_slots.py
# The copy is a symlink tree of the installed package in a temporary folder, the patched file made a real
# file and patched there (no fuzz); the installed vLLM is not touched and nothing is left behind.
set -euo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  presize) patch=presize-staging-buffers.patch target=v1/worker/gpu/cudagraph_utils.py test=test_cudagraph_presize.py ;;
  kda) patch=kda-spec-state-slots.patch target=model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py test=test_kda_spec_state_slots.py ;;
  *) echo "usage: bash lab/upstream/run-patched.sh presize|kda" >&2; exit 2 ;;
esac
python=${PYTHON:-.venv/bin/python}
site=$("$python" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cp -rs "$site" "$tmp/vllm"
rm "$tmp/vllm/$target"
rm -f "$tmp/vllm/$(dirname "$target")/__pycache__/$(basename "$target" .py)".*.pyc
cp "$site/$target" "$tmp/vllm/$target"
patch -d "$tmp" -p1 --fuzz=0 --forward --batch --no-backup-if-mismatch <"vllm_staging_plugin/patches/$patch"

export PYTHONPATH="$tmp${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 VLLM_PLUGINS=none
found=$("$python" -c 'import importlib.util as u; print(u.find_spec("vllm").origin)')
[[ $found == "$tmp/vllm/__init__.py" ]] || { echo "run-patched: imports vllm from $found" >&2; exit 1; }
"$python" -m pytest -c lab/upstream/pytest.ini -p no:cacheprovider -q -W ignore::DeprecationWarning "lab/upstream/$test"
