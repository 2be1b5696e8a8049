// device_common.cuh: what every kernel shares: limits, Params and the arena's signal layout, memory-model
// and copy helpers, timeline stamps, and the bounded waits and flag raises.
#pragma once

#include <cuda_runtime.h>

#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstddef>
#include <cstdint>

namespace moe {


constexpr int MAXW = 64;
constexpr int NTHREADS = 512;
constexpr int NWARPS = NTHREADS / 32;

// Error phases recorded by a timed-out wait (mirrored in nvshmem_runtime.py).
enum Phase : int { PH_DISPATCH_RECV = 1, PH_COMBINE_RECV = 2, PH_DISPATCH_GRID = 3 };

// Kernel parameters sit in constant bank 0 from 0x210 (sm_90), read through a constant cache of
// 64-byte lines; a launch misses on each line it first touches (round 46: the combine receive's
// constant-cache stalls sat at the first loads of its 8 lines). So the fields the latency kernels
// read (combine send/receive, fused dispatch: found from their SASS) come first, in the three lines
// from 0x210 to 0x2c0, and the struct is padded so the arguments after it start on a line.
// Combine receive and send 8 -> 6 lines, the fused dispatch 9 -> 7; DeepSeek decode combine at world
// size 1, 1 / 32 / 128 tokens: 9.0-9.1 / 10.5-10.7 / 16.0-16.3 -> 8.8-8.9 / 10.1-10.2 / 15.9-16.1 us.
struct Params {
  // 0x210-0x240 (shares the line with the driver's 0x208)
  int W, G, tp, rank, E, L, topk, H, M;
  int part_bytes;
  int comb_items;   // a combine call cuts each token's partial into slices, each with its own flag,
                    // until it has about this many work items (call_slices)
  int entry_last;   // the "entered" flags come from the grid's last block (entering_peer), not block 0
  // 0x240-0x280
  int group, replica;
  int row_bytes, scale_bytes, slot_bytes, table_bytes;
  int entry_release;  // nvlink announces by release operations alone, no fence.sc.sys (round 14; =0 restores it)
  int recv_prefetch;  // combine receive: the next item's expert ids loaded before this item's wait
  int finish_block0;   // the combine receive's block 0 advances the round, no finish counter
  int copy_pieces;  // pieces per token of the dispatch copy's work items (see dispatch_copy_kernel)
  int direct_blocks;  // send blocks that write the direct table (each its share of the tokens)
  int early_load;      // direct receive: a warp loads its piece of the row before the tables are in (round 25)
  int own_group;       // the group whose tokens the receive reads from its own x: `group`, or -1 with
                       // SELF_SEND (every token through the slots and flags, as another group's)
  int ll_comb;         // nvlink two-kernel combine: the tokens a rank of the round-tagged partials' region
                       // (comb_tagged_off; 0: none). M: every call's partials tagged (TAG_EVERY
                       // instances), fewer: the calls of at most that many tokens (TAG_BY_CALL)
  long long timeout_ns;
  // 0x280-0x2c0
  unsigned long long own_ranks;  // the ranks the dispatch send skips: the own group's (none with SELF_SEND);
                                // set by the host: derived in the send it cost 8 B of spill
  char* sym;  // this PE's symmetric arena (same offsets on every PE)
  long long off_sig, off_tables, off_disp, off_comb;
  unsigned long long* state;  // [0]=seq [1]=plan grid-barrier counter (never reset) [2]=fused combine
                              // send work counter [3]=combine-receive finish counter [4]=err
                              // [5]=dispatch copy work counter [6]=round of the current combine
                              // [7]=fused combine receive work counter ([2], [5], [7] reset by the plan)
                              // [8]=largest source-token count of this round (set by the plan)
  int* rowmap;   // [G, M, topk] received row of (g, t, k) or -1
  // from 0x2c0: the rest
  int* err_host; // pinned, mapped: {flag, phase, peer, round}
  int* cnt;      // [nchunks, L]
  long long off_stage_disp, off_stage_table, off_stage_comb;
  int out_code, xfer_code;
  int chunk, nchunks, num_sms;
  int nvl;
  int comb_loads;  // fused combine send: how it loads its rows (RowLoads)
  int bulk_recv;   // with LOADS_BULK: the fused receive half's partials by bulk copies too
  int direct;       // sender-side expert ranks, one receive kernel (dispatch_direct_kernel; create_ctx)
  int token_release;  // nvlink token flags by release stores alone, no fence.sc.sys (round 17)
  int ce_send;      // tokens cross by copy-engine copies (launch_ce_send); the send kernel ships the table only
  int table_prefetch;  // direct table, one id per thread: id and weight loaded before the masks are cleared
  int ll_table;        // direct table of round-tagged words, polled by the receive: no announce (round 25)
  int par_scan;        // direct receive: the expert offsets scanned by every thread, not by warp 0 (round 25)
  int copy_bulk;       // dispatch copy with a work counter: rows by bulk copies through shared memory (round 33)
  int plan_vec;        // plan: the count matrix read four experts a thread by 16-byte loads (round 33)
  int item_spread;     // direct receive: item i is warp i / grid of block (i + table blocks) % grid (round 37)
  int lean_fused;      // the fused dispatch's lean instance serves: the switches it fixes at their defaults
  int small_fused;     // with lean_fused, tagged table: calls of <= NTHREADS / topk rows take the SMALL instance
  int ll_rows;         // direct receive, nvlink: rows in round-tagged words, polled by the receive: no token flag
  int put_from_x;      // put send, rows without scales: P2P peers' puts straight from x, not staged (round 55)
  int pe[MAXW];
  char* peer[MAXW];  // nvshmem_ptr(sym, pe[r]) (nvlink transport)
  // No padding needed: the 4-byte hole before peer[] ends Params on a 64-byte line (static_assert
  // below), so the kernel arguments after it start on a constant-cache line.
};
constexpr int PARAMS_BASE = 0x210;  // sm_90's first kernel-parameter byte in constant bank 0
constexpr int PARAMS_HOT_BYTES = offsetof(Params, err_host);  // the hot fields: those before err_host
static_assert(PARAMS_BASE + PARAMS_HOT_BYTES == 0x2c0, "Params' hot fields fill 0x210-0x2c0");
static_assert((PARAMS_BASE + sizeof(Params)) % 64 == 0, "the arguments after Params must start on a 64-byte line");

// A launch's first read of each 64-byte line of its parameters misses the SM's constant cache,
// and an instruction whose constant operand misses blocks its warp until the line arrives (ncu's
// "imc" stall), so a kernel's entry fetched its lines one after another (round 46: 34% of the
// 1-token combine receive's stall samples). warm_param_lines (round 48) has thread 0 read one
// word of every line of Params' hot part (0x210-0x2c0) and of the given arguments by indexed
// loads (LDC), which issue without waiting: the misses overlap, and the block's other warps find
// the lines in the cache or on their way. The index is the block's rank in its cluster, zero (the
// kernels are launched without clusters), read from a special register: the compiler cannot fold
// it (constant offsets become blocking uniform loads) and it does not wait for line 0x0's miss as
// gridDim would. The loads' OR feeds a store that never runs, on a condition of that rank the
// compiler cannot decide, so they are not removed (a static __shared__ sink moved other kernels'
// shared arrays in the device link: the untagged fused dispatch grew from 30 to 59 KB). The
// kernel's parameters must be __grid_constant__, so taking their addresses makes no local copy.
template <typename... A>
__device__ __forceinline__ void warm_param_lines(const Params& p, const A&... args) {
  if (threadIdx.x != 0) return;
  unsigned z;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(z));
  auto line_words = [z](const void* base, int bytes) {
    const int* w = reinterpret_cast<const int*>(base);
    int v = 0;
#pragma unroll
    for (int off = 0; off < bytes; off += 64) v |= w[z + off / 4];
    return v | w[z + (bytes - 4) / 4];  // the last line, where the object does not start on one
  };
  // Params starts at 0x210: its words at 0x210, 0x250 and 0x290 are in the lines 0x200-0x280.
  const int v = line_words(&p, PARAMS_HOT_BYTES) | (line_words(&args, sizeof(A)) | ... | 0);
  // A cluster rank is below 16 under any launch: the store never runs, with clusters or not.
  asm volatile("{ .reg .pred q; setp.gt.u32 q, %1, 0xffff; @q st.volatile.shared.u32 [%1], %0; }" ::"r"(v), "r"(z));
}

