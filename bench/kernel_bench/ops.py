"""The non-linear kernel families at Llama-3.1-8B sizes against their torch references.

rmsnorm (with and without the fused residual add), rope (cos/sin tables, as lowering picks),
attention (decode T=1 and verify T=5 over 1024 and 4096 cached tokens, GQA 32/8, B=1; baselines
the reference and torch SDPA), gate_up_silu (cuBLAS twice plus the activation as baseline),
greedy_accept (chain of 4 and a 7-node tree, vocabulary 128256) and kv_compact (all 32 layers at
once). Each case returns nothing; its rows go through the Runner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from specpilot.codegen.families import next_power_of_two
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime import reference_ops as ref

from .measure import compare, compare_exact, poison_, rotation_sets
from .runner import Runner, first_ok_us, row_base


@dataclass(frozen=True)
class Sizes:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    layers: int
    positions: int
    contexts: tuple
    norm_rows: tuple
    rope_tokens: tuple
    mlp_rows: tuple


LLAMA_8B = Sizes(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256,
                 layers=32, positions=8192, contexts=(1024, 4096), norm_rows=(1, 8, 64),
                 rope_tokens=(1, 5), mlp_rows=(1, 8))
SMOKE = Sizes(hidden=64, heads=2, kv_heads=1, head_dim=16, intermediate=32, vocab=64, layers=2,
              positions=64, contexts=(16,), norm_rows=(1,), rope_tokens=(1,), mlp_rows=(1,))


def _both(*checks: dict) -> dict:
    """Several comparisons of one kernel call: passes only if all do; reports the worst error."""
    errs = [c.get("rel_err") for c in checks]
    abs_errs = [c.get("max_abs_err") for c in checks if c.get("max_abs_err") is not None]
    tolerances = [c["tolerance"] for c in checks if isinstance(c.get("tolerance"), float)]
    return {"ok": all(c.get("ok") for c in checks),
            "rel_err": None if any(e is None for e in errs) else max(errs),
            "max_abs_err": max(abs_errs) if abs_errs else None,
            "tolerance": max(tolerances) if tolerances else "exact", "parts": list(checks)}


def _rand(*shape, device, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device=device) * scale).to(dtype)


def _run_pair(runner: Runner, group: str, case: str, shape: dict, M: Optional[int], spec,
              bytes_moved: int, torch_prepare: Callable, ours_prepare: Callable,
              torch_capture: bool = True, torch_kernel: str = "torch_ref") -> None:
    """The torch baseline row, then our kernel's row with the speed-up against it."""
    base_t = row_base(group, case, torch_kernel, "torch", "baseline", shape, M)
    baseline = runner.measure(base_t, torch_prepare, bytes_moved, capture=torch_capture)
    base_o = row_base(group, case, spec.family, "triton", "default", shape, M, spec)

    def prepare():
        module = runner.builder.get(spec)
        return ours_prepare(module)

    runner.measure(base_o, prepare, bytes_moved, first_ok_us([baseline]))


def run_rmsnorm(runner: Runner, sz: Sizes, device: str, l2: int, rotate: bool) -> None:
    H, eps = sz.hidden, 1e-5
    block = min(next_power_of_two(H), 4096)
    for residual in (True, False):
        spec = kernel_spec("rmsnorm", BLOCK_H=block, HAS_RESIDUAL=residual,
                           num_warps=4 if block <= 1024 else 8)
        for M in sz.norm_rows:
            nbytes = ((4 if residual else 2) * M * H + H) * 2
            sets = rotation_sets(nbytes, l2) if rotate else 1
            xs = [_rand(M, H, device=device) for _ in range(sets)]
            rs = [_rand(M, H, device=device) for _ in range(sets)] if residual else [None] * sets
            w = _rand(H, device=device, scale=0.1) + 1
            outs = [torch.empty(M, H, device=device, dtype=torch.bfloat16) for _ in range(sets)]
            r_outs = [torch.empty(M, H, device=device, dtype=torch.bfloat16) for _ in range(sets)]
            exp_out, exp_res = ref.rmsnorm_ref(xs[0], w, eps, rs[0])

            def torch_prepare():
                thunks = [lambda i=i: ref.rmsnorm_ref(xs[i], w, eps, rs[i]) for i in range(sets)]
                return thunks, lambda: compare(ref.rmsnorm_ref(xs[0], w, eps, rs[0])[0], exp_out)

            def ours_prepare(module):
                extra = (lambda i: (rs[i], r_outs[i])) if residual else (lambda i: (None, None))
                thunks = [lambda i=i: module.launch(xs[i], w, outs[i], eps, *extra(i)) for i in range(sets)]

                def check():
                    poison_(outs[0])
                    poison_(r_outs[0])
                    module.launch(xs[0], w, outs[0], eps, *extra(0))
                    parts = [compare(outs[0], exp_out)]
                    if residual:
                        parts.append(compare_exact([r_outs[0]], [exp_res]))
                    return _both(*parts)
                return thunks, check

            case = "residual" if residual else "plain"
            _run_pair(runner, "rmsnorm", case, {"H": H}, M, spec, nbytes, torch_prepare, ours_prepare)


