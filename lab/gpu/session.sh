#!/usr/bin/env bash
# One GPU-machine call per stage, each planned to end within STAGE_BUDGET seconds (default 510 = 8.5 min,
# under the 10-minute limit of one call). Run from the project root on the GPU machine after the payload
# is staged (bash .gpu/pK/device-stage.sh for every part; the last prints READY):
#   bash lab/gpu/session.sh kda|kda-dense|k3-control|kda-fault|k3|tp|...
# It installs the plugin into /tmp/site (so vLLM finds its entry point the real way), runs the stage's
# boots under a deadline (no boot starts unless 1.3x the model's typical boot still fits, its first boot
# of the call, which may compile, left out) and an outer `timeout`, packs records, receipts, trimmed logs
# (full logs too while small), versions and the summary into $OUT/<stage>.tar.gz, and prints the summary
# table last. Records live in $STUDY_DIR/<stage> (default /tmp/study): calling a stage again on the same
# warm machine runs only the boots still missing (--fill-to). SEED="a.tar.gz ..." (stage archives of
# earlier machines, paths from the project root) copies their boots, receipts and logs in first: they
# count as done, and this call's archive and summary hold them beside its own (their env.txt in seed-env/).
# DRY_RUN=1 (any machine, with python3 having vLLM importable): installs nothing, prints the boots.
#
#   kda        Kimi-Linear 4-layer shape, n-gram 2 tokens, --use-replayssm, max_num_seqs 4, grid [1..16]:
#              vanilla x3 and plugin x3 through vllm.LLM, one `vllm serve` per arm answering a
#              completion; 2 boots at once, one per GPU.                               about 5-6 min
#   kda-dense  Kimi-Linear 4-layer shape without experts, at those small settings and at the K3 widths
#              (n-gram 8 tokens, max_num_seqs 48, grid 1..512 powers of two), vanilla x3 / plugin x3 each,
#              and a control (vLLM's derived grid, stock-safe) vanilla x3; one `vllm serve` per arm; two
#              boots at a time on one GPU.                                           2 calls of ~9 min
#   k3-control the K3 widths with the pre-flight's verified stock workaround (grid + 261), vanilla x3 and
#              one `vllm serve`.                                                     about 3 min
#   kda-fault  the post-capture fault at the K3 widths (dense shape, vllm.LLM, 2 prompts x 8 tokens): the
#              plugin with the power-of-two grid (plain, CUDA_LAUNCH_BLOCKING=1, a fresh TRITON_CACHE_DIR
#              per boot, PDL off), no plugin with the workaround grid (plain, CUDA_LAUNCH_BLOCKING=1, PDL
#              off) and no plugin with vLLM's derived grid; FILL_TO (default 3) boots each, three at a
#              time on one GPU; the summary adds faults, JIT-at-inference and the iff check.
#                                                                                      2-3 calls of ~9.5 min
#   tp         Qwen3-0.6B tensor_parallel_size=2: stock/plugin under ascending, vanilla/plugin under
#              descending (N=1), and `vllm serve --tensor-parallel-size 2` with the plugin under
#              ascending.                                                              about 5 min
#   pp-eagle3  Qwen3-0.6B pipeline_parallel_size=2, the same four cells; then EAGLE3 (one-layer draft)
#              beside Qwen3-0.6B on one GPU each, two at once.                         about 6-7 min
#   parallel   tp, then pp, then eagle3, as far as the budget goes; call again to finish.
#   eagle3     EAGLE3 alone on one GPU: the same four cells, N=3, one boot at a time.
#                                                                                      2 calls
#   ray        Ray on every GPU here: a Ray head started from a shell without any
#              STAGING_PLUGIN_* variable or VLLM_PLUGINS (the raylet's environment is recorded), then
#              Qwen3-0.6B with distributed_executor_backend=ray (stock and plugin under ascending) and
#              with the Ray data-parallel backend (plugin under ascending; its engine core is a Ray actor),
#              TP = number of GPUs.
#                                                                                  about 4-5 min
#   k3         Kimi-K3 and the shared KDA layer's fault, each arm at its own N, join traffic (the second
#              request arrives once the first has its first token: one step mixes a speculative decode
#              with a prefill) unless said; calling it again fills what the last call left, priority first.
#              (1) The K3 architecture (KimiK3ForConditionalGeneration, 4 layers cut to hidden 2048, dummy
#              weights) at the K3 widths: plugin x2, `vllm serve` with the plugin x1, no plugin on the
#              workaround grid x2, vLLM with the staging patch x2 (and with the plugin x1: its stand-down
#              line); the Kimi-Linear dense shape at the K3 widths on the workaround grid, no plugin:
#              kernel arguments logged x2, on vLLM with vllm_staging_plugin/patches/kda-spec-state-slots.patch x2; the K3
#              architecture at n-gram 4 / max_num_seqs 16 (plugin) and n-gram 7 / 48 (both arms) x1.
#              (2) The padding control x2. (3) The token check: one request whose prompt repeats (n-gram
#              drafts from the first step) without speculation, without --use-replayssm, with it (stock)
#              and with it on the patched vLLM. (4) The K3 capture crash (no plugin x2, n-gram 4 / 16 x1).
#              (5) compute-sanitizer memcheck of lab/kda_replay.py (three index layouts). Four boots
#              at a time on one GPU, each started once the others finished memory profiling (about one a
#              minute).                                                       3 calls of ~9.5 min
#   k3-deploy  Kimi-K3 as deployed: tests/data/kimi-k3-4l as shipped (MXFP4 experts, hidden 7168) with a
#              config-only K3 DSpark drafter from tests/data, join traffic, two boots at a time on one GPU
#              (gpu_memory_utilization 0.47 each), priority first, calling it again fills what is missing.
#              At the K3 widths (8 tokens on the 8-token-block drafter, max_num_seqs 48, powers of two to
#              512, --use-replayssm): no plugin x2 (capture crash), the plugin x3 and `vllm serve` with the
#              plugin x2 (two streamed completions), no plugin on the pre-flight's workaround grid x2, vLLM
#              with vllm_staging_plugin/patches/presize-staging-buffers.patch x1; the 5- and 7-token-block drafters at their
#              own blocks (the first crashes stock, the second does not), no plugin and plugin x1 each.
#                                                                                   2 calls of ~9.5 min
#   k3-serve   the k3-deploy deployment on a fresh machine, `vllm serve` first: `vllm serve` with the plugin
#              x2 (two streamed completions) beside no plugin x1 (capture crash), then the 5- and
#              7-token-block drafters' no plugin and plugin x1 each; calling it again fills what is missing.
#                                                                                   1-2 calls of ~9.5 min
#   k3-tp      the same deployment (block 8, 8 tokens) at tensor parallel = every GPU of the machine (8,
#              or 2 where only two are lent), one boot at a time on all GPUs: no plugin x2 (every rank
#              crashes at capture), the plugin x3 and `vllm serve --tensor-parallel-size N` with the plugin
#              x2 (two streamed completions), no plugin on the workaround grid x1; receipts from every rank.
#                                                                                   2 calls of ~9.5 min
#   k3-decode  decode tokens/s on that deployment under vLLM's own order: the plugin against the workaround
#              grid, then against the patched vLLM, ABAB, N=3 per pair, batches 1 and 16.  about 8 min
#   v034-kda   vLLM 0.34.0 (payload: build-payload.sh 0.34.0), the Kimi-Linear dense shape at the K3 widths
#              (shared KDA layer), join traffic, two boots at a time (gpu_memory_utilization 0.3 each; at
#              0.2 with three at a time one plugin boot found no memory left for its KV cache): no plugin x2
#              (the boot's mixed warm-up step faults), vLLM with kda-spec-state-slots.patch x1, the plugin x3
#              (its KDA state-slot fix) and `vllm serve` with the plugin x1.          about 5 min
#   v034-k3    vLLM 0.34.0, Kimi-K3 as deployed (the shipped MXFP4 cut, DSpark block-8 drafter, 8 tokens,
#              48 seqs, powers of two to 512, --use-replayssm), join traffic, one boot at a time
#              (gpu_memory_utilization 0.7: 0.34.0 counts CUDA graphs inside it): no plugin x2, the plugin
#              x2, the plugin under STAGING_PLUGIN_ORDER=ascending x2 (receipts), `vllm serve` with the
#              plugin x1; calling it again fills what is missing.                 2 calls of ~9.5 min
#   v034-kda-decode  decode tokens/s of the v034-kda deployment: the plugin (its KDA state-slot fix) against
#              vLLM with kda-spec-state-slots.patch, both alive on one GPU, ABAB, N=3, batches 1 and 16
#              (KDA_DECODE_ENGINES=kimi-linear-4l-dense-k3=vanilla+vllm-kdafix,kimi-linear-4l-dense-k3=plugin
#              puts the patched vLLM first in each pair).
#                                                                                      about 6 min
#   v033-kda   vLLM 0.33.0 (payload: build-payload.sh 0.33.0), the Kimi-Linear dense shape at the K3 widths,
#              join traffic, four boots at a time (gpu_memory_utilization 0.22 each): no plugin on the
#              pre-flight's workaround grid x2 (so that the staging crash does not come first: the shared KDA
#              layer's fault at the join step), the plugin on the K3 grid x3 (both fixes) and `vllm serve`
#              with the plugin x2.                                                    about 6 min
#   v034-order the capture-order study on vLLM 0.34.0: every built-in order with the plugin (receipts), the
#              Qwen3-8B shape at vLLM's default grid and Kimi-K3 as deployed (v034-k3's deployment), two
#              boots per order and model, one boot at a time on the GPU (vLLM's "took" reads the device's
#              free memory), the models alternating and the orders interleaved round by round; calling it
#              again fills what the last call left; ORDERS="a b ..." narrows the orders of a call and
#              MODELS="qwen3-8b" (or kimi-k3-mxfp4-dspark8) its models (FILL_TO sets N, default 2). A boot
#              takes about 15-80 s once each model compiled.                       4+ calls of ~9.5 min
#   v033-order the same study on vLLM 0.33.0 (payload: build-payload.sh 0.33.0), where the plugin pre-sizes.
#              Both order stages boot with vLLM's own attention backend (FLASH_ATTN on Hopper for the
#              Qwen3-8B shape); MODELS="qwen3-8b-triton" is the TRITON_ATTN arm of earlier records.
#   v024-seed  the closed upstream PR's table on its own release, vLLM 0.24.0 (payload: build-payload.sh
#              0.24.0), the Qwen3-8B shape at vLLM's default grid and backend, one boot at a time
#              (gpu_memory_utilization 0.7): stock under ascending x3 (the plugin only reorders: the staging
#              crash), the plugin under vLLM's order x2 and under ascending x2 (receipts: graph memory and
#              pool), rounds interleaved; calling it again fills what is missing; the plan runs on whichever
#              payload is staged.                                                       about 7-8 min
#   decode     steady-state decode tokens/s, vanilla vs plugin under the default order, batch 1 and 64,
#              Qwen3-0.6B on GPU 0 and Qwen3-8B on GPU 1, N=3 ABBA.                    about 5 min
set -uo pipefail
stage=${1:?usage: bash lab/gpu/session.sh v024-seed|v033-kda|v033-order|v034-order|v034-kda|v034-k3|kda|kda-dense|k3-control|kda-fault|k3|k3-deploy|k3-serve|k3-tp|k3-decode|tp|pp-eagle3|parallel|decode|eagle3|ray}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
root=$(pwd)
dry=${DRY_RUN:-0}
py=${PYTHON:-python3}
[[ $py == */* && $py != /* ]] && py=$root/$py  # the summary runs from the stage's folder
budget=${STAGE_BUDGET:-510}
out=${OUT:-/tmp/out}
work=${STUDY_DIR:-/tmp/study}/$stage
mkdir -p "$out" "$work"
for seed in ${SEED:-}; do  # an earlier machine's records count as done here (see the header)
  unpacked=$(mktemp -d)
  tar -xzf "$seed" -C "$unpacked" || { echo "SEED: cannot unpack $seed"; exit 5; }
  for d in boots receipts logs; do
    [[ -d $unpacked/$d ]] && mkdir -p "$work/$d" && cp -rn "$unpacked/$d/." "$work/$d/"
  done
  [[ -f $unpacked/env.txt ]] && mkdir -p "$work/seed-env" && cp "$unpacked/env.txt" "$work/seed-env/$(basename "$seed" .tar.gz).txt"
  rm -rf "$unpacked"
  echo "seeded from $seed: $(ls "$work/boots" | wc -l) boot records here"
done
if [[ $dry != 1 ]]; then
  [[ -f /tmp/site/env.sh ]] || { echo "no /tmp/site/env.sh: stage the payload first (bash .gpu/pK/device-stage.sh)"; exit 3; }
  # shellcheck disable=SC1091
  source /tmp/site/env.sh
  # One Inductor and vLLM cache per staged release: vLLM torch.compiles small helpers (grouped_topk) whose
  # cached code Inductor would hand to another release's custom ops on the same machine (0.34.0's code
  # called 0.33.0's 8-argument _moe_C.grouped_topk with 9 arguments in every K3 boot).
  staged=$(basename /tmp/site/vllm-*.dist-info .dist-info)
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$staged VLLM_CACHE_ROOT=/tmp/vllm-cache-$staged
  $py -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site . \
    || { echo "could not install the plugin into /tmp/site"; exit 4; }
fi
extra=(); [[ $dry == 1 ]] && extra=(--dry-run --gpus 2)
# Patched copies of the installed vLLM for the vllm-* variants: a symlink tree of the package with the
# patched file made real, as lab/upstream/run-patched.sh builds it; $STUDY_PATCHED_VLLM/NAME goes first on a
# boot's PYTHONPATH.
export STUDY_PATCHED_VLLM=/tmp/vllm-patched
patched_vllm() {  # NAME PATCH FILE (FILE relative to the vllm package)
  local dir=$STUDY_PATCHED_VLLM/$1 site
  [[ $dry == 1 || -d $dir/vllm ]] && return 0
  site=$($py -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])')
  mkdir -p "$dir" && cp -rs "$site" "$dir/vllm" && rm "$dir/vllm/$3" && cp "$site/$3" "$dir/vllm/$3"
  rm -f "$dir/vllm/$(dirname "$3")/__pycache__/$(basename "$3" .py)".*.pyc
  patch -d "$dir" -p1 --fuzz=0 --forward --batch --no-backup-if-mismatch < "$root/vllm_staging_plugin/patches/$2" \
    || { echo "could not apply $2 to this vLLM: the vllm-$1 variant is not available"; rm -rf "$dir"; return 0; }
  echo "patched vLLM $1: $2"
}
patched_vllm presize presize-staging-buffers.patch v1/worker/gpu/cudagraph_utils.py
patched_vllm kdafix kda-spec-state-slots.patch model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py

left() { echo $((budget - SECONDS)); }
study() {  # order_study.py run with the time left, 30 s kept for packing
  local t; t=$(left)
  if (( t < 90 )); then echo "budget: skipping study $*"; return 0; fi
  timeout "$((t - 15))" $py lab/order_study.py run --out "$work" --deadline "$((t - 30))" "${extra[@]}" "$@"
}
memcheck() {  # compute-sanitizer memcheck of lab/kda_replay.py, the three layouts at once
  [[ $dry != 1 ]] && command -v compute-sanitizer > /dev/null || return 0
  for layout in short padded staged; do
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 75 compute-sanitizer --tool memcheck --print-limit 12 \
      $py "$root/lab/kda_replay.py" "$layout" > "$work/memcheck-$layout.txt" 2>&1 &
  done
  wait
  for layout in short padded staged; do
    echo "memcheck $layout: $(grep -c 'Invalid __global__' "$work/memcheck-$layout.txt") invalid accesses"
    grep -E 'ERROR SUMMARY|^\{' "$work/memcheck-$layout.txt"
  done
}
asc_desc=stock@ascending,plugin@ascending,vanilla@descending,plugin@descending

{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  $py -c 'import sys, torch, vllm, importlib.metadata as m; print("python", sys.version.split()[0], "torch", torch.__version__, "vllm", vllm.__version__, "plugin", m.version("vllm-staging-plugin"))'
  $py -c 'import importlib.metadata as m, torch; print("triton", m.version("triton"), "cuda", torch.version.cuda)' 2>/dev/null \
    || echo "triton -"
  nproc; date -u +%FT%TZ
} > "$work/env.txt" 2>&1
cat "$work/env.txt"

case $stage in
  kda)
    study --models kimi-linear-4l --plan vanilla@descending,plugin@descending --fill-to 3 \
          --serve-plan vanilla@descending,plugin@descending --concurrent 2 --boot-timeout 420 ;;
  kda-dense)
    # On one GPU, two boots at a time on it: the dense 4-layer shape (no experts) at the small settings
    # and at the Kimi-K3 widths, vanilla vs plugin x3, after the control (vLLM's derived grid, which stock
    # boots) vanilla x3; one `vllm serve` per arm answering a completion.
    study --models kimi-linear-4l-dense-safe --plan vanilla@descending --fill-to 3 \
          --serve-plan vanilla@descending --concurrent 2 --per-gpu 2 --boot-timeout 420
    study --models kimi-linear-4l-dense,kimi-linear-4l-dense-k3 --plan vanilla@descending,plugin@descending \
          --fill-to 3 --serve-plan vanilla@descending,plugin@descending --concurrent 2 --per-gpu 2 --boot-timeout 420 ;;
  k3-control)
    # The K3 widths with the pre-flight's stock workaround (grid + 261), plugin not loaded, x3 and one
    # `vllm serve`: the control at the K3 widths (and the workaround on a GPU).
    study --models kimi-linear-4l-dense-k3-workaround --plan vanilla@descending --fill-to 3 \
          --serve-plan vanilla@descending --concurrent 2 --per-gpu 2 --boot-timeout 420 ;;
  kda-fault)
    # One plan over three models, so that the three boots at a time always have work (a model named in a
    # plan item boots only that item). Variants change the environment alone (lab/study/plan.py).
    k3=kimi-linear-4l-dense-k3; wa=$k3-workaround; dv=$k3-derived
    p=$k3=plugin@descending; v=$wa=vanilla@descending
    study --models "$k3,$wa,$dv" --fill-to "${FILL_TO:-3}" --concurrent 3 --per-gpu 3 --boot-timeout 420 \
          --plan "$p,$p+launch-blocking,$p+fresh-triton-cache,$p+pdl-off,$v,$v+launch-blocking,$v+pdl-off,$dv=vanilla@descending" ;;
  k3)
    # Priority first (what the issue's Ns need), then the padding control, the token check, the capture
    # crash again (no plugin, recorded on 2026-12-01) and the memcheck replay, as far as the budget goes.
    k3=kimi-k3-4l-k3; w4=kimi-k3-4l-w4s16; w7=kimi-k3-4l-w7s48; wa=kimi-linear-4l-dense-k3-workaround
    four=(--concurrent 4 --per-gpu 4 --gpu-mem 0.2 --boot-timeout 420); d=@descending
    study --models "$k3,$k3-workaround,$w4,$w7,$wa" --traffic join --fill-to 1 "${four[@]}" \
          --serve-plan "$k3=plugin$d" --plan "$k3=plugin$d*2,$k3-workaround=vanilla$d*2,$k3=vanilla$d+vllm-presize*2,\
$wa=vanilla$d+kda-log*2,$wa=vanilla$d+kda-log+vllm-kdafix*2,$k3=plugin$d+vllm-presize,$w4=plugin$d,$w7=vanilla$d,$w7=plugin$d"
    study --models "$wa" --traffic join --fill-to 2 "${four[@]}" --plan "vanilla$d+kda-pad"
    study --models "kimi-linear-4l-dense-k3-nospec,kimi-linear-4l-dense-k3-noreplay,$wa" --traffic single \
          --fill-to 1 "${four[@]}" --plan "vanilla$d,$wa=vanilla$d+vllm-kdafix"
    study --models "$k3,$w4" --traffic join --fill-to 1 "${four[@]}" --plan "$k3=vanilla$d*2,$w4=vanilla$d"
    (( $(left) > 120 )) && memcheck ;;
  k3-deploy)
    m=kimi-k3-mxfp4-dspark8; b5=kimi-k3-mxfp4-dspark5; b7=kimi-k3-mxfp4-dspark7; d=@descending
    two=(--concurrent 2 --per-gpu 2 --gpu-mem 0.47 --boot-timeout 480)
    study --models "$m,$m-workaround,$b5,$b7" --traffic join --fill-to 1 "${two[@]}" --serve-plan "$m=plugin$d*2" \
          --plan "$m=plugin$d*3,$m=vanilla$d*2,$m-workaround=vanilla$d*2,$m=vanilla$d+vllm-presize,\
$b5=vanilla$d,$b5=plugin$d,$b7=vanilla$d,$b7=plugin$d" ;;
  k3-serve)
    m=kimi-k3-mxfp4-dspark8; b5=kimi-k3-mxfp4-dspark5; b7=kimi-k3-mxfp4-dspark7; d=@descending
    two=(--concurrent 2 --per-gpu 2 --gpu-mem 0.47 --boot-timeout 480)
    study --models "$m" --traffic join --fill-to 1 "${two[@]}" --serve-plan "$m=plugin$d*2" --plan "$m=vanilla$d"
    study --models "$b5,$b7" --traffic join --fill-to 1 "${two[@]}" \
          --plan "$b5=vanilla$d,$b5=plugin$d,$b7=vanilla$d,$b7=plugin$d" ;;
  k3-tp)
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); (( n > 0 )) || n=2  # 2: the dry run's
    m=kimi-k3-mxfp4-dspark8; d=@descending
    study --models "$m,$m-workaround" --tp "$n" --traffic join --fill-to 1 --gpu-mem 0.5 --boot-timeout 540 \
          --serve-plan "$m=plugin$d*2" --plan "$m=plugin$d*3,$m=vanilla$d*2,$m-workaround=vanilla$d" ;;
  k3-decode)
    m=kimi-k3-mxfp4-dspark8; t=$(left)
    timeout "$((t - 15))" $py lab/decode_bench.py run --out "$work" --deadline "$((t - 60))" "${extra[@]}" \
      --engines "$m=plugin,$m-workaround=vanilla,$m=vanilla+vllm-presize" --gpu-mem 0.47 --boot-timeout 480 \
      --batches 1,16 --reps 3 --max-tokens 128 ;;
  v034-kda)
    kl=kimi-linear-4l-dense-k3; d=@descending
    study --models "$kl" --traffic join --fill-to 1 --concurrent 2 --per-gpu 2 --gpu-mem 0.3 --boot-timeout 420 \
          --serve-plan "$kl=plugin$d" --plan "$kl=vanilla$d*2,$kl=plugin$d*3,$kl=vanilla$d+vllm-kdafix" ;;
  v034-k3)
    m=kimi-k3-mxfp4-dspark8; d=@descending
    study --models "$m" --traffic join --fill-to 1 --concurrent 1 --per-gpu 1 --gpu-mem 0.7 --boot-timeout 480 \
          --serve-plan "$m=plugin$d" --plan "$m=vanilla$d*2,$m=plugin$d*2,$m=plugin@ascending*2" ;;
  v033-kda)
    kl=kimi-linear-4l-dense-k3; d=@descending
    study --models "$kl,$kl-workaround" --traffic join --fill-to 1 --concurrent 4 --per-gpu 4 --gpu-mem 0.22 \
          --boot-timeout 420 --serve-plan "$kl=plugin$d*2" --plan "$kl-workaround=vanilla$d*2,$kl=plugin$d*3" ;;
  v033-order|v034-order)  # the same plan on whichever payload is staged (the stage names the release)
    q=qwen3-8b; k=kimi-k3-mxfp4-dspark8; plan=""
    models=${MODELS:-$q $k}  # MODELS="kimi-k3-mxfp4-dspark8" narrows a call to one model
    for o in ${ORDERS:-descending ascending max-first shuffle:1 full-first size-descending interleaved}; do
      for m in $models; do plan+="$m=plugin@$o,"; done
    done
    study --models "${models// /,}" --fill-to "${FILL_TO:-2}" --concurrent 1 --per-gpu 1 --gpu-mem 0.7 --boot-timeout 480 \
          --plan "${plan%,}" ;;
  v024-seed)
    q=${MODELS:-qwen3-8b}
    study --models "$q" --fill-to 1 --concurrent 1 --per-gpu 1 --gpu-mem 0.7 --boot-timeout 480 \
          --plan "$q=stock@ascending*3,$q=plugin@descending*2,$q=plugin@ascending*2" ;;
  v034-kda-decode)
    kl=kimi-linear-4l-dense-k3; t=$(left)
    timeout "$((t - 15))" $py lab/decode_bench.py run --out "$work" --deadline "$((t - 60))" "${extra[@]}" \
      --engines "${KDA_DECODE_ENGINES:-$kl=plugin,$kl=vanilla+vllm-kdafix}" --gpu-mem 0.3 --boot-timeout 300 \
      --batches 1,16 --reps 3 --max-tokens 128 ;;
  tp)
    study --models qwen3-0.6b --tp 2 --plan "$asc_desc" --fill-to 1 --serve-plan plugin@ascending ;;
  pp-eagle3)
    study --models qwen3-0.6b --pp 2 --plan "$asc_desc" --fill-to 1
    study --models qwen3-0.6b-eagle3 --plan "$asc_desc" --fill-to 1 --concurrent 2 ;;
  parallel)
    study --models qwen3-0.6b --tp 2 --plan "$asc_desc" --fill-to 1 --serve-plan plugin@ascending
    study --models qwen3-0.6b --pp 2 --plan "$asc_desc" --fill-to 1
    study --models qwen3-0.6b-eagle3 --plan "$asc_desc" --fill-to 1 --concurrent 2 ;;
  eagle3)
    study --models qwen3-0.6b-eagle3 --plan "$asc_desc" --fill-to 3 ;;
  ray)
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); (( n > 0 )) || n=2  # 2: the dry run's
    clean=(env -u VLLM_PLUGINS)  # the cluster's shell knows nothing of the plugin
    for v in $(compgen -e | grep '^STAGING_PLUGIN_'); do clean+=(-u "$v"); done
    if [[ $dry != 1 ]]; then
      "${clean[@]}" $py -m ray.scripts.scripts start --head --num-gpus "$n" --num-cpus 8 --port 6379 \
        --include-dashboard=false --disable-usage-stats > "$work/ray-cluster.txt" 2>&1
      raylet=$(pgrep -x raylet | head -1)
      { echo "== raylet pid $raylet: STAGING_PLUGIN_* / VLLM_PLUGINS in its environment (none expected):"
        tr '\0' '\n' < "/proc/$raylet/environ" | grep -E '^(STAGING_PLUGIN_|VLLM_PLUGINS=)' || echo "(none)"
      } >> "$work/ray-cluster.txt" 2>&1
      cat "$work/ray-cluster.txt"
    fi
    export RAY_ADDRESS=auto  # vLLM's ray.init() joins that cluster
    study --models qwen3-0.6b --tp "$n" --executor ray --plan stock@ascending,plugin@ascending --fill-to 1
    # DP size 1 takes the DP master from VLLM_DP_MASTER_IP (default 127.0.0.1, not a Ray node's address)
    export VLLM_DP_MASTER_IP; VLLM_DP_MASTER_IP=$($py -c 'from vllm.utils.network_utils import get_ip; print(get_ip())')
    study --models qwen3-0.6b --tp "$n" --executor ray-dp --plan plugin@ascending --fill-to 1
    [[ $dry == 1 ]] || $py -m ray.scripts.scripts stop --force > /dev/null 2>&1 ;;
  decode)
    t=$(left)
    timeout "$((t - 15))" $py lab/decode_bench.py run --out "$work" --deadline "$((t - 40))" "${extra[@]}" \
      --models qwen3-0.6b,qwen3-8b --batches 1,64 --reps 3 --max-tokens 128 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac

cd "$work"
if [[ $stage == decode || $stage == *-decode ]]; then
  $py "$root/lab/decode_bench.py" summarize . > summary.md 2>&1
  keep=(decode.json receipts); logs=engines; trimmed=(engines/*/engine.trim.log)
else
  faults=(); [[ $stage == kda-fault || $stage == k3 ]] && faults=(--faults)
  plot=(); [[ $stage == *-order || $stage == v024-seed ]] && plot=(--plot order-study.png)
  $py "$root/lab/order_study.py" summarize . "${faults[@]}" "${plot[@]}" > summary.md 2>&1
  keep=(boots receipts); logs=logs; trimmed=(logs/*.trim.log)
fi
# full engine logs while they are small (they compress about 10x; one returned file may hold 16 MiB)
if [[ -d $logs && $(du -sm "$logs" | cut -f1) -lt 60 ]]; then keep+=("$logs"); else keep+=("${trimmed[@]}"); fi
[[ -f ray-cluster.txt ]] && keep+=(ray-cluster.txt)
for f in memcheck-*.txt; do [[ -f $f ]] && keep+=("$f"); done
[[ -f order-study.png ]] && keep+=(order-study.png)
[[ -d seed-env ]] && keep+=(seed-env)  # the seeding machines' versions
tar czf "$out/$stage.tar.gz" --ignore-failed-read env.txt summary.md models "${keep[@]}" 2>/dev/null
ls -la "$out"
echo "== $stage summary ($SECONDS s) =="
cat summary.md
