// moe_backend._C: the host side of the four split dispatch/combine kernels on NVSHMEM (the
// arena's context, the launchers, the torch ops) and the few NVSHMEM host calls the Python
// runtime needs. The kernels live in the headers below (device_common.cuh, dispatch_kernels.cuh,
// combine_kernels.cuh, probes.cuh); they are one translation unit on purpose (the CI machine has
// 2 cores). See docs/KERNELS.md for the protocol and buffer layout.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <vector>

#include "device_common.cuh"
#include "dispatch_kernels.cuh"
#include "combine_kernels.cuh"
#include "padded_kernels.cuh"
#include "host_checks.h"

namespace moe {

// ---------------------------------------------------------------------------------------
// Host side

// Kernels that run concurrently on one SM (send beside receive) need one SM configuration that
// fits both; the driver sizes it for the first kernel on the SM, and a receive needing more
// waits until the SM drains (seen with the overlapped combine receive, round 7). So kernels ask
// for the largest shared-memory carveout (our kernels stream through L2: L1 is not needed),
// except the two-kernel combine (send without the fused receive, and the receive): round 16
// measured it faster at the driver's default (128-token decode combine 25.6 -> 23.4 us, 1 token
// 16.4 -> 15.6, 512 tokens 60.3 -> 54.7); elsewhere the default measured no better (prefill
// 229.7 / 221.9 against 229.6 / 222.0 us), so the other kernels keep the largest. Round 84's
// step-bulk send (~142 KB a block) asks for the largest too, and the receive beside it for the
// largest by its launch (launch_combine_recv_n).
// MOE_BACKEND_NVSHMEM_CARVEOUT=1 / =0: the largest / the default for every kernel.
static bool env_switch(const char* name, bool dflt, bool can_force = false);
template <typename K>
static bool max_shared_carveout(K kernel, bool by_default = true) {
  if (!env_switch("MOE_BACKEND_NVSHMEM_CARVEOUT", by_default, true)) return true;
  CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               (int)cudaSharedmemCarveoutMaxShared));
  return true;
}

// Host-side context: the kernels' Params plus what the overlapped dispatch receive needs.
// overlap: dispatch_send forks a side stream (event `fork` recorded before the send kernel)
// that runs the receive's plan + copy kernels concurrently with the send, and stashes their
// outputs; dispatch_recv joins (event `join`) and returns them. Safe because the waiting
// kernels never fill the GPU (plan: <= one 256-thread block per SM, copy: one 512-thread block
// per SM), so the never-waiting send kernel can always be scheduled next to them.
// Blocks of the kernels whose items are one warp's each, fixed per arena (size_grids): the direct
// receive and the fused dispatch (one item a warp, all at once), the two-kernel combine's send and
// receive (grid-stride items).
// split_recv: the direct receive of a split dispatch (dispatch_send, then dispatch_recv); the
// fused dispatch takes `direct`.
struct Grids {
  int direct = 1, split_recv = 1, comb_send = 1, comb_recv = 1;
  // The split receive's pieces per token and early load (the arena's own but in a send-stream
  // arena, round 62), and the split send's block cap (0: none); a two-part receive's second grid.
  int split_pieces = 1, split_early = 0, split_send = 0, split_recv2 = 0;
};

// The copy-engine send's chunks each CE_DECAY times the one before (MOE_BACKEND_NVSHMEM_CE_DECAY),
// so the last, whose rows the receive writes only after every transfer, is the smallest. Run 43 at
// EP2 (DeepSeek prefill, 4 chunks): 0.5 / 0.6 / 0.7 / 0.8 211.0-211.6 / 211.6 / 212.4-212.5 /
// 212.5-212.9 us against the equal split's 216.7-217.8.
constexpr double CE_DECAY = 0.6;

struct Ctx {
  Params p;
  bool overlap = false;
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  bool stashed = false;
  std::vector<at::Tensor> stash;
  // The own group's tokens are copied from the caller's x / x_scale by the receive (the send
  // skips them), so the last send's x and x_scale are held until its receive has been
  // launched (non-overlapped) or joined (overlapped): the caching allocator must not hand
  // their memory out while the side stream may still read it. The caller must not modify
  // x / x_scale between dispatch_send and dispatch_recv.
  at::Tensor keep_x, keep_s;
  // Combine overlap: combine_send also launches the receive kernel on `side` (fork/join
  // events reused: a dispatch's join is consumed before its combine starts) writing `out`;
  // combine_recv joins. The receive's inputs are held until then (comb_out defined = pending).
  bool comb_overlap = false;
  // Fused combine (default for arenas past the overlap limit, see create_ctx):
  // combine_send launches one kernel, send then receive, on `side`; its `y` / weights are
  // held too, since the side stream reads them after combine_send has returned.
  bool comb_fused = false;
  at::Tensor comb_out, comb_ids, comb_ntok, comb_y, comb_w;
  // Send stream (backend option send_stream, overlap only): the send kernel also runs off the
  // caller's stream, on `send_side` (fork event shared with the receive), so the caller's
  // stream goes on at once (e.g. a matmul between dispatch_send and dispatch_recv) and
  // dispatch_recv joins both (`send_join` too). Its inputs are held until then, like x.
  cudaStream_t send_side = nullptr;
  cudaEvent_t send_join = nullptr;
  at::Tensor keep_ids, keep_w, keep_n;  // keep_ids defined = a send on send_side not yet joined
  // Copy-engine send (p.ce_send, see launch_ce_send): chunk c copied on `ce_copies[c % k]`, each chunk's flags
  // raised by a kernel on `ce_flags` behind the chunk's event `ce_done[c]`; dispatch_recv joins
  // `ce_join` (ce_pending), and x / x_scale are held until then like for the receive.
  std::vector<cudaStream_t> ce_copies;
  cudaStream_t ce_flags = nullptr;
  std::vector<cudaEvent_t> ce_done;
  cudaEvent_t ce_join = nullptr;
  bool ce_pending = false;
  bool ce_forced = false;  // MOE_BACKEND_NVSHMEM_CE_SEND=1: for every token count
  bool fused_dispatch = true;  // dispatch_whole launches dispatch_fused_kernel where it can (round 35)
  // Round 64 (MOE_BACKEND_NVSHMEM_TWO_PART_RECV=1, send-stream arenas with the direct receive): the
  // split receive's items claimed from a counter by two launches, OVERLAP_SMS blocks with the send
  // (`grids.split_recv`) and `grids.split_recv2` more behind the caller's work in dispatch_recv
  // (`two_part_pending` until then).
  bool two_part = false, two_part_pending = false;
  // combine_whole: which calls run send and receive on the caller's stream, the receive by PDL,
  // where the receive would overlap the send (round 36): none, those whose wide receive passes the
  // side stream's grid (round 53, the default), or every one (round 52's default).
  enum class Whole { Never, ByCall, Every } whole_combine = Whole::ByCall;
  bool wide_recv = true;  // a PDL-launched receive takes a warp per item of the call (recv_blocks, round 52)
  bool step_bulk = true;  // the two-kernel send loads a step's rows by bulk copies (step_bulk_call)
  double ce_decay = CE_DECAY;  // each chunk this fraction of the one before (ce_chunk_starts)
  bool ce_flag_fence = true;  // the flag kernel: one fence, relaxed flag stores (round 38; =0 a release each)
  // The chunks' flags copied by the copy engines behind their rows, no flag kernel (round 60,
  // MOE_BACKEND_NVSHMEM_CE_FLAG_COPY=1; `ce_filled`: the round written into the copies' source).
  bool ce_flag_copy = false;
  cudaEvent_t ce_filled = nullptr;
  Grids grids;  // the latency kernels' blocks, fixed per arena (size_grids)
};

// The combine receive runs concurrently with the send only for arenas of at most this many
// source tokens (G*M). Measured (2 x H200, DeepSeek shape, results/gpu/2026-11-30-run6):
// overlapped vs sequential combine 17 vs 39 us (1 token) ... 64 vs 68 us (G*M = 1024), but
// 109 vs 85 us (2048) and 319 vs 260 us (8192): at prefill sizes the concurrent receive's
// small blocks (needed to fit beside the send) lag the send and finish ~100 us after it.
constexpr long long COMB_OVERLAP_MAX_TOKENS = 1024;

static Ctx& CX(int64_t ctx) {
  MOE_CHECK(ctx != 0, "nvshmem backend: the communicator was closed");
  return *reinterpret_cast<Ctx*>(ctx);
}

// An on/off choice read when an arena is created: `name`=0 turns it off, `name`=1 turns it on
// if `can_force` (otherwise the default stands), anything else or unset: `dflt`.
static bool env_switch(const char* name, bool dflt, bool can_force) {
  const char* v = std::getenv(name);
  if (v && v[0] == '0') return false;
  if (v && v[0] == '1' && can_force) return true;
  return dflt;
}

int64_t num_sms(int64_t device);

// Pieces per token of the dispatch copy's items: as many as let the arena's tokens fill one
// warp per item on a block per SM (num_sms * NWARPS warps), each piece at least
// COPY_MIN_PIECE bytes of the row; 1 (and a work counter) when the tokens alone are more.
// A few hundred tokens on one warp each wrote their rows from a few SMs, at a few SMs' store
// rate (decode, 128 tokens: the copy took 12 us; 5 us in pieces, round 13).
// MOE_BACKEND_NVSHMEM_COPY_PIECES=k caps it (k = 1: one warp per token, for A/B runs).
constexpr int COPY_MIN_PIECE = 512;
static int copy_pieces(const Params& p, int sms) {
  const long long by_work = (long long)sms * NWARPS / ((long long)p.G * p.M);
  const long long by_size = p.row_bytes / COPY_MIN_PIECE;
  const char* v = std::getenv("MOE_BACKEND_NVSHMEM_COPY_PIECES");
  const long long cap = v && *v ? std::atoi(v) : 64;
  return (int)std::max(1LL, std::min({by_work, by_size, cap}));
}

// Copy-engine send defaults (round 15, DeepSeek prefill on 2 x H200: 4 chunks 231 us, 6: 242,
// 8: 246, 12: 277, 32: 405, the send kernel 263-264: each chunk's event and flag kernel cost
// ~5 us on the critical path, so few chunks).
// The chunks' copies to several ranks run one after another on one stream: at EP4 (DeepSeek
// prefill, density 0.90) the dispatch took 941 us against put's 595, hence a density that in
// practice means one other rank.
constexpr int CE_CHUNKS = 4;
constexpr int CE_MIN_TOKENS = 1024;
constexpr double CE_MIN_DENSITY = 0.99;
// Chance that a token's topk distinct experts (uniform over E) include one of a given rank's L.
static double dense_fraction(int E, int L, int topk) {
  double none = 1.0;
  for (int i = 0; i < topk && none > 0.0; ++i) none *= std::max(0.0, (double)(E - L - i) / (double)(E - i));
  return 1.0 - none;
}

// The latency kernels' blocks (round 50): one per item of the largest call, while SMs last, so a
// call's items sit one a block (a kernel takes item i on warp i / grid of some block), each on its
// own SM, whatever the arena's size. Sized by the arena's tokens (=0, before round 50), a 1-token
// arena's direct receive had one block (G*M*P / NWARPS: a token's 14 pieces on one SM) and its
// combine send and receive one each (a token's 14 slices on one SM, 4 warps of it in the receive
// beside the send), 2-5 us slower than the same call in a 128-token arena (round 49).
// Blocks that give each of the arena's copy items (G*M tokens, copy_pieces pieces each) a warp.
static long long item_warp_blocks(const Params& p) {
  return ((long long)p.G * p.M * p.copy_pieces + NWARPS - 1) / NWARPS;
}

// Round 25: the direct receive may load an own token's piece before the tables are in where a
// piece fits the registers (EARLY_UNROLL vectors per lane) and rows and scales are 16-byte vectors.
static bool early_load_fits(const Params& p) {
  const int n16 = p.row_bytes >> 4, per16 = (n16 + p.copy_pieces - 1) / p.copy_pieces;
  return p.row_bytes % 16 == 0 && per16 <= 32 * EARLY_UNROLL && p.scale_bytes % 16 == 0 && p.scale_bytes <= 512;
}