def run_rope(runner: Runner, sz: Sizes, device: str, l2: int, rotate: bool) -> None:
    D, HQ, HK = sz.head_dim, sz.heads, sz.kv_heads
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
    cos, sin = ref.rope_cos_sin(torch.arange(sz.positions, device=device), inv_freq, torch.bfloat16)
    spec = kernel_spec("rope", HEAD_DIM=D, COS_SIN="table")
    for T in sz.rope_tokens:
        nbytes = (2 * T * (HQ + HK) * D + 2 * T * D) * 2
        sets = rotation_sets(nbytes, l2) if rotate else 1
        qs = [_rand(T, HQ, D, device=device) for _ in range(sets)]
        ks = [_rand(T, HK, D, device=device) for _ in range(sets)]
        pos = [torch.randint(0, sz.positions, (T,), device=device) for _ in range(sets)]
        q_outs = [torch.empty_like(q) for q in qs]
        k_outs = [torch.empty_like(k) for k in ks]
        exp_q = ref.rope_ref(qs[0], cos[pos[0]], sin[pos[0]])
        exp_k = ref.rope_ref(ks[0], cos[pos[0]], sin[pos[0]])

        def torch_call(i):
            c, s = cos[pos[i]], sin[pos[i]]
            return ref.rope_ref(qs[i], c, s), ref.rope_ref(ks[i], c, s)

        def torch_prepare():
            def check():
                q, k = torch_call(0)
                return _both(compare(q, exp_q), compare(k, exp_k))
            return [lambda i=i: torch_call(i) for i in range(sets)], check

        def ours_prepare(module):
            def call(i):
                module.launch(qs[i], ks[i], pos[i], q_outs[i], k_outs[i], cos=cos, sin=sin)

            def check():
                poison_(q_outs[0])
                poison_(k_outs[0])
                call(0)
                return _both(compare(q_outs[0], exp_q), compare(k_outs[0], exp_k))
            return [lambda i=i: call(i) for i in range(sets)], check

        _run_pair(runner, "rope", f"T{T}", {"Hq": HQ, "Hk": HK, "D": D}, T, spec, nbytes,
                  torch_prepare, ours_prepare)


def _attention_mask(T: int, ctx: int, S: int, device: str) -> torch.Tensor:
    mask = torch.zeros(1, T, S, dtype=torch.bool, device=device)
    mask[0, :, :ctx] = True
    mask[0, :, ctx:ctx + T] = torch.tril(torch.ones(T, T, dtype=torch.bool, device=device))
    return mask


