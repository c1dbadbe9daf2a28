"""Every Triton kernel compiles, ahead of time, to Hopper (sm_90) and Ampere (sm_80) machine code.

The interpreter (TRITON_INTERPRET=1) runs kernels as Python, so a construct that only the real compiler
rejects would pass every CPU test and fail on the first GPU. Triton compiles for a CUDA target without a GPU
(its wheel ships ptxas), so this runs in CI. The compile runs in a subprocess, without the interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _compiler_available() -> bool:
    try:
        import triton.backends.nvidia  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except Exception:
        return False
    return True


pytestmark = pytest.mark.skipif(not _compiler_available(), reason="triton's CUDA backend is not installed")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _compile_all(arch: int) -> dict[str, tuple[dict, dict]]:
    result = _run([str(HERE / "compile_kernels.py"), str(arch)], ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    out = {}
    for line in result.stdout.splitlines():
        status, name, loads, stores = line.split("\t")
        assert status == "ok", line
        out[name] = (json.loads(loads), json.loads(stores))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 80])
def test_every_kernel_compiles(arch):
    assert len(_compile_all(arch)) >= 14


@pytest.mark.slow
def test_pack_and_unpack_of_bf16_states_use_128_bit_accesses():
    # The bandwidth target (most of a device-to-device copy) needs 16-byte loads and stores per thread on the
    # hidden axis; scalar 2-byte accesses would issue 8x the memory instructions.
    kernels = _compile_all(90)
    for name in ("pack[bf16 x 4096]", "unpack[bf16 x 4096]"):
        loads, stores = kernels[name]
        assert loads.get("ld.global.v4.b32", 0) > 0 and stores.get("st.global.v4.b32", 0) > 0, (name, loads, stores)
        assert not any(op.endswith(".b16") for op in [*loads, *stores]), (name, loads, stores)


def test_the_check_catches_a_kernel_only_the_compiler_rejects(tmp_path):
    # tl.arange needs a power-of-two range on the GPU; the interpreter runs this kernel happily.
    (tmp_path / "bad_kernel.py").write_text(
        textwrap.dedent("""
        import triton, triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        @triton.jit
        def kernel(x_ptr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, offs)

        triton.compile(ASTSource(fn=kernel, signature={"x_ptr": "*i32", "BLOCK": "constexpr"},
                                 constexprs={"BLOCK": 100}), target=GPUTarget("cuda", 90, 32))
    """)
    )
    result = _run([str(tmp_path / "bad_kernel.py")], tmp_path)
    assert result.returncode != 0
