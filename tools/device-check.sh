#!/usr/bin/env bash
# device-check.sh - everything the GPU host should run, in one call of the
# device tool (/work/shared/device/README.md), within ~7 minutes:
#
#   here:      ../shared/device/pack.sh
#              python3 -m pip download --no-deps --only-binary=:all: \
#                  -d .device/whl fla-core==0.6.0
#              tools/device-bundle-trim.sh (under the 64 MiB a call carries)
#   device:    run(carry: [".device"], command: "bash tools/device-check.sh",
#                  timeout_s: 600)
#
# Steps, each under its own `timeout`; a failed or timed-out step is
# reported and the next still runs:
#   0. in the background from the start: the benchmark checkpoints
#      (tools/gen_model.py --fast, bf16): the Qwen3.5-0.8B shape
#      (bench/llamacpp_compare.py's GEN_ARGS) and a 9B-like shape
#      (Qwen3.5-9B's widths, 8 layers instead of 32, tied head); and FLA's
#      kernels compiled and autotuned (bench/fla_warmup.py, DC_WARM_S,
#      150; DC_WARM=0 skips it), waited for before the first timed step
#   1. nvidia-smi (what the device is)
#   2. every CUDA test (build-device/test/test_cuda_*), full shape grid
#   3. engine parity: hypic-engine generate, greedy, --device cuda against
#      --device cpu on models/test/* and models/default, modes full and
#      pic (parity.md)
#   4. the first checkpoint of DC_MODELS (once generated):
#      build-device/bench/gpu_engine (prefill, batched decode, PIC TTFT),
#      hypic-engine logits on a short text, bench/gpu_engine_ref.py
#      (transformers+FLA on the same checkpoint, each shape warmed up
#      before it is timed, logits parity); engine.tsv and engine.md
#   5. build-device/bench/gpu_kernels: timings, copy bandwidth, dumps
#   6. bench/gpu_kernels_ref.py: our outputs against float64, FLA / torch
#      timed on the same shapes, then their accuracy; kernels.tsv,
#      accuracy.tsv, report.md (written as it goes: a timeout keeps rows)
#   7. step 4 for the other checkpoints of DC_MODELS, in the time left
# Everything goes to $DC_WORK/gpu/<date>-<device>/ (DC_WORK defaults to
# /tmp/device-check), summarized in device-check.md there; with OUT set
# (the device tool's), device-check.md and device-check.tgz (the whole
# folder) are copied to $OUT at the end. Without a
# device (no nvidia-smi, or no CUDA device) the same report says so, the
# tests SKIP, the engine steps run on the CPU with toy shapes (DC_DEVICE
# and the shape knobs below), and the reference script still checks the
# dumps it finds. Copy the folder to bench/results/gpu/ afterwards.
#
# Limits (seconds) can be changed: DC_TEST_S (each CUDA test, 90),
# DC_PARITY_S (60), DC_GEN_S (the checkpoints, 240), DC_ENGINE_S and
# DC_HF_S (each checkpoint's gpu_engine, 120, and gpu_engine_ref.py, 200),
# DC_BENCH_S (240, shared by the families of ops below), DC_REF_S (150);
# DC_TOTAL_S (570: under the device
# tool's 600 s a call) caps them all: a step gets at most what is left of
# it less 10 s for the report, and one with under 15 s left is skipped
# (said so in the summary). DC_STEPS picks steps: "tests parity engine
# kernels" (the default, all; DC_KERNELS=0 drops kernels); gpu_kernels
# runs once per family of ops (--only PREFIX), DC_KERNELS_ONLY lists the
# families (default: gdn_chunk gdn_step gdn_decode kvbuf attention_prefill
# attention_decode matmul sample attention_prefill_flash3; e.g. kvbuf: its
# rows, copy_d2d and the gdn_step times they compare with; sample: argmax
# and top-k). The engine
# steps: DC_DEVICE (cuda, or cpu without a GPU), DC_MODELS ("q35-0.8b
# q35-9b-l8", or checkpoint folders; the first runs before the kernels,
# the rest after them), DC_TOKENS, DC_BATCH (empty: no decode),
# DC_KVBUF_BATCH (the KVBuffer decode's batches, gpu_engine's
# decode_kvbuf rows after the PIC ones; empty: none), DC_DECODE, DC_PIC,
# DC_REPS, DC_DECODE_AB (1: the first checkpoint's decode at B = 1 again
# with the staging memo off, then the few-row GEMV off, DC_AB_S each);
# DC_GDN_MODES (default "auto"): the HYPIC_CUDA_GDN modes gpu_engine runs
# each checkpoint with, one run each under DC_ENGINE_S; modes after the
# first skip the batched decodes (--batch '', prefill and PIC only) and
# label their rows' shapes TAG@MODE (e.g. "auto tc_bf16": the bf16 prefill
# beside the default, each against the same transformers+FLA rows); a
# mode GDN+ATT also sets HYPIC_CUDA_ATT, GDN+tune (or GDN+ATT+tune)
# HYPIC_CUDA_TUNE=1 (the kernel tuners; such a mode keeps the batched
# decode, the decode step's tuner's rows, and its engine-*.md ends with
# the tuners' choices, "# tuned" lines), and a mode's :N suffix runs
# gpu_engine --piece N, the prefill's piece (e.g. auto:1024; default
# the engine's, 4096 on a device) (e.g. tc_bf16+flash2x; the
# default on a bf16 checkpoint is --dtype auto's bf16 attention, FLASH3_SEQ
# on Hopper: auto+flash2x times the f32-accurate one beside it);
# DC_PYTHON runs gpu_engine_ref.py (python3: it needs torch and
# transformers).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
run=(bash "$root/.device/on-device.sh")
if [ -f .device/on-device.sh ]; then
    "${run[@]}" true # unpacks build-device/ from the bundle