// Round 62's default: a send-stream arena's split dispatch on the 4 SMs that a one-wave matmul of
// one-SM tiles leaves free (the bench's overlap row: 128 tiles on 132 SMs, round 21), where the
// arena's expected rows (uniform routing: topk * L / E local experts a source token) fit those
// SMs' stores in ~8 us (OVERLAP_BYTES_PER_SM at ~62 GB/s an SM, sm_ceilings), so a matmul of
// about the dispatch's length hides them. Measured at world size 1 (run 44 call 4, the sweep's
// overlap rows, bf16 rows of 14 KB): 16 tokens (1.8 MB) 31.1-32.1 -> 27.6-28.2 us; 64 tokens
// (7.3 MB, 4 SMs forced) 32.0-33.4 -> 51.2-52.7 us, hence the bound.
constexpr int OVERLAP_SMS = 4;
constexpr double OVERLAP_BYTES_PER_SM = 512.0 * 1024;
static bool overlap_rows_fit(const Params& p) {
  const double rows = (double)p.G * p.M * p.topk * p.L / p.E;
  return rows * (p.row_bytes + p.scale_bytes) <= OVERLAP_SMS * OVERLAP_BYTES_PER_SM;
}

// compact_split: the split receive's grid by the arena's tokens whatever per_item says (round 61).
// overlap_sms (send-stream arenas, round 62; p.num_sms: none): with compact_split, the split
// dispatch of an arena with the direct receive sized for that many SMs: its receive's pieces as
// copy_pieces gives them on overlap_sms SMs (a warp per item, so at least a warp per token), its
// send at most SEND_BLOCKS_PER_SM blocks each.
// two_part (round 64): the split receive in two launches claiming one counter's items, pieces that
// make ~16 a warp of the first part's OVERLAP_SMS blocks, the second part a warp per item.
static Grids size_grids(const Params& p, bool per_item, bool compact_split, int overlap_sms, bool two_part) {
  const long long pieces = (long long)p.G * p.M * p.copy_pieces;
  const long long slices = (long long)p.M * max_slices(p.H);
  auto on_sms = [&](long long items) { return (int)std::max(1LL, std::min((long long)p.num_sms, items)); };
  Grids g;
  // The direct kernels give the items to the blocks after the table's direct_blocks (item i to block
  // (i + tb) % grid), so with tb more blocks no item of the largest call waits behind the table's write.
  g.direct = per_item ? on_sms(pieces + p.direct_blocks) : (int)item_warp_blocks(p);
  g.split_pieces = p.copy_pieces;
  g.split_early = p.early_load;
  auto pieces_for = [&](int sms) {  // the arena's Params with the pieces copy_pieces gives on `sms` SMs
    Params q = p;
    q.copy_pieces = copy_pieces(p, sms);
    return q;
  };
  if (compact_split && p.direct && overlap_sms < p.num_sms) {
    const Params q = pieces_for(overlap_sms);
    g.split_pieces = q.copy_pieces;
    g.split_early = p.early_load && early_load_fits(q);
    g.split_send = SEND_BLOCKS_PER_SM * overlap_sms;
    g.split_recv = (int)item_warp_blocks(q);
  } else {
    g.split_recv = compact_split ? (int)item_warp_blocks(p) : g.direct;
  }
  if (two_part) {
    const Params q = pieces_for(4 * OVERLAP_SMS);
    g.split_pieces = q.copy_pieces;
    g.split_early = 0;  // claimed items load nothing before the polls
    g.split_recv = OVERLAP_SMS;
    g.split_recv2 = (int)std::min<long long>(p.num_sms, item_warp_blocks(q));
  }
  g.comb_send = on_sms(per_item ? p.G * slices : (long long)p.G * p.M);
  g.comb_recv = on_sms(per_item ? slices : p.M);
  return g;
}

// Direct receive (round 16): nvlink, or put with the round-tagged table (round 26); the table fits one portion (written by
// direct_blocks send blocks); ranks and ids packed in 16 bits each; the sender's masks and the receiver's bases in
// shared memory; one warp per item within one block per SM.
constexpr size_t DIRECT_MAX_SMEM = 32 * 1024;
static size_t direct_send_smem(const Params& p) { return (size_t)p.E * ((p.M + 31) / 32) * 4; }
static bool direct_recv_fits(const Params& p, bool transport_ok) {
  return transport_ok && table_portions(p) == 1 && (long long)p.M * p.topk * 8 <= TABLE_PORTION_BYTES && p.M < 32768 &&
         p.E < 65536 && direct_send_smem(p) <= DIRECT_MAX_SMEM && (size_t)(p.G + 1) * p.L * 4 <= DIRECT_MAX_SMEM &&
         item_warp_blocks(p) <= p.num_sms;
}

// Releases an arena context and what it holds (streams, events, kept tensors).
static void free_ctx(Ctx* cx) {
  cx->stash.clear();
  cx->keep_x = at::Tensor();
  cx->keep_s = at::Tensor();
  cx->comb_out = cx->comb_ids = cx->comb_ntok = cx->comb_y = cx->comb_w = at::Tensor();
  cx->keep_ids = cx->keep_w = cx->keep_n = at::Tensor();
  for (auto st : cx->ce_copies) cudaStreamDestroy(st);
  if (cx->ce_flags) cudaStreamDestroy(cx->ce_flags);
  for (auto e : cx->ce_done) cudaEventDestroy(e);
  if (cx->ce_join) cudaEventDestroy(cx->ce_join);
  if (cx->ce_filled) cudaEventDestroy(cx->ce_filled);
  if (cx->send_side) cudaStreamDestroy(cx->send_side);
  if (cx->send_join) cudaEventDestroy(cx->send_join);
  if (cx->side) cudaStreamDestroy(cx->side);  // pending work still completes
  if (cx->fork) cudaEventDestroy(cx->fork);
  if (cx->join) cudaEventDestroy(cx->join);
  delete cx;
}

