"""Build script: the only compiled part is ``omnibal_kernels._C`` (plain C++17 over numpy buffers)."""
import sys

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

extra_compile_args = ["-O3"] if sys.platform != "win32" else ["/O2"]

ext_modules = [
    Pybind11Extension(
        "omnibal_kernels._C",
        sources=sorted(
            [
                "csrc/bindings.cpp",
                "csrc/grouping.cpp",
            ]
        ),
        include_dirs=["csrc"],
        cxx_std=17,
        extra_compile_args=extra_compile_args,
    )
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
