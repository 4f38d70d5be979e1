"""The dense kernel families: parameter schemas and launcher contracts, in one table.

Each rendered Triton module (and each built CUDA module) exposes one plain Python function,
`launch(...)`, that checks its tensors, computes the grid and starts the kernel(s). Launchers
write into caller-provided outputs and return None, so a backend can preallocate buffers and
capture the calls in a CUDA graph. Shapes, strides and shape-derived block sizes are read from
the tensors at launch; the spec fixes only the specialisation (dtype, tiles, warps, flags).

Launcher contracts (all tensors on one device; the last dimension of each tensor contiguous):

linear         launch(x, w, out, bias=None)
               x [M, K], w [N, K], out [M, N], bias [N] (only and always when HAS_BIAS);
               out = x @ w.T (+ bias), float32 accumulation, one rounding to DTYPE.
gate_up_silu   launch(x, w_gate, w_up, out)
               x [M, K], w_gate/w_up [I, K], out [M, I]; out = silu(x @ w_gate.T) * (x @ w_up.T)
               computed in float32, rounded once.
rmsnorm        launch(x, weight, out, eps, residual=None, residual_out=None)
               x/out [M, H], weight [H]. With HAS_RESIDUAL: s = x + residual is rounded to DTYPE
               and written to residual_out (may alias residual), then out = rmsnorm(s) * weight.
               Numerics follow HF Llama: float32 statistics, normalised value rounded to DTYPE
               before the weight multiply.
rope           launch(q, k, positions, q_out, k_out, inv_freq=None, cos=None, sin=None,
                      attention_scaling=1.0)
               q/q_out [T, Hq, D], k/k_out [T, Hk, D] (outputs may alias inputs), positions [T];
               COS_SIN=inv_freq: inv_freq [D/2] float32; COS_SIN=table: cos/sin [P, D] (HF
               layout, halves duplicated) indexed by positions. HF rotate-half convention with
               HF's rounding order (cos/sin and both products rounded to DTYPE).
attention      launch(q, k_cache, v_cache, mask, out, scale=None, kv_len=None, kv_len_out=None,
                      workspace=None, positions=None, w_o=None, residual=None)
               q/out [B, T, Hq, D], caches [B, S, Hkv, D] with Hq % Hkv == 0 (GQA), mask
               [B, T, S] bool (True = visible), scale defaults to 1/sqrt(D), kv_len [B] int
               optionally bounds the visible slots (slots >= kv_len[b] are skipped); or
               kv_len_out [B] int32 receives each request's bound as the kernel finds it in the
               mask (one past its last visible slot, 0 where it sees none), which the walk then
               keeps. Softmax in float32; a query that sees no slot gets zeros. SPLITS > 1: the
               walk is shared by that many programs per row block, their partials merged by the
               last to finish; workspace is the module's split_workspace(B, T, Hq, Hkv, device),
               left as found. mask None with positions [B, T] (int): a query at position p
               sees slots 0..p (a chain's cache, where a token's slot is its position), each
               program's walk bounded by its own rows' positions (no kv_len, no kv_len_out).
               FOLD_O: launch(..., w_o=, residual=) with the output projection w_o [N, Hq*D]
               folded in: out is a float32 [B*T, N] residual stream, zeros on entry, that
               receives residual (float32 [B*T, N]) + the attention rounded to DTYPE @ w_o^T,
               each program adding its heads' share atomically (the order of the float32
               additions varies). Torch reference: attention_ref, then fold_ref.
varlen_attention launch(q, k_cache, v_cache, cu_seqlens, cache_rows, kv_limits, window_bits, out,
                        scale=None, max_seqlen=None)
               Every request's new tokens packed without padding: q/out [N, Hq, D], request r
               owns tokens cu_seqlens[r]:cu_seqlens[r+1] (int [R+1], from 0 to N) and reads
               cache row cache_rows[r] (int [R]) of the caches [B, S, Hkv, D] (GQA as attention).
               Visibility is data, so one kernel serves every tree: token t sees the slots
               < kv_limits[t] (int32 [N]) and slot kv_limits[t] + j where bit j % 32 of
               window_bits[t, j // 32] is set (int32 [N, W], W >= 1). scale defaults to
               1/sqrt(D); max_seqlen (the most tokens of one request) avoids reading the offsets
               back (without it they are checked on the host). Softmax in float32; a token that
               sees no slot gets zeros.
greedy_accept  launch(logits, draft_tokens, parents, pred_out, accept_count_out, path_out,
                      bonus_out)
               logits [B, N+1, V] (row 0: the root = last committed token, row i+1: draft node
               i), draft_tokens [B, N], parents [N] or [B, N] (-1 = root, parents before
               children, as ir.topology.TreeShape); outputs int64: pred_out [B, N+1] (argmax,
               first index on ties), accept_count_out [B], path_out [B, N] (accepted node
               indices root to leaf, -1 after the end), bonus_out [B] (prediction after the last
               accepted node). A chain is parents = (-1, 0, 1, ...).
chain_commit   launch(committed, drafts, out, count, length, last, prev, limit, active, log,
                      status, round_index, eos=None, row_round=None, n_out=None,
                      before_out=None, r_out=None)
               A graphed chain round's end (runtime/graphed_chain.py's `_accepted` and
               `_commit`), one program for the batch. committed int64 [B, C], drafts int64
               [B, C - 1]; n_b is the count of leading drafts equal to committed[b, j]. On each
               row b active before: out[b, count_b + j] = committed[b, j] for j <= n_b (columns
               clamped to W - 1; out int64 [B, W]), last/prev = committed[b, n_b] and the token
               before it (the old last where n_b = 0), length and count += n_b + 1; the row
               stays active while count < limit and no kept token is in eos (int64 [E]).
               log int64 [W, B], status int64 [W, 2], round_index int64 [1] (r = min(index,
               W - 1)). LOG=round: log[r] = n (-1 where the row did not run); row: log[
               min(row_round_b, W - 1), b] = the same and row_round int64 [B] += ran; row_plain:
               row_round += ran only. Except row_plain, status[r, 0] = every row has finished.
               round_index += 1. n_out int64 [B], before_out bool [B] and r_out int64 [1]
               receive n, the active flags before and r. Torch reference: chain_commit_ref.
length_policy  launch(accepted_avg, rejected_avg, accepted_total, rejected_total, first_judged,
                      rounds, off, chosen, workload, draining, round_cost, n, drafted, ran,
                      limit, count, active, status, r, smoothing, depth_smoothing, z,
                      off_after, depth_rates=None, depth_tried=None, depth_took=None,
                      depth_workload=None)
               The adaptive chain length's update after a round (runtime/batch_length.py,
               `policy_round`, its torch reference), one program for the batch: the state
               (float32 [B] moving averages and whole-history counts, first_judged; rounds
               int64, off bool, chosen int64, workload float32 [3], one each) is updated in
               place from the round's n accepted of drafted (int64 [B]) on the rows in ran
               (bool [B]), and the next length is written to status[r, 1] (status int64 [W,
               2], r int64 [1]): the L in 1..cap (round_cost float32 [cap + 1]) with the
               shortest makespan over the active rows (remaining = max(limit - count, 0)), or
               OBJECTIVE=throughput the least time per token unless draining (bool [1]), or 0
               once TURN_OFF has turned speculation off. ESTIMATOR=per_depth: depth_rates,
               depth_tried, depth_took float32 [B, cap] and depth_workload float32 [2, cap].
length_admit   launch(accepted_avg, rejected_avg, accepted_total, rejected_total, workload, row,
                      cap, off_after, depth_rates=None, depth_tried=None, depth_took=None,
                      depth_workload=None)
               A continuous refill's newcomer in row `row` (int, host) of the adaptive length's
               state (`BatchLengthPolicy.admit`, its torch reference; length_policy's tensors):
               its moving averages start at the workload's averages per round (workload
               float32 [3]: accepted drafts, rejections, request rounds; cap and 0 before any
               round), its whole-history counts at off_after such rounds. ESTIMATOR=per_depth:
               its rates at the workload's per depth (depth_workload float32 [2, cap]: tries,
               acceptances; 1 where none was tried), its depth counts likewise.
row_start      launch(logits, out, accepted, row_round, length, prev, limit_t, count, last,
                      active, eos, row, prompt_len, prompt_last, limit)
               A continuous refill's newcomer in row `row` (int, host) of a batch's state, once
               its prefill is in the caches (`start_row_ops` in runtime/graphed_refill.py, its
               torch reference): the first token g0 = argmax of logits [1, V] (float; the first
               of equal maxima); out [B, W] int64 row = g0 then zeros, accepted [LOG, B] int64
               column = -1, and of the int64 [B] tensors row_round = 0, length = prompt_len,
               prev = prompt_last, limit_t = limit, count = 1, last = g0; active (bool [B]) =
               limit > 1 and g0 not in eos (int64 [E], or None).
kv_compact     launch(k_cache, v_cache, src_slots, dst_start, counts)
               caches [B, S, Hkv, D] or [L, B, S, Hkv, D] (all layers at once), modified in
               place: for each request b and i < counts[b], slot dst_start[b] + i receives slot
               src_slots[b, i]. src_slots [B, N] int; requires src_slots[b] increasing and
               src_slots[b, i] >= dst_start[b] + i (true for tree nodes staged after the
               committed tokens), which makes the in-place, in-order copy safe.
fused_linear   launch(x, w, out, residual=None, norm_weight=None, eps=0.0)
               x [M, K], w [N, K], out [M, N]; with NORM x is first RMS-normalised (rmsnorm's
               numerics, norm_weight [K]); the product is rounded to DTYPE and, with RESIDUAL,
               added to residual [M, N] and rounded again (a bf16 add). OUT_FP32: out is float32
               holding the DTYPE values (logits). Torch reference: fused_linear_ref.
               X_FP32 (with NORM): x is a float32 residual stream, normalised into DTYPE.
               ARGMAX: launch(..., argmax_out, workspace) also writes argmax_out int64 [M], each
               row's argmax of out (first column on ties, as torch.argmax); workspace is the
               module's argmax_workspace(M, N, device), left as found.
norm_gate_up_silu launch(x, norm_weight, w_gate, w_up, out, eps, w_down=None)
               gate_up_silu of rmsnorm(x, norm_weight, eps). Torch reference:
               norm_gate_up_silu_ref. FOLD_DOWN: x is a float32 residual stream [M, K] and out
               a float32 [M, K] holding zeros, which receives x + the activation (rounded to
               DTYPE) @ w_down [K, I]^T, added atomically by column blocks. Torch reference:
               norm_gate_up_silu_ref, then fold_ref.
norm_qkv_rope  launch(x, norm_weight, w_qkv, positions, slots, inv_freq, q_out, k_cache, v_cache,
                      eps, tokens=None, x_out=None, cache_positions=None)
               A layer's attention input for B x T tokens (positions/slots [B, T]): RMSNorm, the
               [q; k; v] projection (w_qkv [(Hq + 2 Hkv) D, H]) rounded to DTYPE, RoPE on q and k
               from inv_freq [D/2] float32 (rope's numerics), q to q_out [B, T, Hq, D], k/v into
               the caches [B, S, Hkv, D] at slots. x is [B*T, H], or with tokens the embedding
               table [V, H] (rows gathered, also written to x_out [B*T, H]); cache_positions
               [B, S] records positions at slots. Torch reference: norm_qkv_rope_ref.
               X_FP32: x (the residual stream, when not gathered) and x_out are float32.
gemv_bf16      launch(x, w, out, bias=None)   (CUDA, sm_90)
               bf16 x [M, K] with M <= M_MAX, w [N, K], out [M, N], bias [N] when HAS_BIAS;
               K % 8 == 0 and 16-byte aligned rows (vectorised loads).
gemv_lossless12 launch(x, w, out, bias=None)   (CUDA, sm_90)
               bf16 x [M, K] with M <= M_MAX, w a Lossless12Tensor (N, K) with one base per row
               or per tensor, planes contiguous on x's device, out [M, N] bf16, bias [N] when
               HAS_BIAS; K % 16 == 0 and 16-byte aligned rows of x. out = x @ W.T (+ bias) in
               float32: dense planes first (escapes read as +0.0), then the escapes, rounded once.
               MATH=fma widens to float32 on CUDA cores; MATH=mma feeds bf16 pairs to tensor
               cores (mma.m16n8k16, a block per 16 weight rows). Torch reference:
               linear_ref(x, decode_reference(w), bias).
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional

from .cuda_launchers import launch_gemv_bf16, launch_gemv_lossless12
from .params import BoolParam, EnumParam, FamilySchema, IntParam, Value

DTYPES = ("bf16", "fp16", "fp32")
TORCH_DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


def next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _dtype(default: str = "bf16") -> EnumParam:
    return EnumParam("DTYPE", DTYPES, default, doc="dtype of activations, weights and outputs")


def _fold_columns() -> IntParam:
    """FOLD_N of the families that fold a projection in (attention's FOLD_O,
    norm_gate_up_silu's FOLD_DOWN)."""
    return IntParam("FOLD_N", 16, 256, 128, power_of_two=True,
                    doc="output columns per step of the folded projection")


def _warps(default: int) -> IntParam:
    return IntParam("num_warps", 1, 16, default, power_of_two=True, doc="warps per program")


def _stages(default: int) -> IntParam:
    return IntParam("num_stages", 1, 6, default, doc="software pipelining depth of the K loop")


# Mantissa bits a float32 loses when rounded to the dtype (23 - stored mantissa bits).
DROP_BITS = {"bf16": 16, "fp16": 13, "fp32": 0}


def _dtype_constants(p: Mapping[str, Value]) -> Dict[str, Value]:
    return {"TORCH_DTYPE": TORCH_DTYPE[p["DTYPE"]], "DROP_BITS": DROP_BITS[p["DTYPE"]]}


# A broadcast-multiply tile [BLOCK_M, BLOCK_N, BLOCK_K] lives in registers; past this many
# elements it spills, so such configurations are refused rather than silently slow.
MAX_FMA_TILE = 32768


def check_matmul_tiles(p: Mapping[str, Value], min_dot_k: int = 16) -> Optional[str]:
    """Tile legality shared by the matmul families (tl.dot minimum sizes, register budget).
    `min_dot_k`: the smallest BLOCK_K a family's dot accepts (a family that splits each K step
    into two dots needs twice tl.dot's 16)."""
    if p["USE_DOT"]:
        small = [n for n in ("BLOCK_M", "BLOCK_N") if p[n] < 16] + (
            ["BLOCK_K"] if p["BLOCK_K"] < min_dot_k else [])
        if small:
            return (f"USE_DOT needs BLOCK_M, BLOCK_N >= 16 and BLOCK_K >= {min_dot_k} (tl.dot), "
                    f"got {small} smaller")
    elif p["BLOCK_M"] * p["BLOCK_N"] * p["BLOCK_K"] > MAX_FMA_TILE:
        return (f"without USE_DOT the tile BLOCK_M*BLOCK_N*BLOCK_K must be <= {MAX_FMA_TILE}, got "
                f"{p['BLOCK_M'] * p['BLOCK_N'] * p['BLOCK_K']}")
    return None


def _matmul_params(block_n: int) -> tuple:
    return (
        _dtype(),
        IntParam("BLOCK_M", 1, 64, 16, power_of_two=True, doc="rows of x per program"),
        IntParam("BLOCK_N", 8, 256, block_n, power_of_two=True, doc="output columns per program"),
        IntParam("BLOCK_K", 16, 1024, 64, power_of_two=True, doc="reduction step"),
        BoolParam("USE_DOT", True, doc="tl.dot (tensor cores) or a broadcast multiply-add (tiny M)"),
    )


LINEAR = FamilySchema(
    name="linear", backend="triton",
    summary="dense y = x @ W.T (+ bias) for decode/verify batch sizes (GEMV, skinny GEMM)",
    launcher="launch(x, w, out, bias=None)",
    params=_matmul_params(64) + (
        IntParam("SPLIT_K", 1, 16, 1, doc="programs sharing one output tile along K"),
        BoolParam("HAS_BIAS", False),
        _warps(4), _stages(3)),
    check=check_matmul_tiles, derive=_dtype_constants)

GATE_UP_SILU = FamilySchema(
    name="gate_up_silu", backend="triton",
    summary="fused MLP input: silu(x @ Wg.T) * (x @ Wu.T)",
    launcher="launch(x, w_gate, w_up, out)",
    params=_matmul_params(32) + (_warps(4), _stages(3)),
    check=check_matmul_tiles, derive=_dtype_constants)

RMSNORM = FamilySchema(
    name="rmsnorm", backend="triton",
    summary="RMSNorm with an optional fused residual add that also returns the new residual",
    launcher="launch(x, weight, out, eps, residual=None, residual_out=None)",
    params=(_dtype(),
            IntParam("BLOCK_H", 16, 16384, 1024, power_of_two=True, doc="columns per loop step"),
            BoolParam("HAS_RESIDUAL", True),
            _warps(4)),
    derive=_dtype_constants)


def _check_rope(p: Mapping[str, Value]) -> Optional[str]:
    if p["HEAD_DIM"] % 2:
        return f"HEAD_DIM must be even (rotate-half pairs its two halves), got {p['HEAD_DIM']}"
    return None


def _rope_constants(p: Mapping[str, Value]) -> Dict[str, Value]:
    half = p["HEAD_DIM"] // 2
    return {**_dtype_constants(p), "HALF_DIM": half, "BLOCK_HALF": next_power_of_two(half)}


ROPE = FamilySchema(
    name="rope", backend="triton",
    summary="rotary position embedding of q and k (HF rotate-half), one launch for both",
    launcher="launch(q, k, positions, q_out, k_out, inv_freq=None, cos=None, sin=None, "
             "attention_scaling=1.0)",
    params=(_dtype(),
            IntParam("HEAD_DIM", 2, 512, 128),
            EnumParam("COS_SIN", ("inv_freq", "table"), "inv_freq",
                      doc="compute cos/sin from inv_freq, or read them from tables"),
            _warps(4)),
    check=_check_rope, derive=_rope_constants)


def _check_attention(p: Mapping[str, Value]) -> Optional[str]:
    if p["BLOCK_R"] * p["BLOCK_S"] > 16384:
        return f"BLOCK_R*BLOCK_S must be <= 16384, got {p['BLOCK_R'] * p['BLOCK_S']}"
    return None


# Mask slots a program reads per step when it finds its request's bound itself (kv_len_out):
# wide, so that a decode cache's mask row takes one or two steps.
SCAN_S = 256


def _attention_constants(p: Mapping[str, Value]) -> Dict[str, Value]:
    return {**_dtype_constants(p), "BLOCK_D": next_power_of_two(p["HEAD_DIM"]), "SCAN_S": SCAN_S}


def _attention_params(rows_doc: str) -> tuple:
    """The parameters both attention families take (the dense and the packed one)."""
    return (_dtype(),
            IntParam("HEAD_DIM", 16, 256, 128),
            IntParam("BLOCK_R", 16, 128, 16, power_of_two=True, doc=rows_doc),
            IntParam("BLOCK_S", 16, 256, 64, power_of_two=True, doc="cache slots per loop step"),
            _warps(4), _stages(2))


ATTENTION = FamilySchema(
    name="attention", backend="triton",
    summary="attention of T new queries per request over a static KV cache with an explicit "
            "visibility mask (decode, causal and tree verification), GQA",
    launcher="launch(q, k_cache, v_cache, mask, out, scale=None, kv_len=None, kv_len_out=None, "
             "workspace=None, positions=None, w_o=None, residual=None)",
    params=_attention_params("query rows (token, head-in-group) per program") + (
        IntParam("SPLITS", 1, 16, 1, doc="programs that share one row block's walk over the "
                                         "slots, merged by the last to finish"),
        BoolParam("FOLD_O", False, doc="the output projection and the residual folded in: each "
                                       "row block's heads times their columns of W_o, added "
                                       "atomically into a float32 residual stream"),
        _fold_columns()),
    check=_check_attention, derive=_attention_constants)

VARLEN_ATTENTION = FamilySchema(
    name="varlen_attention", backend="triton",
    summary="attention of requests packed without padding (cu_seqlens offsets, a cache row per "
            "request) with per-token visibility as data: a prefix length and a window bitmask",
    launcher="launch(q, k_cache, v_cache, cu_seqlens, cache_rows, kv_limits, window_bits, out, "
             "scale=None, max_seqlen=None)",
    params=_attention_params("query rows (token of one request, head-in-group) per program"),
    check=_check_attention, derive=_attention_constants)

GREEDY_ACCEPT = FamilySchema(
    name="greedy_accept", backend="triton",
    summary="argmax of the target logits and the longest accepted path of a chain or tree",
    launcher="launch(logits, draft_tokens, parents, pred_out, accept_count_out, path_out, bonus_out)",
    params=(IntParam("BLOCK_V", 64, 16384, 2048, power_of_two=True, doc="vocabulary step"),
            _warps(4)))

CHAIN_COMMIT = FamilySchema(
    name="chain_commit", backend="triton",
    summary="a graphed round's end in one launch: chain acceptance, the committed tokens out, "
            "the rows' state moved on, who stops, the round's log",
    launcher="launch(committed, drafts, out, count, length, last, prev, limit, active, log, "
             "status, round_index, eos=None, row_round=None, n_out=None, before_out=None, "
             "r_out=None)",
    params=(EnumParam("LOG", ("round", "row", "row_plain"), "round",
                      doc="the round's log: by the batch's round, by each row's own counter "
                          "(continuous refill), or a refilled batch's plain step (counters "
                          "only)"),
            _warps(1)))

def _estimator() -> EnumParam:
    return EnumParam("ESTIMATOR", ("geometric", "per_depth"), "geometric",
                     doc="what a chain of L is expected to commit: one acceptance per request "
                         "or one per request and depth (a Program's batch.length_estimator)")


LENGTH_POLICY = FamilySchema(
    name="length_policy", backend="triton",
    summary="the adaptive chain length's update after a round in one launch: acceptance "
            "estimates, the next length (makespan or time per token), the turn-off",
    launcher="launch(accepted_avg, rejected_avg, accepted_total, rejected_total, first_judged, "
             "rounds, off, chosen, workload, draining, round_cost, n, drafted, ran, limit, count, "
             "active, status, r, smoothing, depth_smoothing, z, off_after, depth_rates=None, "
             "depth_tried=None, depth_took=None, depth_workload=None)",
    params=(_estimator(),
            EnumParam("OBJECTIVE", ("makespan", "throughput"), "makespan",
                      doc="a padded batch's makespan, or continuous refill's time per token"),
            BoolParam("TURN_OFF", True, doc="speculation may turn off for good"),
            _warps(1)))

LENGTH_ADMIT = FamilySchema(
    name="length_admit", backend="triton",
    summary="a refilled row's adaptive-length estimates started from the workload's, in one "
            "launch",
    launcher="launch(accepted_avg, rejected_avg, accepted_total, rejected_total, workload, row, "
             "cap, off_after, depth_rates=None, depth_tried=None, depth_took=None, "
             "depth_workload=None)",
    params=(_estimator(), _warps(1)))

ROW_START = FamilySchema(
    name="row_start", backend="triton",
    summary="a refilled row's state started in one launch: the first token (the prefill's "
            "argmax), the cleared output and log, position, limit, count, who runs",
    launcher="launch(logits, out, accepted, row_round, length, prev, limit_t, count, last, "
             "active, eos, row, prompt_len, prompt_last, limit)",
    params=(IntParam("BLOCK_V", 128, 8192, 1024, power_of_two=True,
                     doc="vocabulary entries per step of the argmax"),
            _warps(4)))

KV_COMPACT = FamilySchema(
    name="kv_compact", backend="triton",
    summary="in-place copy of accepted tree nodes' K/V rows to contiguous cache slots",
    launcher="launch(k_cache, v_cache, src_slots, dst_start, counts)",
    params=(IntParam("BLOCK", 32, 8192, 1024, power_of_two=True, doc="row elements per program"),
            _warps(4)))

GEMV_BF16 = FamilySchema(
    name="gemv_bf16", backend="cuda",
    summary="bandwidth-bound bf16 GEMV for 1..8 rows on Hopper (16-byte loads, warp per column(s))",
    launcher="launch(x, w, out, bias=None)",
    params=(IntParam("M_MAX", 1, 8, 1, doc="most rows of x one launch accepts"),
            IntParam("WARPS_PER_BLOCK", 1, 16, 4, power_of_two=True),
            IntParam("UNROLL", 1, 8, 4, doc="16-byte weight loads in flight per lane and column"),
            IntParam("COLS_PER_WARP", 1, 4, 1,
                     doc="output columns per warp: each x load then serves that many weight rows"),
            BoolParam("HAS_BIAS", False)),
    derive=lambda p: {"THREADS": 32 * p["WARPS_PER_BLOCK"]},
    host_launcher=launch_gemv_bf16)


def _check_gemv_lossless12(p: Mapping[str, Value]) -> Optional[str]:
    if p["MATH"] == "mma" and p["ROWS_PER_WARP"] != 1:
        return "ROWS_PER_WARP applies to MATH=fma only (an mma block owns 16 rows): leave it at 1"
    return None


GEMV_LOSSLESS12 = FamilySchema(
    name="gemv_lossless12", backend="cuda",
    summary="fused-decode GEMV for 1..8 rows and a lossless12 weight on Hopper (16+8-byte loads, "
            "decode in registers, CUDA-core FMA or tensor-core mma)",
    launcher="launch(x, w, out, bias=None)",
    params=(IntParam("M_MAX", 1, 8, 8, doc="most rows of x one launch accepts"),
            EnumParam("MATH", ("fma", "mma"), "fma",
                      doc="float32 FMAs on CUDA cores, or bf16 mma.m16n8k16 on tensor cores"),
            IntParam("WARPS_PER_BLOCK", 1, 16, 4, power_of_two=True,
                     doc="warps per block (with mma: warps sharing K, plus one escape warp)"),
            IntParam("UNROLL", 1, 8, 2, doc="vector loads in flight per lane and weight row"),
            IntParam("ROWS_PER_WARP", 1, 4, 1,
                     doc="weight rows per warp with fma: each x vector then serves that many rows"),
            BoolParam("HAS_BIAS", False)),
    check=_check_gemv_lossless12,
    derive=lambda p: {"THREADS": 32 * (p["WARPS_PER_BLOCK"] + (p["MATH"] == "mma"))},
    host_launcher=launch_gemv_lossless12)


def _check_fused_linear(p: Mapping[str, Value]) -> Optional[str]:
    if p["X_FP32"] and not p["NORM"]:
        return "X_FP32 needs NORM (the norm brings float32 rows to the dtype the product takes)"
    return check_matmul_tiles(p)


def _check_norm_gate_up_silu(p: Mapping[str, Value]) -> Optional[str]:
    problem = check_matmul_tiles(p)
    if problem is None and p["FOLD_DOWN"] and not p["USE_DOT"]:
        # the folded product's register tile: BLOCK_M rows x BLOCK_N activations x FOLD_N outputs
        problem = check_matmul_tiles({**p, "BLOCK_K": p["FOLD_N"]})
    return problem


# The fused layer families (runtime/fused_forward.py): a small model's decoder layer in five
# launches (norm_qkv_rope, attention, fused_linear with RESIDUAL, norm_gate_up_silu, fused_linear
# with RESIDUAL) and its LM head in one (fused_linear with NORM and OUT_FP32); or folded in
# three (attention with FOLD_O, norm_gate_up_silu with FOLD_DOWN) over a float32 residual
# stream that norm_qkv_rope and the head read (X_FP32).
FUSED_LINEAR = FamilySchema(
    name="fused_linear", backend="triton",
    summary="y = [residual +] [rmsnorm](x) @ W.T: a linear with its norm and residual add fused",
    launcher="launch(x, w, out, residual=None, norm_weight=None, eps=0.0)",
    params=_matmul_params(32) + (
        BoolParam("NORM", False, doc="RMS-normalise x's rows first"),
        BoolParam("RESIDUAL", False, doc="add the residual after the product"),
        BoolParam("OUT_FP32", False, doc="write float32 (logits) rather than DTYPE"),
        BoolParam("ARGMAX", False, doc="each row's argmax over all columns too (a drafter's "
                                       "next token), reduced by the last program of a row block"),
        BoolParam("X_FP32", False, doc="x is a float32 residual stream (with NORM: normalised "
                                       "into DTYPE)"),
        _warps(4), _stages(2)),
    check=_check_fused_linear, derive=_dtype_constants)

NORM_GATE_UP_SILU = FamilySchema(
    name="norm_gate_up_silu", backend="triton",
    summary="the MLP's input with its RMSNorm: silu(n @ Wg.T) * (n @ Wu.T), n = rmsnorm(x)",
    launcher="launch(x, norm_weight, w_gate, w_up, out, eps, w_down=None)",
    params=_matmul_params(32) + (
        BoolParam("FOLD_DOWN", False, doc="the down projection and the residual folded in: x is "
                                          "a float32 residual stream, each program's product "
                                          "added atomically into the float32 output"),
        _fold_columns(),
        _warps(4), _stages(2)),
    check=_check_norm_gate_up_silu, derive=_dtype_constants)


def _check_norm_qkv_rope(p: Mapping[str, Value]) -> Optional[str]:
    problem = _check_rope(p)
    if problem is None and p["USE_DOT"] and (p["HEAD_DIM"] < 32 or p["BLOCK_M"] < 16
                                            or p["BLOCK_K"] < 16):
        problem = ("USE_DOT needs HEAD_DIM >= 32 (two dots of D/2 columns) and BLOCK_M, BLOCK_K "
                   ">= 16 (tl.dot)")
    if problem is None and not p["USE_DOT"]:
        # the multiply-add's register tile: BLOCK_M rows x one half's columns x BLOCK_K
        problem = check_matmul_tiles({**p, "BLOCK_N": next_power_of_two(p["HEAD_DIM"] // 2)})
    return problem


NORM_QKV_ROPE = FamilySchema(
    name="norm_qkv_rope", backend="triton",
    summary="a layer's attention input: RMSNorm, q/k/v projection, RoPE and the KV-cache write",
    launcher="launch(x, norm_weight, w_qkv, positions, slots, inv_freq, q_out, k_cache, v_cache, "
             "eps, tokens=None, x_out=None, cache_positions=None)",
    params=(_dtype(),
            IntParam("HEAD_DIM", 2, 512, 64),
            IntParam("BLOCK_M", 1, 64, 16, power_of_two=True, doc="tokens per program"),
            IntParam("BLOCK_K", 16, 1024, 64, power_of_two=True, doc="reduction step"),
            BoolParam("USE_DOT", True, doc="tl.dot (tensor cores) or a broadcast multiply-add"),
            BoolParam("X_FP32", False, doc="the residual stream x (and x_out) is float32"),
            _warps(4), _stages(2)),
    check=_check_norm_qkv_rope, derive=_rope_constants)

DENSE_FAMILIES = (LINEAR, GATE_UP_SILU, RMSNORM, ROPE, ATTENTION, VARLEN_ATTENTION, GREEDY_ACCEPT,
                  CHAIN_COMMIT, LENGTH_POLICY, LENGTH_ADMIT, ROW_START,
                  KV_COMPACT, GEMV_BF16, GEMV_LOSSLESS12, FUSED_LINEAR, NORM_GATE_UP_SILU,
                  NORM_QKV_ROPE)
