"""CPU-side checks of the native extension: it was built (when a toolchain exists) and its
ops and buffer-size function are importable. No GPU needed."""

from __future__ import annotations

import glob
import os
import shutil

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_buffer_bytes_without_extension():
    from moe_backend.backends.nvshmem_runtime import buffer_bytes, layout
    from moe_backend.spec import CommSpec

    spec = CommSpec(256, 8, 7168, 128, 2)
    b = buffer_bytes(spec, "put")
    # The decode arena's nvlink slots have room for round-tagged rows (twice a bf16 row, LL_ROWS);
    # put's (it never tags rows) and the prefill arena's (a table past one 8 KB portion: no direct
    # receive) hold plain rows.
    assert buffer_bytes(spec, "nvlink")["dispatch"] == 2 * 128 * (2 * 7168 * 2)
    assert b["dispatch"] == 2 * 128 * 7168 * 2 and b["combine"] == 2 * 128 * 7168 * 2
    assert buffer_bytes(CommSpec(256, 8, 7168, 4096, 2), "nvlink")["dispatch"] == 2 * 4096 * 7168 * 2
    assert buffer_bytes(spec, "nvlink")["staging"] == 0
    lay = layout(spec, "put")
    assert lay["symmetric_total"] >= sum(b[k] for k in ("signals", "tables", "dispatch", "combine", "staging"))
    # Each group's table has room for the round-tagged direct table (the kernels fall back to the
    # untagged one otherwise): 16-byte header, 16 bytes per (token, k), 8 per expert count.
    assert b["tables"] == 2 * (16 + 128 * 8 * 16 + 256 * 8)


def test_extension_built_and_registers_ops():
    so = glob.glob(os.path.join(ROOT, "moe_backend", "_C*.so"))
    if not so:
        if shutil.which("nvcc") is None or os.environ.get("MOE_BACKEND_NO_EXT"):
            pytest.skip("no nvcc: the extension is not expected to be built here")
        pytest.fail("nvcc is available but moe_backend/_C*.so was not built (pip install --no-build-isolation -e .)")
    try:
        import moe_backend._C  # noqa: F401
    except ImportError as err:  # e.g. no libcuda on a CPU-only machine: the file exists, that is enough
        pytest.skip(f"built ({so[0]}) but not loadable here: {err}")
    for op in ("dispatch_send", "dispatch_recv", "dispatch_whole", "combine_send", "combine_recv"):
        assert hasattr(torch.ops.moe_backend, op)


def test_extension_errors_raise_with_their_numbers():
    """A bad argument to a native op raises RuntimeError naming the value; it does not kill the
    process (messages with numbers once crashed it on the GPU machine: csrc msg())."""
    try:
        import moe_backend._C  # noqa: F401
    except ImportError as err:
        pytest.skip(f"extension not loadable here: {err}")
    probe = torch.ops.moe_backend.rate_probe  # no dispatch key: runs its checks on any machine
    modes = (r"mode must be 0 \(stores\), 1 \(loads\), 2 \(bulk stores\), 3 \(1 KB bulk loads\), "
             r"4 \(4 KB bulk loads\), 5 \(512 B bulk loads\) or 6 \(2 KB bulk loads\)")
    with pytest.raises(RuntimeError, match=modes + ", got 7"):
        probe(16, 0, 64, 7, 1, 0)
    with pytest.raises(RuntimeError, match="nbytes must be a positive multiple of 16, got 60"):
        probe(16, 0, 60, 0, 1, 0)
    with pytest.raises(RuntimeError, match="timeline_stamps: mode must be 0 or 1, got 3"):
        torch.ops.moe_backend.timeline_stamps(3)
    if os.environ.get("MOE_BACKEND_STAMPS") != "1":  # a default build has none (they cost time)
        with pytest.raises(RuntimeError, match="this build has no timeline stamps; rebuild with MOE_BACKEND_STAMPS=1"):
            torch.ops.moe_backend.timeline_stamps(1)


def _one_rank_config(signal_bytes: int) -> list[int]:
    """create_ctx's config vector for a one-rank arena (M = 16, 1024 combine items) whose signal
    region holds `signal_bytes`."""
    return [1, 1, 1, 0, 8, 8, 2, 64, 16,  # W G tp rank E L topk H M
            128, 0, 128, 4096, 128, 0, 0,  # row, scale, slot, table, part bytes; out and transfer dtypes
            32, 1, 1, 1, 10**9, 1024, 0, 0, 0,  # chunk, chunks, SMs, nvl, timeout ns, combine items,
            # tagged partials, tagged rows, send stream
            0, 0, signal_bytes, 1 << 20, 2 << 20, 0, 0, 0,  # sym, offsets (signals, tables, ...)
            0, 0, 0, 0,  # state, cnt, rowmap, err
            0, 0]  # pes, peers


def _create_ctx_or_skip():
    try:
        import moe_backend._C  # noqa: F401
    except ImportError as err:
        pytest.skip(f"extension not loadable here: {err}")
    return torch.ops.moe_backend.create_ctx


def test_create_ctx_rejects_a_signal_region_too_small():
    """An arena whose signal region cannot hold every flag the kernels index (W ranks' partial
    flags included) is refused before anything is allocated, naming the sizes."""
    create_ctx = _create_ctx_or_skip()
    flags = 2 + 1 + 16 + max(16, 1024)  # arrive + barrier, table, tokens, partials (M = 16, 1024 items)
    expected = rf"signal region \({8 * flags - 8} bytes at offset 0\) cannot hold the {flags} flags"
    with pytest.raises(RuntimeError, match=expected):
        create_ctx(_one_rank_config(8 * flags - 8))  # one flag short


def test_create_ctx_names_a_config_from_another_tree():
    """A config vector of another length (the Python side and the extension built from different
    trees, e.g. a carried device build) is refused with both lengths."""
    create_ctx = _create_ctx_or_skip()
    cfg = _one_rank_config(8 * (2 + 1 + 16 + 1024))  # every flag fits
    expected = rf"bad config length \({len(cfg) + 1} entries for 1 ranks, want {len(cfg)}\)"
    with pytest.raises(RuntimeError, match=expected):
        create_ctx([*cfg, 0])


def test_copy_engine_chunks_shrink_by_the_decay():
    """The copy-engine send's chunk starts: the equal split by default (decay 1), chunks that
    shrink by `decay` otherwise (MOE_BACKEND_NVSHMEM_CE_DECAY), whole runs of 64 tokens, every
    token in exactly one chunk."""
    try:
        import moe_backend._C  # noqa: F401
    except ImportError as err:
        pytest.skip(f"extension not loadable here: {err}")
    starts = torch.ops.moe_backend.ce_chunk_starts
    assert starts(4096, 4, 1.0) == [0, 1024, 2048, 3072, 4096]
    assert starts(100, 4, 1.0) == [0, 50, 100]  # at most one chunk per 64 tokens
    assert starts(0, 4, 0.6) == [0, 0]
    for n in (64, 1000, 4096, 8191):
        s = starts(n, 4, 0.6)
        sizes = [b - a for a, b in zip(s, s[1:])]
        assert s[0] == 0 and s[-1] == n and all(size > 0 for size in sizes), s
        assert all(a % 64 == 0 for a in s[:-1]), s
        assert all(x > y for x, y in zip(sizes[:-1], sizes[1:])) or len(sizes) == 1, s
    assert starts(4096, 4, 0.6) == [0, 1856, 3008, 3712, 4096]
    with pytest.raises(RuntimeError, match=r"decay must be in \(0, 1\]"):
        starts(4096, 4, 1.5)
