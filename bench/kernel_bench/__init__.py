"""Parts of bench/kernels.py: timing and correctness (measure), row bookkeeping and builds
(runner), the linear layers (linears), the other kernel families (ops), the markdown (report)."""