else
    run=() # a local build: no bundle
fi

name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader \
    2>/dev/null | head -1)
dev=$(echo "${name:-nodevice}" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' |
    sed 's/-$//')
# The results are written under DC_WORK; where the device tool's OUT is
# set (it brings back 8 files at most), the summary and one tarball of the
# whole folder go there when the script ends, also when it is stopped.
work=${DC_WORK:-/tmp/device-check}
res=$work/gpu/$(date -u +%Y-%m-%d)-$dev
mkdir -p "$res"
bring_back() {
    [ -n "${OUT:-}" ] && [ "$OUT" != "$work" ] || return 0
    mkdir -p "$OUT"
    cp "$res/device-check.md" "$OUT/" 2>/dev/null
    tar -C "$work" -czf "$OUT/device-check.tgz" gpu 2>/dev/null
}
trap bring_back EXIT
trap 'exit 143' TERM INT
sum=$res/device-check.md
t_all=$(date +%s)
total=${DC_TOTAL_S:-570}
steps=" ${DC_STEPS:-tests parity engine kernels} "
[ "${DC_KERNELS:-1}" = 0 ] && steps=${steps/ kernels / }
want() { [[ $steps == *" $1 "* ]]; } # want STEP: DC_STEPS names it
# lim DEFAULT: a step's limit, DEFAULT or what DC_TOTAL_S leaves (less 10 s)
lim() {
    local l=$((total - ($(date +%s) - t_all) - 10))
    echo $(($1 < l ? $1 : l))
}
{
    echo "# device check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- device: ${name:-none (no nvidia-smi or no GPU): nothing below ran on a GPU}"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    echo "| step | status | seconds | notes |"
    echo "|---|---|---:|---|"
} >"$sum"

