#!/usr/bin/env bash
# Run bench/gpu_run.sh phases on several GPUs of one machine at once: one lane per GPU, each a
# quoted list of phases run in order. Lanes share the trained pair, the results folder and the
# compile memory; a lane that needs the pair waits until another lane has trained it.
#
#   OUT=/path/to/empty/dir DEADLINE=560 bash bench/gpu_lanes.sh "train mechanisms" "tests shapes"
#
# With fewer GPUs than lanes the lanes run one after another on GPU 0. At DEADLINE seconds
# (default 560) the lanes still running are stopped: what they finished is kept (benches keep
# partial results, compiles resume at their last round), and every result is packed into
# $OUT/results.tar.gz. Each lane's logs go to $OUT/laneN/.
set -uo pipefail
: "${OUT:?set OUT to an empty output folder}"
RESULTS=${RESULTS:-/tmp/specpilot-results}
PAIR=${PAIR:-/tmp/specpilot-pair}
export RESULTS PAIR NO_TAR=1
mkdir -p "$RESULTS"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
deadline=$((SECONDS + ${DEADLINE:-560}))

lane() {  # lane N GPU PHASES
    local n=$1 gpu=$2; shift 2
    mkdir -p "$OUT/lane$n"
    for p in $1; do
        case $p in  # phases that read the pair wait for a lane that trains it
        bench*|smoke|compile*|mech*)
            while [ ! -f "$PAIR/train_report.json" ] && [ -d /tmp/specpilot-training ]; do sleep 5; done ;;
        esac
        CUDA_VISIBLE_DEVICES=$gpu OUT="$OUT/lane$n" bash bench/gpu_run.sh "$p"
        [ "$p" = train ] && rmdir /tmp/specpilot-training 2>/dev/null  # done, or failed: stop waiting
    done
}

# Mark the pair as coming before any lane starts, so no lane reads a half-written pair.
case " $* " in *" train "*) [ -f "$PAIR/train_report.json" ] || mkdir -p /tmp/specpilot-training ;; esac
pids=()
if [ "$gpus" -ge "$#" ]; then
    n=0
    for phases in "$@"; do
        setsid bash -c "$(declare -f lane); lane $n $n '$phases'" &
        pids+=($!); n=$((n + 1))
    done
else
    echo "$gpus GPU(s) for $# lanes: the lanes run one after another"
    all=$(printf '%s ' "$@")
    setsid bash -c "$(declare -f lane); lane 0 0 '$all'" &
    pids+=($!)
fi
while [ $SECONDS -lt $deadline ]; do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive -eq 1 ] || break
    sleep 2
done
for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null && { echo "deadline: stopping lane pid $pid"; kill -TERM -- "-$pid"; }
done
sleep 3
for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
tar czf "$OUT/results.tar.gz" -C "$RESULTS" .
for f in "$OUT"/lane*/*.log; do echo "--- $f"; grep -E '^=== |passed|failed|Error|error' "$f" | tail -8; done
