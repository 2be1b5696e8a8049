"""A kernel's SASS instructions by source line, on this (CPU) machine.

The latency kernels' time goes largely to fetching their code: every launch fetches it again and
each jump over code not yet run stalls the warp ~0.15-0.5 us (docs/PERF_NOTES.md, round 42). So a
kernel's size, and which source lines make it, is worth knowing before a GPU call: an unrolled
loop on a cold path or an inlined fallback shows up here as hundreds of instructions (round 75:
the padded dispatch's 2,920, a third of them one unrolled mask loop).

Compiles a header of csrc/ into a cubin with line info (nvcc, sm_90a, as csrc/build.py does),
disassembles it (nvdisasm: $NVDISASM, PATH, or the `nvidia-cuda-nvdisasm` wheel's copy in this
Python's site-packages) and prints, for each kernel whose name contains NAME, its instruction
count, ptxas's registers and spills, and the source lines with the most instructions.

    python3 scripts/sass_lines.py pad_dispatch_kernel [--header padded_kernels.cuh]
        [--instantiate 'moe::pad_combine_partials_kernel<__nv_bfloat16, __nv_bfloat16>'] [--top 20]

Template kernels need --instantiate (each expression's address is taken, which compiles it).
--cubin reads a cubin built elsewhere instead, e.g. the whole csrc/moe_kernels.cu compiled with the
build's flags and `-lineinfo` (for the kernels checked, the padded dispatch and two fused-dispatch
instances, the header alone gave the same counts as the whole build).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+\S")
SECTION = re.compile(r"^\.text\.(\S+):")


def count_by_line(sass: str, name: str) -> dict[str, collections.Counter]:
    """Per kernel (mangled name containing `name`): its instructions counted by (file, line),
    from `nvdisasm -c -g` output (a `//## File "...", line N` comment before each line's code)."""
    kernels: dict[str, collections.Counter] = {}
    current: collections.Counter | None = None
    where = ("?", 0)
    for line in sass.splitlines():
        section = SECTION.match(line)
        if section:
            current = kernels.setdefault(section.group(1), collections.Counter()) if name in section.group(1) else None
            continue
        if line.startswith("//----"):
            current = None
            continue
        at = LINE.search(line)
        if at:
            where = (Path(at.group(1)).name, int(at.group(2)))
        elif current is not None and INSTRUCTION.search(line):
            current[where] += 1
    return kernels


def ptxas_usage(log: str, name: str) -> dict[str, str]:
    """ptxas -v's registers and spills for each entry function containing `name`."""
    usage: dict[str, str] = {}
    current = None  # the function the lines below describe (a kernel, or a function it calls)
    for line in log.splitlines():
        named = re.search(r"(?:Compiling entry function '|Function properties for )([^'\s]+)", line)
        if named:
            current = named.group(1)
            continue
        if current and name in current and ("spill" in line or "registers" in line):
            usage[current] = (usage.get(current, "") + " " + line.split(":", 1)[-1].strip()).strip()
    return usage


def find_nvdisasm() -> str | None:
    candidates = [os.environ.get("NVDISASM"), shutil.which("nvdisasm")]
    site = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    candidates += [str(p) for p in sorted(site.glob("cu*/bin/nvdisasm"))]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def include_dirs(cuda_home: Path) -> list[str]:
    import nvidia.nvshmem  # the pinned nvidia-nvshmem-cu13 wheel: nvshmem.h

    nvshmem = Path(list(nvidia.nvshmem.__path__)[0]) / "include"
    return [str(ROOT / "csrc"), str(nvshmem), str(cuda_home / "include" / "cccl")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a substring of the kernels' mangled names, e.g. pad_dispatch_kernel")
    ap.add_argument("--header", default="padded_kernels.cuh", help="the csrc/ header that defines them")
    ap.add_argument("--instantiate", nargs="*", default=[], metavar="EXPR",
                    help="template kernels to compile, e.g. 'moe::pad_combine_partials_kernel<float, float>'")
    ap.add_argument("--top", type=int, default=20, help="source lines to list per kernel")
    ap.add_argument("--cubin", help="disassemble this cubin (built with -lineinfo) instead of compiling")
    args = ap.parse_args()
    nvdisasm = find_nvdisasm()
    if nvdisasm is None:
        ap.error("nvdisasm not found: set NVDISASM, or `pip install nvidia-cuda-nvdisasm` into this Python")
    if args.cubin:
        sass = subprocess.run([nvdisasm, "-c", "-g", args.cubin], capture_output=True, text=True, check=True).stdout
        return report(count_by_line(sass, args.name), {}, args.name, args.top)
    cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda-13.0"))
    nvcc = cuda_home / "bin" / "nvcc"
    if not nvcc.exists():
        ap.error(f"no nvcc at {nvcc} (set CUDA_HOME)")
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
        keep = "".join(f"  (void*)({e}),\n" for e in args.instantiate)
        src.write_text(f'#include "{args.header}"\n' + (f"void* keep[] = {{\n{keep}}};\n" if keep else ""))
        cmd = [str(nvcc), "-O3", "-rdc=true", "-cubin", "-lineinfo", "-gencode=arch=compute_90a,code=sm_90a",
               "--expt-relaxed-constexpr", "-Xptxas", "-v", *(f"-I{d}" for d in include_dirs(cuda_home)),
               str(src), "-o", str(cubin)]
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode != 0:
            print(built.stdout + built.stderr, file=sys.stderr)
            return built.returncode
        sass = subprocess.run([nvdisasm, "-c", "-g", str(cubin)], capture_output=True, text=True, check=True).stdout
    return report(count_by_line(sass, args.name), ptxas_usage(built.stdout + built.stderr, args.name), args.name,
                  args.top)


def report(kernels: dict[str, collections.Counter], usage: dict[str, str], name: str, top: int) -> int:
    if not kernels:
        print(f"no kernel whose name contains {name!r} (a template needs --instantiate)", file=sys.stderr)
        return 1
    for kernel, lines in kernels.items():
        print(f"== {kernel}: {sum(lines.values())} instructions; {usage.get(kernel, 'ptxas: no report')}")
        for (file, line), n in lines.most_common(top):
            print(f"  {n:>6}  {file}:{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
