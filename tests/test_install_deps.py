"""scripts/install_deps.py: the install plan that keeps setup's disk peak small."""

import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def install_deps():
    path = os.path.join(HERE, "..", "scripts", "install_deps.py")
    spec = importlib.util.spec_from_file_location("install_deps", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plan_installs_large_wheels_one_by_one_largest_first(install_deps):
    resolved = [
        ("numpy", "2.3.0"),
        ("nvidia-nccl-cu13", "2.30.7"),
        ("triton", "3.8.0"),
        ("moe_backend", "0.1.0"),
        ("nvidia_cudnn_cu13", "9.24.0.43"),
        ("torch", "2.14.1"),
        ("megatron-core", "0.19.0"),
    ]
    large, small = install_deps.plan(resolved)
    assert large == ["torch==2.14.1", "nvidia_cudnn_cu13==9.24.0.43", "triton==3.8.0", "nvidia-nccl-cu13==2.30.7"]
    # Our own package is installed afterwards by setup_env.sh, without dependencies.
    assert small == ["numpy==2.3.0", "megatron-core==0.19.0"]


def test_main_splits_requirements_from_pip_args(install_deps, monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(install_deps, "resolve", lambda reqs, args: [("torch", "2.14.1"), ("pyyaml", "6.0")])
    monkeypatch.setattr(install_deps, "pip", calls.append)
    install_deps.main(["-e", ".[test]", "--", "--retries", "10"])
    assert calls == [["--no-deps", "--retries", "10", "torch==2.14.1"], ["--no-deps", "--retries", "10", "pyyaml==6.0"]]
