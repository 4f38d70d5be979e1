"""The cost model: a roofline per IR node on a GPU spec, acceptance models, calibration against
measurements, and CostReports that split the gap to the ceiling by category.

    gpu_specs.py   GpuSpec, the built-in H100/H200/A100/L40S/RTX 4090 datasheet specs
    measure.py     measure_device: bandwidth, matmul rate, launch overhead of the present device
    acceptance.py  RankProfile (measured) and per-depth acceptance models
    topologies.py  the chains and trees the search considers
    roofline.py    NodeCost of every node of a step, and how its time splits by category
    calibrate.py   Calibration fitted on measured runs
    model.py       CostModel: step, workload and report
    report.py      CostReport and its categories
"""
from .acceptance import (AssumedAcceptance, ChainProfileAcceptance, RankProfile, load_acceptance,
                         measure_rank_profile)
from .calibrate import Calibration, CalibrationPoint
from .gpu_specs import BUILTIN_GPUS, GpuSpec, UnknownGpu, gpu_key, gpu_spec
from .measure import measure_device
from .model import CostModel, WorkloadPrediction
from .report import CATEGORIES, CATEGORY_TITLES, GAP_CATEGORIES, CostReport

__all__ = ["AssumedAcceptance", "ChainProfileAcceptance", "RankProfile", "load_acceptance",
           "measure_rank_profile", "Calibration", "CalibrationPoint", "BUILTIN_GPUS", "GpuSpec",
           "UnknownGpu", "gpu_key", "gpu_spec", "measure_device", "CostModel",
           "WorkloadPrediction", "CATEGORIES", "CATEGORY_TITLES", "GAP_CATEGORIES", "CostReport"]
