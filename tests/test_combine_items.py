"""The combine's work items and the partial flags they need (CPU: the host side of the nvshmem
backend's layout; no kernels run)."""

from __future__ import annotations

import pytest

from moe_backend.backends.nvshmem_runtime import (
    buffer_bytes,
    combine_flags_per_rank,
    combine_items,
    layout,
    ll_combine_by_call,
    ll_combine_tokens,
    ll_rows_tokens,
    put_tagged,
    tagged_partials,
    tagged_rows,
)
from moe_backend.spec import CommSpec


def test_flags_cover_a_call_cut_into_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOE_BACKEND_NVSHMEM_COMBINE_ITEMS", raising=False)
    assert combine_items() == 1024
    # A decode arena: up to 1024 / 2 = 512 slice flags per rank (e.g. 128 tokens x 4 slices).
    assert combine_flags_per_rank(CommSpec(256, 8, 7168, 128, 2)) == 512
    # A prefill arena: one flag per token (one slice) is the most a call of >= 512 tokens needs.
    assert combine_flags_per_rank(CommSpec(256, 8, 7168, 4096, 2)) == 4096
    W, G, M = 2, 2, 128
    assert layout(CommSpec(256, 8, 7168, M, W))["signals"] == 8 * (2 * W + G + G * M + W * 512)


def test_combine_items_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_COMBINE_ITEMS", "4096")
    assert combine_flags_per_rank(CommSpec(256, 8, 7168, 128, 2)) == 2048
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("MOE_BACKEND_NVSHMEM_COMBINE_ITEMS", bad)
        with pytest.raises(ValueError, match="COMBINE_ITEMS"):
            combine_items()