def run_attention(runner: Runner, sz: Sizes, device: str, l2: int, rotate: bool) -> None:
    D, HQ, HKV = sz.head_dim, sz.heads, sz.kv_heads
    group = HQ // HKV
    for ctx in sz.contexts:
        for T in (1, 5):
            S = ctx + 8
            kv_len = torch.tensor([ctx + T], device=device)
            mask = _attention_mask(T, ctx, S, device)
            nbytes = 2 * (ctx + T) * HKV * D * 2 + 2 * T * HQ * D * 2 + T * S
            sets = rotation_sets(nbytes, l2) if rotate else 1
            qs = [_rand(1, T, HQ, D, device=device) for _ in range(sets)]
            kc = [_rand(1, S, HKV, D, device=device) for _ in range(sets)]
            vc = [_rand(1, S, HKV, D, device=device) for _ in range(sets)]
            outs = [torch.empty_like(q) for q in qs]
            expected = ref.attention_ref(qs[0].double(), kc[0].double(), vc[0].double(), mask, kv_len=kv_len)
            spec = kernel_spec("attention", HEAD_DIM=D, BLOCK_R=max(16, min(64, next_power_of_two(T * group))),
                               BLOCK_S=64)
            shape = {"B": 1, "T": T, "ctx": ctx, "Hq": HQ, "Hkv": HKV, "D": D}
            case = f"T{T}_ctx{ctx}"

            def torch_prepare():
                thunks = [lambda i=i: ref.attention_ref(qs[i], kc[i], vc[i], mask, kv_len=kv_len)
                          for i in range(sets)]
                return thunks, lambda: compare(ref.attention_ref(qs[0], kc[0], vc[0], mask, kv_len=kv_len),
                                               expected)

            def ours_prepare(module):
                def check():
                    poison_(outs[0])
                    module.launch(qs[0], kc[0], vc[0], mask, outs[0], kv_len=kv_len)
                    return compare(outs[0], expected)
                return [lambda i=i: module.launch(qs[i], kc[i], vc[i], mask, outs[i], kv_len=kv_len)
                        for i in range(sets)], check

            _run_pair(runner, "attention", case, shape, T, spec, nbytes, torch_prepare, ours_prepare)

            # torch SDPA over the same cache layout (GQA through enable_gqa), as a stronger baseline.
            n = ctx + T
            sdpa_mask = mask[:, None, :, :n]

            def sdpa(i):
                q = qs[i].transpose(1, 2)
                k = kc[i][:, :n].transpose(1, 2)
                v = vc[i][:, :n].transpose(1, 2)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, enable_gqa=True).transpose(1, 2)

            def sdpa_prepare():
                return [lambda i=i: sdpa(i) for i in range(sets)], lambda: compare(sdpa(0), expected)

            runner.measure(row_base("attention", case, "torch_sdpa", "torch", "baseline", shape, T),
                           sdpa_prepare, nbytes)


def run_gate_up_silu(runner: Runner, sz: Sizes, device: str, l2: int, rotate: bool) -> None:
    I, K = sz.intermediate, sz.hidden
    sets = rotation_sets(2 * I * K * 2, l2) if rotate else 1
    wg0 = _rand(I, K, device=device, scale=0.02)
    wu0 = _rand(I, K, device=device, scale=0.02)
    wgs = [wg0] + [wg0.clone() for _ in range(sets - 1)]
    wus = [wu0] + [wu0.clone() for _ in range(sets - 1)]
    for M in sz.mlp_rows:
        try:
            from specpilot.codegen.lower import matmul_tiles
            tiles = matmul_tiles(M, I, K, 32)
        except Exception:
            tiles = {}
        spec = kernel_spec("gate_up_silu", **tiles)
        xs = [_rand(M, K, device=device) for _ in range(sets)]
        outs = [torch.empty(M, I, device=device, dtype=torch.bfloat16) for _ in range(sets)]
        x64 = xs[0].double()
        expected = F.silu(x64 @ wg0.double().T) * (x64 @ wu0.double().T)
        nbytes = (2 * I * K + M * K + M * I) * 2

        def torch_call(i):
            return F.silu(F.linear(xs[i], wgs[i])) * F.linear(xs[i], wus[i])

        def torch_prepare():
            return [lambda i=i: torch_call(i) for i in range(sets)], lambda: compare(torch_call(0), expected)

        def ours_prepare(module):
            def check():
                poison_(outs[0])
                module.launch(xs[0], wgs[0], wus[0], outs[0])
                return compare(outs[0], expected)
            return [lambda i=i: module.launch(xs[i], wgs[i], wus[i], outs[i]) for i in range(sets)], check

        _run_pair(runner, "gate_up_silu", "llama", {"I": I, "K": K}, M, spec, nbytes, torch_prepare,
                  ours_prepare, torch_kernel="torch_cublas")


TREES = {"chain4": (-1, 0, 1, 2), "tree7": (-1, -1, 0, 0, 2, 4, 1)}