// Bit mask of group g's ranks (its tp replicas).
inline unsigned long long group_ranks(int g, int tp) {
  return tp >= 64 ? ~0ULL : (((1ULL << tp) - 1ULL) << (g * tp));
}

// Signal slots (uint64) inside the arena's signal region.
__host__ __device__ inline long long sig_arrive(const Params& p, int r) { return r; }
__host__ __device__ inline long long sig_table(const Params& p, int g) { return p.W + g; }
__host__ __device__ inline long long sig_token(const Params& p, int g, int t) { return p.W + p.G + (long long)g * p.M + t; }
__host__ __device__ inline long long sig_barrier(const Params& p, int r) { return p.W + p.G + (long long)p.G * p.M + r; }
// Rank r's partial flags: token t's slice s of S is flag t * S + s. S * (largest token count) never
// exceeds max(M, comb_items / G) (call_slices), the flags each rank has.
__host__ __device__ inline long long comb_flags_per_rank(const Params& p) {
  return p.M > p.comb_items / p.G ? p.M : p.comb_items / p.G;
}
__host__ __device__ inline long long sig_comb(const Params& p, int r, int t, int s, int S) {
  return 2LL * p.W + p.G + (long long)p.G * p.M + (long long)r * comb_flags_per_rank(p) + (long long)t * S + s;
}

// S, the slices of this call's combine: about comb_items work items (a warp's each), from this
// round's largest source-token count (state[8], set by the plan; the same on every rank: the
// largest of the groups' counts every rank receives), at least SLICE_MIN_ELEMS elements a slice.
// Measured at EP2, DeepSeek decode in a 128-token arena, combine 1 / 32 / 128 tokens: one S for
// the arena (8) 14.2 / 15.9 / 22.2 us; 14 slices 13.0 / 15.5 / 27.7; 4 slices 17.4 / 19.0 / 21.0.
// Round 34 (world size 1): 256-element slices (28 at 1 token) 9.3-9.5 / 13.2-13.3 / 16.7 us
// against 9.3-9.5 / 11.5-11.6 / 16.8 us with 512.
constexpr int SLICE_MIN_ELEMS = 512;
// The most slices a token's partial has (call_slices' cap); the host sizes the combine's grids by it.
__host__ __device__ constexpr int max_slices(int H) { return (H + SLICE_MIN_ELEMS - 1) / SLICE_MIN_ELEMS; }
__device__ __forceinline__ int call_slices(const Params& p) {
  const unsigned long long n = p.state[8];
  const long long tokens = (long long)p.G * (long long)(n < 1 ? 1 : (n > (unsigned long long)p.M ? p.M : n));
  const long long by_items = p.comb_items / tokens;
  // max_slices(p.H), written out: through the helper ptxas assigned the registers of the prefill's
  // fused send instances differently (same instructions; the built kernels are kept as measured).
  const int cap = (p.H + SLICE_MIN_ELEMS - 1) / SLICE_MIN_ELEMS;
  return by_items < 1 ? 1 : (by_items > cap ? cap : (int)by_items);
}

// Round-tagged partials (p.ll_comb, the combine's counterpart of LL_ROWS): the combine stores
// its partials as round-tagged words (4 payload bytes in each 8-byte word, twice the bytes) into
// their own region after the plain partials (nvshmem_runtime.layout), and raises no flag: each
// receive lane polls the words it sums, so the partial's bytes and its "ready" arrive together,
// with no release (which waits for the stores' acknowledgements) between them. Not the plain
// region: there a word's high half is data, which could by chance equal a later round's tag
// (the fused combine, which an arena may also run, writes plain partials).
// Byte offset of rank r's tagged partial of token t < p.ll_comb (2 * part_bytes each).
__device__ __forceinline__ long long comb_tagged_off(const Params& p, int r, int t) {
  return p.off_comb + (long long)p.W * p.M * p.part_bytes + ((long long)r * p.ll_comb + t) * 2LL * p.part_bytes;
}
// The combine instances' tagged forms (Params::ll_comb): none, every call, or per call.
enum TagForm : int { TAG_NONE = 0, TAG_EVERY = 1, TAG_BY_CALL = 2 };
// Whether this call's partials go as tagged words: by call where the round's largest source-token
// count (state[8], the same on every rank) fits the tagged region, so send and receive agree.
template <int TAGGED>
__device__ __forceinline__ bool call_tagged(const Params& p) {
  if constexpr (TAGGED == TAG_EVERY) return true;
  else if constexpr (TAGGED == TAG_BY_CALL) return p.state[8] <= (unsigned long long)p.ll_comb;
  else return false;
}

// Element range [h0, h1) of slice s of a row of H elements cut into S slices of whole steps
// of `step` elements (h0 >= H: an empty slice, whose flag is still raised).
__device__ __forceinline__ void slice_range(int H, int S, int s, int step, int& h0, int& h1) {
  const int per = (H + step * S - 1) / (step * S) * step;
  h0 = s * per;
  h1 = min(H, h0 + per);
}