def test_tagged_partials_token_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arenas of at most LL_COMBINE tokens send round-tagged partials (default 32, 0: none);
    anything but a token count is refused (before an arena's collective allocation)."""
    monkeypatch.delenv("MOE_BACKEND_NVSHMEM_LL_COMBINE", raising=False)
    assert ll_combine_tokens() == 32
    for good, want in (("0", 0), ("32", 32), ("4096", 4096)):
        monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE", good)
        assert ll_combine_tokens() == want
    for bad in ("-1", "eight", "1.5", "9999999999"):
        monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE", bad)
        with pytest.raises(ValueError, match="LL_COMBINE must be a token count"):
            ll_combine_tokens()
        for transport in ("nvlink", "put"):  # refused where no arena could use it too
            with pytest.raises(ValueError, match="LL_COMBINE must be a token count"):
                tagged_partials(CommSpec(256, 8, 7168, 1, 2), transport)


def test_tagged_partials_every_call_or_by_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tagged region's tokens a rank: an nvlink arena of at most LL_COMBINE tokens holds all of
    them (every call tagged), a larger one with the room LL_COMBINE of them (the calls of at most
    that many tokens tagged), unless LL_COMBINE_BY_CALL=0; put, prefill-sized arenas and rows that
    are not whole 16-byte vectors hold none. LL_COMBINE_BY_CALL takes 0 or 1 only."""
    for name in ("MOE_BACKEND_NVSHMEM_LL_COMBINE", "MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL",
                 "MOE_BACKEND_NVSHMEM_PUT_TAGGED"):
        monkeypatch.delenv(name, raising=False)
    one, small, decode, prefill = (CommSpec(256, 8, 7168, m, 2) for m in (1, 32, 128, 4096))
    assert ll_combine_by_call()
    assert [tagged_partials(s, "nvlink") for s in (one, small, decode, prefill)] == [1, 32, 32, 0]
    assert tagged_partials(decode, "put") == 0 and tagged_partials(CommSpec(256, 8, 7164, 128, 2), "nvlink") == 0
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE", "20")
    assert [tagged_partials(s, "nvlink") for s in (one, small, decode)] == [1, 20, 20]
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL", "0")
    assert [tagged_partials(s, "nvlink") for s in (one, small, decode)] == [1, 0, 0]
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE", "0")
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL", "1")
    assert [tagged_partials(s, "nvlink") for s in (one, small, decode)] == [0, 0, 0]
    for bad in ("2", "yes", "on"):
        monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL", bad)
        with pytest.raises(ValueError, match="LL_COMBINE_BY_CALL must be 0 or 1"):
            tagged_partials(decode, "nvlink")


def test_tagged_rows_token_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arenas of at most LL_ROWS tokens may send round-tagged rows (default 32, 0: none; nvlink
    arenas with the room only); anything but a token count is refused, on any transport."""
    monkeypatch.delenv("MOE_BACKEND_NVSHMEM_LL_ROWS", raising=False)
    assert ll_rows_tokens() == 32
    one, small, decode, prefill = (CommSpec(256, 8, 7168, m, 2) for m in (1, 32, 128, 4096))
    assert tagged_rows(one, "nvlink") and tagged_rows(small, "nvlink")
    assert not tagged_rows(decode, "nvlink") and not tagged_rows(prefill, "nvlink") and not tagged_rows(one, "put")
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_ROWS", "0")
    assert not tagged_rows(one, "nvlink")
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_ROWS", "4096")
    assert tagged_rows(decode, "nvlink") and not tagged_rows(prefill, "nvlink")  # no room for them there
    for bad in ("-1", "yes", "1.5", "9999999999"):
        monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_ROWS", bad)
        for transport in ("nvlink", "put"):
            with pytest.raises(ValueError, match="LL_ROWS must be a token count"):
                tagged_rows(one, transport)


def test_tagged_partials_have_their_own_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """An nvlink arena whose partials may go as round-tagged words holds the plain partials and,
    after them, the tagged region's tokens in tagged words (twice the bytes): the tagged receive
    never polls words that a plain combine (the fused one, or a larger call) wrote. Other arenas
    hold no such room: put's (without PUT_TAGGED=1), the prefill arena's; a decode arena of more
    than 32 tokens holds 32 tokens' worth (its calls of at most 32 tokens are tagged)."""
    monkeypatch.delenv("MOE_BACKEND_NVSHMEM_PUT_TAGGED", raising=False)
    monkeypatch.delenv("MOE_BACKEND_NVSHMEM_LL_COMBINE", raising=False)
    monkeypatch.delenv("MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL", raising=False)
    W, part = 2, 7168 * 2
    small = CommSpec(256, 8, 7168, 32, W)
    nvl = layout(small, "nvlink")
    assert nvl["combine"] == W * 32 * part + 2 * W * 32 * part
    assert nvl["off_stage_disp"] - nvl["off_combine"] >= 3 * W * 32 * part  # what create_ctx checks
    assert layout(small, "put")["combine"] == W * 32 * part
    decode = CommSpec(256, 8, 7168, 128, W)
    assert buffer_bytes(decode, "nvlink")["combine"] == W * 128 * part + 2 * W * 32 * part
    assert buffer_bytes(CommSpec(256, 8, 7168, 4096, W), "nvlink")["combine"] == W * 4096 * part
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE", "128")
    assert buffer_bytes(decode, "nvlink")["combine"] == 3 * W * 128 * part
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL", "0")
    assert buffer_bytes(decode, "nvlink")["combine"] == 3 * W * 128 * part  # every call: not by call
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE", "32")
    assert buffer_bytes(decode, "nvlink")["combine"] == W * 128 * part
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_LL_COMBINE", "0")
    assert layout(small, "nvlink")["combine"] == W * 32 * part


def test_put_tags_its_partials_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """put arenas send round-tagged partials only with PUT_TAGGED=1 (round 63): then a decode-sized
    put arena holds the same tagged region as nvlink's, and a staging for the tagged words after the
    plain partials' staging (2 x G x T partials); never its rows (no tagged slots), never the
    prefill arena. PUT_TAGGED takes 0 or 1 only."""
    for name in ("MOE_BACKEND_NVSHMEM_LL_COMBINE", "MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL",
                 "MOE_BACKEND_NVSHMEM_LL_ROWS", "MOE_BACKEND_NVSHMEM_PUT_TAGGED"):
        monkeypatch.delenv(name, raising=False)
    W, part = 2, 7168 * 2
    small, decode, prefill = (CommSpec(256, 8, 7168, m, W) for m in (32, 128, 4096))
    plain = layout(small, "put")
    assert not put_tagged() and tagged_partials(small, "put") == 0
    assert plain["stage_comb"] == W * 32 * part
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_PUT_TAGGED", "1")
    assert put_tagged()
    assert [tagged_partials(s, "put") for s in (small, decode, prefill)] == [32, 32, 0]
    tagged = layout(small, "put")
    assert tagged["combine"] == layout(small, "nvlink")["combine"] == 3 * W * 32 * part
    assert tagged["stage_comb"] == W * 32 * part + 2 * W * 32 * part
    assert tagged["dispatch"] == plain["dispatch"] and not tagged_rows(small, "put")
    assert layout(decode, "put")["stage_comb"] == W * 128 * part + 2 * W * 32 * part
    for bad in ("2", "yes"):
        monkeypatch.setenv("MOE_BACKEND_NVSHMEM_PUT_TAGGED", bad)
        with pytest.raises(ValueError, match="PUT_TAGGED must be 0 or 1"):
            tagged_partials(small, "put")