def run_greedy_accept(runner: Runner, sz: Sizes, device: str, l2: int, rotate: bool) -> None:
    V = sz.vocab
    spec = kernel_spec("greedy_accept", BLOCK_V=max(64, min(2048, next_power_of_two(V))))
    for name, parent_list in TREES.items():
        N = len(parent_list)
        parents = torch.tensor(parent_list, device=device)
        nbytes = (N + 1) * V * 4
        sets = rotation_sets(nbytes, l2) if rotate else 1
        logits = [torch.randn(1, N + 1, V, device=device) for _ in range(sets)]
        tokens = []
        for lg in logits:  # accept along node 0 then its first child: a path of length >= 2
            pred = lg.argmax(-1)
            t = torch.randint(0, V, (1, N), device=device)
            t[0, 0] = pred[0, 0]
            child = parent_list.index(0)
            t[0, child] = pred[0, 1]
            tokens.append(t)
        outs = [[torch.empty(s, dtype=torch.int64, device=device) for s in ((1, N + 1), (1,), (1, N), (1,))]
                for _ in range(sets)]
        expected = ref.greedy_accept_ref(logits[0], tokens[0], parents)

        def torch_prepare():
            thunks = [lambda i=i: ref.greedy_accept_ref(logits[i], tokens[i], parents) for i in range(sets)]
            return thunks, lambda: compare_exact(ref.greedy_accept_ref(logits[0], tokens[0], parents), expected)

        def ours_prepare(module):
            def check():
                for o in outs[0]:
                    poison_(o)
                module.launch(logits[0], tokens[0], parents, *outs[0])
                return compare_exact(outs[0], expected)
            return [lambda i=i: module.launch(logits[i], tokens[i], parents, *outs[i]) for i in range(sets)], check

        # The reference walks the tree on the host (it synchronises): timed eagerly.
        base_t = row_base("greedy_accept", name, "torch_ref", "torch", "baseline", {"N": N, "V": V})
        baseline = runner.measure(base_t, torch_prepare, nbytes, capture=False)
        base_o = row_base("greedy_accept", name, "greedy_accept", "triton", "default", {"N": N, "V": V},
                          spec=spec)
        runner.measure(base_o, lambda: ours_prepare(runner.builder.get(spec)), nbytes,
                       first_ok_us([baseline]))


def run_kv_compact(runner: Runner, sz: Sizes, device: str, l2: int, rotate: bool) -> None:
    L, HKV, D, ctx = sz.layers, sz.kv_heads, sz.head_dim, sz.contexts[-1]
    S = ctx + 16
    k_cache = _rand(L, 1, S, HKV, D, device=device)
    v_cache = _rand(L, 1, S, HKV, D, device=device)
    src = torch.tensor([[ctx, ctx + 2, ctx + 3, ctx + 3]], device=device)
    start = torch.tensor([ctx], device=device)
    counts = torch.tensor([3], device=device)
    dst_idx = torch.arange(ctx, ctx + 3, device=device)
    src_idx = src[0, :3]
    spec = kernel_spec("kv_compact", BLOCK=max(32, min(1024, next_power_of_two(HKV * D))))
    nbytes = 2 * L * 3 * HKV * D * 2 * 2
    shape = {"L": L, "S": S, "Hkv": HKV, "D": D, "moved": 3}

    def torch_call(k, v):
        k[:, 0, dst_idx] = k[:, 0, src_idx]
        v[:, 0, dst_idx] = v[:, 0, src_idx]

    def check_on_copies(call):
        # The caches change in place while other rows are timed: compare on fresh copies.
        k, v = k_cache.clone(), v_cache.clone()
        expected = [ref.kv_compact_ref(k, src, start, counts), ref.kv_compact_ref(v, src, start, counts)]
        call(k, v)
        return compare_exact([k, v], expected)

    def torch_prepare():
        def check():
            return check_on_copies(torch_call)
        return [lambda: torch_call(k_cache, v_cache)], check

    def ours_prepare(module):
        def check():
            return check_on_copies(lambda k, v: module.launch(k, v, src, start, counts))
        return [lambda: module.launch(k_cache, v_cache, src, start, counts)], check

    # Repeated calls in place move the same rows (their contents drift, the work does not); the
    # few rows moved stay in L2 whatever is rotated, so one buffer set is used.
    _run_pair(runner, "kv_compact", "accept3", shape, None, spec, nbytes, torch_prepare, ours_prepare,
              torch_kernel="torch_index_copy")


OPS = (run_rmsnorm, run_rope, run_attention, run_gate_up_silu, run_greedy_accept, run_kv_compact)
