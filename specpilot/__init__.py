"""SpecPilot: a compiler for lossless speculative decoding.

Kept light on purpose: importing `specpilot.ir` must not pull in agents, kernels or the CLI.
"""
__version__ = "0.1.0"
