"""Backend selection: `auto` takes the nvshmem kernels only where they can run (the extension
loads and the GPU is compute capability 9.0, what sm_90a code runs on), else the reference."""

from __future__ import annotations

import pytest
import torch

from moe_backend import CommSpec
from moe_backend.backends import create_backend, nvshmem_available, resolve_backend


def _pretend_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize("capability,name", [((8, 0), "NVIDIA A100-SXM4-80GB"), ((10, 0), "NVIDIA B200"),
                                             ((8, 9), "NVIDIA L40S")])
def test_auto_takes_the_reference_on_gpus_the_kernels_do_not_run_on(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], name: str
) -> None:
    _pretend_gpu(monkeypatch, capability, name)
    ok, why = nvshmem_available()
    sm = f"sm_{capability[0]}{capability[1]}"
    assert not ok and "built for sm_90a" in why and name in why and sm in why, why
    cuda = torch.device("cuda", 0)
    with pytest.warns(UserWarning, match=f"backend 'auto' on cuda:0 takes 'reference': .*{sm}.*milliseconds"):
        assert resolve_backend("auto", cuda) == "reference"
    spec = CommSpec(num_experts=4, topk=2, hidden=8, max_num_tokens=4, world_size=1)
    with pytest.raises(RuntimeError, match=f"backend 'nvshmem' is unavailable: .*{sm}"):
        create_backend("nvshmem", spec, None, cuda)


def test_a_hopper_gpu_passes_the_capability_check(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_gpu(monkeypatch, (9, 0), "NVIDIA H200")
    ok, why = nvshmem_available()
    # What remains is whether the extension loads here (CI builds it where nvcc is present).
    assert "sm_90a" not in why, why
    assert ok == (why == "ok")


def test_no_cuda_means_the_reference() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert nvshmem_available() == (False, "no CUDA device")
    assert resolve_backend("auto", torch.device("cpu")) == "reference"
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("nccl", torch.device("cpu"))


def test_a_full_symmetric_heap_names_its_size_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from moe_backend.backends import nvshmem_runtime as rt

    class Full:
        def sym_malloc(self, nbytes: int) -> int:
            raise RuntimeError(f"nvshmem_malloc({nbytes}) failed")

    monkeypatch.setattr(rt, "ops", lambda: Full())
    with pytest.raises(RuntimeError, match=r"nvshmem_malloc\(412752640\) failed: the arena of .* needs "
                                           r"412,752,640 bytes .*NVSHMEM_SYMMETRIC_SIZE \(default 1 GiB"):
        rt.sym_malloc(412752640, "the arena of E=256 (put)")