// ---------------------------------------------------------------------------------------
// Memory-model helpers
__device__ __forceinline__ unsigned long long ld_acquire_sys(const unsigned long long* ptr) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(unsigned long long* ptr, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(ptr), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_sys(unsigned long long* ptr, unsigned long long v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(ptr), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu(unsigned long long* ptr, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(ptr), "l"(v) : "memory");
}
// A counter's add with acquire-release semantics, at GPU or system scope: returns the old value.
__device__ __forceinline__ unsigned long long atom_add_acq_rel_gpu(unsigned long long* ptr) {
  unsigned long long old;
  asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(old) : "l"(ptr) : "memory");
  return old;
}
__device__ __forceinline__ unsigned long long atom_add_acq_rel_sys(unsigned long long* ptr) {
  unsigned long long old;
  asm volatile("atom.acq_rel.sys.global.add.u64 %0, [%1], 1;" : "=l"(old) : "l"(ptr) : "memory");
  return old;
}
__device__ __forceinline__ unsigned long long ld_acquire_gpu(const unsigned long long* ptr) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void red_add_release_sys(unsigned long long* ptr, unsigned long long v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(ptr), "l"(v) : "memory");
}
// Round-tagged words (the direct table with p.ll_table): each 8-byte word holds a 32-bit value
// (low half) and the low 32 bits of the round (high half), written by one 8-byte store, and an
// aligned 8-byte access is single-copy atomic (vector accesses per element), so a reader that
// sees this round's tag sees the value stored with it. Volatile accesses (relaxed, system
// scope) bypass L1, so a poll sees a peer's store.
__device__ __forceinline__ unsigned long long tag_word(unsigned v, unsigned long long round) {
  return ((unsigned long long)(unsigned)round << 32) | v;
}
__device__ __forceinline__ void st_tagged(char* dst, unsigned v, unsigned long long round) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(dst), "l"(tag_word(v, round)) : "memory");
}
// Two tagged words in one 16-byte store.
__device__ __forceinline__ void st_tagged2(char* dst, unsigned a, unsigned b, unsigned long long round) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(dst), "l"(tag_word(a, round)),
               "l"(tag_word(b, round))
               : "memory");
}
// 16 payload bytes as four tagged words (32 bytes, two 16-byte stores): a tagged row's or partial's vector.
__device__ __forceinline__ void st_tagged_int4(char* dst, int4 v, unsigned long long round) {
  st_tagged2(dst, (unsigned)v.x, (unsigned)v.y, round);
  st_tagged2(dst + 16, (unsigned)v.z, (unsigned)v.w, round);
}
__device__ __forceinline__ unsigned long long ld_tagged(const char* src) {
  unsigned long long v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(src) : "memory");
  return v;
}
__device__ __forceinline__ ulonglong2 ld_tagged2(const char* src) {
  ulonglong2 v;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(src) : "memory");
  return v;
}
__device__ __forceinline__ bool tagged_now(unsigned long long v, unsigned long long round) {
  return (unsigned)(v >> 32) == (unsigned)round;
}
// A shared-memory address as the shared state space's 32-bit address (what the cp.async,
// mbarrier and bulk-copy instructions take; a caller can keep it in a register).
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// 16-byte asynchronous copies from global into shared memory (L2 only), in commit groups.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int K>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(K) : "memory"); }
// 16 bytes from shared memory by its 32-bit address. Volatile: it stays after the barrier wait
// that made them visible (the wait is an asm of its own).
__device__ __forceinline__ int4 lds16(unsigned addr) {
  int4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
// Bulk copies (the copy engine of the SM, "TMA") from global into shared memory, their bytes
// counted by an mbarrier in this block's shared memory: one instruction moves a whole piece.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialisations visible to the bulk copies (the async proxy).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Arrives once and expects `bytes` more of bulk copies in the barrier's current phase (the
// barrier by its smem_addr).
__device__ __forceinline__ void mbar_arrive_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase of the given parity has completed (every arrival and every byte in).
// Not bounded by timeout_ns like the waits for peers: it waits for this SM's own bulk copies
// from this GPU's memory, which always complete.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to shared `dst`.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// A warp's rows behind one wait (the padded combine's send, round 83; the two-kernel combine's,
// round 84): lane u < nk copies `bytes` from its `src` to shared `dst` + u * stride, lane 0 arms
// the warp's mbarrier `bar` for all of them, every lane waits, and `parity` (the phase the
// barrier completes next) flips.
__device__ __forceinline__ void bulk_rows_one_wait(unsigned dst, unsigned stride, const void* src, unsigned bytes,
                                                   int nk, unsigned bar, unsigned& parity) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) mbar_arrive_expect(bar, bytes * (unsigned)nk);
  if (lane < nk) bulk_load(dst + lane * stride, src, bytes, bar);
  mbar_wait(bar, parity);
  parity ^= 1u;
}
// Orders this thread's view of global memory (what an acquire made visible) before its later
// bulk copies (the async proxy) read it.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
// Bulk copies from shared `src` to global `dst` (16-byte aligned, bytes a multiple of 16), in
// this thread's bulk groups: commit after issuing, then wait until at most K groups still
// read shared memory (before refilling it) or until every group's writes are done (before the
// kernel ends).
__device__ __forceinline__ void bulk_store(void* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int K>
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(K) : "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Programmatic dependent launch: a kernel launched with it may start before the previous
// kernel on its stream ends; grid_dependency_wait() waits for that kernel's end and results
// (a no-op without it); launch_dependents() lets the next kernel be scheduled early.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" :::); }
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Timeline stamps (diagnostic, round 14; scripts/kernel_timeline.py): while on, the
// blocks record %globaltimer: each kernel's first and last block entry (thread 0 of each
// block) and last exit (lane 0 of each warp), and the latest of these moments: the plan's
// waits done, its grid barrier passed; the combine send's warps at their first item, past an
// item's row map, its sums, its fence (nvlink), and done with all their send items (in the
// fused combine, the start of its receive half); the direct table's masks built and entries
// written, the fused dispatch's receive half begun, a direct-receive warp's copy issued; the
// plan's count columns summed and its expert offsets scanned.
enum Stamp { ST_SEND = 0, ST_PLAN, ST_PLAN_WAITED, ST_COPY, ST_CSEND, ST_CSEND_ITEMS, ST_CRECV, ST_PLAN_BARRIER,
             ST_CSEND_SUMMED, ST_CSEND_FENCED, ST_CSEND_LOOP, ST_CSEND_ROWS, ST_SEND_TABLE, ST_DIRECT_ROWS,
             ST_TABLE_MASKS, ST_TABLE_ENTRIES, ST_RECV_START, ST_DIRECT_COPIED, ST_PLAN_SUMMED, ST_PLAN_SCANNED,
             // the padded kernels (padded_kernels.cuh): the dispatch, its masks built, its rows and
             // counts stored, its counts seen; the combine, its pair scan, its send items done; the
             // dispatch's counts of empty experts stored, a row slice's copy issued; a live partials
             // send item's slot words in, its rows in (bulk copies waited, or loads issued)
             ST_PAD_DISPATCH, ST_PAD_MASKS, ST_PAD_ROWS, ST_PAD_COUNTS, ST_PAD_COMBINE, ST_PAD_SCANNED, ST_PAD_SENT,
             ST_PAD_EMPTY_COUNTS, ST_PAD_COPIED, ST_PAD_SLOTS_IN, ST_PAD_ROWS_IN, NSTAMP };
__device__ int g_stamps_on;
__device__ unsigned long long g_stamps[3 * NSTAMP];  // [3k]: first entry, [3k+1]: last entry, [3k+2]: last exit
// Compiled in only by a build with MOE_BACKEND_STAMPS=1 (-DMOE_STAMPS): even switched off, the
// flag's loads cost the decode ops ~0.5 us each and the 24-SM prefill combine ~15 us (round 18).
#ifdef MOE_STAMPS
constexpr bool STAMPS_BUILT = true;
#else
constexpr bool STAMPS_BUILT = false;
#endif
__device__ __forceinline__ void stamp_entry(int k) {
  if (STAMPS_BUILT && threadIdx.x == 0 && g_stamps_on) {
    const unsigned long long t = gtimer();
    atomicMin(&g_stamps[3 * k], t);
    atomicMax(&g_stamps[3 * k + 1], t);
  }
}
__device__ __forceinline__ void stamp_exit(int k) {
  if (STAMPS_BUILT && (threadIdx.x & 31) == 0 && g_stamps_on) atomicMax(&g_stamps[3 * k + 2], gtimer());
}

// The round of the current combine: published by the dispatch plan's block 0 (state[6]),
// not derived from seq (state[0]), which the combine receive advances at its end: with the
// receive running concurrently on a side stream, a late-starting combine-send block would
// otherwise read the advanced seq and stamp its flag with the next round.
__device__ __forceinline__ unsigned long long combine_round(const Params& p) {
  return *reinterpret_cast<volatile unsigned long long*>(&p.state[6]);
}

__device__ __forceinline__ unsigned long long* sigp(const Params& p, char* base, long long slot) {
  return reinterpret_cast<unsigned long long*>(base + p.off_sig) + slot;
}

__device__ void report_error(const Params& p, int phase, int peer, unsigned long long round) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(&p.state[4]), 0ULL, 1ULL) == 0ULL) {
    volatile int* h = p.err_host;
    h[1] = phase;
    h[2] = peer;
    h[3] = (int)round;
    __threadfence_system();
    h[0] = 1;
    __threadfence_system();
  }
}

