"""GPU specs for the roofline: memory bandwidth, matrix and vector FLOP/s, SM count, launch
overhead. Five GPUs are built in with their datasheet figures; `measure_device`
(specpilot/cost/measure.py) measures the present device and its figures override these.

Datasheet figures are the vendor's dense (no sparsity) peak numbers for the SXM/PCIe part named;
launch overheads are not on any datasheet: the built-in value is the usual few microseconds of an
eager CUDA kernel launch, labelled as an estimate, and a measurement replaces it.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Dict, Optional

from specpilot.ir.errors import SpecPilotError

TB = 1e12
GB = 1e9
# An eager CUDA launch costs the host a few microseconds; a measured value overrides this.
ESTIMATED_LAUNCH_OVERHEAD_S = 5e-6


class UnknownGpu(SpecPilotError):
    """A GPU name that matches no built-in spec."""


@dataclass(frozen=True)
class GpuSpec:
    """What the roofline needs of a device.

    memory_bandwidth: bytes/s of device memory (HBM/GDDR, or DRAM for a CPU).
    matmul_flops: dense 16-bit matrix FLOP/s (tensor cores), used for bfloat16 models.
    vector_flops: FP32 FLOP/s without tensor cores, used for float32 models.
    launch_overhead_s: seconds one kernel launch (one op, on a CPU) costs beyond its work.
    source: where the numbers come from ("datasheet", "measured", "nominal").
    graphed_launch_s: seconds one tiny kernel costs when replayed inside a CUDA graph (measured
      on a GPU; None where unknown, and the roofline assumes a share of the eager overhead).
    """
    name: str
    memory_bandwidth: float
    matmul_flops: float
    vector_flops: float
    sm_count: int
    launch_overhead_s: float
    memory_bytes: float
    source: str = "datasheet"
    graphed_launch_s: Optional[float] = None

    def flops_for(self, dtype: str) -> float:
        """Peak matmul rate for a model computing in `dtype`."""
        return self.matmul_flops if dtype == "bfloat16" else self.vector_flops

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "GpuSpec":
        optional = {"source", "graphed_launch_s"}   # specs written before they existed
        try:
            return cls(**{k: obj[k] for k in cls.__dataclass_fields__
                          if k in obj or k not in optional})
        except (KeyError, TypeError) as exc:
            raise SpecPilotError(f"not a GPU spec: {exc}") from None

    def overridden_by(self, measured: "GpuSpec") -> "GpuSpec":
        """This spec with the measured bandwidth, matmul rate and launch overheads."""
        return replace(self, memory_bandwidth=measured.memory_bandwidth,
                       matmul_flops=measured.matmul_flops, vector_flops=measured.vector_flops,
                       launch_overhead_s=measured.launch_overhead_s,
                       graphed_launch_s=measured.graphed_launch_s,
                       source=f"measured ({measured.name}) over {self.source}")


BUILTIN_GPUS: Dict[str, GpuSpec] = {
    # H100 SXM5 80 GB: HBM3 3.35 TB/s, BF16 989 TFLOP/s dense, FP32 67 TFLOP/s, 132 SMs.
    "h100": GpuSpec("H100 SXM5 80GB", 3.35 * TB, 989 * TB, 67 * TB, 132,
                    ESTIMATED_LAUNCH_OVERHEAD_S, 80 * GB),
    # H200 SXM 141 GB: HBM3e 4.8 TB/s, same compute as the H100 SXM.
    "h200": GpuSpec("H200 SXM 141GB", 4.8 * TB, 989 * TB, 67 * TB, 132,
                    ESTIMATED_LAUNCH_OVERHEAD_S, 141 * GB),
    # A100 SXM4 80 GB: HBM2e 2.039 TB/s, BF16 312 TFLOP/s, FP32 19.5 TFLOP/s, 108 SMs.
    "a100": GpuSpec("A100 SXM4 80GB", 2.039 * TB, 312 * TB, 19.5 * TB, 108,
                    ESTIMATED_LAUNCH_OVERHEAD_S, 80 * GB),
    # L40S: GDDR6 864 GB/s, BF16 362 TFLOP/s dense, FP32 91.6 TFLOP/s, 142 SMs.
    "l40s": GpuSpec("L40S 48GB", 864 * GB, 362 * TB, 91.6 * TB, 142,
                    ESTIMATED_LAUNCH_OVERHEAD_S, 48 * GB),
    # RTX 4090: GDDR6X 1008 GB/s, BF16 (FP32 accumulate) 165 TFLOP/s dense, FP32 82.6, 128 SMs.
    "rtx4090": GpuSpec("GeForce RTX 4090 24GB", 1008 * GB, 165.2 * TB, 82.6 * TB, 128,
                       ESTIMATED_LAUNCH_OVERHEAD_S, 24 * GB),
}

# A CPU has no datasheet entry here: these round numbers only give the roofline a scale until
# `measure_device` replaces them (compile always measures).
NOMINAL_CPU = GpuSpec("cpu", 10 * GB, 50 * GB, 50 * GB, 0, 5e-6, 16 * GB, source="nominal")

_ALIASES = (("rtx4090", r"4090"), ("l40s", r"l40s"), ("h200", r"h200"), ("h100", r"h100"),
            ("a100", r"a100"))


def gpu_key(name: str) -> str:
    """The built-in key a device name refers to ('NVIDIA H200' -> 'h200'), 'cpu' for a CPU.
    Raises UnknownGpu naming the known keys."""
    text = re.sub(r"[\s_-]+", "", name.lower())
    if text in ("cpu", ""):
        return "cpu"
    for key, pattern in _ALIASES:
        if re.search(pattern, text):
            return key
    raise UnknownGpu(f"unknown GPU {name!r}: built-in specs are {', '.join(sorted(BUILTIN_GPUS))} "
                     "and cpu; on the device itself use --gpu measure")


def gpu_spec(name: str) -> GpuSpec:
    """The built-in spec of a GPU name (any spelling gpu_key understands), or the nominal CPU."""
    key = gpu_key(name)
    return NOMINAL_CPU if key == "cpu" else BUILTIN_GPUS[key]
