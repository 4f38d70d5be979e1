"""Code generation: kernel specs, template rendering, the kernel cache and the builders.

    kernel_spec.py   KernelSpec (family + validated params) and the family registry
    families.py      the dense families: parameter schemas and launcher contracts
    params.py        typed parameters and FamilySchema
    render.py        render_kernel: spec -> source through templates/<backend>/<family>.*.j2
    cache.py         content-addressed KernelCache and build_triton_module
    cuda_build.py    compile_cuda_object and build_cuda_module (nvcc, sm_90)
    cuda_launchers.py host-side launchers of the CUDA families
    build.py         build_kernel / try_build_kernel for any backend
    round_end.py     the kernels that end a graphed chain round, by plan node, and their build
    formats/         weight formats and the kernel families that read them

Kept free of imports so that `import specpilot.codegen` stays cheap.
"""
