"""Installs the sample_fc library (its backbones, sample_fc/symbols, and tools included; the benchmarks,
bench/, stay in the repository) and default.py (the card: the user's datasets, which
sample_fc/config/presets.py reads from wherever the tools run), the one name it adds at the top."""
import importlib.util
import os
import platform

from setuptools import Extension, find_packages, setup


def mxnet_ops_extension():
    """sample_fc/_mx_ops.cc as an MXNet operator library (sample_fc/fused_ops.py loads it), built
    against the installed mxnet's lib_api (found without importing mxnet); optional: without it
    (no mxnet at build time, no C++ compiler) training uses the composite forms, slower."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        return []
    mxnet_dir = spec.submodule_search_locations[0]
    lib_api = os.path.join(mxnet_dir, "src", "lib_api.cc")
    if not os.path.exists(lib_api):
        return []
    # x86-64-v2 (SSE4.1's blend, every x86 server since 2009): GCC vectorises the backward's select only with it
    arch = ["-march=x86-64-v2"] if platform.machine() in ("x86_64", "AMD64") else []
    return [Extension("sample_fc._mx_ops", ["sample_fc/_mx_ops.cc", lib_api], optional=True, language="c++",
                      include_dirs=[os.path.join(mxnet_dir, "include"), os.path.join(mxnet_dir, "include", "mxnet")],
                      extra_compile_args=["-O3", "-std=c++17", "-fopenmp", "-fno-trapping-math",
                                          "-fno-gnu-unique"] + arch,
                      extra_link_args=["-fopenmp", "-Wl,-Bsymbolic"])]


setup(
    name="sample_fc",
    version="0.1.0",
    description="Partial FC for MXNet + Horovod: face recognition with millions of identities",
    packages=find_packages(include=["sample_fc", "sample_fc.*"]),
    py_modules=["default"],        # the card: the user's datasets (sample_fc/config/presets.py reads it)
    python_requires=">=3.8",
    # float16 bank rows (sample_fc/pfc/rounding.py); optional: without a compiler NumPy does it, slowly
    ext_modules=[Extension("sample_fc.pfc._half_rows", ["sample_fc/pfc/_half_rows.c"], optional=True,
                           extra_compile_args=["-O3", "-std=c99"])] + mxnet_ops_extension(),
    install_requires=["mxnet==1.9.1", "numpy<2", "easydict", "horovod==0.28.1"],
)