// Bounded poll: true once ready() (which loads again each call); false on timeout (recorded
// as (phase, peer, round)) or after another wait's error.
template <typename Ready>
__device__ __forceinline__ bool bounded_poll(const Params& p, Ready ready, int phase, int peer,
                                             unsigned long long round) {
  if (ready()) return true;
  if (*(volatile unsigned long long*)&p.state[4]) return false;
  const unsigned long long deadline = gtimer() + (unsigned long long)p.timeout_ns;
  for (unsigned i = 1;; ++i) {
    if (ready()) return true;
    if ((i & 31) == 0) {
      if (*(volatile unsigned long long*)&p.state[4]) return false;
      if (gtimer() > deadline) {
        report_error(p, phase, peer, round);
        return false;
      }
    }
  }
}

// True once *flag >= need; false on timeout (recorded with `round`, default need) or an
// earlier error.
__device__ bool wait_flag(const Params& p, const unsigned long long* flag, unsigned long long need, int phase,
                          int peer, unsigned long long round = 0) {
  return bounded_poll(p, [&] { return ld_acquire_sys(flag) >= need; }, phase, peer, round ? round : need);
}

// The whole warp waits until every lane's flag (nullptr: none) is >= need, its control flow
// the same in every lane (each loop's exit a warp vote), so no lane leaves it before the others
// and the code after it runs as one warp. Per-lane polls (wait_flag in a loop over the lane's
// flags) let ptxas leave the combine receive's warps split, lane 0 apart from lanes 1-31, through
// the sums after them: twice the warp instructions in one build (run 42, docs/PERF_NOTES.md).
// False on timeout (recorded by a lane still waiting, with its peer) or an earlier error.
__device__ __forceinline__ bool wait_flags_warp(const Params& p, const unsigned long long* flag,
                                                unsigned long long need, int phase, int peer) {
  bool ready = flag == nullptr || ld_acquire_sys(flag) >= need;
  if (__all_sync(0xffffffffu, ready)) return true;
  const unsigned long long deadline = __shfl_sync(0xffffffffu, gtimer(), 0) + (unsigned long long)p.timeout_ns;
  for (unsigned i = 1;; ++i) {
    if (!ready) ready = ld_acquire_sys(flag) >= need;
    if (__all_sync(0xffffffffu, ready)) return true;
    if ((i & 31) == 0) {
      if (__any_sync(0xffffffffu, *(volatile unsigned long long*)&p.state[4] != 0)) return false;
      const bool late = __shfl_sync(0xffffffffu, gtimer(), 0) > deadline;
      if (late) {  // the same in every lane (lane 0's clock)
        const unsigned waiting = __ballot_sync(0xffffffffu, !ready);
        if ((threadIdx.x & 31) == __ffs(waiting) - 1) report_error(p, phase, peer, need);
        return false;
      }
    }
  }
}

// Bounded poll of a round-tagged word (8 bytes) or pair of words (16 bytes) at src, starting
// from a load `v` already made, until it carries this round (both words of a pair); the word
// as loaded, or whatever it holds after a timeout (recorded like wait_flag's) or an earlier
// error: callers range-check what they take from it.
__device__ __forceinline__ bool tagged_now(ulonglong2 v, unsigned long long round) {
  return tagged_now(v.x, round) && tagged_now(v.y, round);
}
__device__ __forceinline__ void ld_tagged_into(const char* src, unsigned long long& v) { v = ld_tagged(src); }
__device__ __forceinline__ void ld_tagged_into(const char* src, ulonglong2& v) { v = ld_tagged2(src); }
// The first load usually has it: the loop only when it does not.
template <typename T>
__device__ __forceinline__ T poll_tagged(const Params& p, const char* src, T v, unsigned long long round, int peer) {
  if (!tagged_now(v, round))
    bounded_poll(p, [&] { ld_tagged_into(src, v); return tagged_now(v, round); }, PH_DISPATCH_RECV, peer, round);
  return v;
}

// A release store of `v` into a flag at rank r (nvlink): at GPU scope when r is this rank, whose
// readers are then this GPU's kernels (the release waits for the L2, not the system; round 32:
// 24-SM prefill combine 299 -> 296 us at world size 1), at system scope otherwise.
__device__ __forceinline__ void release_flag_at(const Params& p, int r, long long slot, unsigned long long v) {
  unsigned long long* flag = sigp(p, p.peer[r], slot);
  if (r == p.rank) st_release_gpu(flag, v);
  else st_release_sys(flag, v);
}

