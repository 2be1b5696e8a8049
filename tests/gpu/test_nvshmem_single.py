"""The nvshmem backend on ONE GPU (world 1: every token stays local), both transports, the
receives overlapped and not: runs where only one GPU is lent, and covers the paths a
one-rank world takes (the plan's grid barrier, the combine send finishing every own token
at prefill sizes). Fresh seed per run (printed); MOE_TEST_SEED replays one."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest
import torch

from moe_backend import launch
from moe_backend.backends import nvshmem_runtime as rt
from moe_backend.communicator import Communicator
from moe_backend.spec import CommSpec
from moe_backend.testing import (
    NUM_TOKENS_MODES,
    ROUTINGS,
    Case,
    GroupInputs,
    bitwise_equal,
    oracle_dispatch,
    random_topk,
    run_case,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _workers  # noqa: E402

pytestmark = pytest.mark.gpu(gpus=1)

if torch.cuda.device_count() < 1:
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
try:
    import moe_backend._C  # noqa: F401
except ImportError as err:
    pytest.skip(f"moe_backend._C unavailable: {err}", allow_module_level=True)

SEED = int(os.environ.get("MOE_TEST_SEED", time.time_ns() % (2**31)))


def one_rank_cases(seed: int, count: int = 16) -> list[Case]:
    """Random shapes and dtypes, half of them past the combine-overlap limit (G*M > 1024)."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        L = rng.choice([1, 2, 3, 4, 8, 16])
        hidden = rng.choice([8, 36, 64, 128, 200, 256, 1000])
        in_dtype = _workers.DTYPES_IN[i % 4]
        block = None
        if in_dtype == _workers.FP8:
            block = rng.choice([d for d in (4, 8, 16, 32, 64, 128) if hidden % d == 0] or [hidden])
        tokens = rng.choice([rng.randint(1, 48), rng.randint(1100, 3000)])
        spec = CommSpec(num_experts=L, topk=rng.randint(1, min(L, 8)), hidden=hidden, max_num_tokens=tokens,
                        world_size=1, in_dtype=in_dtype, out_dtype=rng.choice(_workers.DTYPES_OUT),
                        scale_block_size=block, combine_in_float32=rng.random() < 0.4)
        cases.append(Case(spec, ROUTINGS[i % len(ROUTINGS)], seed * 1000 + i, rng.random() < 0.6,
                          NUM_TOKENS_MODES[(i // 4) % 3]))
    # More than 32 rows a token (the bulk sums keep rows lane and lane + 32), a row of 2000 bytes
    # (the last bulk step short), past the overlap limit (the fused combine).
    cases.append(Case(CommSpec(48, 40, 1000, 1200, 1), "uniform", seed * 1000 + 998, True, "tensor"))
    cases.append(Case(CommSpec(256, 8, 7168, 4096, 1), "uniform", seed * 1000 + 999, True, "tensor"))
    return cases


def _one_rank_worker(seed: int, env: dict[str, str], num_sms: int | None = None) -> None:
    os.environ.update(env)  # read when an arena is created
    for case in one_rank_cases(seed):  # cases outside: the oracle's answer is kept for the latest
        for transport in ("put", "nvlink"):
            comm = Communicator(case.spec, backend="nvshmem", transport=transport, sync_check=True, num_sms=num_sms)
            try:
                for _ in range(2):  # a second round on the same arena
                    run_case(comm, case)
            except Exception as err:
                raise AssertionError(f"[{transport}, {env}] {case.describe()}: {err}") from err
            finally:
                comm.close()


def _overlap_env(on: str) -> dict[str, str]:
    return {f"MOE_BACKEND_NVSHMEM_{k}": on for k in ("OVERLAP", "COMBINE_OVERLAP", "COMBINE_FUSED")}


# The small arenas take the direct receive, by default with the round-tagged table (put too,
# round 26), the early load of own rows and the parallel scan of the offsets (round 25);
# "untagged" runs nvlink's with the table's flag, without the early load, with warp 0's scan and
# a token's pieces on one SM (ITEM_SPREAD=0, before round 37), and put's plan and copy kernels.
# "async-rows": the fused combine (every case past the overlap limit) sums rows that cp.async
# brought into shared memory (COMBINE_BULK=0), and its receive half takes the partials by register
# loads; by default (run 43) bulk copies, its receive half through the ring the send left (the
# "overlap" variant).
# "register-copy": the dispatch copy with a work counter (arenas past a block per SM of items)
# stores its rows from registers, and the plan reads the count matrix by 4-byte loads, as before
# round 33 (by default: bulk copies through shared memory, 16-byte loads where L % 4 == 0).
# "split-dispatch": `comm.dispatch` as a send and a receive kernel (by default, with the direct
# receive, one fused kernel since round 35).
# "side-combine": `comm.combine` with the receive on the side stream (WHOLE_COMBINE=0); "pdl-combine":
# every call's send and receive on the caller's stream, the receive launched by PDL (WHOLE_COMBINE=1;
# by default, round 53, only the calls whose warp-per-item receive grid passes the side stream's).
# "self-send*": the send ships the own group's tokens into the slots and raises their flags, and
# the receive waits for the flags and reads the slots, as for another rank's tokens
# (SELF_SEND=1), so one GPU runs the dispatch's cross-rank path: with the defaults, with the
# untagged table, two kernels and register copies, and with the copy-engine send;
# "self-send-staged-put": put's rows staged for every peer, as before round 55 (PUT_FROM_X=0; by
# default a row without scales goes to a P2P peer straight from x).
# "tagged-rows*": with SELF_SEND, the rows in round-tagged words the receive polls, no token flag
# (round 38; nvlink's direct receive), fused and split, in every arena with room for them
# (LL_ROWS=4096; by default since round 51 arenas of at most 32 tokens); "self-send-untagged-rows":
# in none (LL_ROWS=0).
# "general-fused": the fused dispatch's general instance at the defaults (LEAN_FUSED=0; by
# default, round 42, the lean instance with the switches fixed at compile time serves there).
# "lean-not-small": the lean instance for every call (SMALL_FUSED=0; by default, round 43, calls
# of at most 512 / topk tokens take the small instance, with the table's one-id-a-thread form only).
# "tagged-partials": every nvlink arena with room for them (the small ones) sends its combine
# partials in round-tagged words that the receive polls, no flag (LL_COMBINE; by default arenas of
# at most 32 tokens, and by call in larger ones with the room: the calls of at most 32 tokens);
# "untagged-partials": none does; "mixed-partials": arenas of at most 20 tokens do, larger ones by
# call at 20; "plain-large-arenas": only arenas of at most 32 tokens do (LL_COMBINE_BY_CALL=0).
# "token-grids": the direct receive's and the combine's grids sized by the arena's tokens (ITEM_GRIDS=0,
# before round 50; by default by the largest call's items, one a block while SMs last).
# "register-send-rows": the two-kernel combine send's rows by registers, four a batch (COMBINE_STEP_BULK=0;
# by default, round 84, a step's rows by bulk copies into the warp's shared memory, one wait).
SELF_SEND = {"MOE_BACKEND_NVSHMEM_SELF_SEND": "1"}
VARIANTS = {
    "overlap": _overlap_env("1"),
    "no-overlap": _overlap_env("0"),
    "untagged": {f"MOE_BACKEND_NVSHMEM_{k}": "0" for k in ("LL_TABLE", "EARLY_LOAD", "PAR_SCAN", "ITEM_SPREAD")},
    "async-rows": {**_overlap_env("1"), "MOE_BACKEND_NVSHMEM_COMBINE_BULK": "0"},
    "register-copy": {f"MOE_BACKEND_NVSHMEM_{k}": "0" for k in ("COPY_BULK", "PLAN_VEC")},
    "split-dispatch": {"MOE_BACKEND_NVSHMEM_FUSED_DISPATCH": "0"},
    "side-combine": {"MOE_BACKEND_NVSHMEM_WHOLE_COMBINE": "0"},
    "pdl-combine": {"MOE_BACKEND_NVSHMEM_WHOLE_COMBINE": "1"},
    "self-send": SELF_SEND,
    "self-send-untagged": {**SELF_SEND, **{f"MOE_BACKEND_NVSHMEM_{k}": "0"
                                           for k in ("LL_TABLE", "FUSED_DISPATCH", "COPY_BULK")}},
    "self-send-copy-engine": {**SELF_SEND, **_overlap_env("1"), "MOE_BACKEND_NVSHMEM_CE_SEND": "1"},
    "self-send-staged-put": {**SELF_SEND, "MOE_BACKEND_NVSHMEM_PUT_FROM_X": "0"},
    "tagged-rows": {**SELF_SEND, "MOE_BACKEND_NVSHMEM_LL_ROWS": "4096"},
    "tagged-rows-split": {**SELF_SEND, "MOE_BACKEND_NVSHMEM_LL_ROWS": "4096",
                          "MOE_BACKEND_NVSHMEM_FUSED_DISPATCH": "0"},
    "self-send-untagged-rows": {**SELF_SEND, "MOE_BACKEND_NVSHMEM_LL_ROWS": "0"},
    "general-fused": {**SELF_SEND, "MOE_BACKEND_NVSHMEM_LEAN_FUSED": "0"},
    "lean-not-small": {**SELF_SEND, "MOE_BACKEND_NVSHMEM_SMALL_FUSED": "0"},
    "tagged-partials": {"MOE_BACKEND_NVSHMEM_LL_COMBINE": "4096"},
    "untagged-partials": {"MOE_BACKEND_NVSHMEM_LL_COMBINE": "0"},
    "mixed-partials": {"MOE_BACKEND_NVSHMEM_LL_COMBINE": "20"},
    "plain-large-arenas": {"MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL": "0"},
    "token-grids": {"MOE_BACKEND_NVSHMEM_ITEM_GRIDS": "0"},
    "token-grids-self-send": {**SELF_SEND, "MOE_BACKEND_NVSHMEM_ITEM_GRIDS": "0"},
    "register-send-rows": {**SELF_SEND, "MOE_BACKEND_NVSHMEM_COMBINE_STEP_BULK": "0"},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_contract_on_one_gpu(variant: str) -> None:
    print(f"seed={SEED}")
    launch.spawn(_one_rank_worker, 1, SEED, VARIANTS[variant], dist_backend="nccl", timeout=300)


@pytest.mark.parametrize("partials", ["0", "1"])
def test_padded_layout_on_one_gpu(partials: str) -> None:
    """dispatch_padded / combine_padded at world size 1, both transports (nvlink: the padded
    kernels), against the oracle, with contiguous rounds between and CUDA-graph replays; also with
    the combine's per-token partials in tagged words (PADDED_PARTIALS=1, round 66)."""
    print(f"seed={SEED}")
    launch.spawn(_workers.padded_worker, 1, SEED, 12, {"MOE_BACKEND_NVSHMEM_PADDED_PARTIALS": partials},
                 dist_backend="nccl", timeout=300)


def test_contract_with_few_sms_on_one_gpu() -> None:
    """Kernels sized for 4 SMs (backend option num_sms), the fused combine forced: its rows come
    by bulk copies by default there, in cases up to DeepSeek prefill's 4096 tokens."""
    print(f"seed={SEED}")
    launch.spawn(_one_rank_worker, 1, SEED, _overlap_env("1"), 4, dist_backend="nccl", timeout=300)


def _rounds_and_graphs_worker(seed: int, env: dict[str, str]) -> None:
    os.environ.update(env)  # read when an arena is created
    for transport in ("nvlink", "put"):
        _workers.rounds_worker(seed, transport, 8)
        _workers.graph_worker(seed, transport, 4)


@pytest.mark.parametrize("variant", ["overlap", "untagged", "side-combine", "pdl-combine", "self-send",
                                     "tagged-rows", "tagged-partials"])
def test_rounds_and_graphs_on_one_gpu(variant: str) -> None:
    """Rounds on a shared arena and CUDA-graph replays (the round advanced on the device) at
    world 1, on both transports: the round-tagged table (put since round 26: staged and put)
    must carry each round's tag, replay after replay."""
    print(f"seed={SEED}")
    launch.spawn(_rounds_and_graphs_worker, 1, SEED, VARIANTS[variant], dist_backend="nccl", timeout=300)


def _compile_worker(seed: int) -> None:
    for transport in ("nvlink", "put"):
        _workers.compile_worker(seed, transport, 4)


def test_compiled_decode_step_on_one_gpu() -> None:
    """A decode step (dispatch, experts, combine) under `torch.compile`, on both transports: the
    compiled caller breaks its graph at each call, and every call matches the oracle bit for bit."""
    print(f"seed={SEED}")
    launch.spawn(_compile_worker, 1, SEED, dist_backend="nccl", timeout=300)


class _DeviceMemory:
    """Raw device memory as `torch.as_tensor` takes it (the CUDA array interface): the arena's words."""

    def __init__(self, ptr: int, count: int, typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": typestr, "data": (ptr, False),
                                         "version": 3, "strides": None}


def _arena_words(arena: rt.Arena, offset: int, count: int, typestr: str) -> torch.Tensor:
    return torch.as_tensor(_DeviceMemory(arena.sym + offset, count, typestr), device=arena.device).clone()


def _self_send_worker(seed: int, self_send: bool, ll_rows: str) -> None:
    os.environ["MOE_BACKEND_NVSHMEM_SELF_SEND"] = "1" if self_send else "0"  # read when an arena is created
    os.environ["MOE_BACKEND_NVSHMEM_LL_ROWS"] = ll_rows
    device = torch.device("cuda", 0)
    for transport in ("nvlink", "put"):
        for tokens in (24, 2048):  # the direct receive's arena, the plan and copy's
            spec = CommSpec(num_experts=16, topk=4, hidden=128, max_num_tokens=tokens, world_size=1)
            comm = Communicator(spec, backend="nvshmem", transport=transport, sync_check=True)
            try:
                gen = torch.Generator().manual_seed(seed + tokens)
                n = tokens - 3
                ids = torch.rand(n, 16, generator=gen).argsort(dim=1)[:, :4].to(torch.int32).to(device)
                x = torch.randn(n, 128, generator=gen).to(torch.bfloat16).to(device)
                result = comm.dispatch(x, ids)
                torch.cuda.synchronize(device)
                arena, sizes = comm.backend.arena, rt.row_sizes(spec, transport)
                # Token t's flag is signal W + G + t, its slot [0][t] a row of slot_bytes.
                first_flag = arena.layout["off_signals"] + 8 * (spec.world_size + spec.num_groups)
                flags = _arena_words(arena, first_flag, tokens, "<i8")
                slots = _arena_words(arena, arena.layout["off_dispatch"], tokens * sizes["slot_bytes"], "|u1")
                slots = slots.view(tokens, sizes["slot_bytes"])[:n]
                rows = slots[:, : sizes["row_bytes"]]
                where = f"[{transport}, {tokens} tokens, SELF_SEND={int(self_send)}, LL_ROWS={ll_rows}]"
                if self_send and rt.tagged_rows(spec, transport):
                    # Round-tagged words, no flag: each 8-byte word a 4-byte piece of the row, then round 1.
                    words = slots[:, : 2 * sizes["row_bytes"]].contiguous().view(torch.int32).view(n, -1, 2)
                    assert flags.eq(0).all(), f"{where} tagged rows raised token flags {flags.tolist()}"
                    assert words[:, :, 1].eq(1).all(), f"{where} the words do not carry round 1"
                    assert torch.equal(words[:, :, 0], x.view(torch.int32)), f"{where} the words do not hold x's rows"
                elif self_send:
                    assert flags[:n].eq(1).all() and flags[n:].eq(0).all(), f"{where} token flags {flags.tolist()}"
                    assert torch.equal(rows, x.view(torch.uint8)), f"{where} the slots do not hold x's rows"
                else:
                    assert flags.eq(0).all(), f"{where} the own tokens were sent: flags {flags.tolist()}"
                comm.combine(result.tokens, result.handle)  # ends the round
            finally:
                comm.close()


def _work_between_worker(seed: int, env: dict[str, str]) -> None:
    os.environ.update(env)  # read when an arena is created
    _workers.work_between_worker(seed, 4096, 6)


@pytest.mark.parametrize("copy_engine", [False, True])
def test_work_between_send_and_receive_on_one_gpu(copy_engine: bool) -> None:
    """The sweep's overlap row (the send on its own stream, 2048^2 matmuls between dispatch_send
    and dispatch_recv; run 39 timed out at EP2 with 2048 tokens a rank, G*M = 4096 source tokens)
    on the cross-rank path of one GPU (SELF_SEND) at the same G*M = 4096, where the receive's copy
    takes a work counter and bulk copies on every SM: the default split send, and the copy-engine
    send forced (CE_SEND=1), whose flag kernels reach the GPU behind their chunks' copies. Rows and
    counts bit for bit a whole dispatch's, no wait timed out."""
    print(f"seed={SEED}")
    env = {**SELF_SEND, **({"MOE_BACKEND_NVSHMEM_CE_SEND": "1"} if copy_engine else {})}
    launch.spawn(_work_between_worker, 1, SEED, env, dist_backend="nccl", timeout=300)


@pytest.mark.parametrize(("self_send", "ll_rows"), [(True, "32"), (True, "0"), (False, "32")])
def test_self_send_goes_through_the_slots(self_send: bool, ll_rows: str) -> None:
    """SELF_SEND=1 puts the own tokens' rows into the slots and raises their flags (round 1), on
    both transports, in a direct-receive arena and a plan-and-copy one; in the small nvlink arena
    (at most LL_ROWS tokens, the default 32) as round-tagged words with no flag (round 51); without
    SELF_SEND the own tokens never touch the slots (the receive reads x)."""
    launch.spawn(_self_send_worker, 1, SEED, self_send, ll_rows, dist_backend="nccl", timeout=120)


def _dispatch_and_combine(comm: Communicator, x: torch.Tensor, ids: torch.Tensor) -> None:
    result = comm.dispatch(x, ids)
    comm.combine(result.tokens, result.handle)


def _split_dispatch(comm: Communicator, x: torch.Tensor, ids: torch.Tensor) -> None:
    result = comm.dispatch_send(x, ids).recv()
    comm.combine(result.tokens, result.handle)


def _grids_worker(seed: int, per_item: bool, compact_recv: str | None, overlap_sms: int | None) -> None:
    # Read when an arena is created.
    os.environ["MOE_BACKEND_NVSHMEM_ITEM_GRIDS"] = "1" if per_item else "0"
    for name, value in (("COMPACT_RECV", compact_recv), ("OVERLAP_SMS", overlap_sms)):
        if value is None:
            os.environ.pop(f"MOE_BACKEND_NVSHMEM_{name}", None)
        else:
            os.environ[f"MOE_BACKEND_NVSHMEM_{name}"] = str(value)
    device = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    # bf16 rows of 2048 elements (4096 bytes): 8 pieces of 512 bytes, 4 combine slices of 512
    # elements; rows of 16384 (32 KB) pass round 62's bound (4 SMs x 512 KB of expected rows).
    for tokens, hidden in ((1, 2048), (32, 2048), (32, 16384)):
        spec = CommSpec(num_experts=16, topk=4, hidden=hidden, max_num_tokens=tokens, world_size=1)
        per_row = hidden * 2 // 512
        pieces, slices = tokens * min(per_row, sms * 16 // tokens, 64), tokens * (hidden // 512)
        by_tokens = -(-pieces // 16)  # a warp per piece
        by_items = min(sms, pieces + 2)  # a block per item of the largest call, the table's 2 blocks first
        rows_fit = tokens * 4 * hidden * 2 <= 4 * 512 * 1024  # 4 local experts a token
        gen = torch.Generator().manual_seed(seed + tokens)
        ids = torch.rand(tokens, 16, generator=gen).argsort(dim=1)[:, :4].to(torch.int32).to(device)
        x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).to(device)
        for send_stream in (False, True):
            comm = Communicator(spec, backend="nvshmem", transport="nvlink", sync_check=True, send_stream=send_stream)
            try:
                first = comm.dispatch(x, ids)  # a first round: one-time setup out of the trace
                comm.combine(first.tokens, first.handle)
                where = f"[{tokens}-token arena of {hidden}, send_stream={send_stream}, ITEM_GRIDS={int(per_item)}, " \
                        f"COMPACT_RECV={compact_recv}, OVERLAP_SMS={overlap_sms}]"
                if hidden == 2048:  # the whole ops' grids (the 32 KB rows' combine takes the wide PDL receive)
                    got = _workers.traced_grids(_dispatch_and_combine, comm, x, ids)
                    want = {"dispatch_fused_kernel": by_items if per_item else by_tokens,
                            "combine_send_kernel": min(sms, slices if per_item else tokens),
                            "combine_recv_kernel": min(sms, slices if per_item else tokens)}
                    assert got == want, f"{where} grids {got}, want {want}"
                # The split receive (round 61): by the arena's tokens in a send-stream arena, unless
                # COMPACT_RECV says otherwise; else as the fused dispatch.
                compact = compact_recv == "1" or (compact_recv is None and send_stream)
                split = _workers.traced_kernels(_split_dispatch, comm, x, ids,
                                                names=("dispatch_direct_kernel", "dispatch_send_kernel"))
                got_split = split["dispatch_direct_kernel"]["grid"][0]
                want_split = by_tokens if compact or not per_item else by_items
                want_send = tokens  # a block per token while 3 blocks per SM last
                # Round 62: a compact send-stream arena's split dispatch sized for k SMs (OVERLAP_SMS,
                # by default 4 where the expected rows fit): the pieces that fill k blocks, at most
                # the row's, the send on 3 blocks per SM of them.
                k = overlap_sms if overlap_sms is not None else (4 if rows_fit else None)
                if send_stream and compact and k is not None:
                    per_token = max(1, min(k * 16 // tokens, per_row, 64))
                    want_split = -(-tokens * per_token // 16)
                    want_send = min(tokens, 3 * k)
                assert got_split == want_split, f"{where} split receive grid {got_split}, want {want_split}"
                got_send = split["dispatch_send_kernel"]["grid"][0]
                assert got_send == want_send, f"{where} split send grid {got_send}, want {want_send}"
            finally:
                comm.close()


@pytest.mark.parametrize("per_item, compact_recv, overlap_sms",
                         [(True, None, None), (False, None, None), (True, "0", None), (True, "1", None),
                          (True, None, 4), (True, None, 1)])
def test_grids_follow_the_largest_call(per_item: bool, compact_recv: str | None, overlap_sms: int | None) -> None:
    """The direct receive and the combine launch a block per item of the arena's largest call
    while SMs last (round 50): a 1-token arena's 8 pieces on 8 blocks after the table's 2, its 4
    combine slices on 4; with ITEM_GRIDS=0, as many as the arena's tokens fill (one block each at
    1 token). A send-stream arena's split receive takes the arena's tokens' grid (round 61), every
    arena's with COMPACT_RECV=1, none with COMPACT_RECV=0. Round 62: a send-stream arena's split
    dispatch is sized for 4 SMs where its expected rows fit them (the 32-token arena of 4 KB rows,
    not of 32 KB rows), for k with OVERLAP_SMS=k whatever the rows: the receive's pieces fill k
    blocks (32 tokens of 4 KB rows: 2 pieces on 4 blocks at k=4, 1 piece on 2 blocks at k=1), the
    send has 3k blocks."""
    launch.spawn(_grids_worker, 1, SEED, per_item, compact_recv, overlap_sms, dist_backend="nccl", timeout=120)


def _two_part_worker(seed: int) -> None:
    os.environ["MOE_BACKEND_NVSHMEM_TWO_PART_RECV"] = "1"  # read when an arena is created
    device = torch.device("cuda", 0)
    spec = CommSpec(num_experts=16, topk=4, hidden=2048, max_num_tokens=64, world_size=1)
    gen = torch.Generator().manual_seed(seed)
    ids = random_topk(gen, 64, spec)  # every row routed
    groups = [GroupInputs(torch.randn(64, 2048, generator=gen).to(spec.in_dtype), ids, None, None, 64)]
    x, ids = groups[0].x.to(device), ids.to(device)
    comm = Communicator(spec, backend="nvshmem", transport="nvlink", sync_check=True, send_stream=True)
    a = torch.randn(1024, 1024, device=device)
    got: dict[str, torch.Tensor] = {}

    def split_with_work_between() -> None:
        receiver = comm.dispatch_send(x, ids)
        torch.mm(a, a)
        result = receiver.recv()
        got["tokens"], got["tpe"] = result.tokens.clone(), result.tokens_per_expert.clone()
        comm.combine(result.tokens, result.handle)

    try:
        split_with_work_between()  # a first round: one-time setup out of the trace
        launches = [e for e in _workers.traced_launches(split_with_work_between)
                    if "dispatch_direct_kernel" in e["name"]]
        where = f"launches {[(e['name'][:60], e['args']['grid'][0], e['args']['stream']) for e in launches]}"
        assert len(launches) == 2, where
        first, second = launches
        assert first["name"] == second["name"] and first["name"].split("(")[0].endswith("true>"), where
        assert first["args"]["grid"][0] == 4, where  # OVERLAP_SMS blocks, launched with the send
        assert second["args"]["stream"] != first["args"]["stream"], where  # behind the caller's work
        want = oracle_dispatch(spec, groups, 0)
        total = int(want.tokens_per_expert.sum())
        assert bitwise_equal(got["tpe"].cpu(), want.tokens_per_expert), where
        assert bitwise_equal(got["tokens"][:total].cpu(), want.tokens), where
    finally:
        comm.close()


def test_two_part_receive_launches_both_parts() -> None:
    """TWO_PART_RECV=1 (round 64) in a send-stream arena with the direct receive: the split
    dispatch's receive is the DYN instance launched twice, 4 blocks with the send and the rest on
    the caller's stream behind its work, and its rows are the oracle's (session 47: the switch
    could not be turned on before, so round 64's earlier tests ran the default)."""
    launch.spawn(_two_part_worker, 1, SEED, dist_backend="nccl", timeout=120)


@pytest.mark.parametrize("wide", [True, False])
def test_whole_combine_by_call(wide: bool) -> None:
    """By default (round 53) the PDL launch, with its wide receive, only for the calls whose wide
    grid passes the side stream's, the others on the side stream (all of them with WIDE_RECV=0),
    by the profiler's streams and grids; bit-exact either way."""
    launch.spawn(_workers.wide_recv_worker, 1, SEED, 2, wide, None, dist_backend="nccl", timeout=120)


@pytest.mark.parametrize("wide", [True, False])
def test_whole_combine_receive_takes_a_warp_per_item(wide: bool) -> None:
    """A whole combine's receive launched by PDL (WHOLE_COMBINE=1) may have more blocks than SMs
    (round 52): one warp per item of the call, its rows times 4 slices over 4 warps a block, and
    stays bit-exact; with WIDE_RECV=0 the side stream's grid (a block per SM at most)."""
    launch.spawn(_workers.wide_recv_worker, 1, SEED, 2, wide, dist_backend="nccl", timeout=120)


def test_contract_tasks_on_one_gpu() -> None:
    """Bad inputs, split phases, `padded()` and valid-row combines at world 1, both transports."""
    launch.spawn(_workers.contract_tasks_worker, 1, dist_backend="nccl", timeout=120)


def test_bulk_load_probe_loads_every_stage() -> None:
    """The benchmark's bulk-load ceilings (rate_probe modes 3-6: 1 KB, 4 KB, 512 B and 2 KB bulk copies
    in the few-SM combine's ring shape) really load: the XOR of the blocks' words is the XOR of the
    first word of every 4 KB stage, a short last stage included, for any block count."""
    device = torch.device("cuda", 0)
    o = torch.ops.moe_backend
    gen = torch.Generator(device=device).manual_seed(SEED)
    src = torch.randint(-(2**31), 2**31 - 1, ((1 << 22) // 4,), dtype=torch.int32, device=device, generator=gen)
    cases = [(mode, nbytes, blocks) for mode in (3, 4, 5, 6)
             for nbytes, blocks in ((src.numel() * 4, 24), (src.numel() * 4 - 48, 5), (4096 * 7 + 32, 132))]
    for mode, nbytes, blocks in cases:
        blocks = min(blocks, torch.cuda.get_device_properties(device).multi_processor_count)
        sink = torch.zeros(blocks * 4, dtype=torch.int32, device=device)  # a 16-byte word per block
        o.rate_probe(sink.data_ptr(), src.data_ptr(), nbytes, mode, blocks, device.index)
        torch.cuda.synchronize(device)
        got = want = 0
        for v in sink.view(-1, 4)[:, 0].tolist():
            got ^= v
        for v in src[: (nbytes + 4095) // 4096 * 1024 : 1024].tolist():
            want ^= v
        assert got == want, (mode, nbytes, blocks, got, want)


def test_step_costs_probe_times_every_step(tmp_path) -> None:
    """scripts/step_costs.py (the cost of one dependent step of each kind) runs every step at 1,
    32 and one block per SM and writes its JSON; its numbers are ordered as the hardware must
    order them: a load from L2 and a store with a fence cost more than the timer loop alone, a
    load from memory more than one from L2, code's first pass (its instruction fetches) no less
    than its warm passes, straight or branchy, after other code evicted it or not."""
    out = tmp_path / "costs.json"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "step_costs.py")
    proc = subprocess.run([sys.executable, script, "--reps", "64", "--trials", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    steps = res["ns_per_step"]
    assert set(steps) == {"timer", "l2_load", "hbm_load", "acquire_load", "store_fence_sys", "store_fence_gpu",
                          "release_store_sys", "release_add_sys", "atomic_chain", "block_barrier", "portion",
                          "code_first_pass", "code_again", "code_cold_sm", "jumps_first_pass", "jumps_cold_sm",
                          "jumps_cold_l2", "jumps_again", "code_evict", "jumps_64b_cold_sm", "jumps_256b_cold_sm",
                          "jumps_4kb_cold_sm"}
    med = {name: by_blocks["1"]["median"] for name, by_blocks in steps.items()}
    assert all(v > 0 for v in med.values()), med
    assert med["l2_load"] > med["timer"] and med["hbm_load"] > med["l2_load"], med
    assert med["store_fence_sys"] > med["timer"] and med["store_fence_gpu"] > med["timer"], med
    assert med["code_first_pass"] >= 0.9 * med["code_again"] > 0, med  # fetches never make code faster
    assert med["jumps_cold_sm"] >= 0.9 * med["jumps_again"] > 0, med
    assert med["jumps_cold_l2"] >= 0.9 * med["jumps_again"], med
    assert set(steps["portion"]) == {"1", "32", str(torch.cuda.get_device_properties(0).multi_processor_count)}
    assert res["machine"]["commit"], res["machine"]
