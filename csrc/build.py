"""Build description of the native extension `moe_backend._C` (called by setup.py).

`extensions()` returns `(ext_modules, cmdclass)`: the CUDA extension when nvcc, torch's
CUDA support and the pinned NVSHMEM wheel (nvidia-nvshmem-cu13 3.4.5) are all present,
else `([], {})` after printing why (the package then installs as pure Python and the
`nvshmem` backend reports itself unavailable).

Facts the flags encode (see docs/KERNELS.md):
- NVSHMEM device code is not inline: compile with `-rdc=true` and device-link against the
  wheel's `libnvshmem_device.a` ourselves (`nvcc_dlink`), not with `dlink=True` (its
  `-dlto` cannot load that archive).
- torch's `-D__CUDA_NO_HALF_OPERATORS__` & co. break NVSHMEM's headers: undefine them.
- Host link: `-lcuda -l:libnvshmem_device.a -l:libnvshmem_host.so.3` + rpath to the wheel.
- Only sm_90a (H100/H200) is generated.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["csrc/moe_kernels.cu"]  # one translation unit; the kernels are in the headers it includes
HEADERS = sorted(os.path.relpath(h, os.path.dirname(HERE)) for h in glob.glob(os.path.join(HERE, "*.cuh")))
HEADERS += ["csrc/host_checks.h"]


def _skip(reason: str):
    print(f"[moe_backend] building WITHOUT the native NVSHMEM extension: {reason}", file=sys.stderr)
    return [], {}


def nvshmem_root() -> str | None:
    """The pip-installed NVSHMEM wheel folder (`.../nvidia/nvshmem`), or None."""
    env = os.environ.get("NVSHMEM_HOME")
    cands = [env] if env else []
    try:
        import nvidia  # namespace package of the NVIDIA wheels

        cands += [os.path.join(p, "nvshmem") for p in list(nvidia.__path__)]
    except ImportError:
        pass
    for c in cands:
        if c and os.path.exists(os.path.join(c, "include", "nvshmem.h")) and glob.glob(
            os.path.join(c, "lib", "libnvshmem_device.a")
        ):
            return c
    return None


def extensions():
    if os.environ.get("MOE_BACKEND_NO_EXT"):
        return _skip("MOE_BACKEND_NO_EXT is set")
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as err:
        return _skip(f"torch is not importable ({err}); install with --no-build-isolation")
    if torch.version.cuda is None:
        return _skip("torch was built without CUDA")
    cuda_home = cpp_extension.CUDA_HOME
    if not cuda_home or not os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        if not shutil.which("nvcc"):
            return _skip("nvcc not found (set CUDA_HOME)")
    root = nvshmem_root()
    if root is None:
        return _skip("the NVSHMEM wheel (nvidia-nvshmem-cu13==3.4.5) is not installed")
    if not os.path.exists(os.path.join(root, "lib", "libnvshmem_host.so.3")):
        return _skip(f"{root}/lib has no libnvshmem_host.so.3")
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    inc, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    gencode = "-gencode=arch=compute_90a,code=sm_90a"
    cccl = os.path.join(cuda_home or "", "include", "cccl")
    nvcc = [
        "-O3", "-rdc=true", gencode, "--expt-relaxed-constexpr",
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    ]
    if os.environ.get("MOE_BACKEND_STAMPS") == "1":  # the diagnostic timeline stamps (kernel_timeline.py)
        nvcc.append("-DMOE_STAMPS")
    # libcuda is absent on CPU-only build machines: link against the toolkit's stub (same soname).
    stub_dir = os.path.join(cuda_home or "", "lib64", "stubs")
    import ctypes.util

    if os.path.exists(os.path.join(stub_dir, "libcuda.so")):
        cuda_link = [f"-L{stub_dir}", "-lcuda"]
    elif ctypes.util.find_library("cuda"):
        cuda_link = ["-lcuda"]
    else:  # CPU-only machine without the driver or its stub: the module builds but cannot load here
        print("[moe_backend] libcuda not found: linking _C without -lcuda (it will only load where a driver is)",
              file=sys.stderr)
        cuda_link = []
    ext = cpp_extension.CUDAExtension(
        name="moe_backend._C",
        sources=SOURCES,
        depends=HEADERS,
        include_dirs=[inc, cccl],
        library_dirs=[lib],
        extra_compile_args={
            "cxx": ["-O2"],
            "nvcc": nvcc,
            "nvcc_dlink": ["-dlink", gencode, f"-L{lib}", "-lnvshmem_device"],
        },
        extra_link_args=[*cuda_link, f"-L{lib}", "-l:libnvshmem_device.a", "-l:libnvshmem_host.so.3",
                         f"-Wl,-rpath,{lib}"],
    )

    class BuildExt(cpp_extension.BuildExtension):
        def build_extensions(self):
            if "9.0a" not in os.environ.get("TORCH_CUDA_ARCH_LIST", ""):
                os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
            super().build_extensions()

    return [ext], {"build_ext": BuildExt.with_options(use_ninja=True)}
