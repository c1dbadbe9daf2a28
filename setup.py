"""Build script: the only compiled part is ``omnibal_kernels._C`` (plain C++17 over numpy buffers)."""

import sys

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

# -ffp-contract=off: no fused multiply-add, so pack costs (and so plans) are bit-identical on every CPU.
if sys.platform != "win32":
    extra_compile_args = ["-O3", "-ffp-contract=off", "-Wall", "-Wextra"]
else:
    extra_compile_args = ["/O2", "/fp:precise"]

ext_modules = [
    Pybind11Extension(
        "omnibal_kernels._C",
        sources=sorted(
            [
                "csrc/assignment.cpp",
                "csrc/bindings.cpp",
                "csrc/grouping.cpp",
                "csrc/length_records.cpp",
                "csrc/loads.cpp",
                "csrc/plan.cpp",
                "csrc/step_order.cpp",
                "csrc/step_pool.cpp",
                "csrc/step_refine.cpp",
                "csrc/step_spill.cpp",
                "csrc/step_raise.cpp",
            ]
        ),
        include_dirs=["csrc"],
        cxx_std=17,
        extra_compile_args=extra_compile_args,
    )
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
