"""Every one of the 65,536 bf16 bit patterns round-trips bit-exactly through lossless12.

Each pattern is tried in several contexts, since whether a value is coded or escaped depends on
its group's base: all patterns in one tensor, each one alone in a group of realistic weights, odd
K, and groups whose base is pinned at an extreme by their other values.
"""
import pytest
import torch

from specpilot.codegen.formats.lossless12 import decode_reference, pack_lossless12, unpack_lossless12


def all_bf16_patterns() -> torch.Tensor:
    """The 65,536 bf16 values (every bit pattern once) as a 1-D tensor."""
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def assert_round_trips(w: torch.Tensor, group_size) -> None:
    t = pack_lossless12(w, group_size)
    expected = w.view(torch.int16)
    assert torch.equal(unpack_lossless12(t).view(torch.int16), expected)
    assert torch.equal(decode_reference(t).view(torch.int16), expected)


def embed_one_per_group(filler: torch.Tensor, values: torch.Tensor, group: int, gen: torch.Generator):
    """Place each of `values` at a random column of its own random group of `group` columns."""
    n, k = filler.shape
    per_row = -(-k // group)
    chosen = torch.randperm(n * per_row, generator=gen)[: values.numel()]
    assert chosen.numel() == values.numel(), "not enough groups for one value each"
    rows, gi = chosen // per_row, chosen % per_row
    width = torch.clamp(k - gi * group, max=group)  # the last group of a row may be shorter
    cols = gi * group + (torch.rand(values.numel(), generator=gen) * width).long()
    w = filler.clone()
    w[rows, cols] = values
    return w


@pytest.mark.parametrize("group_size", [None, "row", 2, 64, 128])
@pytest.mark.parametrize("order", ["natural", "shuffled"])
def test_every_pattern_in_one_tensor(group_size, order):
    values = all_bf16_patterns()
    if order == "shuffled":
        values = values[torch.randperm(values.numel())]
    assert_round_trips(values.reshape(256, 256), group_size)


@pytest.mark.parametrize("group_size", [2, 64, "row", 301])
def test_every_pattern_with_odd_k(group_size):
    # 256 x 257 holds the 65,536 patterns plus 256 realistic weights, in random order.
    values = torch.cat([all_bf16_patterns(), (torch.randn(256) * 0.02).bfloat16()])
    values = values[torch.randperm(values.numel())]
    assert_round_trips(values.reshape(256, 257), group_size)
    assert_round_trips(values.reshape(257, 256)[:, :255].contiguous(), group_size)


def test_every_pattern_with_odd_k_per_tensor():
    values = torch.cat([all_bf16_patterns(), (torch.randn(256) * 0.02).bfloat16()])
    assert_round_trips(values[torch.randperm(values.numel())].reshape(256, 257), None)


@pytest.mark.parametrize("group_size,shape", [(None, (1024, 4096)), ("row", (1024, 4096)),
                                              (64, (1024, 4096)),
                                              (64, (2048, 2047)), (128, (2048, 4096))])
def test_every_pattern_alone_among_normal_weights(group_size, shape):
    gen = torch.default_generator  # seeded per test by tests/conftest.py
    filler = (torch.randn(shape, generator=gen) * 0.02).bfloat16()
    values = all_bf16_patterns()[torch.randperm(65536, generator=gen)]
    w = embed_one_per_group(filler, values, group_size if isinstance(group_size, int) else 64, gen)
    assert_round_trips(w, group_size)


def extreme_filler(kind: str, shape, gen: torch.Generator) -> torch.Tensor:
    """Weights whose exponents pin every group's base: at the top, at the bottom, or on inf/NaN.

    Exponents cycle along each row through 15 consecutive values, so every group of 64 holds each
    of them at least 4 times and exactly one window of 15 covers all its fillers.
    """
    n, k = shape
    sign = torch.randint(0, 2, shape, generator=gen) << 15
    mantissa = torch.randint(0, 128, shape, generator=gen)
    cycle = (torch.arange(k) % 15).expand(n, k)
    first = {"huge": 240, "tiny": 1, "nonfinite": 255}[kind]   # 240..254, 1..15, or 255 (inf/NaN)
    exponent = torch.full(shape, 255) if kind == "nonfinite" else first + cycle
    bits = sign | (exponent << 7) | mantissa
    return bits.to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("kind", ["huge", "tiny", "nonfinite"])
@pytest.mark.parametrize("group_size", [None, "row", 64])
def test_every_pattern_in_groups_with_extreme_bases(kind, group_size):
    gen = torch.default_generator  # seeded per test by tests/conftest.py
    filler = extreme_filler(kind, (1024, 4096), gen)
    values = all_bf16_patterns()[torch.randperm(65536, generator=gen)]
    w = embed_one_per_group(filler, values, 64, gen)
    t = pack_lossless12(w, group_size)
    # The fillers outnumber the probes 63 to 1, so only the window covering theirs can win.
    expected_base = {"huge": 240, "tiny": 1, "nonfinite": 241}[kind]
    assert torch.all(t.base == expected_base)
    assert torch.equal(unpack_lossless12(t).view(torch.int16), w.view(torch.int16))
    assert torch.equal(decode_reference(t).view(torch.int16), w.view(torch.int16))