// Set a flag on rank r to `round`, ordered after this thread's (and its CTA-synchronised
// peers') earlier writes: nvshmem signal (put transport) or a release store (nvlink).
template <bool NVL>
__device__ __forceinline__ void raise_flag(const Params& p, long long slot, int r, unsigned long long round) {
  if constexpr (NVL) {
    __threadfence_system();
    st_release_sys(sigp(p, p.peer[r], slot), round);
  } else {
    nvshmemx_signal_op(reinterpret_cast<uint64_t*>(sigp(p, p.sym, slot)), round, NVSHMEM_SIGNAL_SET, p.pe[r]);
  }
}

// The rank r whose "entered" flag the calling thread raises (or, in the combine receive, waits
// for), or -1. The release store waits for its fence, so the flags come from the last W threads
// of the grid's last block (p.entry_last): block 0 writes the routing table and warp 0 of
// block 0 takes the first combine item, and both waited behind it (round 23: 1-token dispatch
// 0.4-0.7 us shorter). The combine receive's wait moves there too (round 24).
template <bool LEAN = false>  // LEAN: the defaults at compile time (see dispatch_fused_kernel)
__device__ __forceinline__ int entering_peer(const Params& p) {
  const bool last = LEAN || p.entry_last != 0;
  if (blockIdx.x != (last ? gridDim.x - 1 : 0)) return -1;
  const int r = last ? (int)threadIdx.x - ((int)blockDim.x - p.W) : (int)threadIdx.x;
  return r >= 0 && r < p.W ? r : -1;
}

// Warp-cooperative byte copy; 16-byte vectors when everything is aligned.
__device__ __forceinline__ void warp_copy(char* dst, const char* src, int bytes, int lane) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | (uintptr_t)bytes) & 15) == 0) {
    int4* d = reinterpret_cast<int4*>(dst);
    const int4* s = reinterpret_cast<const int4*>(src);
    const int n = bytes >> 4;
    int i = lane;
    for (; i + 96 < n; i += 128) {
      int4 a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];
      d[i] = a;
      d[i + 32] = b;
      d[i + 64] = c;
      d[i + 96] = e;
    }
    for (; i < n; i += 32) d[i] = s[i];
  } else if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | (uintptr_t)bytes) & 3) == 0) {
    int* d = reinterpret_cast<int*>(dst);
    const int* s = reinterpret_cast<const int*>(src);
#pragma unroll 1  // the unaligned fallbacks: rarely run, kept small (round 45)
    for (int i = lane; i < (bytes >> 2); i += 32) d[i] = s[i];
  } else {
#pragma unroll 1
    for (int i = lane; i < bytes; i += 32) dst[i] = src[i];
  }
}

// warp_copy with U loads a lane in flight before the first store (warp_copy: 4), each pass's
// tail predicated rather than copied a vector at a time: a 7 KB row (448 vectors) is one pass of
// load latency at U = 16, five (three passes and two tail vectors) in warp_copy. For latency-bound
// copies (a few rows a call). dst, src and bytes must be multiples of 16 (no fallback inlined: cold
// code between a latency kernel's hot stretches costs its warps instruction fetches, round 42).
template <int U>
__device__ __forceinline__ void warp_copy_wide(char* dst, const char* src, int bytes, int lane) {
  int4* d = reinterpret_cast<int4*>(dst);
  const int4* s = reinterpret_cast<const int4*>(src);
  const int n = bytes >> 4;
  for (int i = lane; i < n; i += 32 * U) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i + 32 * u < n) v[u] = s[i + 32 * u];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i + 32 * u < n) d[i + 32 * u] = v[u];
  }
}

// A thread's share of a block's 16-byte vectors of s: i0, i0 + nt, ... (those below n), loaded
// together so that all are in flight before the first store.
template <int UNROLL>
__device__ __forceinline__ void load_block_vectors(const int4* __restrict__ s, int i0, int nt, int n,
                                                   int4 (&v)[UNROLL]) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
    if (i0 + u * nt < n) v[u] = __ldg(s + i0 + u * nt);
}

// Block-cooperative copy of `bytes` from src to byte offset dst_off of every rank in `mask`
// (their arenas through p.peer), reading the source once: UNROLL 16-byte loads in flight per
// thread, then the stores. Byte loop when anything is not 16-byte aligned.
constexpr int COPY_UNROLL = 8;
__device__ __forceinline__ void block_copy_multi(const Params& p, long long dst_off, unsigned long long mask,
                                                 const char* __restrict__ src, int bytes) {
  const int tid = threadIdx.x, nt = blockDim.x;
  if (((reinterpret_cast<uintptr_t>(src) | (uintptr_t)bytes | (uintptr_t)dst_off) & 15) == 0) {
    const int4* s = reinterpret_cast<const int4*>(src);
    const int n = bytes >> 4;
    for (int i0 = tid; i0 < n; i0 += COPY_UNROLL * nt) {
      int4 v[COPY_UNROLL];
      load_block_vectors(s, i0, nt, n, v);
      for (unsigned long long m = mask; m; m &= m - 1) {
        int4* d = reinterpret_cast<int4*>(p.peer[__ffsll((long long)m) - 1] + dst_off);
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; ++u)
          if (i0 + u * nt < n) d[i0 + u * nt] = v[u];
      }
    }
  } else {
    for (int i = tid; i < bytes; i += nt) {
      char v = src[i];
      for (unsigned long long m = mask; m; m &= m - 1) p.peer[__ffsll((long long)m) - 1][dst_off + i] = v;
    }
  }
}

// Block-cooperative copy of `bytes` (a multiple of 16) from src to byte offset dst_off of every
// rank in `mask` as round-tagged words (p.ll_rows): each 4 bytes of payload become one 8-byte
// word with the round in its high half (st_tagged_int4: 16 payload bytes, two 16-byte stores), so
// the destination takes twice the bytes and needs no flag. Half block_copy_multi's loads in
// flight: with 8, in an instance that also held the flagged copy, the send kernel spilled 36 B.
constexpr int TAGGED_UNROLL = 4;
__device__ __forceinline__ void block_copy_tagged(const Params& p, long long dst_off, unsigned long long mask,
                                                  const char* __restrict__ src, int bytes, unsigned long long round) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int4* s = reinterpret_cast<const int4*>(src);
  const int n = bytes >> 4;
  for (int i0 = tid; i0 < n; i0 += TAGGED_UNROLL * nt) {
    int4 v[TAGGED_UNROLL];
    load_block_vectors(s, i0, nt, n, v);
    for (unsigned long long m = mask; m; m &= m - 1) {
      char* d = p.peer[__ffsll((long long)m) - 1] + dst_off;
#pragma unroll
      for (int u = 0; u < TAGGED_UNROLL; ++u)
        if (i0 + u * nt < n) st_tagged_int4(d + 32LL * (i0 + u * nt), v[u], round);
    }
  }
}

