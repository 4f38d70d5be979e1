"""Benchmarks: SpecPilot's decoders side by side with HF transformers on a real model pair
(`pair_bench`), and step costs of shape-only presets with replayed acceptance (`shapes_bench`).

Kept free of imports so `import specpilot.bench.<module>` loads only what it needs."""