int64_t create_ctx(std::vector<int64_t> c) {
  MOE_CHECK(c.size() >= 39, "create_ctx: short config");
  // Freed with what it holds if a check below throws; handed to the caller at the end.
  std::unique_ptr<Ctx, void (*)(Ctx*)> owner(new Ctx(), free_ctx);
  Ctx* cx = owner.get();
  Params* p = &cx->p;
  int i = 0;
  p->W = c[i++]; p->G = c[i++]; p->tp = c[i++]; p->rank = c[i++];
  p->E = c[i++]; p->L = c[i++]; p->topk = c[i++]; p->H = c[i++]; p->M = c[i++];
  p->row_bytes = c[i++]; p->scale_bytes = c[i++]; p->slot_bytes = c[i++]; p->table_bytes = c[i++];
  p->part_bytes = c[i++]; p->out_code = c[i++]; p->xfer_code = c[i++];
  p->chunk = c[i++]; p->nchunks = c[i++]; p->num_sms = c[i++]; p->nvl = c[i++];
  p->timeout_ns = c[i++];
  p->comb_items = c[i++];
  MOE_CHECK(p->comb_items >= 1, "create_ctx: combine items must be positive, got ", p->comb_items);
  p->ll_comb = (int)c[i++];
  const bool rows_tagged = c[i++] != 0;  // the layout's choice (nvshmem_runtime.tagged_rows)
  const bool send_stream = c[i++] != 0;
  p->sym = reinterpret_cast<char*>(c[i++]);
  p->off_sig = c[i++]; p->off_tables = c[i++]; p->off_disp = c[i++]; p->off_comb = c[i++];
  p->off_stage_disp = c[i++]; p->off_stage_table = c[i++]; p->off_stage_comb = c[i++];
  p->state = reinterpret_cast<unsigned long long*>(c[i++]);
  p->cnt = reinterpret_cast<int*>(c[i++]);
  p->rowmap = reinterpret_cast<int*>(c[i++]);
  p->err_host = reinterpret_cast<int*>(c[i++]);
  MOE_CHECK(p->W <= MAXW && (int)c.size() == i + 2 * p->W, "create_ctx: bad config length (", c.size(),
            " entries for ", p->W, " ranks, want ", i + 2 * p->W,
            "): the extension and nvshmem_runtime.py come from different trees");
  for (int r = 0; r < p->W; ++r) p->pe[r] = c[i++];
  for (int r = 0; r < p->W; ++r) p->peer[r] = reinterpret_cast<char*>(c[i++]);
  p->group = p->rank / p->tp;
  p->replica = p->rank % p->tp;
  // SELF_SEND=1 (off by default; a test and measurement mode): the send ships the own group's
  // tokens too, into the slots and flags another group's take, and the receive reads them from
  // there, not from x. One GPU then runs the whole cross-rank path of the dispatch (at world
  // size 1 every token is the own group's), at the cost of the self copy.
  const bool self_send = env_switch("MOE_BACKEND_NVSHMEM_SELF_SEND", false, true);
  p->own_group = self_send ? -1 : p->group;
  p->own_ranks = self_send ? 0ULL : group_ranks(p->group, p->tp);
  // The signal region (before the tables) must hold every flag the kernels index: the last
  // is rank W-1's last partial flag, so the count is sig_comb's index of a rank W. A layout
  // computed with another COMBINE_ITEMS than the one passed here would not hold them.
  {
    const long long flags = sig_comb(*p, p->W, 0, 0, 1);
    MOE_CHECK(p->off_sig >= 0 && p->off_tables - p->off_sig >= 8 * flags,
              "create_ctx: the signal region (", p->off_tables - p->off_sig, " bytes at offset ", p->off_sig,
              ") cannot hold the ", flags, " flags of this arena");
  }
  const long long sources = (long long)p->G * p->M;
  p->copy_pieces = copy_pieces(*p, p->num_sms);
  // Direct receive wherever it fits (round 16: decode dispatch 21.3 -> 17.4 us at 1 token,
  // 26.7 -> 24.4 at 128); =0 keeps the plan and copy kernels.
  // Round 25: the direct table in round-tagged words that the receive polls (no announce, no
  // load after a flag), where the arena has room for it (nvshmem_runtime.row_sizes).
  const bool ll_on = p->table_bytes >= ll_count_off(*p) + (long long)p->E * 8 &&
                     env_switch("MOE_BACKEND_NVSHMEM_LL_TABLE", true);
  // Round 26: put takes the direct receive too, with the tagged table only (staged and put with
  // no signal; put_direct_table). By default only where every peer is reachable by P2P stores
  // (nvshmem_ptr), whose aligned 8-byte stores land whole. Over IB or EFA a tagged word is
  // whole only if the NIC's RDMA writes of aligned 8-byte words are (what NCCL's LL protocol
  // assumes, NVSHMEM does not promise): MOE_BACKEND_NVSHMEM_PUT_DIRECT=1 forces it there
  // (validate with the contract suite on that fabric), =0 keeps the plan and copy kernels.
  bool all_p2p = true;
  for (int r = 0; r < p->W; ++r) all_p2p = all_p2p && p->peer[r] != nullptr;
  const bool transport_ok = p->nvl || (ll_on && env_switch("MOE_BACKEND_NVSHMEM_PUT_DIRECT", all_p2p, true));
  p->direct = direct_recv_fits(*p, transport_ok) && env_switch("MOE_BACKEND_NVSHMEM_DIRECT_RECV", true) ? 1 : 0;
  // The direct table written by k send blocks (each builds the masks and writes 1/k of the
  // tokens; MOE_BACKEND_NVSHMEM_DIRECT_TABLE_BLOCKS=k). Round 17, 128 tokens: 1 block 21.9-22.0
  // us, 2 blocks 20.9, 4 blocks 21.0; 1 and 32 tokens the same.
  const char* vtb = std::getenv("MOE_BACKEND_NVSHMEM_DIRECT_TABLE_BLOCKS");
  p->direct_blocks = std::max(1, std::min(32, vtb && *vtb ? std::atoi(vtb) : 2));
  // Token flags by release stores alone (round 17: Mixtral 4096 dispatch 128.7 -> 111.1 us;
  // decode the same); =0 puts the fence.sc.sys back.
  p->token_release = env_switch("MOE_BACKEND_NVSHMEM_TOKEN_RELEASE", true) ? 1 : 0;
  // Round 16: 1-token combine 15.6 -> 15.3 us, 32 tokens 16.9-17.0 -> 16.4-16.5, 128 a wash.
  p->entry_release = env_switch("MOE_BACKEND_NVSHMEM_ENTRY_RELEASE", true) ? 1 : 0;
  // Round 23 (one H200, world size 1): 1-token dispatch 12.9-13.2 -> 12.5 us (=0: block 0).
  p->entry_last = env_switch("MOE_BACKEND_NVSHMEM_ENTRY_LAST", true) ? 1 : 0;
  // Round 23 (one H200, world size 1): 128-token combine 23.5 -> 18.7 us, put 24.1 -> 18.9-19.6.
  p->recv_prefetch = env_switch("MOE_BACKEND_NVSHMEM_RECV_PREFETCH", true) ? 1 : 0;
  // Round 24 (one H200, world size 1): dispatch 1 / 32 / 128 tokens 12.8-12.9 / 13.5-13.6 / 15.1
  // -> 12.5-12.6 / 13.3-13.4 / 14.7-14.8 us.
  p->table_prefetch = env_switch("MOE_BACKEND_NVSHMEM_TABLE_PREFETCH", true) ? 1 : 0;
  // Round 24 (one H200, world size 1): combine 10.0-10.1 / 11.3-11.4 / 18.8 -> 9.3-9.5 / 10.3-10.4 / 18.0-18.1 us.
  p->finish_block0 = env_switch("MOE_BACKEND_NVSHMEM_FINISH_BLOCK0", true) ? 1 : 0;
  p->ll_table = p->direct && ll_on ? 1 : 0;
  // Round 38: with the tagged table on nvlink, the rows too in round-tagged words (twice the
  // bytes, no token flag to release or wait for), where the layout chose them (since round 51 by
  // default arenas of at most 32 tokens: nvshmem_runtime.tagged_rows, LL_ROWS) and rows and scales
  // are 16-byte vectors (scales <= 512 B) that the slots hold twice. Only where rows cross (a rank
  // outside the own group, or SELF_SEND): with none (world size 1, or tp = W) no row is sent, and
  // the ROWS instance cost the own rows' path 0.2-0.3 us (round 51, world size 1).
  {
    const bool fits = p->row_bytes % 16 == 0 && p->scale_bytes % 16 == 0 && p->scale_bytes <= 512 &&
                      p->slot_bytes >= 2 * (p->row_bytes + p->scale_bytes);
    const bool crossing = p->G > 1 || self_send;  // the send skips the own group's ranks (own_ranks)
    p->ll_rows = rows_tagged && crossing && p->ll_table && p->nvl && fits ? 1 : 0;
  }
  // The combine's round-tagged partials (the TAGGED instances, round 49; by call, round 59), as the
  // layout chose them (nvshmem_runtime.tagged_partials): nvlink, or put with PUT_TAGGED=1 (round
  // 63: staged after the plain partials' staging, then put with no signal), rows of whole 16-byte
  // vectors (H % 8 == 0, the N = 8 instances), their region of ll_comb <= M tokens after the plain
  // partials.
  MOE_CHECK(p->ll_comb >= 0 && p->ll_comb <= p->M &&
                (!p->ll_comb || (p->H % 8 == 0 && p->off_stage_disp - p->off_comb >=
                                                      (long long)p->W * (p->M + 2LL * p->ll_comb) * p->part_bytes)),
            "create_ctx: tagged combine partials need hidden % 8 == 0 and their region");
  // Round 25: the direct receive's early load of an own token's piece (early_load_fits).
  p->early_load = p->direct && early_load_fits(*p) && env_switch("MOE_BACKEND_NVSHMEM_EARLY_LOAD", true) ? 1 : 0;
  p->par_scan = env_switch("MOE_BACKEND_NVSHMEM_PAR_SCAN", true) ? 1 : 0;
  // Round 55: the put send's rows without scales go from x to P2P peers, unstaged (=0 stages
  // every row, as before).
  p->put_from_x = env_switch("MOE_BACKEND_NVSHMEM_PUT_FROM_X", true) ? 1 : 0;
  // Round 37: the direct receive's items warp-major over the grid (a token's pieces on as many
  // SMs, the table blocks' items last); =0 gives block b the items 16b..16b+15 (one token's
  // pieces on one SM, behind the table's write at 1 token).
  p->item_spread = env_switch("MOE_BACKEND_NVSHMEM_ITEM_SPREAD", true) ? 1 : 0;
  // Round 42: the fused dispatch's lean instances (dispatch_fused_kernel<..., LEAN>) fix these
  // switches at their defaults, so they serve only where every one is, and (round 45) where the
  // local experts fit one a thread (L <= NTHREADS: the offsets' scan has one form); =0 keeps the
  // general ones.
  p->lean_fused = p->token_release && p->entry_release && p->entry_last && p->item_spread && p->table_prefetch &&
                          p->par_scan && p->put_from_x && p->L <= NTHREADS && env_switch("MOE_BACKEND_NVSHMEM_LEAN_FUSED", true)
                      ? 1
                      : 0;
  // Round 43: where lean, a call whose x has at most NTHREADS / topk rows takes the SMALL instance
  // (the table's one-id-a-thread form only); =0 keeps the lean instance for every call.
  p->small_fused = p->lean_fused && env_switch("MOE_BACKEND_NVSHMEM_SMALL_FUSED", true) ? 1 : 0;
  // Round 33: the copy with a work counter writes each expert row by one bulk store from the
  // warp's shared buffer (copy_token_bulk); =0 keeps the register copy.
  p->copy_bulk = env_switch("MOE_BACKEND_NVSHMEM_COPY_BULK", true) ? 1 : 0;
  // Round 33: the plan reads the chunk count matrix by 16-byte loads where L % 4 == 0; =0 by 4-byte loads.
  p->plan_vec = (reinterpret_cast<uintptr_t>(p->cnt) & 15) == 0 && env_switch("MOE_BACKEND_NVSHMEM_PLAN_VEC", true) ? 1 : 0;
  // Overlap needs the waiting kernels (plan, copy) never to fill the GPU, or the send blocks
  // that feed them could not be scheduled: plan blocks of <= 256 threads, or kernels sized
  // for at most half the GPU's SMs (backend option num_sms), whatever the chunk.
  cudaPointerAttributes attr{};
  CUDA_OK(cudaPointerGetAttributes(&attr, p->sym));
  const int dev_sms = (int)num_sms(attr.device);
  cx->overlap = env_switch("MOE_BACKEND_NVSHMEM_OVERLAP", p->chunk <= 256 || 2 * p->num_sms <= dev_sms);
  cx->comb_overlap = env_switch("MOE_BACKEND_NVSHMEM_COMBINE_OVERLAP", sources <= COMB_OVERLAP_MAX_TOKENS);
  // The fused combine send's row loads (RowLoads): by bulk copies into a per-warp ring. Once
  // cp.async with the whole GPU (prefill 240 -> 230 us, before rounds 28-32's ring); run 43 with
  // the whole GPU: bulk 212.7-213.5 against 218.8-219.8 us at EP2 (4096 tokens a rank; 69.1 / 115
  // against 72.6 / 119 at 1024 / 2048) and 168.3-168.5 against 176.2-176.3 at world size 1.
  // COMBINE_BULK=0 falls back to cp.async (COMBINE_ASYNC=0 as well: register loads).
  p->comb_loads = env_switch("MOE_BACKEND_NVSHMEM_COMBINE_BULK", true, true)    ? LOADS_BULK
                  : env_switch("MOE_BACKEND_NVSHMEM_COMBINE_ASYNC", true, true) ? LOADS_ASYNC
                                                                                : LOADS_REGS;
  // With bulk row loads, the receive half's partials by bulk copies too (round 28: 24-SM
  // prefill combine at world size 1 444 -> 399 us); "0" keeps its register loads.
  p->bulk_recv = env_switch("MOE_BACKEND_NVSHMEM_COMBINE_BULK_RECV", true) ? 1 : 0;
  // Fused combine: by default in every arena past the overlap limit (run 43 at EP2: 69.1 / 115 /
  // 213 us against two kernels' 77.7 / 133 / - at 1024 / 2048 / 4096 tokens a rank); "0" keeps
  // the send and receive kernels apart.
  cx->comb_fused = !cx->comb_overlap && env_switch("MOE_BACKEND_NVSHMEM_COMBINE_FUSED", true);
  // Copy-engine send (launch_ce_send): nvlink with the overlapped receive only, when nearly
  // every token has an expert at each other rank (>= CE_MIN_DENSITY; it sends every token to
  // every other group),
  // and not with CUDA_DEVICE_MAX_CONNECTIONS=1, where its queued flag kernels hold back the
  // receive (prefill 362 against 264 us, round 15). Used per call for whole dispatches of
  // >= CE_MIN_TOKENS tokens (send_op).
  // MOE_BACKEND_NVSHMEM_CE_SEND=0 never, =1 always (any token count and routing density);
  // MOE_BACKEND_NVSHMEM_CE_CHUNKS=k cuts the tokens into k chunks (default CE_CHUNKS).
  {
    const char* conns = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    const bool one_queue = conns && std::atoi(conns) == 1;
    const bool dense = dense_fraction(p->E, p->L, p->topk) >= CE_MIN_DENSITY;
    const bool can = p->nvl && cx->overlap && !p->ll_rows;  // the copy engines write untagged rows
    p->ce_send = can && env_switch("MOE_BACKEND_NVSHMEM_CE_SEND", dense && !one_queue, true);
    cx->ce_forced = p->ce_send && env_switch("MOE_BACKEND_NVSHMEM_CE_SEND", false, true);
  }
  // Round 35: a whole dispatch with the direct receive in one launch; =0 keeps send + receive.
  cx->fused_dispatch = env_switch("MOE_BACKEND_NVSHMEM_FUSED_DISPATCH", true);
  // Round 50: grids by the largest call's items (size_grids); =0 by the arena's tokens.
  // Round 61: a send-stream arena's split receive by the arena's tokens. Such an arena is for work
  // between the halves, and its receive, launched with the send, holds its blocks' SMs while it
  // waits: the sweep's overlap row (a 2048^3 matmul of 128 one-SM tiles between the halves, 4 of
  // 132 SMs free) went from 1.03x at 1 token (run 22, two receive blocks) to 1.15x (run 43, 30
  // blocks, round 50); at world size 1 (run 37, as ITEM_GRIDS=0) 1 / 4 tokens 1.15 / 1.20x ->
  // 1.07 / 1.06x, 16-128 tokens unchanged; not yet measured at EP2. COMPACT_RECV=0 never, =1 in
  // every arena.
  // Round 62: a send-stream arena's split dispatch sized for OVERLAP_SMS SMs where its rows fit
  // them (overlap_rows_fit), else every SM (round 61's grids); MOE_BACKEND_NVSHMEM_OVERLAP_SMS=k
  // sizes it for k SMs whatever the rows (k >= the SMs: round 61's grids in every arena).
  int overlap_sms = send_stream && overlap_rows_fit(*p) ? OVERLAP_SMS : p->num_sms;
  if (const char* v = std::getenv("MOE_BACKEND_NVSHMEM_OVERLAP_SMS"); send_stream && v && *v)
    overlap_sms = std::max(1, std::min(p->num_sms, std::atoi(v)));
  // Round 64 (off by default until measured): the two-part receive (size_grids), its items few
  // enough that the first part's warps claim a few each, small enough for the second part.
  cx->two_part = send_stream && p->direct && env_switch("MOE_BACKEND_NVSHMEM_TWO_PART_RECV", false, true);
  cx->grids = size_grids(*p, env_switch("MOE_BACKEND_NVSHMEM_ITEM_GRIDS", true),
                         env_switch("MOE_BACKEND_NVSHMEM_COMPACT_RECV", send_stream, true), overlap_sms, cx->two_part);
  // Round 36: a whole combine of a decode-sized arena on one stream, its receive launched by PDL
  // (=0: the side stream). Round 36 measured it alone no faster (9.5 / 11.1 / 17.0 us at 1 / 32 /
  // 128 tokens against 9.4 / 11.0 / 16.9, world size 1); with the receive a warp per item (round 52,
  // WIDE_RECV, which only a PDL launch allows) 14.1-14.4 -> 12.5-12.8 us at 128 tokens, 1-32 tokens
  // within +0.3 us. One fused kernel (send items, then receive items) was slower: 12.5 / 14.3 / 17.7 us.
  // Round 53: per call, PDL only where the wide receive's grid passes the side stream's, since the
  // calls below it were up to 0.3 us slower that way: 128-token arena at 1 / 32 / 128 tokens
  // 8.4-8.5 / 9.7-9.8 / 12.8 us against 8.5-8.7 / 10.0-10.1 / 12.6-12.9 (every call) and
  // 8.4 / 9.7 / 14.3-14.4 (none). =1: every call by PDL, =0: none.
  // A switch like the others (=0 off); "1", which a switch reads as its default, means every call.
  const char* whole = std::getenv("MOE_BACKEND_NVSHMEM_WHOLE_COMBINE");
  cx->whole_combine = !env_switch("MOE_BACKEND_NVSHMEM_WHOLE_COMBINE", true) ? Ctx::Whole::Never
                      : whole && whole[0] == '1'                                ? Ctx::Whole::Every
                                                                                : Ctx::Whole::ByCall;
  cx->wide_recv = env_switch("MOE_BACKEND_NVSHMEM_WIDE_RECV", true);
  cx->step_bulk = env_switch("MOE_BACKEND_NVSHMEM_COMBINE_STEP_BULK", true);
  if (p->ce_send) {
    // cudaMemcpy into another device's memory is a peer copy; peer access makes it a direct
    // NVLink copy by this device's copy engine. (The configuration measured in round 15; the
    // copies were as fast without it in a debug run. It costs a context on the peer device.)
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)attr.device);
    for (int r = 0; r < p->W && p->ce_send; ++r) {
      cudaPointerAttributes pa{};
      if (cudaPointerGetAttributes(&pa, p->peer[r]) != cudaSuccess) {
        cudaGetLastError();
        p->ce_send = 0;
        break;
      }
      if (pa.device == attr.device) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(pa.device, 0);
      if (e != cudaSuccess) cudaGetLastError();
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) p->ce_send = 0;
    }
  }
  if (p->ce_send) {
    // Round 38: the flag kernel's flags by relaxed stores behind its one fence; =0 a release each.
    cx->ce_flag_fence = env_switch("MOE_BACKEND_NVSHMEM_CE_FLAG_FENCE", true);
    const char* v = std::getenv("MOE_BACKEND_NVSHMEM_CE_CHUNKS");
    const int chunks = std::max(1, std::min(64, v && *v ? std::atoi(v) : CE_CHUNKS));
    // MOE_BACKEND_NVSHMEM_CE_DECAY=d (0 < d <= 1, default CE_DECAY; 1 = the equal split).
    if (const char* d = std::getenv("MOE_BACKEND_NVSHMEM_CE_DECAY"); d && *d) {
      char* end = nullptr;
      cx->ce_decay = std::strtod(d, &end);
      MOE_CHECK(end && *end == '\0' && cx->ce_decay > 0.0 && cx->ce_decay <= 1.0,
                "MOE_BACKEND_NVSHMEM_CE_DECAY must be a number in (0, 1], got '", d, "'");
    }
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)attr.device);
    // MOE_BACKEND_NVSHMEM_CE_STREAMS=k (1..4, default 1): chunk c copied on stream c % k, so a
    // chunk's copy need not wait for the previous one's end (round 15 measured ~4-5 us per extra
    // chunk on one stream; round 28: prepared, not yet measured).
    const char* ns = std::getenv("MOE_BACKEND_NVSHMEM_CE_STREAMS");
    const int nstreams = ns && *ns ? std::atoi(ns) : 1;
    MOE_CHECK(nstreams >= 1 && nstreams <= 4, "MOE_BACKEND_NVSHMEM_CE_STREAMS must be 1..4, got '", ns, "'");
    cx->ce_copies.resize(nstreams);
    for (auto& st : cx->ce_copies) CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&cx->ce_flags, cudaStreamNonBlocking));
    cx->ce_done.resize(chunks);
    for (auto& e : cx->ce_done) CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_OK(cudaEventCreateWithFlags(&cx->ce_join, cudaEventDisableTiming));
    // Round 60 (prepared, not yet measured): each chunk's token flags copied by its copy stream
    // right behind its rows, from the own arena's own-group flags (ce_round_fill_kernel), instead
    // of a flag kernel behind the chunk's event: no event-to-kernel latency on the last chunk, and
    // no kernel that needs an SM behind the copies (run 39's time-out). Not with SELF_SEND, whose
    // receive reads the own group's flags.
    cx->ce_flag_copy = p->own_group >= 0 && env_switch("MOE_BACKEND_NVSHMEM_CE_FLAG_COPY", false, true);
    if (cx->ce_flag_copy) CUDA_OK(cudaEventCreateWithFlags(&cx->ce_filled, cudaEventDisableTiming));
  }
  if (cx->overlap || cx->comb_overlap || cx->comb_fused) {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)attr.device);
    CUDA_OK(cudaStreamCreateWithFlags(&cx->side, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&cx->fork, cudaEventDisableTiming));
    CUDA_OK(cudaEventCreateWithFlags(&cx->join, cudaEventDisableTiming));
    if (cx->overlap && send_stream) {
      CUDA_OK(cudaStreamCreateWithFlags(&cx->send_side, cudaStreamNonBlocking));
      CUDA_OK(cudaEventCreateWithFlags(&cx->send_join, cudaEventDisableTiming));
    }
  }
  return reinterpret_cast<int64_t>(owner.release());
}