// Block-cooperative local copy (put transport: x row into symmetric staging).
__device__ __forceinline__ void block_copy(char* __restrict__ dst, const char* __restrict__ src, int bytes) {
  const int tid = threadIdx.x, nt = blockDim.x;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | (uintptr_t)bytes) & 15) == 0) {
    const int4* s = reinterpret_cast<const int4*>(src);
    int4* d = reinterpret_cast<int4*>(dst);
    const int n = bytes >> 4;
    for (int i0 = tid; i0 < n; i0 += COPY_UNROLL * nt) {
      int4 v[COPY_UNROLL];
#pragma unroll
      for (int u = 0; u < COPY_UNROLL; ++u)
        if (i0 + u * nt < n) v[u] = __ldg(s + i0 + u * nt);
#pragma unroll
      for (int u = 0; u < COPY_UNROLL; ++u)
        if (i0 + u * nt < n) d[i0 + u * nt] = v[u];
    }
  } else {
    for (int i = tid; i < bytes; i += nt) dst[i] = src[i];
  }
}

// Routing table of a group, as the plan kernel reads it: a 16-byte header {n, has_weights},
// then per token ids[topk] (int32, ids outside [0,E) as -1) and weights[topk] (float32).
// It is cut into table_portions() portions of whole tokens, each written by one send block
// at the start of the kernel and announced by one signal ADD of 1: a receiver has the
// whole table once table[g] reaches round * portions. Spread over blocks because one block
// writing the whole 262 KB prefill table shared the link with every token stream and
// arrived ~140 us late, holding back the plan and with it every copy.
constexpr int TABLE_PORTION_BYTES = 8192;
constexpr int MAX_TABLE_PORTIONS = 64;
__host__ __device__ inline int table_portions(const Params& p) {
  const long long bytes = (long long)p.M * p.topk * 8;
  const long long n = (bytes + TABLE_PORTION_BYTES - 1) / TABLE_PORTION_BYTES;
  return (int)(n < 1 ? 1 : (n > MAX_TABLE_PORTIONS ? MAX_TABLE_PORTIONS : n));
}
// Tokens [t0, t1) of portion j (multiples of 4 tokens, so 16-byte vectors stay aligned).
__device__ __forceinline__ void table_portion_range(const Params& p, int n, int j, int& t0, int& t1) {
  const int np = table_portions(p);
  const int per = ((n + np - 1) / np + 3) & ~3;
  t0 = min(n, j * per);
  t1 = min(n, t0 + per);
}
__device__ __forceinline__ long long table_token_off(const Params& p, int t) { return 16 + (long long)t * p.topk * 8; }
// The untagged direct table's count[E], after its M tokens (written by write_table_direct, read by the direct receive).
__device__ __forceinline__ long long table_count_off(const Params& p) { return table_token_off(p, p.M); }
// Token t's ids[topk] (then weights[topk]) in group g's table at this rank.
__device__ __forceinline__ const int* table_ids(const Params& p, int g, int t) {
  return reinterpret_cast<const int*>(p.sym + p.off_tables + (long long)g * p.table_bytes + table_token_off(p, t));
}
// Token t's rank at an expert, counted from `first`: the set bits before bit t in the expert's
// row of mask words, word i of the row at m[i * stride + row] (the direct table's rows are
// contiguous, the plan's strided by its experts).
// ROLLED: the loop over earlier words kept as one small body (the direct table's few tokens
// rarely reach a second word; its unrolled copies were ~800 instructions of that kernel).
template <bool ROLLED = false>
__device__ __forceinline__ int bit_rank(const unsigned* m, int row, int stride, int t, int first = 0) {
  const int w = t >> 5;
  int rank = first + __popc(m[w * stride + row] & ((1u << (t & 31)) - 1));
  if constexpr (ROLLED) {
#pragma unroll 1
    for (int c = 0; c < w; ++c) rank += __popc(m[c * stride + row]);
  } else {
    for (int c = 0; c < w; ++c) rank += __popc(m[c * stride + row]);
  }
  return rank;
}
// The direct table of round-tagged words (p.ll_table; st_tagged): the header {n, has_weights}
// in one 16-byte store, then per (token, k) {packed id, weight} in one 16-byte store, then
// count[E], 8 bytes each. Twice the untagged table's bytes (nvshmem_runtime.slot_sizes).
__host__ __device__ inline long long ll_entry_off(const Params& p, int t, int k) {
  return 16 + ((long long)t * p.topk + k) * 16;
}
__host__ __device__ inline long long ll_count_off(const Params& p) { return 16 + (long long)p.M * p.topk * 16; }

// Write tokens [t0, t1) of the table (plus the header when t0 == 0 and head) at `nd`
// destinations: the arena at table offset `toff` of every rank (to_peers, nvlink) or the
// staging buffer `stage` (put). Block-cooperative; 16-byte vectors when topk % 4 == 0.
__device__ void write_table_portion(const Params& p, bool to_peers, long long toff, char* stage,
                                    const int* __restrict__ ids, const float* __restrict__ w, int n, int t0, int t1,
                                    bool head) {
  const int tid = threadIdx.x, nt = blockDim.x, E = p.E, topk = p.topk;
  const int nd = to_peers ? p.W : 1;
  const long long e0 = (long long)t0 * topk, ne = (long long)(t1 - t0) * topk;
  auto dest = [&](int r) -> char* { return to_peers ? p.peer[r] + toff : stage; };
  const bool vec = (topk & 3) == 0 && (reinterpret_cast<uintptr_t>(ids) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(w) & 15) == 0;
  if (vec) {
    const int4* i4 = reinterpret_cast<const int4*>(ids + e0);
    const float4* w4 = reinterpret_cast<const float4*>(w ? w + e0 : nullptr);
    const int q = topk >> 2;  // vectors per token
    for (long long v = tid; v < (ne >> 2); v += nt) {
      int4 a = __ldg(i4 + v);
      float4 b = w ? __ldg(w4 + v) : float4{};
      a.x = (a.x >= 0 && a.x < E) ? a.x : -1;
      a.y = (a.y >= 0 && a.y < E) ? a.y : -1;
      a.z = (a.z >= 0 && a.z < E) ? a.z : -1;
      a.w = (a.w >= 0 && a.w < E) ? a.w : -1;
      const long long t = t0 + v / q, o = table_token_off(p, (int)t) + (v % q) * 16;
      for (int r = 0; r < nd; ++r) {
        *reinterpret_cast<int4*>(dest(r) + o) = a;
        if (w) *reinterpret_cast<float4*>(dest(r) + o + topk * 4) = b;
      }
    }
  } else {
    for (long long i = tid; i < ne; i += nt) {
      int id = ids[e0 + i];
      id = (id >= 0 && id < E) ? id : -1;
      const float wv = w ? w[e0 + i] : 0.0f;
      const long long o = table_token_off(p, (int)(t0 + i / topk)) + (i % topk) * 4;
      for (int r = 0; r < nd; ++r) {
        *reinterpret_cast<int*>(dest(r) + o) = id;
        if (w) *reinterpret_cast<float*>(dest(r) + o + topk * 4) = wv;
      }
    }
  }
  if (head && tid == 0) {
    for (int r = 0; r < nd; ++r) {
      reinterpret_cast<int*>(dest(r))[0] = n;
      reinterpret_cast<int*>(dest(r))[1] = w ? 1 : 0;
    }
  }
}

