"""The nvshmem backend on 2 GPUs: contract suite (both transports), buffer reuse, CUDA
graphs, timeouts. Each test spawns NCCL processes: MOE_TEST_WORLD of them (default 2; 4 or
8 on larger machines) for the contract suite, rounds and graphs, 2 for the timeout and
valid-rows tests. Seeds are fresh per run (printed); set MOE_TEST_SEED to replay one.
With MOE_TEST_SHARED_GPU=1 the ranks share one GPU over gloo (_workers.shared_gpu): the
results of the multi-rank paths on a machine of one GPU, with longer time limits."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from moe_backend import launch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _workers  # noqa: E402

pytestmark = pytest.mark.gpu(shared=True)  # MOE_TEST_SHARED_GPU=1: every rank on one GPU


def _ext_missing() -> str | None:
    try:
        import moe_backend._C  # noqa: F401
    except ImportError as err:
        return str(err)
    return None


WORLD = _workers.gpu_world()
SHARED = _workers.shared_gpu()
if torch.cuda.device_count() < (1 if SHARED else WORLD):
    pytest.skip(f"needs {WORLD} CUDA GPUs (MOE_TEST_WORLD), or one with MOE_TEST_SHARED_GPU=1",
                allow_module_level=True)
if _ext_missing():
    pytest.skip(f"moe_backend._C unavailable: {_ext_missing()}", allow_module_level=True)

SEED = int(os.environ.get("MOE_TEST_SEED", time.time_ns() % (2**31)))
BACKEND = _workers.dist_backend()
SLOW = 5 if SHARED else 1  # time limits stretch: the ranks' kernels take turns on one GPU
COUNT = int(os.environ.get("MOE_TEST_CASES", "24"))


def _spawn(worker, seed_offset: int, count: int, *args, timeout: int = 90) -> None:
    """Print the seed, then run `worker(seed, count, *args)` on WORLD processes."""
    print(f"seed={SEED}")
    launch.spawn(worker, WORLD, SEED + seed_offset, count, *args, dist_backend=BACKEND,
                 timeout=timeout * WORLD * SLOW)


def _contract_under_env(seed, count, env, transports, rounds, replays, tokens=None, replay_transport="nvlink"):
    """Set the backend's variables (read when an arena is created, PDL at the first dispatch of
    the process), then the contract suite on `transports`, rounds on a shared arena and CUDA-graph
    replays on `replay_transport` (`tokens` per rank; the workers' small defaults when None)."""
    os.environ.update(env)
    sized = {} if tokens is None else {"tokens": tokens}
    _workers.contract_worker(seed, count, transports)
    _workers.rounds_worker(seed, replay_transport, rounds, **sized)
    _workers.graph_worker(seed, replay_transport, replays, **sized)


def test_contract_suite_both_transports():
    _spawn(_workers.contract_worker, 0, COUNT, ("put", "nvlink"), timeout=60)


@pytest.mark.parametrize("partials", ["0", "1"])
def test_padded_layout(partials: str):
    """dispatch_padded / combine_padded on both transports (nvlink: the padded kernels), against
    the oracle, with contiguous rounds between and CUDA-graph replays; also with the combine's
    per-token partials in tagged words (PADDED_PARTIALS=1, round 66)."""
    _spawn(_workers.padded_worker, 40, max(6, COUNT // 2), {"MOE_BACKEND_NVSHMEM_PADDED_PARTIALS": partials},
           timeout=90)


def test_contract_suite_without_overlap():
    """The receives on the caller's stream after their sends (MOE_BACKEND_NVSHMEM_OVERLAP=0,
    MOE_BACKEND_NVSHMEM_COMBINE_OVERLAP=0, MOE_BACKEND_NVSHMEM_COMBINE_FUSED=0): the same
    results as the overlapped default."""
    _spawn(_contract_without_overlap, 1, max(4, COUNT // 3), timeout=60)


def _contract_without_overlap(seed, count):
    os.environ["MOE_BACKEND_NVSHMEM_OVERLAP"] = "0"  # read when an arena is created
    os.environ["MOE_BACKEND_NVSHMEM_COMBINE_OVERLAP"] = "0"
    os.environ["MOE_BACKEND_NVSHMEM_COMBINE_FUSED"] = "0"
    _workers.contract_worker(seed, count, ("put", "nvlink"))


@pytest.mark.parametrize("switch", [None, "OVERLAP_SMS=4", "TWO_PART_RECV=1"])
def test_contract_suite_with_send_stream(switch: str | None):
    """The send kernel on its own stream (backend option send_stream=True): the same results,
    rounds on a shared arena and CUDA-graph replays included; also with the split dispatch sized
    for 4 SMs (OVERLAP_SMS=4, round 62: fewer pieces per token, a capped send grid) and with the
    two-part receive (TWO_PART_RECV=1, round 64: 4 blocks with the send and the rest launched by
    dispatch_recv claim the items from one counter)."""
    _spawn(_contract_with_send_stream, 2, max(4, COUNT // 3), switch)


def _contract_with_send_stream(seed, count, switch=None):
    if switch is not None:
        name, value = switch.split("=")
        os.environ[f"MOE_BACKEND_NVSHMEM_{name}"] = value  # read when an arena is created
    _workers.contract_worker(seed, count, ("put", "nvlink"), send_stream=True)
    _workers.rounds_worker(seed, "nvlink", 10, send_stream=True)
    _workers.graph_worker(seed, "nvlink", 4, send_stream=True)


@pytest.mark.parametrize("tokens", [1024, 2048])
def test_work_between_send_and_receive_at_prefill_sizes(tokens: int):
    """The benchmark's overlap row as a test: the send on its own stream, 2048^2 matmuls between
    dispatch_send and dispatch_recv, DeepSeek rows at 1024 and 2048 tokens a rank (the copy-engine
    send's sizes). Run 39 (nvidia-h200-x2, main 21491dd) timed out in the sweep's 2048-token row
    at its first round with matmuls between; since then a split send takes the SM send, never the
    copy engines, by default (docs/PERF_NOTES.md, "Run 39 at EP2")."""
    print(f"seed={SEED}")
    launch.spawn(_workers.work_between_worker, WORLD, SEED, tokens, 6, dist_backend=BACKEND, timeout=180 * WORLD * SLOW)


def test_contract_suite_with_fused_combine():
    """The fused combine (send and receive in one kernel on the side stream; the default past the
    combine-overlap limit, forced here): the same results; rounds and CUDA-graph replays at a
    size that takes the fused path, then rounds with its rows loaded by cp.async
    (MOE_BACKEND_NVSHMEM_COMBINE_BULK=0) instead of bulk copies."""
    _spawn(_contract_with_fused_combine, 3, max(4, COUNT // 3))


def _contract_with_fused_combine(seed, count):
    os.environ["MOE_BACKEND_NVSHMEM_COMBINE_FUSED"] = "1"  # read when an arena is created
    _workers.contract_worker(seed, count, ("put", "nvlink"))
    for transport in ("put", "nvlink"):
        _workers.rounds_worker(seed, transport, 10, tokens=1100)  # G*M > 1024: past the overlap limit
        _workers.graph_worker(seed, transport, 4, tokens=1100)
    os.environ["MOE_BACKEND_NVSHMEM_COMBINE_BULK"] = "0"
    for transport in ("put", "nvlink"):
        _workers.rounds_worker(seed, transport, 6, tokens=1100)


def test_contract_suite_with_few_sms():
    """Kernels sized for 4 SMs (backend option num_sms): the same results; at G*M = 2200 the
    plan's chunks exceed 256 tokens, and the receive still overlaps the send (the grids use
    at most half the GPU), in rounds and CUDA-graph replays too. Those rounds take the fused
    combine, which sums rows that bulk copies brought into shared memory, and takes the partials
    of its receive half the same way (the fused test covers the cp.async pipeline too)."""
    _spawn(_contract_with_few_sms, 4, max(4, COUNT // 3))


def _contract_with_few_sms(seed, count):
    _workers.contract_worker(seed, count, ("put", "nvlink"), num_sms=4)
    os.environ["MOE_BACKEND_NVSHMEM_COMBINE_FUSED"] = "1"  # read when an arena is created
    tokens = 2200 // WORLD  # G*M = 2200 at any world size (4 SMs take at most 4096)
    _workers.rounds_worker(seed, "nvlink", 6, tokens=tokens, num_sms=4)
    _workers.graph_worker(seed, "nvlink", 3, tokens=tokens, num_sms=4)


def test_contract_suite_copy_variants():
    """The dispatch copy's launch and work-item variants (docs/PERF_NOTES.md, round 13): one warp
    per token without the programmatic launch (MOE_BACKEND_NVSHMEM_COPY_PIECES=1,
    MOE_BACKEND_NVSHMEM_PDL=0), then every copy launched programmatically, the work-counter
    copy of a large arena included (MOE_BACKEND_NVSHMEM_PDL=1): the same results, rounds and
    CUDA-graph replays too."""
    for pieces, pdl in (("1", "0"), ("", "1")):
        env = {"MOE_BACKEND_NVSHMEM_COPY_PIECES": pieces, "MOE_BACKEND_NVSHMEM_PDL": pdl}
        _spawn(_contract_under_env, 5, max(4, COUNT // 3), env, ("put", "nvlink"), 6, 3, 1100)


def test_contract_suite_with_copy_engine_send():
    """Tokens sent by copy-engine copies and per-chunk flag kernels instead of the send kernel
    (nvlink; by default only for dense routings at >= 1024 tokens), here forced on for every
    call and arena (MOE_BACKEND_NVSHMEM_CE_SEND=1) with 3 chunks, so that chunk edges, scales
    (2D copies), tp replicas and device-side token counts are all crossed: the same results,
    rounds and CUDA-graph replays. Then 5 chunks that shrink (MOE_BACKEND_NVSHMEM_CE_DECAY)
    copied on 2 streams (MOE_BACKEND_NVSHMEM_CE_STREAMS), then with the chunks' flags copied by the
    copy engines behind their rows, no flag kernel (MOE_BACKEND_NVSHMEM_CE_FLAG_COPY=1)."""
    base = {"MOE_BACKEND_NVSHMEM_CE_SEND": "1", "MOE_BACKEND_NVSHMEM_CE_CHUNKS": "3"}
    shrinking = {"MOE_BACKEND_NVSHMEM_CE_SEND": "1", "MOE_BACKEND_NVSHMEM_CE_CHUNKS": "5",
                 "MOE_BACKEND_NVSHMEM_CE_DECAY": "0.6", "MOE_BACKEND_NVSHMEM_CE_STREAMS": "2"}
    copied = {**shrinking, "MOE_BACKEND_NVSHMEM_CE_FLAG_COPY": "1"}
    for env in (base, shrinking, copied):
        _spawn(_contract_under_env, 6, max(4, COUNT // 2), env, ("nvlink",), 8, 4, 300)


def test_contract_suite_without_direct_receive():
    """Small nvlink arenas take the direct receive by default (senders ship expert ranks and
    counts with their tables; one receive kernel places and copies the rows), so the other
    tests cover it there. This one turns it off (MOE_BACKEND_NVSHMEM_DIRECT_RECV=0) to keep the
    plan and copy kernels covered at small sizes too, with the table and combine-entry
    announces and token flags behind a full fence (MOE_BACKEND_NVSHMEM_ENTRY_RELEASE=0,
    TOKEN_RELEASE=0, the other defaults off): the same results, rounds and replays."""
    env = {f"MOE_BACKEND_NVSHMEM_{k}": "0" for k in ("DIRECT_RECV", "ENTRY_RELEASE", "TOKEN_RELEASE")}
    _spawn(_contract_under_env, 7, max(4, COUNT // 2), env, ("nvlink",), 8, 4)


def test_contract_suite_direct_receive_untagged():
    """The direct receive reads round-tagged table words by default (put too, round 26), loads
    own rows before the tables are in, and scans the offsets with every thread (round 25). This
    one runs nvlink's with the untagged table and its flag, without the early load, and with
    warp 0's scan, a token's pieces on one SM, and put's plan and copy kernels
    (MOE_BACKEND_NVSHMEM_LL_TABLE=0, EARLY_LOAD=0, PAR_SCAN=0, ITEM_SPREAD=0): the same results, rounds and replays."""
    env = {f"MOE_BACKEND_NVSHMEM_{k}": "0" for k in ("LL_TABLE", "EARLY_LOAD", "PAR_SCAN", "ITEM_SPREAD")}
    _spawn(_contract_under_env, 8, max(4, COUNT // 2), env, ("put", "nvlink"), 8, 4)


def test_contract_suite_split_dispatch():
    """`comm.dispatch` runs the fused dispatch kernel (send, then the direct receive, in one
    launch) wherever the direct receive runs (round 35); the other tests cover it there. This one
    turns it off (MOE_BACKEND_NVSHMEM_FUSED_DISPATCH=0) so that a whole dispatch is again a send
    kernel and a receive kernel: the same results, rounds and replays."""
    env = {"MOE_BACKEND_NVSHMEM_FUSED_DISPATCH": "0"}
    _spawn(_contract_under_env, 9, max(4, COUNT // 2), env, ("put", "nvlink"), 8, 4)


def test_contract_suite_tagged_rows():
    """The rows in round-tagged words that the receive polls, no token flag (round 38, nvlink's
    direct receive only), fused and split, in every arena with room for them (LL_ROWS=4096), and
    in arenas of at most 20 tokens (the others flagged): the same results, rounds and replays."""
    for env in ({"MOE_BACKEND_NVSHMEM_LL_ROWS": "4096"},
                {"MOE_BACKEND_NVSHMEM_LL_ROWS": "4096", "MOE_BACKEND_NVSHMEM_FUSED_DISPATCH": "0"},
                {"MOE_BACKEND_NVSHMEM_LL_ROWS": "20"}):
        _spawn(_contract_under_env, 10, max(4, COUNT // 2), env, ("put", "nvlink"), 8, 4)


def test_contract_suite_tagged_partials():
    """The combine's partials in round-tagged words that the receive polls, no flag (LL_COMBINE:
    by default every call in nvlink arenas of at most 32 tokens, and the calls of at most 32 tokens
    in larger arenas with room for them): in every arena with room for them, in none, in arenas of
    at most 20 tokens (and calls of at most 20 elsewhere) with the whole combine's receive on the
    side stream, and in arenas of at most 4 tokens and calls of at most 4 (so rounds and replays
    switch forms in one arena): the same results, rounds and replays."""
    for env in ({"MOE_BACKEND_NVSHMEM_LL_COMBINE": "4096"}, {"MOE_BACKEND_NVSHMEM_LL_COMBINE": "0"},
                {"MOE_BACKEND_NVSHMEM_LL_COMBINE": "20", "MOE_BACKEND_NVSHMEM_WHOLE_COMBINE": "0"},
                {"MOE_BACKEND_NVSHMEM_LL_COMBINE": "4"}):
        _spawn(_contract_under_env, 11, max(4, COUNT // 2), env, ("nvlink",), 8, 4)


def test_contract_suite_put_tagged_partials():
    """put with the combine's partials as round-tagged words (PUT_TAGGED=1, round 63: staged, then
    put with no signal; the receive polls them as on nvlink): every call of the small arenas and the
    small calls of the larger ones tagged, then only arenas and calls of at most 4 tokens (rounds
    and replays switch forms in one arena): the same results, rounds and replays."""
    for env in ({"MOE_BACKEND_NVSHMEM_PUT_TAGGED": "1"},
                {"MOE_BACKEND_NVSHMEM_PUT_TAGGED": "1", "MOE_BACKEND_NVSHMEM_LL_COMBINE": "4"}):
        _spawn(_contract_under_env, 12, max(4, COUNT // 2), env, ("put",), 8, 4, None, "put")


def test_contract_suite_register_send_rows():
    """The two-kernel combine send's rows by registers, four a batch (COMBINE_STEP_BULK=0; by default,
    round 84, a step's rows by one bulk copy each into the warp's shared memory where top-k <= 8),
    tagged partials or not: the same results, rounds and replays, on both transports."""
    for env in ({"MOE_BACKEND_NVSHMEM_COMBINE_STEP_BULK": "0"},
                {"MOE_BACKEND_NVSHMEM_COMBINE_STEP_BULK": "0", "MOE_BACKEND_NVSHMEM_LL_COMBINE": "0"}):
        _spawn(_contract_under_env, 13, max(4, COUNT // 2), env, ("put", "nvlink"), 8, 4)


@pytest.mark.parametrize("whole", ["0", "1"])
def test_contract_suite_whole_combine_forced(whole: str):
    """`comm.combine` with every call's receive on the side stream (MOE_BACKEND_NVSHMEM_WHOLE_COMBINE=0)
    or every call's on the caller's stream, launched by PDL (=1; by default, round 53, only the calls
    whose warp-per-item receive grid passes the side stream's): bit-exact with the reference,
    through rounds and CUDA-graph replays, on both transports."""
    env = {"MOE_BACKEND_NVSHMEM_WHOLE_COMBINE": whole}
    _spawn(_contract_under_env, 10, max(4, COUNT // 2), env, ("put", "nvlink"), 8, 4)


@pytest.mark.parametrize("wide", [True, False])
def test_whole_combine_receive_takes_a_warp_per_item(wide: bool):
    """The whole combine's PDL-launched receive with a warp per item of the call, more blocks than
    SMs where each rank's rows pass them (round 52, WIDE_RECV), and without: the grids by the
    profiler, the results bit for bit."""
    print(f"seed={SEED}")
    launch.spawn(_workers.wide_recv_worker, WORLD, SEED, 2, wide, dist_backend=BACKEND, timeout=120 * WORLD * SLOW)


@pytest.mark.parametrize("wide", [True, False])
def test_whole_combine_by_call(wide: bool):
    """By default (round 53) the PDL launch only for the calls whose wide receive grid passes the
    side stream's, on every rank: the streams and grids by the profiler, the results bit for bit."""
    print(f"seed={SEED}")
    launch.spawn(_workers.wide_recv_worker, WORLD, SEED, 2, wide, None, dist_backend=BACKEND,
                 timeout=120 * WORLD * SLOW)


def test_latency_floor_probe_runs():
    """The benchmark's latency-floor probe (moe_backend/latency_floor.py): both variants run to
    completion on every rank (no wait times out) and report positive times."""
    launch.spawn(_latency_floor, WORLD, dist_backend=BACKEND, timeout=30 * WORLD * SLOW)


def _latency_floor():
    from moe_backend import latency_floor

    device = torch.device("cuda", torch.cuda.current_device())
    floor = latency_floor.measure(device, iters=20, warmup=3)
    assert floor is not None and set(floor) == set(latency_floor.VARIANTS), floor
    assert all(0 < v["p10"] <= v["median"] <= v["p90"] for v in floor.values()), floor


def test_sm_ceilings_probe():
    """The benchmark's SM-count ceilings (moe_backend/sm_ceilings.py): every rate is positive,
    fewer SMs are not faster than the whole GPU (unless the ranks share one), and the store
    probes (SM and bulk stores) really write (the bytes they store to a local buffer are the
    pattern, not what was there), no further than asked."""
    launch.spawn(_sm_ceilings, WORLD, dist_backend=BACKEND, timeout=60 * WORLD * SLOW)


def _sm_ceilings():
    from moe_backend import sm_ceilings
    from moe_backend.backends import nvshmem_runtime as rt

    device = torch.device("cuda", torch.cuda.current_device())
    got = sm_ceilings.measure(device, [24], iters=3)
    assert got is not None and [e["sms"] for e in got.values()][-1] == 24, got
    whole, few = got.values()
    for entry in got.values():
        assert all(entry[k] > 0 for k in (*sm_ceilings.PROBES, "nvlink_store")), got
    if not SHARED:  # ranks taking turns on one GPU time each other's turns too
        assert few["load"] <= whole["load"] * 1.1 and few["nvlink_store"] <= whole["nvlink_store"] * 1.1, got
    o = rt.ops()
    dst = torch.full((1 << 20,), -1, dtype=torch.int32, device=device)
    # SM stores of the whole buffer; bulk stores of all but its last 3 words (the tail past the
    # last whole 16 KB copy too): the pattern everywhere asked, nothing past nbytes.
    for mode, nbytes in ((0, dst.numel() * 4), (2, dst.numel() * 4 - 48)):
        dst.fill_(-1)
        o.rate_probe(dst.data_ptr(), 0, nbytes, mode, 3, device.index)
        words = dst.view(-1, 4).cpu()
        stored, rest = words[: nbytes // 16], words[nbytes // 16 :]
        assert bool((stored[:, 2] == 1).all() and (stored[:, 3] == 2).all()), (mode, stored[:4])
        assert bool((rest == -1).all()), (mode, rest)
    # A bad argument raises, with the number in the message (this crashed the process before
    # the numbers were formatted by msg() in csrc/host_checks.h).
    # (Every mode's name in the message: tests/gpu/test_build.py.)
    with pytest.raises(RuntimeError, match=r"rate_probe: mode must be 0 \(stores\), .*, got 99"):
        o.rate_probe(dst.data_ptr(), 0, 64, 99, 1, device.index)
    with pytest.raises(RuntimeError, match="launches must be 1 or 2, got 3"):
        o.ping(torch.zeros(1, dtype=torch.int32, device=device), dst.data_ptr(), [dst.data_ptr()], 0, 1, 3, 1000)


@pytest.mark.parametrize("transport", ["put", "nvlink"])
def test_rounds_shared_arena_and_graph(transport):
    print(f"seed={SEED}")
    launch.spawn(_rounds_and_graph, WORLD, SEED, transport, dist_backend=BACKEND, timeout=30 * WORLD * SLOW)


def _rounds_and_graph(seed, transport):
    _workers.rounds_worker(seed, transport, 30)
    _workers.graph_worker(seed, transport, 6)


@pytest.mark.parametrize("tagged_tokens", ["0", "4096"])
def test_timeout_names_phase_and_peer(tagged_tokens):
    """A rank that never sends: the other's receive raises naming the phase and the rank, the
    combine's with its partials behind flags (LL_COMBINE=0) and in round-tagged words (4096)."""
    launch.spawn(_timeout_under_env, 2, tagged_tokens, dist_backend=BACKEND, timeout=45 * SLOW)


def _timeout_under_env(tagged_tokens):
    os.environ["MOE_BACKEND_NVSHMEM_LL_COMBINE"] = tagged_tokens  # read when an arena is created
    _workers.timeout_worker("nvlink")


def test_contract_tasks_bad_inputs_split_phases_padded_valid_rows():
    launch.spawn(_workers.contract_tasks_worker, 2, dist_backend=BACKEND, timeout=120 * SLOW)