void destroy_ctx(int64_t ctx) { free_ctx(reinterpret_cast<Ctx*>(ctx)); }

// The copy kernel's programmatic launch beside the plan: its blocks are scheduled while the
// plan runs instead of after it. Default: for the one-warp-per-item copy of small arenas only,
// where it was measured (decode dispatch -0.1..0.9 us, round 13). With the work-counter copy
// of large arenas, run 17's 4096-token arena took 85 / 94 us at 16 / 256 tokens (37 / 53 us
// without) while 64 / 128 tokens got faster (23 / 28 against 40 / 44 us): not understood yet,
// so not the default. MOE_BACKEND_NVSHMEM_PDL=0: never, 1: for every copy.
static bool copy_pdl(bool dynamic) {
  static const bool small = env_switch("MOE_BACKEND_NVSHMEM_PDL", true, true);
  static const bool large = env_switch("MOE_BACKEND_NVSHMEM_PDL", false, true);
  return dynamic ? large : small;
}

// The copy by bulk copies (copy_token_bulk): how many of a block's warps get a row buffer in
// COPY_BULK_SMEM of dynamic shared memory (besides the copy's 4 KB of row lists); 0 where it
// is off, rows are not 16-byte aligned (x, the slots and the outputs alike) or no buffer fits.
// 192 KB leaves an SM >= 30 KB beside a copy block, room for the send kernel's and the
// copy-engine flag kernel's blocks (~1 KB each, the driver's share) that the waiting copy may
// depend on; 13 warps of 14 KB rows (DeepSeek prefill) took 141.6 us against 139.3
// with 15 (220 KB), in two calls' timelines (round 33).
constexpr long long COPY_BULK_SMEM = 192 * 1024;
static int copy_bulk_warps(const Params& p, const void* x, const void* tokens) {
  const bool aligned = p.row_bytes % 16 == 0 && p.slot_bytes % 16 == 0 &&
                       ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(tokens)) & 15) == 0;
  if (!p.copy_bulk || !aligned) return 0;
  return (int)std::min<long long>(NWARPS, (COPY_BULK_SMEM - copy_bulk_buffer_offset(p, 0)) / copy_bulk_row_stride(p));
}

// A launch that may be programmatic (PDL): the kernel may then start before the one ahead of it
// on the stream has ended, once every block of that one has triggered its dependents
// (`launch_dependents`) or exited.
// max_shared: this launch asks for the largest shared-memory carveout (see max_shared_carveout).
struct Launch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attrs[2]{};
  Launch(int blocks, int threads, cudaStream_t s, bool programmatic, bool max_shared = false) {
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = s;
    cfg.attrs = attrs;
    if (programmatic) {
      attrs[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (max_shared) {
      attrs[cfg.numAttrs].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
      attrs[cfg.numAttrs++].val.sharedMemCarveout = (unsigned)cudaSharedmemCarveoutMaxShared;
    }
  }
  Launch(const Launch&) = delete;  // cfg.attrs points into this object
};

static size_t recv_smem(const Params& p) { return ((size_t)(p.chunk / 32) * p.L + 3 * (size_t)p.L) * 4; }

// A tensor of `sizes` and type `t` at byte `offset` of `storage` (offset a multiple of 16):
// what `view(dtype)` of a byte slice gives, built without three dispatcher calls.
static at::Tensor tensor_in(const c10::Storage& storage, int64_t offset, at::ScalarType t, at::IntArrayRef sizes) {
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                                            c10::scalarTypeToTypeMeta(t));
  out.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  out.unsafeGetTensorImpl()->set_storage_offset(offset / (int64_t)c10::elementSize(t));
  return out;
}

// Receive side of dispatch: allocate the outputs and launch the plan and copy kernels on
// `stream`.
// The receive's outputs: tokens, scales, weights, tokens per expert, offsets, src group / token / k.
// The seven small ones share one allocation (16-byte aligned pieces): an eager decode step is
// host-bound, and each allocation costs the caching allocator's lock and lookup.
static std::vector<at::Tensor> alloc_recv_outputs(const Params& p, const at::TensorOptions& dev, int64_t in_dtype_code,
                                                  bool weighted) {
  const int64_t R = (int64_t)p.G * p.M * std::min(p.topk, p.L);
  static const at::ScalarType codes[] = {at::kBFloat16, at::kHalf, at::kFloat, at::kFloat8_e4m3fn};
  MOE_CHECK(in_dtype_code >= 0 && in_dtype_code < 4, "dispatch_recv: bad dtype code ", in_dtype_code);
  MOE_CHECK(dev.device().is_cuda(), "dispatch_recv: outputs go to a CUDA device");
  struct Piece {
    at::ScalarType t;
    std::vector<int64_t> sizes;
  };
  const Piece pieces[] = {{at::kFloat, {R, p.scale_bytes / 4}}, {at::kFloat, {weighted ? R : 0}}, {at::kLong, {p.L}},
                          {at::kLong, {p.L + 1}},               {at::kInt, {R}},                  {at::kInt, {R}},
                          {at::kInt, {R}}};
  int64_t offsets[7], bytes = 0;
  for (int i = 0; i < 7; ++i) {
    int64_t n = (int64_t)c10::elementSize(pieces[i].t);
    for (int64_t d : pieces[i].sizes) n *= d;
    offsets[i] = bytes;
    bytes += (n + 15) / 16 * 16;
  }
  const at::Tensor meta = at::empty({std::max<int64_t>(bytes, 16)}, dev.dtype(at::kByte));
  std::vector<at::Tensor> out;
  out.reserve(8);
  out.push_back(at::empty({R, p.H}, dev.dtype(codes[in_dtype_code])));
  for (int i = 0; i < 7; ++i) out.push_back(tensor_in(meta.storage(), offsets[i], pieces[i].t, pieces[i].sizes));
  return out;
}
static DirectOut direct_out(const std::vector<at::Tensor>& o) {
  return {reinterpret_cast<char*>(o[0].data_ptr()), o[1].data_ptr<float>(),
          o[2].numel() ? o[2].data_ptr<float>() : nullptr, o[3].data_ptr<int64_t>(), o[4].data_ptr<int64_t>(),
          o[5].data_ptr<int>(), o[6].data_ptr<int>(), o[7].data_ptr<int>()};
}