// Portions j = block, block + grid, ... of this group's table, each announced to every rank.
// Direct receive (round 16; nvlink, one table portion): the table as above, but
// each valid id carries its token's rank among the group's tokens routed to that expert,
// (rank << 16) | id, and after the tokens come count[E] int32 (the group's tokens per expert).
// The receiver then places every row without a plan kernel: row = offset[e] + rows of earlier
// groups at e + rank. Block-cooperative; `msk` is E * ceil(M/32) words of shared memory.
// LEAN: p.table_prefetch at its default (see dispatch_fused_kernel). TLL: the table's format when
// the caller's instance fixes it (1 tagged, 0 untagged; -1: p.ll_table). SMALL: the caller
// guarantees n * topk <= blockDim.x, so only the one-id-a-thread form is compiled. Fixing them
// takes the other forms' code out of the path a launch fetches (round 43).
template <bool LEAN = false, int TLL = -1, bool SMALL = false>
__device__ void write_table_direct(const Params& p, long long toff, const int* __restrict__ ids,
                                   const float* __restrict__ w, int n, unsigned* msk, int j, int k,
                                   unsigned long long round, char* stage) {
  const int tid = threadIdx.x, nt = blockDim.x, E = p.E, topk = p.topk;
  const bool ll = TLL < 0 ? p.ll_table != 0 : TLL == 1;
  // Where the table goes: every rank's arena through p.peer (nvlink), or the staging copy that
  // put_direct_table then puts (put; round-tagged only).
  const int nd = stage ? 1 : p.W;
  auto dst = [&](int r) -> char* { return stage ? stage : p.peer[r] + toff; };
  // One (token, k) entry, round-tagged (ll: the receive polls the words themselves).
  auto put_tagged = [&](int t, int kk, int v, float wv) {
    const long long o = ll_entry_off(p, t, kk);
#pragma unroll 1
    for (int r = 0; r < nd; ++r) st_tagged2(dst(r) + o, (unsigned)v, __float_as_uint(wv), round);
  };
  const int nw = (p.M + 31) / 32;
  // 16-byte vectors only when every thread gets one: each vector's four ids are marked and
  // ranked one after another, so with fewer vectors than threads the scalar path (one id per
  // thread) is shorter (round 18: 1 token 18.0 -> 17.5 us; 128 tokens 22.9 -> 21.0 us by vectors).
  const bool vec = !SMALL && n * (topk >> 2) >= nt && (topk & 3) == 0 && (reinterpret_cast<uintptr_t>(ids) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(w) & 15) == 0;
  const int q = topk >> 2;  // 16-byte vectors per token (vec)
  const int4* i4 = reinterpret_cast<const int4*>(ids);
  // One id per thread (n * topk <= threads, e.g. 1 token): the id and its weight are loaded
  // before the masks are cleared, so their latency overlaps the clearing and the barrier, and
  // the ranking pass loads nothing (it loaded the weight, after the masks were built).
  const bool one = SMALL || (!vec && (LEAN || p.table_prefetch) && n * topk <= nt);
  int my_id = -1;
  float my_w = 0.0f;
  if (one && tid < n * topk) {
    my_id = ids[tid];
    if (w) my_w = w[tid];
  }
  for (int i = tid; i < E * nw; i += nt) msk[i] = 0;
  __syncthreads();
  auto mark = [&](int id, int t) {
    if (id >= 0 && id < E) atomicOr(&msk[id * nw + (t >> 5)], 1u << (t & 31));
  };
  if (vec) {
    for (int v = tid; v < n * q; v += nt) {
      const int4 a = __ldg(i4 + v);
      const int t = v / q;
      mark(a.x, t), mark(a.y, t), mark(a.z, t), mark(a.w, t);
    }
  } else if (one) {
    if (tid < n * topk) mark(my_id, tid / topk);
  } else {
    for (int i = tid; i < n * topk; i += nt) mark(ids[i], i / topk);
  }
  __syncthreads();
  stamp_exit(ST_TABLE_MASKS);
  auto packed = [&](int id, int t) -> int {
    if (id < 0 || id >= E) return -1;
    return (bit_rank<true>(msk, id * nw, 1, t) << 16) | id;
  };
  // Every one of the k blocks built the whole masks (a few thousand shared-memory atomics at
  // most); block j writes its share of the tokens, block 0 the header, block k - 1 the counts.
  const int per = (n + k - 1) / k, t0 = min(n, j * per), t1 = min(n, t0 + per);
  if (vec) {
    const float4* w4 = reinterpret_cast<const float4*>(w);
    for (int v = t0 * q + tid; v < t1 * q; v += nt) {
      const int t = v / q;
      int4 a = __ldg(i4 + v);
      a.x = packed(a.x, t), a.y = packed(a.y, t), a.z = packed(a.z, t), a.w = packed(a.w, t);
      const float4 b = w ? __ldg(w4 + v) : float4{};
      if (ll) {
        const int k0 = (v % q) * 4;
        put_tagged(t, k0, a.x, b.x), put_tagged(t, k0 + 1, a.y, b.y);
        put_tagged(t, k0 + 2, a.z, b.z), put_tagged(t, k0 + 3, a.w, b.w);
        continue;
      }
      const long long o = toff + table_token_off(p, t) + (v % q) * 16;
      for (int r = 0; r < p.W; ++r) {
        *reinterpret_cast<int4*>(p.peer[r] + o) = a;
        if (w) *reinterpret_cast<float4*>(p.peer[r] + o + topk * 4) = b;
      }
    }
  } else if (one) {
    if (tid >= t0 * topk && tid < t1 * topk) {
      const int t = tid / topk;
      const int v = packed(my_id, t);
      if (ll) {
        put_tagged(t, tid % topk, v, my_w);
      } else {
        const long long o = toff + table_token_off(p, t) + (tid % topk) * 4;
        for (int r = 0; r < p.W; ++r) {
          *reinterpret_cast<int*>(p.peer[r] + o) = v;
          if (w) *reinterpret_cast<float*>(p.peer[r] + o + topk * 4) = my_w;
        }
      }
    }
  } else {
    for (int i = t0 * topk + tid; i < t1 * topk; i += nt) {
      const int t = i / topk;
      const int v = packed(ids[i], t);
      const float wv = w ? w[i] : 0.0f;
      if (ll) {
        put_tagged(t, i % topk, v, wv);
        continue;
      }
      const long long o = toff + table_token_off(p, t) + (i % topk) * 4;
      for (int r = 0; r < p.W; ++r) {
        *reinterpret_cast<int*>(p.peer[r] + o) = v;
        if (w) *reinterpret_cast<float*>(p.peer[r] + o + topk * 4) = wv;
      }
    }
  }
  stamp_exit(ST_TABLE_ENTRIES);
  // The counts come from the last of the k blocks and the header from block 0: with one token
  // (block 0's share the only one) both are written, and on put also put, in parallel (round 47).
  // Expert e's count goes only to its owner, rank e / L (each receive reads its own experts'
  // counts; the staging copy takes every count, and put_direct_table puts each rank its own).
  if (j == k - 1) {
    const long long coff = table_count_off(p);
#pragma unroll 1
    for (int r = 0; r < p.W; ++r) {
      char* d = dst(r);
      for (int e = r * p.L + tid; e < (r + 1) * p.L; e += nt) {
        int cnt = 0;
#pragma unroll 1
        for (int c = 0; c < nw; ++c) cnt += __popc(msk[e * nw + c]);
        if (ll) st_tagged(d + ll_count_off(p) + e * 8, (unsigned)cnt, round);
        else *reinterpret_cast<int*>(d + coff + e * 4) = cnt;
      }
    }
  }
  if (j != 0 || tid != 0) return;
#pragma unroll 1
  for (int r = 0; r < nd; ++r) {
    if (ll) {
      st_tagged2(dst(r), (unsigned)n, w ? 1u : 0u, round);
      continue;
    }
    reinterpret_cast<int*>(p.peer[r] + toff)[0] = n;
    reinterpret_cast<int*>(p.peer[r] + toff)[1] = w ? 1 : 0;
  }
}