# step NAME LIMIT LOG CMD...: runs CMD under timeout, logs its output,
# adds a row to the summary.
step() {
    local nm=$1 lim=$2 logf=$3 t0 rc st note=""
    shift 3
    if [ "$lim" -lt 15 ]; then
        echo "| $nm | skipped (DC_TOTAL_S=$total spent) | 0 | |" >>"$sum"
        echo "== $nm: skipped (DC_TOTAL_S)" >&2
        return 0
    fi
    t0=$(date +%s)
    timeout --kill-after=10 "$lim" "$@" >"$logf" 2>&1
    rc=$?
    case $rc in
    0) st=ok ;;
    124 | 137) st="timed out (${lim} s)" ;;
    *) st="failed (exit $rc)" ;;
    esac
    if grep -q '^1\.\.' "$logf" 2>/dev/null; then
        note="$(grep -c '^ok' "$logf") ok, $(grep -c '^not ok' "$logf") not ok,"
        note="$note $(grep -c '# SKIP' "$logf") skipped"
    fi
    echo "| $nm | $st | $(($(date +%s) - t0)) | $note |" >>"$sum"
    echo "== $nm: $st" >&2
    return 0
}

step nvidia-smi 20 "$res/nvidia-smi.txt" nvidia-smi

# FLA, carried as a wheel (the host reaches no package index).
if ls .device/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site \
        .device/whl/*.whl >"$res/pip.txt" 2>&1 &&
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} && fla_ok=1
fi

# FLA's kernels compiled and autotuned into Triton's caches while the tests
# run (bench/fla_warmup.py; ~35 s a head shape and call on a fresh
# machine, which the anchors' and transformers' timed steps paid before);
# the first timed step waits for it (wait_warm). DC_WARM=0 skips it.
warm_pid=
if [ "${fla_ok:-0}" = 1 ] && [ -n "$name" ] && [ "${DC_WARM:-1}" = 1 ]; then
    t_warm=$(date +%s)
    timeout --kill-after=5 "$(lim "${DC_WARM_S:-150}")" python3 \
        bench/fla_warmup.py >"$res/fla-warmup.log" 2>&1 &
    warm_pid=$!
fi
wait_warm() {
    [ -n "$warm_pid" ] || return 0
    wait "$warm_pid"
    local rc=$?
    warm_pid=
    echo "| FLA warm-up | $([ $rc = 0 ] && echo ok || echo "exit $rc") | $(($(date +%s) - t_warm)) | in the background from the start: $(tail -1 "$res/fla-warmup.log" 2>/dev/null) |" >>"$sum"
}

# The benchmark checkpoints, generated while the tests run (numpy on every
# core; nothing is timed until they are done).
gen_dir=${DC_GEN_DIR:-/tmp/dc-models}
mkdir -p "$gen_dir"
read -r -a q08_args < <(python3 -c 'import sys; sys.path.insert(0, "bench")
import llamacpp_compare as l; print(" ".join(l.GEN_ARGS))')
# Qwen3.5-9B's widths (reference: qwen3-hybrid-architecture.md) with 8
# layers (6 linear + 2 full) instead of 32, and a tied head: it generates
# in seconds and loads twice (ours, transformers) within the budget.
q9_args=(--arch qwen3_5 --hidden 4096 --layers 8 --heads 16 --kv-heads 4
    --head-dim 256 --lin-k-heads 16 --lin-v-heads 32 --lin-k-dim 128
    --lin-v-dim 128 --intermediate 12288 --vocab 248320 --tied --seed 1)
gen_one() { # NAME ARGS...: one checkpoint, .done when complete
    local d=$gen_dir/$1
    shift
    [ -f "$d/.done" ] && return 0
    rm -rf "$d"
    timeout "${DC_GEN_S:-240}" python3 tools/gen_model.py "$@" --dtype bf16 \
        --fast --max-positions 262144 --out "$d" && touch "$d/.done"
}
engine_models=${DC_MODELS:-q35-0.8b q35-9b-l8}
(
    t0=$(date +%s)
    for m in $engine_models; do
        case $m in
        q35-0.8b) gen_one "$m" "${q08_args[@]}" ;;
        q35-9b-l8) gen_one "$m" "${q9_args[@]}" ;;
        esac
    done
    echo "generated in $(($(date +%s) - t0)) s"
) >"$res/gen.log" 2>&1 &
gen_pid=$!
t_gen=$(date +%s)

found=0
for t in build-device/test/test_cuda_*; do
    want tests || break
    [ -x "$t" ] || continue
    found=1
    step "$(basename "$t")" "$(lim "${DC_TEST_S:-90}")" \
        "$res/$(basename "$t").tap" "${run[@]}" "$t"
done
want tests && [ $found = 0 ] &&
    echo "| CUDA tests | missing (no build-device/test/test_cuda_*: run pack.sh) | 0 | |" >>"$sum"

# Greedy text on the device against the CPU's, on the committed models.
parity() {
    local m st mode isa disa rows=0 bad=0 near=0 o=${TMPDIR:-/tmp}/dc-parity.$$
    local doc='The capital of France is Paris, on the Seine.<|pic_sep|>'
    echo "| model | mode | $dev_name vs cpu |"
    echo "|---|---|---|"
    for m in models/test/* models/default; do
        [ -f "$m/config.json" ] || continue
        # pic: two documents captured, then spliced warm (seam 3); f32
        # operands on the device too (a bf16 checkpoint's default, bf16
        # attention, is the engine rows' below: this checks the port)
        for mode in full pic; do
            rows=$((rows + 1))
            gen=("${run[@]}" build-device/hypic-engine generate --model "$m"
                --max-tokens 16 --temperature 0 --mode "$mode" --seam 3
                --dtype f32)
            if [ "$mode" = pic ]; then
                gen+=(--prompt "Notes.<|pic_sep|>$doc${doc/Paris/Lyon}The capital of France is")
            else
                gen+=(--prompt 'The capital of France is')
            fi
            # int8: the CPU's dequantizing path, the device's twin
            # (AVX-512 VNNI rounds x to 8 bits)
            isa=()
            disa=()
            [[ $m == *int8* ]] && isa=(env HK_ISA=avx2)
            # without a device, cpu against cpu: the same ISA on both
            [ "$dev_name" = cpu ] && disa=("${isa[@]}")
            "${isa[@]}" "${gen[@]}" --device cpu >"$o.cpu" 2>&1
            if ! "${disa[@]}" "${gen[@]}" --device "$dev_name" >"$o.dev" 2>&1; then
                st="refused or failed: $(tail -1 "$o.dev")"
                # a format the backend does not run is refused by name
                grep -q 'cannot' "$o.dev" || bad=$((bad + 1))
            elif cmp -s "$o.cpu" "$o.dev"; then
                st="same greedy text"
            elif [[ $m != *int8* ]] &&
                grep -q '"num_experts"' "$m/config.json" &&
                grep -q bfloat16 "$m/config.json"; then
                # the device rounds x to bf16 before its bf16 GEMMs, the
                # CPU does not: a random MoE's near-tied routes flip
                # (test_cuda_backend holds it to the CPU that rounds too)
                st="differs, as expected (bf16 MoE: near-tied routes)"
                near=$((near + 1))
            else
                st="DIFFERENT (outputs: $(od -An -c "$o.cpu" | head -2 | tr -s ' ') / $(od -An -c "$o.dev" | head -2 | tr -s ' '))"
                bad=$((bad + 1))
            fi
            echo "| $(basename "$m") | $mode | $st |"
        done
    done
    rm -f "$o.cpu" "$o.dev"
    echo
    echo "$rows runs, $bad differ or fail, $near differ as expected"
    [ "$bad" = 0 ]
}
dev_name=${DC_DEVICE:-cuda}
[ -n "$name" ] || dev_name=${DC_DEVICE:-cpu}
if ! want parity; then
    :
elif [ -x build-device/hypic-engine ]; then
    step "engine parity ($dev_name vs cpu)" "$(lim "${DC_PARITY_S:-60}")" \
        "$res/parity.md" bash -c "$(declare -p run dev_name)
            $(declare -f parity); parity"
else
    echo "| engine parity | missing (no build-device/hypic-engine) | 0 | |" >>"$sum"
fi

# The engine on the device against transformers, per checkpoint. Without
# a GPU: toy shapes on the CPU (the plumbing).
if [ -n "$name" ]; then
    e_tok=${DC_TOKENS:-4096,16384} e_batch=${DC_BATCH-1,16,64,256}
    e_kvb=${DC_KVBUF_BATCH-1,64}
    e_dec=${DC_DECODE:-16} e_pic=${DC_PIC:-4x4096,8x4096}
else
    e_tok=${DC_TOKENS:-256,1024} e_batch=${DC_BATCH-1,4,16}
    e_kvb=${DC_KVBUF_BATCH-1,4}
    e_dec=${DC_DECODE:-4} e_pic=${DC_PIC:-2x128,4x128}
fi
e_reps=${DC_REPS:-3}
text='The capital of France is Paris. The capital of Kabel is Glaek, and'
wait_gen() { # the background generation (each checkpoint under DC_GEN_S)
    wait "$gen_pid"
    echo "| checkpoints | $(tail -1 "$res/gen.log") | $(($(date +%s) - t_gen)) | in the background from the start |" >>"$sum"
}
rm -f "$res/engine_ours.tsv" "$res/engine_hf.tsv"
waited=0 ab_done=0
engine_one() { # MODEL: gpu_engine, logits and transformers on it
    local m=$1 d tag l
    [ $waited = 1 ] || wait_gen
    waited=1
    wait_warm
    d=$m
    [ -d "$d" ] || d=$gen_dir/$m
    tag=$(basename "$d")
    if [ ! -f "$d/config.json" ] || { [ -d "$gen_dir/$m" ] && [ ! -f "$d/.done" ]; }; then
        echo "| gpu_engine $tag | missing (not generated: gen.log) | 0 | |" >>"$sum"
        return
    fi
    local mode first=1 mtag batch kvb att gm piece part tune
    for mode in ${DC_GDN_MODES:-auto}; do
        mtag=$tag batch=$e_batch kvb=$e_kvb att= gm=${mode%:*} piece= tune=
        [[ $mode == *:* ]] && piece=${mode##*:}
        # GDN[+ATT][+tune]: the parts after the GDN mode
        for part in $(tr + ' ' <<<"${gm#"${gm%%+*}"}"); do
            if [ "$part" = tune ]; then tune=1; else att=$part; fi
        done
        [ $first = 1 ] || mtag=$tag@$mode
        [ $first = 1 ] || [ -n "$tune" ] || batch= kvb=
        first=0
        l=$(lim "${DC_ENGINE_S:-120}")
        step "gpu_engine $mtag" "$l" "$res/engine-$mtag.md" "${run[@]}" \
            env HYPIC_CUDA_GDN="${gm%%+*}" ${att:+HYPIC_CUDA_ATT="$att"} \
            ${tune:+HYPIC_CUDA_TUNE=1} \
            build-device/bench/gpu_engine --model "$d" --device "$dev_name" \
            ${piece:+--piece "$piece"} \
            --tokens "$e_tok" --batch "$batch" --kvbuf-batch "$kvb" \
            --decode "$e_dec" \
            --pic "$e_pic" --reps "$e_reps" --tsv "$res/engine_ours.tsv" \
            --profile 1 \
            --budget "$((l * 7 / 10))" --name "$mtag"
    done
    # the first checkpoint: the decode step with each of session 22-23's
    # host-side switches off, beside the defaults above in the same run
    # (the staging memo, HYPIC_CUDA_STAGE_MEMO=0; the few-row GEMV,
    # HYPIC_CUDA_GEMV=0); DC_DECODE_AB=0: none
    local ab
    for ab in memo0:HYPIC_CUDA_STAGE_MEMO=0 gemv0:HYPIC_CUDA_GEMV=0; do
        [ "$ab_done" = 0 ] && [ -n "$e_batch" ] &&
            [ "${DC_DECODE_AB:-1}" != 0 ] || break
        l=$(lim "${DC_AB_S:-20}")
        step "gpu_engine $tag@${ab%%:*}" "$l" "$res/engine-$tag@${ab%%:*}.md" \
            "${run[@]}" env "${ab#*:}" build-device/bench/gpu_engine \
            --model "$d" --device "$dev_name" --tokens '' --batch 1 \
            --kvbuf-batch 1 --pic '' --decode "$e_dec" --reps "$e_reps" \
            --tsv "$res/engine_ours.tsv" --budget "$((l * 7 / 10))" \
            --name "$tag@${ab%%:*}"
    done
    ab_done=1
    step "logits $tag" "$(lim 30)" "$res/logits-$tag.log" "${run[@]}" \
        build-device/hypic-engine logits --model "$d" --device "$dev_name" \
        --prompt "$text" --all --out "$res/logits-$tag.safetensors"
    l=$(lim "${DC_HF_S:-200}")
    step "transformers $tag" "$l" "$res/hf-$tag.log" "${DC_PYTHON:-python3}" \
        bench/gpu_engine_ref.py --model "$d" --name "$tag" \
        --device "$dev_name" \
        --tokens "$e_tok" --batch "$e_batch" --decode "$e_dec" \
        --reps "$e_reps" --ours "$res/engine_ours.tsv" \
        --anchors "$res/engine_hf.tsv" --logits \
        "$res/logits-$tag.safetensors" --text "$text" --out "$res" \
        --budget "$((l * 8 / 10))"
    rm -f "$res/logits-$tag.safetensors"
    # the merge again: a transformers step that timed out wrote none
    [ -f "$res/engine_ours.tsv" ] && python3 bench/gpu_engine_ref.py \
        --ours "$res/engine_ours.tsv" --anchors "$res/engine_hf.tsv" \
        --out "$res" >/dev/null 2>&1
}
read -r -a models <<<"$engine_models"
if ! want engine; then
    models=()
elif [ ! -x build-device/bench/gpu_engine ]; then
    echo "| gpu_engine | missing (no build-device/bench/gpu_engine) | 0 | |" >>"$sum"
    models=()
fi
[ ${#models[@]} -gt 0 ] && engine_one "${models[0]}"

if ! want kernels; then
    echo "| gpu_kernels, gpu_kernels_ref | skipped (DC_STEPS) | 0 | |" >>"$sum"
elif [ -x build-device/bench/gpu_kernels ]; then
    wait_warm
    # One run per family of ops, each with its share of DC_BENCH_S, so a
    # slow family cannot starve the ones after it (each run times
    # copy_d2d too); the tables are merged after. attention_decode holds
    # attention_decode_paged's rows too (a prefix of theirs).
    l=$(lim "${DC_BENCH_S:-240}")
    # attention_prefill_flash3 (FLASH3's wgmma, never run on a GPU before)
    # runs alone, last: a fault there cannot take other rows with it.
    declare -A share=([gdn_chunk]=30 [gdn_step]=10 [gdn_decode]=6 [kvbuf]=14
        [attention_prefill]=22 [attention_append]=6 [attention_decode]=12
        [matmul]=4 [sample]=5 [prefill]=5 [attention_prefill_flash3]=8)
    read -ra fams <<<"${DC_KERNELS_ONLY:-gdn_chunk gdn_step gdn_decode kvbuf attention_prefill attention_append attention_decode matmul sample prefill attention_prefill_flash3}"
    tot=0
    for f in "${fams[@]}"; do tot=$((tot + ${share[$f]:-10})); done
    rm -f "$res"/bench-*.tsv "$res"/bench-*.md
    for f in "${fams[@]}"; do
        b=$((l * ${share[$f]:-10} / tot))
        b=$((b < 20 ? 20 : b)) # a run under 15 s would be skipped
        # gpu_kernels writes its rows as it goes: --budget leaves it time
        # to finish the row it is in
        step "gpu_kernels $f" "$(lim "$b")" "$res/bench-$f.md" "${run[@]}" \
            build-device/bench/gpu_kernels --only "$f" \
            --out "$res/bench-$f.tsv" --dump "$res/dump" \
            --budget "$((b * 7 / 10))"
    done
    # one table: the first run's header and device row, every run's rows
    for f in "${fams[@]}"; do
        [ -f "$res/bench-$f.tsv" ] && echo "$res/bench-$f.tsv"
    done | xargs -r awk 'FNR == NR || ($1 != "op" && $1 != "device")' \
        >"$res/bench.tsv"
    for f in "${fams[@]}"; do
        [ -f "$res/bench-$f.md" ] && cat "$res/bench-$f.md"
    done >"$res/bench.md"
    # it writes its files as it goes and on SIGTERM: --budget leaves 15 s
    l=$(lim "${DC_REF_S:-150}")
    step gpu_kernels_ref "$l" "$res/ref.log" python3 \
        bench/gpu_kernels_ref.py --bench "$res/bench.tsv" --dump "$res/dump" \
        --out "$res" --budget "$((l - 15))"
else
    echo "| gpu_kernels | missing (no build-device/bench/gpu_kernels) | 0 | |" >>"$sum"
fi
rm -rf "$res/dump" # inputs and outputs: large, and rebuilt on every run

for m in "${models[@]:1}"; do
    engine_one "$m"
done
wait_warm
wait "$gen_pid" 2>/dev/null

{
    echo
    echo "Total: $(($(date +%s) - t_all)) s. Results: engine.tsv, engine.md"
    echo "(below), engine-*.md (gpu_engine's tables), hf-*.log, parity.md,"
    echo "kernels.tsv, accuracy.tsv, report.md (below), bench.md (the C"
    echo "bench's table), *.tap."
    echo
    [ -f "$res/parity.md" ] && cat "$res/parity.md" && echo
    # the choices this run settles: each candidate beside the default
    if [ -s "$res/bench.tsv" ] &&
        python3 bench/device_decide.py --bench "$res/bench.tsv" \
            --kernels "$res/kernels.tsv" >"$res/decide.md" 2>&1; then
        cat "$res/decide.md"
        echo
    fi
    # the GDN chunk's in-kernel probes at 16k, the default's and W8's
    # (every variant's are in bench.md)
    if grep -qE '^\| probe_gdn_chunk_bf16(_w8)?\.' "$res/bench.md" 2>/dev/null; then
        echo "In-kernel probes (gdn_chunk_bf16, _w8 at 16k; ms: the phase's"
        echo "share of its launch):"
        echo
        echo "| op | model | params | ms | reps | tokens/s | GB/s | TFLOP/s | note |"
        echo "|---|---|---|---|---|---|---|---|---|"
        grep -E '^\| probe_gdn_chunk_bf16(_w8)?\.' "$res/bench.md"
        echo
    fi
    # the decode step's in-kernel probes at B = 64 and 256, the default's
    # (PIPE) and PIPEW's
    if grep -qE '^\| probe_gdn_step(_pipew)?\.' "$res/bench.md" 2>/dev/null; then
        echo "In-kernel probes (gdn_step, _pipew at B = 64, 256; ms: the"
        echo "phase's share of the launch):"
        echo
        echo "| op | model | params | ms | reps | tokens/s | GB/s | TFLOP/s | note |"
        echo "|---|---|---|---|---|---|---|---|---|"
        grep -E '^\| probe_gdn_step(_pipew)?\.' "$res/bench.md"
        echo
    fi
    # the GDN chunk with its launches overlapped (OVERLAP) beside the
    # default, both entries the engine uses (bf16 in, f32 rounded once)
    if grep -qE '^\| gdn_chunk_(bf16|f32mma_bf16in)_ov(_tc)? ' "$res/bench.md" 2>/dev/null; then
        echo "GDN chunk, default and OVERLAP (the three kernels side by side):"
        echo
        echo "| op | model | params | ms | reps | tokens/s | GB/s | TFLOP/s | note |"
        echo "|---|---|---|---|---|---|---|---|---|"
        grep -E '^\| gdn_chunk_(bf16|f32mma_bf16in)(_ov)?(_tc)? ' "$res/bench.md"
        echo
    fi
    [ -f "$res/engine.md" ] && cat "$res/engine.md" && echo
    [ -f "$res/report.md" ] && cat "$res/report.md"
} >>"$sum"
echo "results in $res" >&2
cat "$sum"