// The split dispatch's direct receive into `out` (alloc_recv_outputs) on `blocks` blocks: the
// arena's kernel with the split receive's pieces (size_grids), its two-part form (DYN) with
// cx.two_part.
static void launch_direct_recv(const Ctx& cx, const std::vector<at::Tensor>& out, const at::Tensor& x,
                               const at::Tensor& xs, int blocks, cudaStream_t stream) {
  const Params& p = cx.p;
  static const bool carve_direct =
      max_shared_carveout(dispatch_direct_kernel<true>) && max_shared_carveout(dispatch_direct_kernel<false>) &&
      max_shared_carveout(dispatch_direct_kernel<true, true>) &&
      max_shared_carveout(dispatch_direct_kernel<true, false, true>) &&
      max_shared_carveout(dispatch_direct_kernel<false, false, true>) &&
      max_shared_carveout(dispatch_direct_kernel<true, true, true>);
  (void)carve_direct;
  auto* kernel = cx.two_part ? (p.ll_rows    ? dispatch_direct_kernel<true, true, true>
                                : p.ll_table ? dispatch_direct_kernel<true, false, true>
                                             : dispatch_direct_kernel<false, false, true>)
                             : (p.ll_rows    ? dispatch_direct_kernel<true, true>
                                : p.ll_table ? dispatch_direct_kernel<true>
                                             : dispatch_direct_kernel<false>);
  Params pr = p;  // the split receive's pieces (size_grids)
  pr.copy_pieces = cx.grids.split_pieces;
  pr.early_load = cx.grids.split_early;
  kernel<<<blocks, NTHREADS, (size_t)(p.G + 1) * p.L * 4, stream>>>(
      pr, direct_out(out), reinterpret_cast<const char*>(x.data_ptr()),
      xs.defined() ? reinterpret_cast<const char*>(xs.data_ptr()) : nullptr, (int)x.size(0));
  CUDA_OK(cudaGetLastError());
}

static std::vector<at::Tensor> launch_dispatch_recv(const Ctx& cx, const at::TensorOptions& dev, int64_t in_dtype_code,
                                                    bool weighted, const at::Tensor& x, const at::Tensor& xs,
                                                    cudaStream_t stream) {
  const Params& p = cx.p;
  std::vector<at::Tensor> out = alloc_recv_outputs(p, dev, in_dtype_code, weighted);
  const at::Tensor &tokens = out[0], &scales = out[1], &weights = out[2], &tpe = out[3], &offs = out[4], &sg = out[5],
                   &st = out[6], &sk = out[7];
  if (p.direct) {  // one kernel, one warp per item (create_ctx checked that they fit)
    // A two-part receive's first part where its second follows (overlapped), else all of it.
    launch_direct_recv(cx, out, x, xs, cx.two_part && stream != cx.side ? cx.grids.split_recv2 : cx.grids.split_recv,
                       stream);
    return out;
  }
  size_t smem = recv_smem(p);
  static bool attr_set = false;
  if (smem > 48 * 1024 && !attr_set) {
    CUDA_OK(cudaFuncSetAttribute(dispatch_recv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    attr_set = true;
  }
  int threads = std::max(p.chunk, 256);  // phase-1 masks need one thread per token
  static const bool carve = max_shared_carveout(dispatch_recv_kernel) &&
                            max_shared_carveout(dispatch_copy_kernel<true, false>) &&
                            max_shared_carveout(dispatch_copy_kernel<true, true>) &&
                            max_shared_carveout(dispatch_copy_kernel<false, false>);
  (void)carve;
  dispatch_recv_kernel<<<p.nchunks, threads, smem, stream>>>(
      p, reinterpret_cast<char*>(tokens.data_ptr()), scales.data_ptr<float>(), weighted ? weights.data_ptr<float>() : nullptr,
      tpe.data_ptr<int64_t>(), offs.data_ptr<int64_t>(), sg.data_ptr<int>(), st.data_ptr<int>(), sk.data_ptr<int>(),
      weighted ? 1 : 0);
  CUDA_OK(cudaGetLastError());
  // One warp per item while the items fit one block per SM (no work counter); else a counter
  // (then copy_pieces is 1).
  const long long need = item_warp_blocks(p);
  const bool dynamic = need > (long long)p.num_sms;
  const int cblocks = (int)std::max(1LL, dynamic ? (long long)p.num_sms : need);
  Launch launch(cblocks, NTHREADS, stream, copy_pdl(dynamic));
  const int bulk_warps = dynamic ? copy_bulk_warps(p, x.data_ptr(), tokens.data_ptr()) : 0;
  if (bulk_warps > 0) {
    static const bool smem_set = [] {
      CUDA_OK(cudaFuncSetAttribute(dispatch_copy_kernel<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)COPY_BULK_SMEM));
      return true;
    }();
    (void)smem_set;
    launch.cfg.dynamicSmemBytes = (size_t)copy_bulk_buffer_offset(p, bulk_warps);
  }
  auto* copy = bulk_warps > 0 ? dispatch_copy_kernel<true, true>
               : dynamic      ? dispatch_copy_kernel<true, false>
                              : dispatch_copy_kernel<false, false>;
  CUDA_OK(cudaLaunchKernelEx(&launch.cfg, copy, p, reinterpret_cast<char*>(tokens.data_ptr()), scales.data_ptr<float>(),
                             reinterpret_cast<const char*>(x.data_ptr()),
                             xs.defined() ? reinterpret_cast<const char*>(xs.data_ptr()) : nullptr, (int)x.size(0),
                             bulk_warps));
  return out;
}

static int64_t dtype_code_of(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return 0;
    case at::kHalf: return 1;
    case at::kFloat: return 2;
    case at::kFloat8_e4m3fn: return 3;
    default: return -1;
  }
}

// The caller's stream waits for a send kernel launched on the send stream, and for the
// copy-engine send; their inputs are released (their later reuse is ordered after them).
static void join_send_side(Ctx& cx, cudaStream_t stream) {
  if (cx.ce_pending) {
    CUDA_OK(cudaStreamWaitEvent(stream, cx.ce_join, 0));
    cx.ce_pending = false;
  }
  if (!cx.keep_ids.defined()) return;
  CUDA_OK(cudaStreamWaitEvent(stream, cx.send_join, 0));
  cx.keep_ids = cx.keep_w = cx.keep_n = at::Tensor();
}

// Copy-engine send: rows [0, n) of x (and x_scale) cut into chunks of at least CE_MIN_CHUNK
// tokens; chunk c (sent by replica c % tp) is copied by the copy engine straight into the
// slots [group][t] of every rank outside this group (through the mapped arenas), then a
// one-block kernel raises the chunk's token flags there. Every token crosses, whether or not
// it routes to that rank (worth it when nearly all do, as at prefill sizes with few ranks);
// with a device-side token count (nptr) every row of x crosses (n = rows) and only rows
// below the count are flagged.
// The SMs are left to the receive's copy, which otherwise competed with the send's stores.
constexpr int CE_MIN_CHUNK = 64;

// The first token of each of the copy-engine send's chunks for n tokens, then n: at most
// max_chunks chunks of at least CE_MIN_CHUNK tokens (the last may be shorter), each `decay`
// times the one before (1: equal chunks of ceil(n / chunks) tokens).
std::vector<int64_t> ce_chunk_starts(int64_t n, int64_t max_chunks, double decay) {
  MOE_CHECK(n >= 0 && max_chunks >= 1, "ce_chunk_starts: n >= 0 and max_chunks >= 1, got ", n, " and ", max_chunks);
  MOE_CHECK(decay > 0.0 && decay <= 1.0, "ce_chunk_starts: decay must be in (0, 1]");
  const int64_t chunks = std::max<int64_t>(1, std::min(max_chunks, (n + CE_MIN_CHUNK - 1) / CE_MIN_CHUNK));
  std::vector<int64_t> starts(chunks + 1, n);
  starts[0] = 0;
  if (decay == 1.0) {
    const int64_t per = (n + chunks - 1) / chunks;
    for (int64_t c = 1; c < chunks; ++c) starts[c] = std::min(n, c * per);
    return starts;
  }
  double total = 0.0, w = 1.0;
  for (int64_t c = 0; c < chunks; ++c, w *= decay) total += w;
  double acc = 0.0;
  w = 1.0;
  for (int64_t c = 1; c < chunks; ++c, w *= decay) {
    acc += w;
    // Rounded to whole CE_MIN_CHUNK runs, at least one run past the previous start.
    const int64_t t = (int64_t)std::llround(n * acc / total / CE_MIN_CHUNK) * CE_MIN_CHUNK;
    starts[c] = std::min(n, std::max(starts[c - 1] + CE_MIN_CHUNK, t));
  }
  return starts;
}

static void launch_ce_send(Ctx& cx, const char* x, const char* scale, const int* nptr, int n,
                           unsigned long long dests) {
  const Params& p = cx.p;
  CUDA_OK(cudaStreamWaitEvent(cx.ce_flags, cx.fork, 0));
  const std::vector<int64_t> starts = ce_chunk_starts(n, (int64_t)cx.ce_done.size(), cx.ce_decay);
  if (cx.ce_flag_copy) {
    ce_round_fill_kernel<<<1, 256, 0, cx.ce_flags>>>(p, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaEventRecord(cx.ce_filled, cx.ce_flags));
  }
  const int chunks = (int)starts.size() - 1, nstreams = (int)cx.ce_copies.size();
  // A copy stream joins the fork only when it gets a chunk: every stream forked is then joined
  // back through its chunks' events (a stream left unjoined would break graph capture).
  std::vector<char> forked(nstreams, 0), filled(nstreams, 0);
  const long long aligned_row = (p.row_bytes + 15) & ~15;
  for (int c = 0; c < chunks; ++c) {
    const int t0 = (int)starts[c], t1 = (int)starts[c + 1];
    if (t0 >= t1 || c % p.tp != p.replica) continue;
    cudaStream_t copy = cx.ce_copies[c % nstreams];
    if (!forked[c % nstreams]) {
      CUDA_OK(cudaStreamWaitEvent(copy, cx.fork, 0));
      forked[c % nstreams] = 1;
    }
    const size_t ntk = (size_t)(t1 - t0);
    for (unsigned long long m = dests; m; m &= m - 1) {
      char* dst = p.peer[__builtin_ctzll(m)] + p.off_disp + ((long long)p.group * p.M + t0) * p.slot_bytes;
      const char* src = x + (long long)t0 * p.row_bytes;
      if (p.slot_bytes == p.row_bytes)
        CUDA_OK(cudaMemcpyAsync(dst, src, ntk * p.row_bytes, cudaMemcpyDeviceToDevice, copy));
      else
        CUDA_OK(cudaMemcpy2DAsync(dst, p.slot_bytes, src, p.row_bytes, p.row_bytes, ntk, cudaMemcpyDeviceToDevice,
                                  copy));
      if (p.scale_bytes)
        CUDA_OK(cudaMemcpy2DAsync(dst + aligned_row, p.slot_bytes, scale + (long long)t0 * p.scale_bytes, p.scale_bytes,
                                  p.scale_bytes, ntk, cudaMemcpyDeviceToDevice, copy));
    }
    if (cx.ce_flag_copy) {
      // The chunk's flags, every one of its tokens (past a device-side count too: the receive
      // reads flags below the count only), on the same copy stream: after its rows' copies end.
      if (!filled[c % nstreams]) {  // once a stream: its later chunks come after this one
        CUDA_OK(cudaStreamWaitEvent(copy, cx.ce_filled, 0));
        filled[c % nstreams] = 1;
      }
      const long long flag0 = p.off_sig + sig_token(p, p.group, t0) * 8;
      for (unsigned long long m = dests; m; m &= m - 1)
        CUDA_OK(cudaMemcpyAsync(p.peer[__builtin_ctzll(m)] + flag0, p.sym + flag0, ntk * 8, cudaMemcpyDeviceToDevice,
                                copy));
    }
    CUDA_OK(cudaEventRecord(cx.ce_done[c], copy));
    CUDA_OK(cudaStreamWaitEvent(cx.ce_flags, cx.ce_done[c], 0));
    if (!cx.ce_flag_copy) {
      ce_flag_kernel<<<1, 256, 0, cx.ce_flags>>>(p, t0, t1, nptr, dests, cx.ce_flag_fence);
      CUDA_OK(cudaGetLastError());
    }
  }
  CUDA_OK(cudaEventRecord(cx.ce_join, cx.ce_flags));
  cx.ce_pending = true;
}

