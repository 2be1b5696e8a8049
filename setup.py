"""Build and install moe_backend.

Pure Python when no usable CUDA toolchain is found; the native NVSHMEM extension
(`moe_backend._C`) is added by `csrc/build.py` when nvcc, torch's CUDA headers and the
pinned NVSHMEM wheel are all present. Install with `--no-build-isolation` so the build
sees the torch already installed (see README).
"""

from setuptools import find_packages, setup

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
        "test": ["pytest", "hypothesis", "ruff"],
    },
    entry_points={"console_scripts": ["moe-backend=moe_backend.cli:main"]},
)
