"""Build and install moe_backend.

Pure Python when no usable CUDA toolchain is found; the native NVSHMEM extension
(`moe_backend._C`) is added by `csrc/build.py` when nvcc, torch's CUDA headers and the
pinned NVSHMEM wheel are all present. Install with `--no-build-isolation` so the build
sees the torch already installed (see README).
"""

import os

from setuptools import find_packages, setup


def _native_extensions():
    """csrc/build.py decides (and prints why not) whether to build moe_backend._C."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "build.py")
    spec = importlib.util.spec_from_file_location("moe_backend_csrc_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.extensions()


ext_modules, cmdclass = _native_extensions()

setup(
    name="moe_backend",
    version="0.1.0",
    description="Mixture-of-Experts dispatch/combine over NVSHMEM, with a PyTorch reference backend",
    python_requires=">=3.12",
    packages=find_packages(include=["moe_backend", "moe_backend.*", "integration", "integration.*"]),
    install_requires=["torch<=2.14.1", "pyyaml", "numpy"],
    extras_require={
        "megatron": ["megatron-core>=0.19,<0.20"],
        "nvshmem": ["nvshmem4py-cu13", "nvidia-nvshmem-cu13==3.4.5"],
        "test": ["pytest", "hypothesis", "ruff", "matplotlib"],
        "plot": ["matplotlib"],  # train-bench's PNG (imported lazily)
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    entry_points={"console_scripts": ["moe-backend=moe_backend.cli:main"]},
)