// Before a new dispatch: side-stream work of a send whose receive never ran, and of the last
// combine, is joined into the caller's stream, and what it held is released.
static void settle_pending(Ctx& cx, cudaStream_t stream) {
  if (cx.stashed || cx.comb_out.defined()) {
    CUDA_OK(cudaStreamWaitEvent(stream, cx.join, 0));
    cx.stash.clear();
    cx.stashed = false;
    cx.two_part_pending = false;  // the first part takes every item alone, only later
    cx.comb_out = cx.comb_ids = cx.comb_ntok = cx.comb_y = cx.comb_w = at::Tensor();
  }
  join_send_side(cx, stream);
}

// The send's inputs from the op's arguments.
static SendIn send_in(const at::Tensor& x, const at::Tensor& ids, const std::optional<at::Tensor>& w,
                      const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& ntok, int64_t n_host) {
  return {reinterpret_cast<const char*>(x.data_ptr()), ids.data_ptr<int>(), w ? w->data_ptr<float>() : nullptr,
          scale ? scale->data_ptr<float>() : nullptr, ntok ? ntok->data_ptr<int>() : nullptr, (int)n_host,
          (int)x.size(0)};
}

// whole: the receive follows at once (dispatch_whole), so nothing of the caller's can be queued
// between the send and the copy-engine send's flag kernels (see ce_send below).
static at::Tensor send_op(const at::Tensor& x, const at::Tensor& ids, const std::optional<at::Tensor>& w,
                          const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& ntok, int64_t n_host,
                          int64_t ctx, bool whole) {
  Ctx& cx = CX(ctx);
  const Params& p = cx.p;
  c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  settle_pending(cx, stream);
  cx.keep_x = x;
  cx.keep_s = scale ? *scale : at::Tensor();
  const int64_t code = dtype_code_of(x.scalar_type());
  const bool overlap = cx.overlap && code >= 0;
  if (overlap) CUDA_OK(cudaEventRecord(cx.fork, stream));
  cudaStream_t send_stream = stream;
  if (overlap && cx.send_side) {
    send_stream = cx.send_side;
    CUDA_OK(cudaStreamWaitEvent(send_stream, cx.fork, 0));
    cx.keep_ids = ids;
    cx.keep_w = w ? *w : at::Tensor();
    cx.keep_n = ntok ? *ntok : at::Tensor();
  }
  const SendIn in = send_in(x, ids, w, scale, ntok, n_host);
  const int rows = in.rows;
  const int per_replica = (p.M + p.tp - 1) / p.tp;
  int blocks = std::max(1, std::min(SEND_BLOCKS_PER_SM * p.num_sms, per_replica));
  if (send_stream != stream && cx.grids.split_send > 0) blocks = std::min(blocks, cx.grids.split_send);
  static const bool carve = max_shared_carveout(dispatch_send_kernel<true>) &&
                            max_shared_carveout(dispatch_send_kernel<true, true>) &&
                            max_shared_carveout(dispatch_send_kernel<false>);
  (void)carve;
  Params ps = p;
  const int n_send = in.nptr ? rows : std::max(0, std::min((int)n_host, rows));
  // The copy-engine send needs the receive beside it, and by default a whole dispatch: its flag
  // kernels reach the GPU only as their chunks' copies end, behind whatever the caller queued
  // meanwhile. Between a split send and its receive that may be a kernel that fits no SM beside
  // the receive's waiting copy blocks (192 KB of shared memory each on every SM past 132 x 16
  // items): it then waits for the receive, which waits for the flags behind it, on both ranks
  // (run 39 at EP2: the sweep's 2048-token row with 2048^2 matmuls between timed out; 1024 tokens,
  // one copy block short of the SMs, passed). The SM send is queued before the caller's work.
  ps.ce_send = p.ce_send && overlap && (cx.ce_forced || (whole && n_send >= CE_MIN_TOKENS));
  if (ps.ce_send) blocks = std::min(blocks, table_blocks(p));  // the send kernel ships the table only
  const size_t send_smem = p.direct ? direct_send_smem(p) : 0;  // the direct table's masks
  if (p.nvl)
    (p.ll_rows ? dispatch_send_kernel<true, true> : dispatch_send_kernel<true>)<<<blocks, SEND_THREADS, send_smem,
                                                                                  send_stream>>>(
        ps, in.x, in.ids, in.w, in.scale, in.nptr, in.n_host, in.rows);
  else
    dispatch_send_kernel<false><<<blocks, SEND_THREADS, send_smem, send_stream>>>(ps, in.x, in.ids, in.w, in.scale,
                                                                                  in.nptr, in.n_host, in.rows);
  CUDA_OK(cudaGetLastError());
  if (send_stream != stream) CUDA_OK(cudaEventRecord(cx.send_join, send_stream));
  // The copy-engine send is enqueued before the receive, never after: streams share hardware
  // queues, and a flag kernel queued behind the receive's polling kernels did not start until
  // they timed out (round 15). Queued first, its items wait only for local copies.
  if (ps.ce_send) {
    const unsigned long long all = p.W >= 64 ? ~0ULL : ((1ULL << p.W) - 1ULL);
    launch_ce_send(cx, in.x, reinterpret_cast<const char*>(in.scale), in.nptr, n_send, all & ~p.own_ranks);
  }
  if (overlap) {
    // Receive side on the side stream, concurrent with the send (see Ctx).
    CUDA_OK(cudaStreamWaitEvent(cx.side, cx.fork, 0));
    cx.stash = launch_dispatch_recv(cx, x.options(), code, w.has_value(), x, cx.keep_s, cx.side);
    CUDA_OK(cudaEventRecord(cx.join, cx.side));
    cx.stashed = true;
    cx.two_part_pending = cx.two_part;  // two_part implies the direct receive
  }
  return at::empty({0}, x.options().dtype(at::kInt));
}

std::vector<at::Tensor> dispatch_recv(const at::Tensor& dep, int64_t ctx, int64_t in_dtype_code, bool weighted) {
  Ctx& cx = CX(ctx);
  c10::cuda::CUDAGuard guard(dep.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (cx.stashed) {
    if (cx.two_part_pending) {  // the receive's second part, behind the caller's work (round 64)
      launch_direct_recv(cx, cx.stash, cx.keep_x, cx.keep_s, cx.grids.split_recv2, stream);
      cx.two_part_pending = false;
    }
    CUDA_OK(cudaStreamWaitEvent(stream, cx.join, 0));
    join_send_side(cx, stream);
    std::vector<at::Tensor> out = std::move(cx.stash);
    cx.stash.clear();
    cx.stashed = false;
    cx.keep_x = at::Tensor();  // joined: later reuse of their memory is ordered after the copy
    cx.keep_s = at::Tensor();
    MOE_CHECK(dtype_code_of(out[0].scalar_type()) == in_dtype_code && (out[2].numel() > 0 || !weighted),
              "dispatch_recv: does not match the pending dispatch_send");
    return out;
  }
  MOE_CHECK(cx.keep_x.defined(), "dispatch_recv: no pending dispatch_send");
  at::Tensor x = std::move(cx.keep_x), xs = std::move(cx.keep_s);
  cx.keep_x = at::Tensor();
  cx.keep_s = at::Tensor();
  return launch_dispatch_recv(cx, dep.options(), in_dtype_code, weighted, x, xs, stream);
}

// A whole dispatch (the Communicator's `dispatch`, no work between send and receive): with the
// direct receive (nvlink, or put with the tagged table), one dispatch_fused_kernel on the
// caller's stream; otherwise the send and the receive as separate ops.
at::Tensor dispatch_send(const at::Tensor& x, const at::Tensor& ids, const std::optional<at::Tensor>& w,
                         const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& ntok, int64_t n_host,
                         int64_t ctx) {
  return send_op(x, ids, w, scale, ntok, n_host, ctx, false);
}

std::vector<at::Tensor> dispatch_whole(const at::Tensor& x, const at::Tensor& ids, const std::optional<at::Tensor>& w,
                                       const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& ntok,
                                       int64_t n_host, int64_t ctx, int64_t in_dtype_code, bool weighted) {
  Ctx& cx = CX(ctx);
  const Params& p = cx.p;
  MOE_CHECK(weighted == w.has_value(), "dispatch_whole: weighted must say whether topk_weights is given");
  if (!(p.direct && (p.nvl || p.ll_table) && cx.fused_dispatch && !cx.ce_forced &&
        dtype_code_of(x.scalar_type()) >= 0)) {
    const at::Tensor dep = send_op(x, ids, w, scale, ntok, n_host, ctx, true);
    return dispatch_recv(dep, ctx, in_dtype_code, weighted);
  }
  c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  settle_pending(cx, stream);
  cx.keep_x = cx.keep_s = at::Tensor();  // nothing pending: a stray dispatch_recv is refused
  std::vector<at::Tensor> out = alloc_recv_outputs(p, x.options(), in_dtype_code, weighted);
  Params ps = p;
  ps.ce_send = 0;
  // Dynamic shared memory: the send's table masks, then (after a barrier) the receive's bases.
  const size_t smem = std::max(direct_send_smem(p), (size_t)(p.G + 1) * p.L * 4);
  static const bool ready = [] {
    for (auto* k : {dispatch_fused_kernel<true, true>, dispatch_fused_kernel<true, false>,
                    dispatch_fused_kernel<false, true>, dispatch_fused_kernel<true, true, true>,
                    dispatch_fused_kernel<true, true, false, true>, dispatch_fused_kernel<true, false, false, true>,
                    dispatch_fused_kernel<false, true, false, true>, dispatch_fused_kernel<true, true, false, true, true>,
                    dispatch_fused_kernel<false, true, false, true, true>, dispatch_fused_kernel<true, true, true, true>,
                    dispatch_fused_kernel<true, true, true, true, true>}) {
      max_shared_carveout(k);
      CUDA_OK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)DIRECT_MAX_SMEM));
    }
    return true;
  }();
  (void)ready;
  // The lean instances where every switch they fix is at its default (tagged rows too since
  // round 51, when small arenas took them by default); with the tagged table, the small ones where
  // every token's ids fit one a thread.
  const bool lean = p.lean_fused != 0;
  const bool small = lean && p.small_fused && p.ll_table && x.size(0) * (int64_t)p.topk <= NTHREADS;
  auto* kernel = !p.nvl      ? (small  ? dispatch_fused_kernel<false, true, false, true, true>
                                : lean ? dispatch_fused_kernel<false, true, false, true>
                                       : dispatch_fused_kernel<false, true>)
                 : p.ll_rows  ? (small  ? dispatch_fused_kernel<true, true, true, true, true>
                                 : lean ? dispatch_fused_kernel<true, true, true, true>
                                        : dispatch_fused_kernel<true, true, true>)
                 : p.ll_table ? (small  ? dispatch_fused_kernel<true, true, false, true, true>
                                 : lean ? dispatch_fused_kernel<true, true, false, true>
                                        : dispatch_fused_kernel<true, true>)
                              : (lean ? dispatch_fused_kernel<true, false, false, true> : dispatch_fused_kernel<true, false>);
  kernel<<<cx.grids.direct, NTHREADS, smem, stream>>>(ps, send_in(x, ids, w, scale, ntok, n_host), direct_out(out));
  CUDA_OK(cudaGetLastError());
  return out;
}

// First launch of a combine kernel (static initialisers below): set its carveout (see
// max_shared_carveout) and return
// the registers a block of `threads` threads takes from an SM's 64K (allocated per warp, in
// units of 8 registers per thread).
template <typename K>
static int ready_kernel(K kernel, int threads, bool max_carveout) {
  max_shared_carveout(kernel, max_carveout);
  cudaFuncAttributes a{};
  CUDA_OK(cudaFuncGetAttributes(&a, kernel));
  return (threads / 32) * 32 * ((a.numRegs + 7) / 8 * 8);
}