// Put transport, direct receive: block j of k puts what write_table_direct staged for it to
// every rank: its tokens' entries, block 0 with the header before them in the same put, and
// block k - 1 each rank's own experts' counts (with one token, one put per block, the two
// blocks in parallel; each put is a block barrier or two, and on P2P a read of the staging).
// No signal: the receive polls the tagged words, and it polls every byte put here, so a
// round's puts have all landed (and read the staging) before the next round can begin.
__device__ void put_direct_table(const Params& p, long long toff, const char* stage, int n, int j, int k) {
  const int per = (n + k - 1) / k, t0 = min(n, j * per), t1 = min(n, t0 + per);
  const long long e0 = j == 0 ? 0 : ll_entry_off(p, t0, 0), e1 = ll_entry_off(p, t1, 0);
#pragma unroll 1
  for (int r = 0; r < p.W; ++r) {
    if (e1 > e0) nvshmemx_putmem_nbi_block(p.sym + toff + e0, stage + e0, (size_t)(e1 - e0), p.pe[r]);
    if (j == k - 1) {
      const long long c0 = ll_count_off(p) + (long long)r * p.L * 8;
      nvshmemx_putmem_nbi_block(p.sym + toff + c0, stage + c0, (size_t)p.L * 8, p.pe[r]);
    }
  }
}

// Send blocks that write a part of the table: the portions, or the direct table's blocks.
__host__ __device__ inline int table_blocks(const Params& p) { return p.direct ? p.direct_blocks : table_portions(p); }

// LEAN (the fused dispatch's default instance): the direct table, release announces. TLL,
// SMALL: as write_table_direct's.
template <bool NVL, bool LEAN = false, int TLL = -1, bool SMALL = false>
__device__ void send_table(const Params& p, const int* __restrict__ ids, const float* __restrict__ w, int n,
                           unsigned* msk, unsigned long long round) {
  const long long toff = p.off_tables + (long long)p.group * p.table_bytes;
  const bool direct = LEAN || p.direct;
  for (int j = blockIdx.x; j < (LEAN ? p.direct_blocks : table_blocks(p)); j += gridDim.x) {
    int t0, t1;
    table_portion_range(p, n, j, t0, t1);
    if constexpr (NVL) {
      if (direct) write_table_direct<LEAN, TLL, SMALL>(p, toff, ids, w, n, msk, j, p.direct_blocks, round, nullptr);
      else write_table_portion(p, true, toff, nullptr, ids, w, n, t0, t1, j == 0);
      __syncthreads();  // (the next portion's masks, if this block writes another)
      if (direct && (TLL < 0 ? p.ll_table != 0 : TLL == 1)) {  // round-tagged words: nothing to announce
        if (threadIdx.x == 0) stamp_exit(ST_SEND_TABLE);
        continue;
      }
      if (threadIdx.x == 0) {
        if (LEAN || p.entry_release) {  // the release add alone orders the block's table stores (bar.sync before it)
          for (int r = 0; r < p.W; ++r) red_add_release_sys(sigp(p, p.peer[r], sig_table(p, p.group)), 1ULL);
        } else {
          __threadfence_system();
          for (int r = 0; r < p.W; ++r) atomicAdd_system(sigp(p, p.peer[r], sig_table(p, p.group)), 1ULL);
        }
        stamp_exit(ST_SEND_TABLE);
      }
    } else {
      char* stage = p.sym + p.off_stage_table;
      if (direct) {  // round-tagged only (create_ctx): staged, then put without a signal
        write_table_direct<LEAN, TLL, SMALL>(p, toff, ids, w, n, msk, j, p.direct_blocks, round, stage);
        __syncthreads();
        put_direct_table(p, toff, stage, n, j, p.direct_blocks);
        __syncthreads();  // (the next portion's masks, if this block writes another)
        continue;
      }
      write_table_portion(p, false, toff, stage, ids, w, n, t0, t1, j == 0);
      __syncthreads();
      const long long b0 = j == 0 ? 0 : table_token_off(p, t0), b1 = table_token_off(p, t1);
      uint64_t* sig = reinterpret_cast<uint64_t*>(sigp(p, p.sym, sig_table(p, p.group)));
      for (int r = 0; r < p.W; ++r) {
        if (b1 > b0)
          nvshmemx_putmem_signal_nbi_block(p.sym + toff + b0, stage + b0, (size_t)(b1 - b0), sig, 1, NVSHMEM_SIGNAL_ADD, p.pe[r]);
        else if (threadIdx.x == 0)
          nvshmemx_signal_op(sig, 1, NVSHMEM_SIGNAL_ADD, p.pe[r]);
      }
    }
    // No barrier before the next portion: portions occupy disjoint bytes of the staging buffer.
  }
}

}  // namespace moe
