"""Installs the sample_fc library (with its data, tools and bench subpackages) and the
symbols package (backbones)."""
from setuptools import Extension, find_packages, setup

setup(
    name="sample_fc",
    version="0.1.0",
    description="Partial FC for MXNet + Horovod: face recognition with millions of identities",
    packages=find_packages(include=["sample_fc", "sample_fc.*", "symbols"]),
    python_requires=">=3.8",
    # float16 bank rows (sample_fc/rounding.py); optional: without a compiler NumPy does it, slowly
    ext_modules=[Extension("sample_fc._half_rows", ["sample_fc/_half_rows.c"], optional=True,
                           extra_compile_args=["-O3", "-std=c99"])],
    install_requires=["mxnet==1.9.1", "numpy<2", "easydict", "horovod==0.28.1"],
)