// One combine-send variant: sets its attributes on first use (the pipelined variant's dynamic
// shared memory) and returns the registers one of its blocks takes.
template <bool NVL, typename TY, typename TX, int N, bool FUSED, int LOADS, int TAGGED = TAG_NONE>
static int launch_send_variant(const Params& p, const TY* y, const float* w, RecvArgs<TY> ra, int blocks,
                               cudaStream_t s) {
  constexpr int smem = LOADS == LOADS_ASYNC        ? NWARPS * async_warp_int4s<TY, N>() * 16
                       : LOADS == LOADS_BULK      ? NWARPS * (bulk_warp_bytes<TY, N>() + BULK_STAGES * 8)
                       : LOADS == LOADS_STEP_BULK ? step_bulk_smem<TY, N>() + NWARPS * 8
                                                  : 0;
  constexpr auto kernel = combine_send_kernel<NVL, TY, TX, N, LOADS, TAGGED, FUSED>;
  static const int regs = [] {
    if (smem) CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return ready_kernel(kernel, NTHREADS, FUSED || LOADS == LOADS_STEP_BULK);
  }();
  kernel<<<blocks, NTHREADS, smem, s>>>(p, y, w, ra);
  return regs;
}

// The combine instances' tagged form for this arena (Params::ll_comb, nvshmem_runtime.tagged_partials).
static TagForm tag_form(const Params& p) {
  return p.ll_comb >= p.M ? TAG_EVERY : p.ll_comb > 0 ? TAG_BY_CALL : TAG_NONE;
}

// Launches the combine send (fused with the receive when `rs` is given, with its rows loaded
// as p.comb_loads says when the chunks are 16-byte vectors; the two-kernel send's by a step's
// bulk copies where `step_bulk` says and the chunks allow); returns the registers one of its
// blocks takes.
template <bool NVL, typename TY, typename TX, int N>
static int launch_combine_send_n(const Params& p, int blocks, const void* y, const float* w, const RecvArgs<void>* rs,
                                 bool step_bulk, cudaStream_t s) {
  const TY* yp = reinterpret_cast<const TY*>(y);
  if (!rs) {
    // The two-kernel send, in the arena's tagged form, its loads by registers or by a step's bulk copies.
    auto two_kernel = [&]<int LOADS>() {
      if constexpr (TAGGED_VEC<TX, N>) {
        if (tag_form(p) == TAG_EVERY)
          return launch_send_variant<NVL, TY, TX, N, false, LOADS, TAG_EVERY>(p, yp, w, RecvArgs<TY>{}, blocks, s);
        if (tag_form(p) == TAG_BY_CALL)
          return launch_send_variant<NVL, TY, TX, N, false, LOADS, TAG_BY_CALL>(p, yp, w, RecvArgs<TY>{}, blocks, s);
      }
      return launch_send_variant<NVL, TY, TX, N, false, LOADS>(p, yp, w, RecvArgs<TY>{}, blocks, s);
    };
    if constexpr (N * sizeof(TY) % 16 == 0) {
      if (step_bulk && reinterpret_cast<uintptr_t>(y) % 16 == 0)
        return two_kernel.template operator()<LOADS_STEP_BULK>();
    }
    return two_kernel.template operator()<LOADS_REGS>();
  }
  if constexpr (N * sizeof(TY) % 16 == 0) {
    if (reinterpret_cast<uintptr_t>(y) % 16 == 0) {
      if (p.comb_loads == LOADS_BULK)
        return launch_send_variant<NVL, TY, TX, N, true, LOADS_BULK>(p, yp, w, typed<TY>(*rs), blocks, s);
      if (p.comb_loads == LOADS_ASYNC)
        return launch_send_variant<NVL, TY, TX, N, true, LOADS_ASYNC>(p, yp, w, typed<TY>(*rs), blocks, s);
    }
  }
  return launch_send_variant<NVL, TY, TX, N, true, LOADS_REGS>(p, yp, w, typed<TY>(*rs), blocks, s);
}

template <bool NVL, typename TY, typename TX>
static int launch_combine_send(const Params& p, int blocks, const void* y, const float* w, const RecvArgs<void>* rs,
                               bool step_bulk, cudaStream_t s) {
  return p.H % 8 == 0 ? launch_combine_send_n<NVL, TY, TX, 8>(p, blocks, y, w, rs, step_bulk, s)
                      : launch_combine_send_n<NVL, TY, TX, 1>(p, blocks, y, w, rs, step_bulk, s);
}

template <bool NVL, typename TY>
static int launch_combine_send_x(const Params& p, int blocks, const void* y, const float* w, const RecvArgs<void>* rs,
                                 bool step_bulk, cudaStream_t s) {
  if (p.xfer_code == 2) return launch_combine_send<NVL, TY, float>(p, blocks, y, w, rs, step_bulk, s);
  return launch_combine_send<NVL, TY, TY>(p, blocks, y, w, rs, step_bulk, s);
}

// The combine receive, alone (send_regs == 0: NTHREADS-thread blocks) or concurrently with a
// running send whose blocks take `send_regs` registers (COMB_OVERLAP_THREADS-thread blocks).
// Concurrent only when one send block and one receive block fit an SM's 64K registers
// together: the receive has <= SMs blocks, so it can never fill every SM twice over and the
// never-waiting send always finds room (no deadlock). Returns false (nothing launched) when
// they would not fit: the caller then runs the receive alone, later.
constexpr int COMB_OVERLAP_THREADS = 128;
// pdl: launched programmatically behind the send on the same stream (combine_whole): it may start
// once every send block has started, as the overlapped receive does on the side stream.
// big_send: the send beside it is a step-bulk one (~142 KB of shared memory a block). An SM takes
// the shared-memory configuration of the first kernel on it, and one that needs more waits until it
// drains (round 7): the receive's blocks, at the driver's default carveout, could take the SMs
// first on the side stream and keep the send, which they wait for, off them (run 52 call 1: a
// 10 s timeout). So that receive asks for the largest carveout, which fits the send beside it.
template <typename TX, typename TO, int N, int TAGGED = TAG_NONE>
static bool launch_combine_recv_n(const Params& p, int blocks, const RecvArgs<void>& ra, int send_regs, bool pdl,
                                  bool big_send, cudaStream_t s) {
  if constexpr (TAGGED == TAG_NONE && TAGGED_VEC<TX, N>) {
    if (tag_form(p) == TAG_EVERY)
      return launch_combine_recv_n<TX, TO, N, TAG_EVERY>(p, blocks, ra, send_regs, pdl, big_send, s);
    if (tag_form(p) == TAG_BY_CALL)
      return launch_combine_recv_n<TX, TO, N, TAG_BY_CALL>(p, blocks, ra, send_regs, pdl, big_send, s);
  }
  const int threads = send_regs ? COMB_OVERLAP_THREADS : NTHREADS;
  static const int regs = ready_kernel(combine_recv_kernel<TX, TO, N, TAGGED>, COMB_OVERLAP_THREADS, false);
  if (send_regs && send_regs + regs > 65536) return false;
  Launch launch(blocks, threads, s, pdl, big_send && send_regs);
  CUDA_OK(cudaLaunchKernelEx(&launch.cfg, combine_recv_kernel<TX, TO, N, TAGGED>, p, typed<TO>(ra)));
  return true;
}
template <typename TX, typename TO>
static bool launch_combine_recv(const Params& p, int blocks, const RecvArgs<void>& ra, int send_regs, bool pdl,
                                bool big_send, cudaStream_t s) {
  return p.H % 8 == 0 ? launch_combine_recv_n<TX, TO, 8>(p, blocks, ra, send_regs, pdl, big_send, s)
                      : launch_combine_recv_n<TX, TO, 1>(p, blocks, ra, send_regs, pdl, big_send, s);
}

// The receive's arguments from the op's tensors.
static RecvArgs<void> recv_args(const at::Tensor& ids, const std::optional<at::Tensor>& ntok, int64_t n_host,
                                const at::Tensor& out) {
  return {ids.data_ptr<int>(), ntok ? ntok->data_ptr<int>() : nullptr, (int)n_host, (int)out.size(0), out.data_ptr()};
}

// The receive's blocks. Beside a send on the side stream, at most one a SM (see launch_combine_recv_n),
// so a 128-token call's ~1,000 items take two or more turns on each of its warps. Launched by PDL
// behind the send (combine_whole) it starts only once every send block has started, so no receive
// block can keep a send block off an SM, and it may have more blocks than SMs: one warp per item of
// this call (its rows times the most slices a token has; at most 16 blocks a SM), the blocks past
// the first wave starting as the send's blocks end, their items' partials already in (round 52;
// MOE_BACKEND_NVSHMEM_WIDE_RECV=0 keeps the side stream's grid).
static int wide_recv_blocks(const Ctx& cx, int rows) {
  const Params& p = cx.p;
  const long long items = (long long)rows * max_slices(p.H);
  const long long per_block = COMB_OVERLAP_THREADS / 32;
  return (int)std::max<long long>(cx.grids.comb_recv,
                                  std::min<long long>(16LL * p.num_sms, (items + per_block - 1) / per_block));
}
static int recv_blocks(const Ctx& cx, const RecvArgs<void>& ra, int send_regs, bool pdl) {
  if (!pdl || !send_regs || !cx.wide_recv) return cx.grids.comb_recv;
  return wide_recv_blocks(cx, ra.rows);
}

// Round 84: whether a two-kernel send loads a step's rows by bulk copies (sum_rows_step_bulk_items;
// every row of an item at once: topk <= STEP_BULK_ROWS). Run 52 calls 2-4 (world size 1, DeepSeek
// decode, 1 / 16 / 32 / 64 / 128 tokens, main beside it): the whole combine 7.4-7.8 / 8.0 / 8.5 /
// 11.6-11.7 / 14.4-14.7 us against 7.4-7.5 / 9.5-9.6 / 9.8-9.9 / 11.6-11.8 / 14.0-14.5, the split
// combine 9.2-9.3 / 9.8-9.9 / 10.2 / 12.8-12.9 / 18.6-18.9 against 9.1 / 11.1-11.3 / 11.6 /
// 14.7-15.1 / 23.5-23.8. (Keeping the registers where the receive follows by PDL, 64 tokens on,
// measured 12.1-12.3 at 64 tokens and 13.9-14.2 at 128.)
static bool step_bulk_call(const Ctx& cx) { return cx.step_bulk && cx.p.topk <= STEP_BULK_ROWS; }

static bool launch_combine_recv_any(const Ctx& cx, const RecvArgs<void>& ra, int send_regs, cudaStream_t s,
                                    bool pdl = false) {
  const Params& p = cx.p;
  const int b = recv_blocks(cx, ra, send_regs, pdl);
  const bool big = step_bulk_call(cx);  // the send beside it may be a step-bulk one (launch_combine_send_any)
  bool launched;
  switch (p.out_code) {
    case 0:
      launched = p.xfer_code == 2 ? launch_combine_recv<float, __nv_bfloat16>(p, b, ra, send_regs, pdl, big, s)
                                  : launch_combine_recv<__nv_bfloat16, __nv_bfloat16>(p, b, ra, send_regs, pdl, big, s);
      break;
    case 1:
      launched = p.xfer_code == 2 ? launch_combine_recv<float, __half>(p, b, ra, send_regs, pdl, big, s)
                                  : launch_combine_recv<__half, __half>(p, b, ra, send_regs, pdl, big, s);
      break;
    default: launched = launch_combine_recv<float, float>(p, b, ra, send_regs, pdl, big, s); break;
  }
  CUDA_OK(cudaGetLastError());
  return launched;
}

// The combine send of the arena's transport and dtypes (fused with the receive when `rs` is
// given); returns the registers one of its blocks takes.
static int launch_combine_send_any(const Ctx& cx, const void* yp, const float* wp, const RecvArgs<void>* rs,
                                   cudaStream_t ks) {
  const Params& p = cx.p;
  const int b = cx.grids.comb_send;
  const bool sb = step_bulk_call(cx);
  int send_regs = 0;
#define CS(NVL)                                                                                   \
  switch (p.out_code) {                                                                           \
    case 0: send_regs = launch_combine_send_x<NVL, __nv_bfloat16>(p, b, yp, wp, rs, sb, ks); break;  \
    case 1: send_regs = launch_combine_send_x<NVL, __half>(p, b, yp, wp, rs, sb, ks); break;         \
    default: send_regs = launch_combine_send<NVL, float, float>(p, b, yp, wp, rs, sb, ks); break;    \
  }
  if (p.nvl) { CS(true) } else { CS(false) }
#undef CS
  CUDA_OK(cudaGetLastError());
  return send_regs;
}

