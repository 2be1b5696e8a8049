"""scripts/sass_lines.py: a kernel's SASS instructions by source line, and ptxas's usage lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sass_lines.py"
spec = importlib.util.spec_from_file_location("sass_lines", SCRIPT)
sass_lines = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_lines)

SASS = """
//--------------------- .text._ZN3moe6helperEv --------------------------
.text._ZN3moe6helperEv:
	//## File "/x/csrc/device_common.cuh", line 10
        /*0000*/                   MOV R1, R2 ;
//--------------------- .text._ZN3moe10the_kernelEv --------------------------
.text._ZN3moe10the_kernelEv:
	//## File "/x/csrc/padded_kernels.cuh", line 62
        /*0000*/                   IMAD R1, R2, R3, RZ ;
        /*0010*/              @!P0 BRA `(.L_x_1) ;
	//## File "/x/csrc/device_common.cuh", line 536
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
.L_x_1:
	//## File "/x/csrc/padded_kernels.cuh", line 62
        /*0030*/                   IMAD R1, R2, R3, RZ ;
        /*0040*/                   EXIT ;
//--------------------- .nv.info --------------------------
        /*0050*/                   NOP ;
"""

PTXAS = """ptxas info    : Compiling entry function '_ZN3moe10the_kernelEv' for 'sm_90a'
ptxas info    : Function properties for _ZN3moe10the_kernelEv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 126 registers, used 1 barriers
ptxas info    : Function properties for _ZN3moe6helperEv
    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
"""


def test_counts_a_kernels_instructions_by_source_line() -> None:
    kernels = sass_lines.count_by_line(SASS, "the_kernel")
    assert list(kernels) == ["_ZN3moe10the_kernelEv"]  # the helper's section is not counted
    lines = kernels["_ZN3moe10the_kernelEv"]
    assert lines == {("padded_kernels.cuh", 62): 4, ("device_common.cuh", 536): 1}  # not the .nv.info NOP


def test_ptxas_usage_is_the_kernels_own_not_its_callees() -> None:
    usage = sass_lines.ptxas_usage(PTXAS, "the_kernel")
    assert usage == {"_ZN3moe10the_kernelEv": "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads "
                                              "Used 126 registers, used 1 barriers"}
