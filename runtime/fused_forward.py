"""A small model's forward in fused kernels: five launches a layer and one for the LM head.

A decode step of a small model is bound by how many kernels it launches, not by the bytes it
reads (runtime/fast_ops.py). The zoo's drafter (4 layers of 384) reads 25 MB, a few microseconds
of H200 bandwidth, yet its per-op step launches some 20 kernels a layer (the target's per-op
forward launched 255 for its 12 layers, BENCHMARKS.md), and a chain round runs one step per
drafted token. Here each layer is

    norm_qkv_rope      RMSNorm, the q/k/v projection, RoPE, k/v written into the cache
    attention          over the cache with the caller's mask, up to each request's last
                       visible slot (the first layer's kernel finds it in the mask and
                       hands it on to the others), or with none in a chain's rounds (slots
                       up to each query's position); each walk shared by a few programs
    fused_linear       o_proj plus the residual
    norm_gate_up_silu  RMSNorm and the MLP's gate/up with SiLU
    fused_linear       down_proj plus the residual

and the LM head is one fused_linear with the final norm, writing float32 logits. The first
layer's norm_qkv_rope also gathers the embeddings and records the tokens' positions in the cache.

Folded (`fold=True`; by default as codegen/fused_layer.py's `fold_default()` says), a layer is
three launches: the attention adds its heads' share of o_proj, and the MLP its columns' share of
down_proj, into a float32 residual stream atomically, so neither has a launch of its own. The
stream is then float32 throughout (each layer's two sums zeroed by one fill a forward), where the
unfolded kernels round it to the dtype after each add as HF does; the drafter's proposals may
then differ from the per-op drafter's at near-ties, never the decoder's output.

It serves the drafter (a Program's kernels.drafter_kernels = "fused"). A drafter only proposes
tokens and the target verifies every one, so the decoder's output does not depend on it; its
roundings follow the per-op path's (HF's) all the same, except the MLP, which rounds once from
the normalised rows on (gate_up_silu's numerics), so its proposals match the per-op drafter's
but for near-ties. The kernels are the codegen families of the same names (codegen/families.py),
each tested against its torch reference.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

import torch

from specpilot.ir.errors import SpecPilotError

from .generated_attention import DTYPE_NAMES, attention_head_dims
from .torch_backend import TorchBackend

# New tokens per call (batch x width) past which the model's own forward runs instead: the fused
# kernels tile 16 rows at a time and every row block re-reads its layer's weights, right for
# decode steps and chain catch-ups, wasteful for a prefill of whole prompts (cuBLAS's GEMMs).
MAX_FUSED_TOKENS = 256


@dataclass
class FusedLayer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


def fused_specs(model, fold: Optional[bool] = None) -> dict:
    """The fused kernels' specs for `model`'s widths and dtype (codegen/fused_layer.py's
    `fused_layer_specs`): what a FusedForward builds unless told otherwise. `fold`: o_proj and
    down_proj folded into the attention and the MLP (default: codegen/fused_layer.py's
    `fold_default()`)."""
    from specpilot.codegen.fused_layer import fused_layer_specs

    cfg = model.config
    return fused_layer_specs(DTYPE_NAMES[model.dtype], cfg.hidden_size, cfg.num_heads,
                             cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, fold=fold)


def fused_forward_refusal(model) -> Optional[str]:
    """Why `model` cannot run as fused kernels (None when it can)."""
    cfg = model.config
    if not isinstance(model.backend, TorchBackend):
        return "it needs dense weights on the torch backend"
    if model.dtype not in DTYPE_NAMES:
        return f"dtype {model.dtype} has no fused kernels"
    if cfg.qk_norm:
        return "q/k norms (Qwen3) are not fused"
    if cfg.attention_bias or cfg.o_bias or cfg.mlp_bias:
        return "linear biases are not fused"
    if model._windows():
        return "sliding-window layers are not fused"
    if not model.layers:
        return "it has no layers"
    low, high = attention_head_dims()
    if cfg.head_dim % 2 or not low <= cfg.head_dim <= high:
        return (f"head_dim {cfg.head_dim} is odd or outside {low}..{high} (RoPE pairs its "
                f"halves; the attention kernel takes {low} to {high})")
    from specpilot.codegen.cache import triton_refusal
    return triton_refusal(model.device)


class FusedForward:
    """`model`'s forward (runtime/model.py's contract) run by the fused kernels, up to
    MAX_FUSED_TOKENS new tokens a call (the model's own forward beyond); every other attribute
    (config, dtype, new_cache, ...) is the model's."""

    # `forward` and `greedy` take mask None for a chain's layout, a query at position p seeing
    # the cache's slots 0..p (its tokens written at slots equal to their positions): the
    # attention then reads no mask, and its caller builds none (runtime/graphed_chain.py).
    sees_by_position = True

    def __init__(self, model, kernel_cache=None, specs=None, fold: Optional[bool] = None):
        why = fused_forward_refusal(model)
        if why is not None:
            raise SpecPilotError(f"the fused forward cannot run this model: {why}")
        # Imported here: only a Program that asks for fused kernels needs codegen.
        from specpilot.codegen.cache import KernelCache, build_triton_module
        from specpilot.codegen.fused_layer import attention_splits

        self.model = model
        self.fused_layers = [self._layer(layer) for layer in model.layers]
        # `specs` replaces some of the six (by name): how a tile sweep times other tiles in a
        # whole forward (bench/fused_tile_sweep.py).
        specs = {**fused_specs(model, fold), **(specs or {})}
        # Folded: no o_proj or down_proj launches, a float32 residual stream, which every kernel
        # that reads or writes the stream must take.
        self.folded = bool(specs["mlp"].get("FOLD_DOWN"))
        mixed = [name for name, flag in (("attention", "FOLD_O"), ("qkv", "X_FP32"),
                                         ("head", "X_FP32"))
                 if bool(specs[name].get(flag)) != self.folded]
        if mixed:
            raise SpecPilotError(
                f"the fused specs mix folded and unfolded kernels: the MLP's FOLD_DOWN is "
                f"{self.folded}, but {', '.join(mixed)} disagree (FOLD_O on the attention, "
                f"X_FP32 on qkv and head must match it)")
        # One cache for all the builds: o_proj's and down_proj's specs are often the same.
        cache = kernel_cache if kernel_cache is not None else KernelCache()
        self.qkv, self.mlp, self.head = (build_triton_module(specs[name], cache)
                                         for name in ("qkv", "mlp", "head"))
        self.o_proj, self.down = ((None, None) if self.folded else
                                  (build_triton_module(specs[name], cache)
                                   for name in ("o_proj", "down")))
        # The attention at each power-of-two split count up to its spec's, one picked per
        # launch by how many walks it has (codegen/fused_layer.py, `attention_splits`).
        attention = specs["attention"]
        most = attention.get("SPLITS")
        self._attention_by_splits = {
            1 << i: build_triton_module(attention.with_params(SPLITS=1 << i), cache)
            for i in range(most.bit_length())}
        self._attention_rows = attention.get("BLOCK_R")          # query rows a program
        self._splits_for = attention_splits
        self.lm_head_weight = model.lm_head[0]
        # The head again, with each row's argmax in the kernel (`greedy`).
        self.head_argmax = build_triton_module(specs["head"].with_params(ARGMAX=True), cache)
        self._new_workspaces()

    def _new_workspaces(self) -> None:
        """The head's argmax workspace and the split attention walks' partials and counts, for
        any call the fused kernels take (up to MAX_FUSED_TOKENS tokens); made here, not in a
        captured forward, where the counts' zeroing would become a kernel of every replay."""
        cfg, dev = self.model.config, self.model.device
        self._argmax_workspace = self.head_argmax.argmax_workspace(
            MAX_FUSED_TOKENS, cfg.vocab_size, dev)
        most = max(self._attention_by_splits)
        self._attention_workspace = (
            self._attention_by_splits[most].split_workspace(
                MAX_FUSED_TOKENS, 1, cfg.num_heads, cfg.num_kv_heads, dev) if most > 1 else None)

    def with_own_workspaces(self) -> "FusedForward":
        """This forward with workspaces of its own, weights and kernels shared: for forwards
        that may run at the same time as this one's on another stream (a newcomer's prefill
        beside the rounds: runtime/row_prefill.py). A workspace serves one call at a time: two
        split attentions at once on the same partials and counts corrupt each other's merge, and
        a count left off by that breaks every later merge of its program."""
        twin = copy.copy(self)
        twin._new_workspaces()
        return twin

    @staticmethod
    def _layer(layer) -> FusedLayer:
        lin = layer.linears
        weight = lambda name: lin[name][0]                                   # noqa: E731
        if "self_attn.qkv_proj" in lin:
            w_qkv = weight("self_attn.qkv_proj")
        else:
            w_qkv = torch.cat([weight(f"self_attn.{x}_proj") for x in "qkv"])
        if "mlp.gate_up_proj" in lin:
            w_gate, w_up = weight("mlp.gate_up_proj").chunk(2, dim=0)
        else:
            w_gate, w_up = weight("mlp.gate_proj"), weight("mlp.up_proj")
        return FusedLayer(layer.input_norm, layer.post_norm, w_qkv,
                          weight("self_attn.o_proj"), w_gate, w_up, weight("mlp.down_proj"))

    @property
    def unfused(self):
        """The model itself, for the runtimes the fused kernels do not serve (the ragged
        layout's packed attention: runtime/ragged.py)."""
        return self.model

    def __getattr__(self, name):
        # Only reached for names FusedForward does not define itself; AttributeError (not
        # KeyError) before `model` is set, as copy and pickle expect.
        try:
            model = self.__dict__["model"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(model, name)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor, cache, logits_at: Optional[torch.Tensor] = None) -> torch.Tensor:
        """As `Transformer.forward`: tokens [B, T] written at `slots`, mask [B, T, S] (or None:
        slots 0..p visible at position p), float32 logits [B, T, V] (or [B, R, V] at the rows
        logits_at [B, R] picks)."""
        b, t = tokens.shape
        if b * t > MAX_FUSED_TOKENS:
            return self.model.forward(tokens, positions, slots, self._or_causal(mask, positions,
                                                                                cache),
                                      cache, logits_at)
        rows = self._layers(tokens, positions, slots, mask, cache, logits_at)
        return self._head(rows, greedy=False).view(b, -1, self.config.vocab_size)

    @torch.no_grad()
    def greedy(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               mask: torch.Tensor, cache, logits_at: Optional[torch.Tensor] = None) -> torch.Tensor:
        """torch.argmax over the vocabulary of `forward`'s logits, [B, T] (or [B, R]) int64,
        found by the LM head's kernel itself: a drafter's step without an argmax launch. One
        call at a time (the kernel's workspace is this object's)."""
        b, t = tokens.shape
        if b * t > MAX_FUSED_TOKENS:
            mask = self._or_causal(mask, positions, cache)
            return torch.argmax(self.model.forward(tokens, positions, slots, mask, cache,
                                                   logits_at), dim=-1)
        rows = self._layers(tokens, positions, slots, mask, cache, logits_at)
        return self._head(rows, greedy=True).view(b, -1)

    def kernel_modules(self) -> dict:
        """{role: [built modules]} of every kernel a forward may launch: the layer's five (three
        folded), the attention at each split count, the head with and without the argmax."""
        roles = {"qkv": [self.qkv], "attention": list(self._attention_by_splits.values()),
                 "o_proj": [self.o_proj], "mlp": [self.mlp], "down": [self.down],
                 "head": [self.head], "head_argmax": [self.head_argmax]}
        return {role: built for role, built in roles.items() if built != [None]}

    @staticmethod
    def _or_causal(mask: Optional[torch.Tensor], positions: torch.Tensor, cache) -> torch.Tensor:
        """`mask`, or where it is None the mask it stands for (slots 0..p at position p): the
        model's own forward, which takes wider calls, reads one."""
        if mask is not None:
            return mask
        slots = torch.arange(cache.capacity, device=positions.device)
        return slots[None, None, :] <= positions[:, :, None]

    def _attention_for(self, b: int, t: int):
        """(the attention module, its workspace or None) for a call of b requests of t tokens:
        split as `attention_splits` says for its walks."""
        cfg = self.model.config
        group = cfg.num_heads // cfg.num_kv_heads
        walks = b * cfg.num_kv_heads * -(-t * group // self._attention_rows)
        splits = self._splits_for(walks, max(self._attention_by_splits))
        return (self._attention_by_splits[splits],
                self._attention_workspace if splits > 1 else None)

    def _head(self, rows: torch.Tensor, greedy: bool) -> torch.Tensor:
        """The final norm and LM head of `rows` [R, H]: float32 logits [R, V], or with
        `greedy` each row's argmax [R] (int64), found in the same kernel."""
        logits = torch.empty((rows.shape[0], self.config.vocab_size), dtype=torch.float32,
                             device=rows.device)
        norm = dict(norm_weight=self.model.final_norm, eps=self.config.rms_norm_eps)
        if not greedy:
            self.head.launch(rows, self.lm_head_weight, logits, **norm)
            return logits
        best = torch.empty(rows.shape[0], dtype=torch.int64, device=rows.device)
        self.head_argmax.launch(rows, self.lm_head_weight, logits, **norm, argmax_out=best,
                                workspace=self._argmax_workspace)
        return best

    def _layers(self, tokens, positions, slots, mask, cache, logits_at) -> torch.Tensor:
        """The decoder layers' output rows [B*T, H] (or the [B*R, H] rows logits_at picks),
        before the final norm."""
        model, cfg = self.model, self.model.config
        b, t = tokens.shape
        m, hidden, dev, dt = b * t, cfg.hidden_size, tokens.device, model.dtype
        q = torch.empty((b, t, cfg.num_heads, cfg.head_dim), dtype=dt, device=dev)
        if self.folded:
            x = torch.empty((m, hidden), dtype=torch.float32, device=dev)
            # Each layer's two sums (after the attention, after the MLP), zeros for the atomic
            # adds: one fill a forward.
            sums = torch.zeros((len(self.fused_layers), 2, m, hidden), dtype=torch.float32,
                               device=dev)
        else:
            x = torch.empty((m, hidden), dtype=dt, device=dev)
            mid = torch.empty_like(x)
            attended = torch.empty_like(q)
            act = torch.empty((m, cfg.intermediate_size), dtype=dt, device=dev)
        positions, slots = positions.contiguous(), slots.contiguous()
        causal = mask is None
        if not causal and mask.stride(-1) != 1:   # the kernels take row strides: a tree
            mask = mask.contiguous()              # level's rows of its round's mask need no copy
        # Per request, one past the last slot any of its queries sees: the attention walks no
        # further. A decoder's cache is sized for its whole run, so a step early in it would
        # otherwise walk slots nothing sees (on an H200, at batch 16 with 192 of 457 slots in
        # use, the attention was 38 % of the drafter's kernel time). The first layer's kernel
        # reads it from the mask itself, so it holds for any caller's layout, and writes it here
        # for the other layers: no launches of its own (two a step when a separate multiply
        # and max found it, some 7 us of a 110 us drafter step; BENCHMARKS.md, 23rd set).
        kv_len = None if causal else torch.empty(b, dtype=torch.int32, device=dev)
        eps = cfg.rms_norm_eps
        attention, workspace = self._attention_for(b, t)
        for i, layer in enumerate(self.fused_layers):
            first = i == 0
            self.qkv.launch(model.embed if first else x, layer.input_norm, layer.w_qkv, positions,
                            slots, model.inv_freq, q, cache.k[i], cache.v[i], eps,
                            tokens=tokens if first else None, x_out=x if first else None,
                            cache_positions=cache.positions if first else None)
            bound = ({"positions": positions} if causal else
                     {"kv_len_out": kv_len} if first else {"kv_len": kv_len})
            if self.folded:       # o_proj and down_proj add into this layer's two sums
                mid, after = sums[i]
                attention.launch(q, cache.k[i], cache.v[i], mask, mid, model.scale,
                                 workspace=workspace, w_o=layer.w_o, residual=x, **bound)
                self.mlp.launch(mid, layer.post_norm, layer.w_gate, layer.w_up, after, eps,
                                w_down=layer.w_down)
                x = after
            else:
                attention.launch(q, cache.k[i], cache.v[i], mask, attended, model.scale,
                                 workspace=workspace, **bound)
                self.o_proj.launch(attended.view(m, -1), layer.w_o, mid, residual=x)
                self.mlp.launch(mid, layer.post_norm, layer.w_gate, layer.w_up, act, eps)
                self.down.launch(act, layer.w_down, x, residual=mid)
        rows = x.view(b, t, hidden)
        if logits_at is not None:
            rows = torch.gather(rows, 1, logits_at[:, :, None].expand(-1, -1, hidden))
        return rows.reshape(-1, hidden)