// combine_send; with `out` (and the receive's ids / token count) and overlap on, also the
// receive, concurrently on the side stream (see Ctx); combine_recv then only joins. With the
// fused combine (default past the overlap limit), one kernel does both halves on the side stream.
at::Tensor combine_send(const at::Tensor& y, const std::optional<at::Tensor>& w, const at::Tensor& dep,
                        const std::optional<at::Tensor>& ids, const std::optional<at::Tensor>& ntok, int64_t n_host,
                        const std::optional<at::Tensor>& out, int64_t ctx) {
  Ctx& cx = CX(ctx);
  c10::cuda::CUDAGuard guard(y.device());
  cudaStream_t s = c10::cuda::getCurrentCUDAStream();
  const bool has_recv = ids.has_value() && out.has_value();
  const bool fused = cx.comb_fused && has_recv;
  const bool overlap = cx.comb_overlap && has_recv;
  if (overlap || fused) CUDA_OK(cudaEventRecord(cx.fork, s));
  const float* wp = w ? w->data_ptr<float>() : nullptr;
  const void* yp = y.data_ptr();
  cudaStream_t ks = s;
  RecvArgs<void> ra{};
  if (has_recv) ra = recv_args(*ids, ntok, n_host, *out);
  if (fused) {
    CUDA_OK(cudaStreamWaitEvent(cx.side, cx.fork, 0));
    ks = cx.side;
  }
  const int send_regs = launch_combine_send_any(cx, yp, wp, fused ? &ra : nullptr, ks);
  at::Tensor dep_out = at::empty({0}, y.options().dtype(at::kInt));
  if (overlap) {
    CUDA_OK(cudaStreamWaitEvent(cx.side, cx.fork, 0));
    // Would it not fit beside the send, combine_recv runs it.
    if (!launch_combine_recv_any(cx, ra, send_regs, cx.side)) return dep_out;
  }
  if (fused || overlap) {
    // The receive runs on the side stream: its inputs (and a fused send's y / weights) are
    // held until combine_recv joins.
    CUDA_OK(cudaEventRecord(cx.join, cx.side));
    cx.comb_out = *out;
    cx.comb_ids = *ids;
    cx.comb_ntok = ntok ? *ntok : at::Tensor();
    if (fused) {
      cx.comb_y = y;
      cx.comb_w = w ? *w : at::Tensor();
    }
  }
  return dep_out;
}

void combine_recv(const at::Tensor& dep, const at::Tensor& ids, const std::optional<at::Tensor>& ntok, int64_t n_host,
                  at::Tensor out, int64_t ctx) {
  Ctx& cx = CX(ctx);
  c10::cuda::CUDAGuard guard(out.device());
  cudaStream_t s = c10::cuda::getCurrentCUDAStream();
  if (cx.comb_out.defined()) {
    MOE_CHECK(cx.comb_out.data_ptr() == out.data_ptr() && cx.comb_out.sizes() == out.sizes(),
              "combine_recv: `out` is not the tensor given to combine_send");
    CUDA_OK(cudaStreamWaitEvent(s, cx.join, 0));
    cx.comb_out = cx.comb_ids = cx.comb_ntok = cx.comb_y = cx.comb_w = at::Tensor();  // joined: reuse is ordered after
    return;
  }
  launch_combine_recv_any(cx, recv_args(ids, ntok, n_host, out), 0, s);
}

// A whole combine (the Communicator's `combine`, nothing between send and receive): where the
// receive would run beside the send (decode-sized arenas), both kernels on the caller's stream,
// the receive launched programmatically (PDL) so that it starts once every send block has
// started (the send triggers at its entry), as on the side stream, but with no fork or join
// (round 36), by default only for the calls whose wide receive passes the side stream's grid
// (round 53; MOE_BACKEND_NVSHMEM_WHOLE_COMBINE=1: every call). Otherwise the send and the receive
// as separate ops (the side stream).
void combine_whole(const at::Tensor& y, const std::optional<at::Tensor>& w, const at::Tensor& dep, const at::Tensor& ids,
                   const std::optional<at::Tensor>& ntok, int64_t n_host, at::Tensor out, int64_t ctx) {
  Ctx& cx = CX(ctx);
  const bool pdl = cx.comb_overlap &&
                   (cx.whole_combine == Ctx::Whole::Every ||
                    (cx.whole_combine == Ctx::Whole::ByCall && cx.wide_recv &&
                     wide_recv_blocks(cx, (int)out.size(0)) > cx.grids.comb_recv));
  if (!pdl) {
    const at::Tensor d = combine_send(y, w, dep, ids, ntok, n_host, out, ctx);
    combine_recv(d, ids, ntok, n_host, out, ctx);
    return;
  }
  c10::cuda::CUDAGuard guard(y.device());
  cudaStream_t s = c10::cuda::getCurrentCUDAStream();
  MOE_CHECK(!cx.comb_out.defined(), "combine_whole: a combine_send is pending (call combine_recv first)");
  const RecvArgs<void> ra = recv_args(ids, ntok, n_host, out);
  const int send_regs = launch_combine_send_any(cx, y.data_ptr(), w ? w->data_ptr<float>() : nullptr, nullptr, s);
  // Would it not fit beside the send, the receive runs alone after it.
  if (!launch_combine_recv_any(cx, ra, send_regs, s, true)) launch_combine_recv_any(cx, ra, 0, s);
}

// NVSHMEM host helpers ------------------------------------------------------------------
at::Tensor get_uid() {
  nvshmemx_uniqueid_t id;
  MOE_CHECK(nvshmemx_get_uniqueid(&id) == 0, "nvshmemx_get_uniqueid failed");
  at::Tensor t = at::empty({(int64_t)sizeof(id)}, at::TensorOptions().dtype(at::kByte));
  memcpy(t.data_ptr(), &id, sizeof(id));
  return t;
}

void init_uid(const at::Tensor& uid, int64_t rank, int64_t nranks) {
  nvshmemx_uniqueid_t id;
  MOE_CHECK(uid.numel() == (int64_t)sizeof(id), "bad unique id size");
  memcpy(&id, uid.data_ptr(), sizeof(id));
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  nvshmemx_set_attr_uniqueid_args((int)rank, (int)nranks, &id, &attr);
  MOE_CHECK(nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) == 0, "nvshmemx_init_attr failed");
}

// After nvshmem4py initialised the host library: register this module's device state.
void register_module() { nvshmem_init(); }
int64_t init_status() { return nvshmemx_init_status(); }
int64_t my_pe() { return nvshmem_my_pe(); }
int64_t n_pes() { return nvshmem_n_pes(); }
int64_t sym_malloc(int64_t bytes) {
  void* ptr = nvshmem_malloc((size_t)bytes);
  MOE_CHECK(ptr != nullptr, "nvshmem_malloc(", bytes, ") failed");
  CUDA_OK(cudaMemset(ptr, 0, (size_t)bytes));
  CUDA_OK(cudaDeviceSynchronize());
  nvshmem_barrier_all();
  return reinterpret_cast<int64_t>(ptr);
}
void sym_free(int64_t ptr) {
  CUDA_OK(cudaDeviceSynchronize());
  nvshmem_free(reinterpret_cast<void*>(ptr));
}
int64_t peer_ptr(int64_t ptr, int64_t pe) {
  return reinterpret_cast<int64_t>(nvshmem_ptr(reinterpret_cast<void*>(ptr), (int)pe));
}
void barrier_all() { nvshmem_barrier_all(); }
int64_t num_sms(int64_t device) {
  int v = 0;
  CUDA_OK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, (int)device));
  return v;
}

}  // namespace moe

#include "probes.cuh"
#include "padded_ops.cuh"

TORCH_LIBRARY(moe_backend, m) {
  m.def("dispatch_send(Tensor x, Tensor topk_ids, Tensor? topk_weights, Tensor? x_scale, Tensor? num_tokens, "
        "int n_host, int ctx) -> Tensor");
  m.def("dispatch_recv(Tensor dep, int ctx, int in_dtype_code, bool weighted) -> Tensor[]");
  m.def("dispatch_whole(Tensor x, Tensor topk_ids, Tensor? topk_weights, Tensor? x_scale, Tensor? num_tokens, "
        "int n_host, int ctx, int in_dtype_code, bool weighted) -> Tensor[]");
  m.def("combine_send(Tensor expert_y, Tensor? weights, Tensor dep, Tensor? topk_ids, Tensor? num_tokens, int n_host, "
        "Tensor(a!)? out, int ctx) -> Tensor");
  m.def("combine_recv(Tensor dep, Tensor topk_ids, Tensor? num_tokens, int n_host, Tensor(a!) out, int ctx) -> ()");
  m.def("combine_whole(Tensor expert_y, Tensor? weights, Tensor dep, Tensor topk_ids, Tensor? num_tokens, int n_host, "
        "Tensor(a!) out, int ctx) -> ()");
  m.def("create_ctx(int[] cfg) -> int", moe::create_ctx);
  m.def("pad_region_bytes(int ctx, int[] cfg) -> int", moe::pad_region_bytes);
  m.def("pad_create(int ctx, int base, int[] cfg) -> int", moe::pad_create);
  m.def("pad_destroy(int pad) -> ()", moe::pad_destroy);
  m.def("pad_views(int pad, int device) -> Tensor[]", moe::pad_views);
  m.def("pad_dispatch(Tensor x, Tensor topk_ids, Tensor? topk_weights, Tensor? x_scale, Tensor? num_tokens, "
        "int n_host, int pad, int phase) -> Tensor[]");
  m.def("pad_recv(Tensor like, int pad) -> Tensor[]");
  m.def("pad_combine(Tensor expert_y, Tensor? weights, Tensor counts, Tensor topk_ids, Tensor? num_tokens, "
        "int n_host, Tensor(a!) out, int pad) -> ()");
  m.def("ce_chunk_starts(int n, int max_chunks, float decay) -> int[]", moe::ce_chunk_starts);
  m.def("destroy_ctx(int ctx) -> ()", moe::destroy_ctx);
  m.def("get_uid() -> Tensor", moe::get_uid);
  m.def("init_uid(Tensor uid, int rank, int nranks) -> ()", moe::init_uid);
  m.def("register_module() -> ()", moe::register_module);
  m.def("init_status() -> int", moe::init_status);
  m.def("my_pe() -> int", moe::my_pe);
  m.def("n_pes() -> int", moe::n_pes);
  m.def("sym_malloc(int bytes) -> int", moe::sym_malloc);
  m.def("sym_free(int ptr) -> ()", moe::sym_free);
  m.def("peer_ptr(int ptr, int pe) -> int", moe::peer_ptr);
  m.def("barrier_all() -> ()", moe::barrier_all);
  m.def("num_sms(int device) -> int", moe::num_sms);
  m.def("rate_probe(int dst, int src, int nbytes, int mode, int blocks, int device) -> ()", moe::rate_probe);
  m.def("timeline_stamps(int mode) -> Tensor", moe::timeline_stamps);
  m.def("launch_cost(int iters, int device) -> float[]", moe::launch_cost);
  m.def("step_cost(Tensor scratch, int chain_words, Tensor(a!) out, int kind, int reps, int blocks) -> ()");
  m.def("ping(Tensor(a!) err, int flags, int[] peers, int rank, int round, int launches, int timeout_ns) -> ()");
}

TORCH_LIBRARY_IMPL(moe_backend, CUDA, m) {
  m.impl("dispatch_send", moe::dispatch_send);
  m.impl("dispatch_recv", moe::dispatch_recv);
  m.impl("dispatch_whole", moe::dispatch_whole);
  m.impl("combine_send", moe::combine_send);
  m.impl("combine_recv", moe::combine_recv);
  m.impl("combine_whole", moe::combine_whole);
  m.impl("pad_dispatch", moe::pad_dispatch);
  m.impl("pad_recv", moe::pad_recv);
  m.impl("pad_combine", moe::pad_combine);
  m.impl("ping", moe::ping);
  m.impl("step_cost", moe::step_cost);
}

// A bare Python module: importing it runs the registrations above.
static struct PyModuleDef moe_module = {PyModuleDef_HEAD_INIT, "_C", "moe_backend native NVSHMEM kernels", -1, nullptr};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&moe_module); }
