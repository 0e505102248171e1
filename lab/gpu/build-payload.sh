#!/usr/bin/env bash
# Builds a payload that puts a real vLLM on the lent GPU machine, which has no package registry.
# Run it from the project root: bash lab/gpu/build-payload.sh [VLLM_VERSION]   (default 0.33.0)
# It writes .gpu/p1, .gpu/p2, ... holding vLLM, its dependency wheels and Ray (each under 61 MiB, so one
# fits in a GPU-machine run beside the project), and keeps them git-ignored. PAYLOAD=.gpu034 writes another
# folder (so that several releases wait side by side); RAY=0 leaves Ray out (one part fewer: only the ray
# stages need it). Then one GPU-machine run per
# part, back to back (the machine stays warm only about 30 s between runs), carrying .gpu/pK:
#   bash .gpu/pK/device-stage.sh
# The last part prints READY; later commands in that run and in later runs on the same warm machine
# start with:  source /tmp/site/env.sh  (see docs/data/h200-2026-11-30/README.md, "Reproduce")
set -euo pipefail
ver=${1:-0.33.0}
ray=2.60.0  # the Ray executor stage; the GPU image has no Ray
[[ ${RAY:-1} == 0 ]] && ray=none
dest=${PAYLOAD:-.gpu}
here=$(cd "$(dirname "$0")" && pwd)
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >> .git/info/exclude
if [[ -f $dest/VERSION && $(cat "$dest/VERSION") == "$ver-kda-ray$ray" ]]; then echo "payload for vLLM $ver already in $dest/"; ls -la "$dest"/p*; exit 0; fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bundle/wheels" "$work/dl"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any --no-deps)
echo "downloading vLLM $ver and $(wc -l < "$here/device-wheels.txt") dependency wheels for the device (Python 3.12)..."
python3 -m pip download -q "${plat[@]}" -d "$work/dl" "vllm==$ver"
python3 -m pip download -q "${plat[@]}" -d "$work/bundle/wheels" -r "$here/device-wheels.txt"
[[ $ray == none ]] || python3 -m pip download -q "${plat[@]}" -d "$work/dl" "ray==$ray"
case $ver in  # 0.34.0's minimums above the GPU image's transformers 5.17.0, huggingface_hub 1.33.0, tokenizers 0.23.2
  0.34.*) python3 -m pip download -q "${plat[@]}" -d "$work/bundle/wheels" transformers==5.20.2 huggingface_hub==2.4.0 tokenizers==0.23.3 ;;
esac
echo "slimming vLLM (drops kernels a dense model on one Hopper GPU does not load)..."
mkdir -p "$work/bundle/site"
python3 -m zipfile -e "$work"/dl/vllm-*.whl "$work/bundle/site"
v="$work/bundle/site/vllm"
# Kept on purpose: _moe_C_stable_libtorch, _flashkda_C, _flashmla_C, _flashmla_extension_C, which the
# Kimi-Linear (KDA) model of docs/stock-crashes.md loads.
rm -rf "$v/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$v/third_party/deep_gemm" "$v/third_party/fmha_sm100" "$v/vllm-rs" \
       "$v"/_deepselect_C*.so "$v"/_qutlass_C*.so
find "$v" -maxdepth 1 -name '_moe_C*.so' ! -name '_moe_C_stable_libtorch*' -delete
# Forced switch (0.34.0+, recorded with every run on such a payload): on CUDA, kernel_warmup imports the
# MiniMax-M3 MSA warm-up on every boot, and that module imports the CuTe DSL (nvidia-cutlass-dsl, over
# 90 MB of wheels, not in the payload). The warm-up returns at once for a model without MiniMax-M3's sparse
# attention, so the staged copy replaces that module with the same early return and nothing else.
msa="$v/model_executor/warmup/minimax_m3_msa_warmup.py"
if [[ -f $msa ]]; then
  printf '%s\n' '"""Staged copy (vllm-staging-plugin payload): the MiniMax-M3 MSA warm-up without its CuTe DSL imports."""' \
    '' 'def minimax_m3_msa_warmup(worker) -> None:' \
    '    """No MiniMax-M3 sparse attention in the models this payload boots: the real warm-up returns here too."""' \
    '    return None' > "$msa"
fi
# Ray without its Java jars and RLlib (79 MB as a wheel; its other needs are on the image or in the wheels)
if [[ $ray != none ]]; then
  unzip -q -o "$work"/dl/ray-*.whl -d "$work/bundle/site"  # unzip keeps raylet/gcs_server executable
  rm -rf "$work/bundle/site/ray/jars" "$work/bundle/site/ray/rllib"
fi
find "$work/bundle" -name __pycache__ -prune -exec rm -rf {} +
echo "compressing (a few minutes on two cores)..."
(cd "$work/bundle" && tar -cf - . | xz -6 -T0 > "$work/payload.tar.xz")
size=$(stat -c %s "$work/payload.tar.xz"); limit=$((61 * 1024 * 1024)); n=$(( (size + limit - 1) / limit ))
rm -rf "$dest" && mkdir -p "$dest"
(cd "$work" && split -n "$n" -d -a 1 payload.tar.xz part.)
for i in $(seq 1 "$n"); do
  mkdir -p "$dest/p$i"; mv "$work/part.$((i - 1))" "$dest/p$i/chunk"
  sed -e "s/@PARTS@/$n/g" -e "s/@PART@/$i/g" -e "s/@ID@/vllm-$ver-$size/g" "$here/device-stage.sh" > "$dest/p$i/device-stage.sh"
done
echo "$ver-kda-ray$ray" > "$dest/VERSION"
echo "payload for vLLM $ver: $n parts, $((size / 1024 / 1024)) MiB in all"; ls -la "$dest"/p*
