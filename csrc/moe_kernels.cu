// moe_backend._C: the four split dispatch/combine kernels on NVSHMEM, their launchers, and
// the few NVSHMEM host calls the Python runtime needs. One translation unit on purpose
// (the CI machine has 2 cores). See docs/KERNELS.md for the protocol and buffer layout.
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
#include <type_traits>
#include <vector>

namespace moe {

constexpr int MAXW = 64;
constexpr int NTHREADS = 512;
constexpr int NWARPS = NTHREADS / 32;

// Error phases recorded by a timed-out wait (mirrored in nvshmem_runtime.py).
enum Phase : int { PH_DISPATCH_RECV = 1, PH_COMBINE_RECV = 2, PH_DISPATCH_GRID = 3 };

struct Params {
  int W, G, tp, rank, group, replica;
  int E, L, topk, H, M;
  int row_bytes, scale_bytes, slot_bytes, table_bytes, part_bytes;
  int out_code, xfer_code;
  int chunk, nchunks, num_sms;
  int nvl;
  int comb_loads;  // fused combine send: how it loads its rows (RowLoads)
  long long timeout_ns;
  int comb_items;   // a combine call cuts each token's partial into slices, each with its own flag,
                    // until it has about this many work items (call_slices)
  int entry_release;  // nvlink announces by release operations alone, no fence.sc.sys (round 14; =0 restores it)
  int copy_pieces;  // pieces per token of the dispatch copy's work items (see dispatch_copy_kernel)
  int direct;       // sender-side expert ranks, one receive kernel (dispatch_direct_kernel; create_ctx)
  int direct_blocks;  // send blocks that write the direct table (each its share of the tokens)
  int token_release;  // nvlink token flags by release stores alone, no fence.sc.sys (round 17)
  int ce_send;      // tokens cross by copy-engine copies (launch_ce_send); the send kernel ships the table only
  int entry_last;   // the "entered" flags come from the grid's last block (entering_peer), not block 0
  int recv_prefetch;  // combine receive: the next item's expert ids loaded before this item's wait
  int table_prefetch;  // direct table, one id per thread: id and weight loaded before the masks are cleared
  int finish_block0;   // the combine receive's block 0 advances the round, no finish counter
  int ll_table;        // direct table of round-tagged words, polled by the receive: no announce (round 25)
  int early_load;      // direct receive: a warp loads its piece of the row before the tables are in (round 25)
  int par_scan;        // direct receive: the expert offsets scanned by every thread, not by warp 0 (round 25)
  char* sym;  // this PE's symmetric arena (same offsets on every PE)
  long long off_sig, off_tables, off_disp, off_comb, off_stage_disp, off_stage_table, off_stage_comb;
  unsigned long long* state;  // [0]=seq [1]=plan grid-barrier counter (never reset) [2]=fused combine
                              // send work counter [3]=combine-receive finish counter [4]=err
                              // [5]=dispatch copy work counter [6]=round of the current combine
                              // [7]=fused combine receive work counter ([2], [5], [7] reset by the plan)
                              // [8]=largest source-token count of this round (set by the plan)
  int* cnt;      // [nchunks, L]
  int* rowmap;   // [G, M, topk] received row of (g, t, k) or -1
  int* err_host; // pinned, mapped: {flag, phase, peer, round}
  int pe[MAXW];
  char* peer[MAXW];  // nvshmem_ptr(sym, pe[r]) (nvlink transport)
};

// Bit mask of this rank's group (its tp replicas): the ranks the dispatch send skips.
__host__ __device__ inline unsigned long long own_group_ranks(const Params& p) {
  return p.tp >= 64 ? ~0ULL : (((1ULL << p.tp) - 1ULL) << (p.group * p.tp));
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
constexpr int SLICE_MIN_ELEMS = 512;
__device__ __forceinline__ int call_slices(const Params& p) {
  const unsigned long long n = p.state[8];
  const long long tokens = (long long)p.G * (long long)(n < 1 ? 1 : (n > (unsigned long long)p.M ? p.M : n));
  const long long by_items = p.comb_items / tokens;
  const int cap = (p.H + SLICE_MIN_ELEMS - 1) / SLICE_MIN_ELEMS;
  return by_items < 1 ? 1 : (by_items > cap ? cap : (int)by_items);
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
__device__ __forceinline__ unsigned long long ld_acquire_gpu(const unsigned long long* ptr) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void red_add_release_sys(unsigned long long* ptr, unsigned long long v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(ptr), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu(unsigned long long* ptr, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(ptr), "l"(v) : "memory");
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
// 16-byte asynchronous copies from global into shared memory (L2 only), in commit groups.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int K>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(K) : "memory"); }
// Bulk copies (the copy engine of the SM, "TMA") from global into shared memory, their bytes
// counted by an mbarrier in this block's shared memory: one instruction moves a whole piece.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(bar)), "r"(count)
               : "memory");
}
// Makes the initialisations visible to the bulk copies (the async proxy).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Arrives once and expects `bytes` more of bulk copies in the barrier's current phase.
__device__ __forceinline__ void mbar_arrive_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   (unsigned)__cvta_generic_to_shared(bar)),
               "r"(bytes)
               : "memory");
}
// Waits until the phase of the given parity has completed (every arrival and every byte in).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(bar);
  unsigned done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to shared `dst`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          (unsigned)__cvta_generic_to_shared(dst)),
      "l"(src), "r"(bytes), "r"((unsigned)__cvta_generic_to_shared(bar))
      : "memory");
}
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
// fused combine, the start of its receive half).
enum Stamp { ST_SEND = 0, ST_PLAN, ST_PLAN_WAITED, ST_COPY, ST_CSEND, ST_CSEND_ITEMS, ST_CRECV, ST_PLAN_BARRIER,
             ST_CSEND_SUMMED, ST_CSEND_FENCED, ST_CSEND_LOOP, ST_CSEND_ROWS, ST_SEND_TABLE, ST_DIRECT_ROWS, NSTAMP };
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
__device__ __forceinline__ int entering_peer(const Params& p) {
  const bool last = p.entry_last != 0;
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
    for (int i = lane; i < (bytes >> 2); i += 32) d[i] = s[i];
  } else {
    for (int i = lane; i < bytes; i += 32) dst[i] = src[i];
  }
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
#pragma unroll
      for (int u = 0; u < COPY_UNROLL; ++u)
        if (i0 + u * nt < n) v[u] = __ldg(s + i0 + u * nt);
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
__device__ void write_table_direct(const Params& p, long long toff, const int* __restrict__ ids,
                                   const float* __restrict__ w, int n, unsigned* msk, int j, int k,
                                   unsigned long long round, char* stage) {
  const int tid = threadIdx.x, nt = blockDim.x, E = p.E, topk = p.topk;
  const bool ll = p.ll_table != 0;
  // Where the table goes: every rank's arena through p.peer (nvlink), or the staging copy that
  // put_direct_table then puts (put; round-tagged only).
  const int nd = stage ? 1 : p.W;
  auto dst = [&](int r) -> char* { return stage ? stage : p.peer[r] + toff; };
  // One (token, k) entry, round-tagged (ll: the receive polls the words themselves).
  auto put_tagged = [&](int t, int kk, int v, float wv) {
    const long long o = ll_entry_off(p, t, kk);
    for (int r = 0; r < nd; ++r) st_tagged2(dst(r) + o, (unsigned)v, __float_as_uint(wv), round);
  };
  const int nw = (p.M + 31) / 32;
  // 16-byte vectors only when every thread gets one: each vector's four ids are marked and
  // ranked one after another, so with fewer vectors than threads the scalar path (one id per
  // thread) is shorter (round 18: 1 token 18.0 -> 17.5 us; 128 tokens 22.9 -> 21.0 us by vectors).
  const bool vec = n * (topk >> 2) >= nt && (topk & 3) == 0 && (reinterpret_cast<uintptr_t>(ids) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(w) & 15) == 0;
  const int q = topk >> 2;  // 16-byte vectors per token (vec)
  const int4* i4 = reinterpret_cast<const int4*>(ids);
  // One id per thread (n * topk <= threads, e.g. 1 token): the id and its weight are loaded
  // before the masks are cleared, so their latency overlaps the clearing and the barrier, and
  // the ranking pass loads nothing (it loaded the weight, after the masks were built).
  const bool one = !vec && p.table_prefetch && n * topk <= nt;
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
  auto packed = [&](int id, int t) -> int {
    if (id < 0 || id >= E) return -1;
    int rank = __popc(msk[id * nw + (t >> 5)] & ((1u << (t & 31)) - 1));
    for (int c = 0; c < (t >> 5); ++c) rank += __popc(msk[id * nw + c]);
    return (rank << 16) | id;
  };
  // Every one of the k blocks built the whole masks (a few thousand shared-memory atomics at
  // most); block j writes its share of the tokens, block 0 the counts and the header.
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
  if (j != 0) return;
  const long long coff = 16 + (long long)p.M * topk * 8;
  for (int e = tid; e < E; e += nt) {
    int cnt = 0;
    for (int c = 0; c < nw; ++c) cnt += __popc(msk[e * nw + c]);
    for (int r = 0; r < nd; ++r) {
      if (ll) st_tagged(dst(r) + ll_count_off(p) + e * 8, (unsigned)cnt, round);
      else *reinterpret_cast<int*>(dst(r) + coff + e * 4) = cnt;
    }
  }
  if (tid == 0)
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
// every rank: its tokens' entries, and (block 0) the header and each rank's own experts'
// counts. No signal: the receive polls the tagged words, and it polls every byte put here, so
// a round's puts have all landed (and read the staging) before the next round can begin.
__device__ void put_direct_table(const Params& p, long long toff, const char* stage, int n, int j, int k) {
  const int per = (n + k - 1) / k, t0 = min(n, j * per), t1 = min(n, t0 + per);
  const long long e0 = ll_entry_off(p, t0, 0), e1 = ll_entry_off(p, t1, 0);
  for (int r = 0; r < p.W; ++r) {
    if (e1 > e0) nvshmemx_putmem_nbi_block(p.sym + toff + e0, stage + e0, (size_t)(e1 - e0), p.pe[r]);
    if (j == 0) {
      nvshmemx_putmem_nbi_block(p.sym + toff, stage, 16, p.pe[r]);
      const long long c0 = ll_count_off(p) + (long long)r * p.L * 8;
      nvshmemx_putmem_nbi_block(p.sym + toff + c0, stage + c0, (size_t)p.L * 8, p.pe[r]);
    }
  }
}

// Send blocks that write a part of the table: the portions, or the direct table's blocks.
__host__ __device__ inline int table_blocks(const Params& p) { return p.direct ? p.direct_blocks : table_portions(p); }

template <bool NVL>
__device__ void send_table(const Params& p, const int* __restrict__ ids, const float* __restrict__ w, int n,
                           unsigned* msk, unsigned long long round) {
  const long long toff = p.off_tables + (long long)p.group * p.table_bytes;
  for (int j = blockIdx.x; j < table_blocks(p); j += gridDim.x) {
    int t0, t1;
    table_portion_range(p, n, j, t0, t1);
    if constexpr (NVL) {
      if (p.direct) write_table_direct(p, toff, ids, w, n, msk, j, p.direct_blocks, round, nullptr);
      else write_table_portion(p, true, toff, nullptr, ids, w, n, t0, t1, j == 0);
      __syncthreads();  // (the next portion's masks, if this block writes another)
      if (p.direct && p.ll_table) {  // round-tagged words: nothing to announce
        if (threadIdx.x == 0) stamp_exit(ST_SEND_TABLE);
        continue;
      }
      if (threadIdx.x == 0) {
        if (p.entry_release) {  // the release add alone orders the block's table stores (bar.sync before it)
          for (int r = 0; r < p.W; ++r) red_add_release_sys(sigp(p, p.peer[r], sig_table(p, p.group)), 1ULL);
        } else {
          __threadfence_system();
          for (int r = 0; r < p.W; ++r) atomicAdd_system(sigp(p, p.peer[r], sig_table(p, p.group)), 1ULL);
        }
        stamp_exit(ST_SEND_TABLE);
      }
    } else {
      char* stage = p.sym + p.off_stage_table;
      if (p.direct) {  // round-tagged only (create_ctx): staged, then put without a signal
        write_table_direct(p, toff, ids, w, n, msk, j, p.direct_blocks, round, stage);
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

// ---------------------------------------------------------------------------------------
// Dispatch send (SEND_THREADS-thread blocks, one token per block at a time). Block 0 first
// raises the "entered dispatch" flag at every rank; on replica 0 of a group the first blocks
// each ship a portion of the group's routing table (send_table); then every block sends owned tokens t = replica + i*tp (i = block,
// block + grid, ...), one copy per destination rank, into the receiver's slot [group][t],
// flag = round. A whole block per token (a few hundred tokens in flight GPU-wide) keeps
// the link busy while tokens land in t order, so the receiver's copy can follow the
// arrival front instead of waiting for one big wave.
// Ranks of the sender's own group get nothing: their receive copies those tokens straight
// from their own `x` (every replica of a group holds the same x), which saves the link-free
// but HBM-costly self copy (~58 MB written + read again at the DeepSeek prefill shape).
// Register cap (<= 64, __launch_bounds__(.., 8)): SEND_BLOCKS_PER_SM send blocks plus one
// 512-thread copy block at 64 registers must fit one SM's 64K registers, or the overlapped
// copy cannot start until the send blocks retire (it did: 90 registers, tail 168 us).
constexpr int SEND_THREADS = 128;
constexpr int SEND_BLOCKS_PER_SM = 3;
template <bool NVL>
__global__ void __launch_bounds__(SEND_THREADS, 8) dispatch_send_kernel(Params p, const char* __restrict__ x,
                                                                     const int* __restrict__ ids,
                                                                     const float* __restrict__ w,
                                                                     const float* __restrict__ scale,
                                                                     const int* __restrict__ nptr, int n_host, int rows) {
  stamp_entry(ST_SEND);
  const unsigned long long round = p.state[0] + 1;
  int n = nptr ? *nptr : n_host;
  n = n < 0 ? 0 : (n > rows ? rows : n);
  const int tid = threadIdx.x, lane = tid & 31;
  const int E = p.E, L = p.L, topk = p.topk;

  // "Entered": orders nothing of this kernel (earlier kernels' accesses are complete), so a
  // release store without the full system fence on nvlink.
  if (const int r = entering_peer(p); r >= 0) {
    if constexpr (NVL) st_release_sys(sigp(p, p.peer[r], sig_arrive(p, p.rank)), round);
    else raise_flag<false>(p, sig_arrive(p, p.rank), r, round);
  }
  extern __shared__ unsigned send_smem[];  // direct receive only: the table's expert masks
  if (p.replica == 0) send_table<NVL>(p, ids, w, n, send_smem, round);
  if (p.ce_send) {  // the tokens cross by copy engine (launch_ce_send)
    stamp_exit(ST_SEND);
    return;
  }

  const int aligned_row = (p.row_bytes + 15) & ~15;
  const unsigned long long own_ranks = own_group_ranks(p);
  // Block 0 ships the table first, so it takes the last token of each sweep (i = grid-1, ...)
  // and block 1 the first: a single token does not wait behind the table. The same for the
  // direct table's tb blocks: block tb takes the first token.
  const int tb = p.direct ? min(p.direct_blocks, (int)gridDim.x) : 1;
  for (int i = (blockIdx.x + gridDim.x - tb) % gridDim.x;; i += gridDim.x) {
    const int t = p.replica + i * p.tp;
    if (t >= n) break;  // uniform over the block
    // Every warp derives the same destination mask from the token's ids.
    unsigned long long mask = 0;
    for (int k = lane; k < topk; k += 32) {
      int id = ids[(long long)t * topk + k];
      if (id >= 0 && id < E) mask |= 1ULL << (id / L);
    }
    unsigned lo = __reduce_or_sync(0xffffffffu, (unsigned)(mask & 0xffffffffu));
    unsigned hi = __reduce_or_sync(0xffffffffu, (unsigned)(mask >> 32));
    mask = (((unsigned long long)hi << 32) | lo) & ~own_ranks;
    if (!mask) continue;
    const long long slot_off = p.off_disp + ((long long)p.group * p.M + t) * p.slot_bytes;
    const char* xs = x + (long long)t * p.row_bytes;
    if constexpr (NVL) {
      block_copy_multi(p, slot_off, mask, xs, p.row_bytes);
      if (p.scale_bytes)
        block_copy_multi(p, slot_off + aligned_row, mask,
                         reinterpret_cast<const char*>(scale) + (long long)t * p.scale_bytes, p.scale_bytes);
      __syncthreads();  // every thread's stores of this token precede thread 0's fence + flags
      if (tid == 0) {
        // The release stores alone order the block's row stores (bar.sync before them), as the
        // table's announce does (p.token_release, the default).
        if (!p.token_release) __threadfence_system();
        for (unsigned long long m = mask; m; m &= m - 1)
          st_release_sys(sigp(p, p.peer[__ffsll((long long)m) - 1], sig_token(p, p.group, t)), round);
      }
    } else {
      char* st = p.sym + p.off_stage_disp + (long long)t * p.slot_bytes;
      block_copy(st, xs, p.row_bytes);
      if (p.scale_bytes)
        block_copy(st + aligned_row, reinterpret_cast<const char*>(scale) + (long long)t * p.scale_bytes, p.scale_bytes);
      __syncthreads();
      const int bytes = aligned_row + p.scale_bytes;
      for (unsigned long long m = mask; m; m &= m - 1)
        nvshmemx_putmem_signal_nbi_block(p.sym + slot_off, st, bytes,
                                         reinterpret_cast<uint64_t*>(sigp(p, p.sym, sig_token(p, p.group, t))), round,
                                         NVSHMEM_SIGNAL_SET, p.pe[__ffsll((long long)m) - 1]);
    }
  }
  stamp_exit(ST_SEND);
}

// Copy-engine send, per chunk of tokens [t0, t1): after the chunk's copies into every
// destination's slots have completed (stream order behind an event), raise the chunk's token
// flags there, so the receive's copy is the same as with the send kernel. The round comes
// from the device (the host does not know it: CUDA graphs replay the same launch).
__global__ void __launch_bounds__(256) ce_flag_kernel(Params p, int t0, int t1, const int* __restrict__ nptr,
                                                      unsigned long long ranks) {
  const unsigned long long round = p.state[0] + 1;
  if (nptr) t1 = min(t1, max(0, *nptr));
  __threadfence_system();
  for (int t = t0 + (int)threadIdx.x; t < t1; t += blockDim.x)
    for (unsigned long long m = ranks; m; m &= m - 1)
      st_release_sys(sigp(p, p.peer[__ffsll((long long)m) - 1], sig_token(p, p.group, t)), round);
}

// Inclusive scan of one value per lane.
__device__ __forceinline__ int warp_incl_scan(int v, int lane) {
  for (int d = 1; d < 32; d <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += u;
  }
  return v;
}

// Exclusive scan of totals[0, L) by one warp: lane i takes the run of experts [e0, e1) and gets
// in `off` the sum of every total before e0; returns the sum of all totals up to e1 (lane 31:
// the grand total).
__device__ __forceinline__ int warp_scan_runs(const int* totals, int L, int lane, int& e0, int& e1, int& off) {
  const int per = (L + 31) / 32;
  e0 = lane * per;
  e1 = min(L, e0 + per);
  int run = 0;
  for (int e = e0; e < e1; ++e) run += totals[e];
  const int incl = warp_incl_scan(run, lane);
  off = incl - run;
  return incl;
}

// What the receive's block 0 (plan or direct kernel) publishes once the layout is known: the
// total row count, and the state of the kernels that follow.
__device__ __forceinline__ void publish_round(const Params& p, int64_t* offs, int L, int total,
                                              unsigned long long round, const int* sh_n) {
  offs[L] = total;
  p.state[5] = 0;      // the copy kernel's work counter (it runs after the plan, same stream)
  p.state[6] = round;  // this round's number for the combine kernels (see combine_round)
  p.state[2] = 0;      // the fused combine's send and receive work counters (its round
  p.state[7] = 0;      // always follows this receive)
  int nmax = 0;        // the combine send visits t < nmax only: no group has rows past it
  for (int g = 0; g < p.G; ++g) nmax = sh_n[g] > nmax ? sh_n[g] : nmax;
  p.state[8] = (unsigned long long)nmax;
}

// ---------------------------------------------------------------------------------------
// Dispatch receive. Block c owns chunk c of the flattened source-token space (g, t). Per
// warp of 32 tokens a bitmask per local expert gives each token its stable rank; chunk
// counts meet in one flag-based grid barrier (the last block scans), then each block
// writes rows (expert, g, t) and copies payloads (waiting for per-token flags).
__global__ void __launch_bounds__(1024) dispatch_recv_kernel(Params p, char* __restrict__ tokens,
                                                             float* __restrict__ scales, float* __restrict__ weights,
                                                             int64_t* __restrict__ tpe, int64_t* __restrict__ offs,
                                                             int* __restrict__ sg, int* __restrict__ stok,
                                                             int* __restrict__ sk, int weighted) {
  stamp_entry(ST_PLAN);
  launch_dependents();  // the copy kernel may be scheduled now; it waits for this grid's end
  extern __shared__ unsigned smem[];
  __shared__ int sh_n[MAXW];
  const unsigned long long round = p.state[0] + 1;
  const int L = p.L, topk = p.topk, M = p.M, G = p.G;
  const int CH = p.chunk;
  const int nmw = CH / 32;
  unsigned* msk = smem;                                    // [nmw][L]
  int* bs = reinterpret_cast<int*>(smem + (size_t)nmw * L);  // [L] first row of each expert in this chunk
  int* before = bs + L;                                    // [L] rows of earlier chunks
  int* totals = before + L;                                // [L] rows of all chunks
  const int c = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  if (c == 0 && tid < p.W)
    wait_flag(p, sigp(p, p.sym, sig_arrive(p, tid)), round, PH_DISPATCH_RECV, tid);
  if (tid < G) {
    wait_flag(p, sigp(p, p.sym, sig_table(p, tid)), round * table_portions(p), PH_DISPATCH_RECV, tid * p.tp, round);
    int n = *reinterpret_cast<volatile int*>(p.sym + p.off_tables + (long long)tid * p.table_bytes);
    sh_n[tid] = n < 0 ? 0 : (n > M ? M : n);
  }
  for (int i = tid; i < nmw * L; i += blockDim.x) msk[i] = 0;
  __syncthreads();
  stamp_exit(ST_PLAN_WAITED);

  // Phase 1: masks and chunk counts.
  const long long u = (long long)c * CH + tid;
  int g = -1, t = -1;
  const int* tids = nullptr;
  if (tid < CH && u < (long long)G * M) {
    g = (int)(u / M);
    t = (int)(u % M);
    if (t < sh_n[g]) {
      tids = reinterpret_cast<const int*>(p.sym + p.off_tables + (long long)g * p.table_bytes + table_token_off(p, t));
      for (int k = 0; k < topk; ++k) {
        int e = tids[k] - p.rank * L;
        if (e >= 0 && e < L) atomicOr(&msk[warp * L + e], 1u << lane);
      }
    }
  }
  __syncthreads();
  for (int e = tid; e < L; e += blockDim.x) {
    int s = 0;
    for (int w = 0; w < nmw; ++w) s += __popc(msk[w * L + e]);
    p.cnt[(long long)c * L + e] = s;
    before[e] = 0;
    totals[e] = 0;
  }
  // Grid barrier on a counter that is never reset: this launch's blocks all see the same
  // generation (old / nchunks); the next launch on this context starts after this one ends.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned long long gen = atomicAdd(&p.state[1], 1ULL) / gridDim.x;
    const unsigned long long need = (gen + 1) * gridDim.x;
    const unsigned long long deadline = gtimer() + (unsigned long long)p.timeout_ns;
    for (unsigned i = 1; ld_acquire_gpu(&p.state[1]) < need; ++i) {
      if ((i & 31) == 0 && gtimer() > deadline) {
        report_error(p, PH_DISPATCH_GRID, -1, round);
        break;
      }
    }
  }
  __syncthreads();
  stamp_exit(ST_PLAN_BARRIER);
  // Every block reads the whole [nchunks, L] count matrix itself and derives its chunk's bases
  // and the expert offsets: the loads of a thread are independent (PLAN_BATCH in flight), so
  // this costs a few L2 round trips, where a serial scan by one block cost one per chunk
  // batch, each slow while a concurrent send loads the memory system (docs/KERNELS.md).
  {
    constexpr int PLAN_BATCH = 16;
    const int cols = L < (int)blockDim.x ? L : (int)blockDim.x;
    const int R = (int)blockDim.x / cols;  // threads per expert column
    const int r0 = tid / cols;
    if (r0 < R) {
      for (int e = tid % cols; e < L; e += cols) {
        int b = 0, tot = 0;
        for (int c0 = r0; c0 < (int)gridDim.x; c0 += R * PLAN_BATCH) {
          int v[PLAN_BATCH];
#pragma unroll
          for (int j = 0; j < PLAN_BATCH; ++j) {
            const int cc = c0 + j * R;
            v[j] = cc < (int)gridDim.x ? __ldcg(&p.cnt[(long long)cc * L + e]) : 0;
          }
#pragma unroll
          for (int j = 0; j < PLAN_BATCH; ++j) {
            tot += v[j];
            if (c0 + j * R < c) b += v[j];
          }
        }
        atomicAdd(&before[e], b);
        atomicAdd(&totals[e], tot);
      }
    }
  }
  __syncthreads();
  if (warp == 0) {
    int e0, e1, off;
    const int incl = warp_scan_runs(totals, L, lane, e0, e1, off);
    for (int e = e0; e < e1; ++e) {
      const int col = totals[e];
      if (c == 0) {
        tpe[e] = col;
        offs[e] = off;
      }
      bs[e] = off + before[e];
      off += col;
    }
    if (c == 0 && lane == 31) publish_round(p, offs, L, incl, round, sh_n);
  }
  __syncthreads();

  // Phase 2: rows, metadata and the combine row map, one thread per token.
  if (g >= 0) {
    int* rm = p.rowmap + u * topk;
    for (int k = 0; k < topk; ++k) {
      int row = -1;
      if (tids) {
        int e = tids[k] - p.rank * L;
        if (e >= 0 && e < L) {
          row = bs[e] + __popc(msk[warp * L + e] & ((1u << lane) - 1));
          for (int w = 0; w < warp; ++w) row += __popc(msk[w * L + e]);
          sg[row] = g;
          stok[row] = t;
          sk[row] = k;
          if (weighted) weights[row] = reinterpret_cast<const float*>(tids + topk)[k];  // weights follow the ids
        }
      }
      rm[k] = row;
    }
  }
  __syncthreads();
  stamp_exit(ST_PLAN);
}

// Dispatch receive, part 2: payload copies. Work item = (received token (g, t), piece): a
// token's row is cut into p.copy_pieces pieces of whole 16-byte vectors (copy_pieces(): as
// many as fill a block per SM with one warp per item when the arena holds few tokens, so a
// small batch is not held to a few SMs' store rate; 1 at prefill sizes). Token order: first
// the own group's tokens, read straight from this rank's `x` / `x_scale` (the sender skips
// its own group, so they need no flag and no link), then the other groups' tokens in (t, g)
// order, the order they arrive in (every sender sends in t order): the copy works on local
// rows while the link delivers, then follows the arrival front. DYNAMIC (more tokens than a
// block per SM has warps; copy_pieces is then 1): warps take items from a work counter
// (state[5], reset by the plan kernel), so a copy block that starts late (its SM still busy
// with send blocks) delays no particular token; otherwise item i is warp i's, no atomic. For a remote token the warp waits for its flag, then reads its
// piece of the slot once (RECV_UNROLL 16-byte loads in flight per lane) and stores it into
// each of the token's local-expert rows with streaming stores (the ~470 MB of rows at the
// prefill shape must not evict the slots from L2). The last piece also copies the scales.
constexpr int RECV_UNROLL = 4;

// Source token (g, t) of receive item i: the own group's tokens first (t = i), then the other
// groups' in (t, g) order, the order they arrive in.
__device__ __forceinline__ void item_token(const Params& p, int i, int& gg, int& tt) {
  if (i < p.M) {
    gg = p.group;
    tt = i;
  } else {
    const int j = i - p.M, o = j % (p.G - 1);
    tt = j / (p.G - 1);
    gg = o < p.group ? o : o + 1;
  }
}

// Lane `lane`'s 16-byte vector of a token's scales (lanes below scale_bytes / 16; scales of
// <= 512 B, 16-byte aligned) into each of the nk expert rows `rows`.
__device__ __forceinline__ void store_scale_vec(const Params& p, float* __restrict__ scales, const int* rows, int nk,
                                                int lane, int4 v) {
  if (lane < (p.scale_bytes >> 4))
    for (int j = 0; j < nk; ++j)
      reinterpret_cast<int4*>(reinterpret_cast<char*>(scales) + (long long)rows[j] * p.scale_bytes)[lane] = v;
}

// Warp: piece `piece` of P of token (gg, tt)'s row (the own group's from x, another group's
// from its slot after its flag) into the nk expert rows `rows`; the last piece also copies the
// scales. Nothing is copied after a timeout.
__device__ __forceinline__ void copy_token_piece(const Params& p, char* __restrict__ tokens, float* __restrict__ scales,
                                                 const char* __restrict__ x, const char* __restrict__ xscale,
                                                 const int* rows, int nk, int gg, int tt, int piece, int P,
                                                 unsigned long long round, int lane) {
  const bool own = gg == p.group;
  const long long uu = (long long)gg * p.M + tt;
  const int aligned_row = (p.row_bytes + 15) & ~15;
  const int n16 = p.row_bytes >> 4, per16 = (n16 + P - 1) / P;
  int arrived = own ? 1 : 0;
  if (!own && nk > 0 && lane == 0)
    arrived = wait_flag(p, sigp(p, p.sym, sig_token(p, gg, tt)), round, PH_DISPATCH_RECV, gg * p.tp + tt % p.tp);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  __syncwarp();  // lane 0's acquire orders the whole warp's reads of the slot
  if (nk == 0 || !arrived) return;
  const char* src = own ? x + (long long)tt * p.row_bytes : p.sym + p.off_disp + uu * p.slot_bytes;
  const char* ssrc = own ? xscale + (long long)tt * p.scale_bytes : src + aligned_row;
  if (((reinterpret_cast<uintptr_t>(src) | (uintptr_t)p.row_bytes) & 15) == 0) {
    const int4* s = reinterpret_cast<const int4*>(src);
    const int c1 = min(n16, (piece + 1) * per16);
    for (int c0 = piece * per16 + lane; c0 < c1; c0 += 32 * RECV_UNROLL) {
      int4 v[RECV_UNROLL];
#pragma unroll
      for (int u = 0; u < RECV_UNROLL; ++u)
        if (c0 + 32 * u < c1) v[u] = __ldcg(s + c0 + 32 * u);
      for (int j = 0; j < nk; ++j) {
        int4* d = reinterpret_cast<int4*>(tokens + (long long)rows[j] * p.row_bytes);
#pragma unroll
        for (int u = 0; u < RECV_UNROLL; ++u)
          if (c0 + 32 * u < c1) __stcs(d + c0 + 32 * u, v[u]);
      }
    }
  } else if (piece == 0) {  // unaligned rows: piece 0 copies the whole row
    for (int j = 0; j < nk; ++j) warp_copy(tokens + (long long)rows[j] * p.row_bytes, src, p.row_bytes, lane);
  }
  if (p.scale_bytes && piece == P - 1) {
    // Scales of up to 512 B (fp8 at H <= 16384): one 16-byte load per lane, then a store per
    // row. warp_copy per row would load the source again before every row's store (it may alias).
    if (p.scale_bytes <= 512 && ((reinterpret_cast<uintptr_t>(ssrc) | reinterpret_cast<uintptr_t>(scales) |
                                  (uintptr_t)p.scale_bytes) & 15) == 0) {
      const int4 v = lane < (p.scale_bytes >> 4) ? *reinterpret_cast<const int4*>(ssrc + 16 * lane) : int4{};
      store_scale_vec(p, scales, rows, nk, lane, v);
    } else {
      for (int j = 0; j < nk; ++j)
        warp_copy(reinterpret_cast<char*>(scales) + (long long)rows[j] * p.scale_bytes, ssrc, p.scale_bytes, lane);
    }
  }
}

template <bool DYNAMIC>
__global__ void __launch_bounds__(NTHREADS, 2) dispatch_copy_kernel(Params p, char* __restrict__ tokens,
                                                                    float* __restrict__ scales,
                                                                    const char* __restrict__ x,
                                                                    const char* __restrict__ xscale, int xrows) {
  grid_dependency_wait();  // launched early beside the plan (programmatic launch): its results first
  stamp_entry(ST_COPY);
  __shared__ int sh_rows[NWARPS][64];
  const unsigned long long round = p.state[0] + 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int topk = p.topk, M = p.M, G = p.G, me = p.group, P = DYNAMIC ? 1 : p.copy_pieces;
  const int total = G * M;  // G*M*P < 2^31: G*M <= 1024 per SM (chunking), P <= 64
  const long long R = (long long)total * (topk < p.L ? topk : p.L);  // rows of the outputs
  for (int item = DYNAMIC ? -1 : (int)blockIdx.x * NWARPS + warp;;) {
    if constexpr (DYNAMIC) {
      unsigned long long next = 0;
      if (lane == 0) next = atomicAdd(&p.state[5], 1ULL);
      next = __shfl_sync(0xffffffffu, next, 0);
      item = next < (unsigned long long)total * P ? (int)next : total * P;
    }
    if (item >= total * P) break;
    const int piece = item % P;
    int gg, tt;
    item_token(p, item / P, gg, tt);
    const bool own = gg == me;
    const int* rm = p.rowmap + ((long long)gg * M + tt) * topk;
    int nk = 0;
    if (!own || tt < xrows) {  // own rows past x's rows: only after a timeout (garbage plan)
      for (int k0 = 0; k0 < topk; k0 += 32) {
        const int k = k0 + lane;
        const int row = k < topk ? rm[k] : -1;
        const bool ok = row >= 0 && row < R;
        const unsigned b = __ballot_sync(0xffffffffu, ok);
        if (ok) sh_rows[warp][nk + __popc(b & ((1u << lane) - 1))] = row;
        nk += __popc(b);
      }
    }
    __syncwarp();
    copy_token_piece(p, tokens, scales, x, xscale, sh_rows[warp], nk, gg, tt, piece, P, round, lane);
    __syncwarp();  // sh_rows is rewritten by the next token
    if constexpr (!DYNAMIC) break;
  }
  stamp_exit(ST_COPY);
}

// Early load (p.early_load, round 25): a warp's piece of an own-group token's row, at most
// 32 * EARLY_UNROLL vectors, and the last piece's scales (<= 512 B), copied from x into the
// warp's shared memory (cp.async: no registers held) at the receive's start, while the tables
// come in; the copy after the scan is then stores only (x is complete before the dispatch
// starts, like the copy's reads of it).
constexpr int EARLY_UNROLL = 2;
constexpr int EARLY_INT4S = 32 * EARLY_UNROLL + 32;  // per warp: the piece, then the scales
__device__ __forceinline__ void early_piece_range(const Params& p, int piece, int P, int lane, int& c0, int& c1) {
  const int n16 = p.row_bytes >> 4, per16 = (n16 + P - 1) / P;
  c0 = piece * per16 + lane;
  c1 = min(n16, (piece + 1) * per16);
}
__device__ __forceinline__ void early_load_piece(const Params& p, const char* __restrict__ src,
                                                 const char* __restrict__ ssrc, int piece, int P, int lane, int4* sh) {
  int c0, c1;
  early_piece_range(p, piece, P, lane, c0, c1);
  const int4* s = reinterpret_cast<const int4*>(src);
#pragma unroll
  for (int u = 0; u < EARLY_UNROLL; ++u)
    if (c0 + 32 * u < c1) cp_async16(sh + 32 * u + lane, s + c0 + 32 * u);
  if (p.scale_bytes && piece == P - 1 && lane < (p.scale_bytes >> 4))
    cp_async16(sh + 32 * EARLY_UNROLL + lane, ssrc + 16 * lane);
  cp_async_commit();
}
// Each lane stores what it copied itself (cp.async.wait_group makes it visible to the lane).
__device__ __forceinline__ void early_store_piece(const Params& p, char* __restrict__ tokens, float* __restrict__ scales,
                                                  const int* rows, int nk, int piece, int P, int lane, const int4* sh) {
  int c0, c1;
  early_piece_range(p, piece, P, lane, c0, c1);
  cp_async_wait<0>();
  for (int j = 0; j < nk; ++j) {
    int4* d = reinterpret_cast<int4*>(tokens + (long long)rows[j] * p.row_bytes);
#pragma unroll
    for (int u = 0; u < EARLY_UNROLL; ++u)
      if (c0 + 32 * u < c1) __stcs(d + c0 + 32 * u, sh[32 * u + lane]);
  }
  if (p.scale_bytes && piece == P - 1) store_scale_vec(p, scales, rows, nk, lane, sh[32 * EARLY_UNROLL + lane]);
}

// Direct receive (round 16; the default where it fits, see create_ctx): one
// kernel instead of plan + copy, for small nvlink arenas (and put arenas with the tagged table,
// round 26) whose senders ship expert ranks and counts with their tables (write_table_direct). Every block waits for the tables and derives
// the expert offsets from the G x L counts (a few hundred ints); then each warp takes one item
// (a token piece) as in the copy kernel: it places the token's rows (offset + earlier groups'
// rows + rank), writes the metadata and the combine row map (piece 0), and copies its piece.
// Block 0 also waits for every rank's arrive flag and publishes what the plan publishes.
// Saves the plan's masks, count matrix and grid barrier, and the second launch.
// With round-tagged tables (p.ll_table, round 25) there is no table flag: the threads poll the
// headers and counts themselves, and each warp its item's entries.
constexpr int LL_BATCH = 2;  // count words polled with their first loads in flight together
// 72 registers (64 spilled 16-48 B with round 25's paths): one 512-thread block per SM
// (36,864 registers; the grid has at most one block per SM) still leaves room for the send's
// SEND_BLOCKS_PER_SM blocks (3 x 128 x 64 = 24,576), so the send is never locked out.
constexpr int DIRECT_MAX_REGS = 72;
template <bool LL>
__global__ void __maxnreg__(DIRECT_MAX_REGS) dispatch_direct_kernel(
    Params p, char* __restrict__ tokens, float* __restrict__ scales, float* __restrict__ weights,
    int64_t* __restrict__ tpe, int64_t* __restrict__ offs, int* __restrict__ sg, int* __restrict__ stok,
    int* __restrict__ sk, int weighted, const char* __restrict__ x, const char* __restrict__ xscale, int xrows) {
  stamp_entry(ST_COPY);  // the timeline shows it as the copy (there is no plan kernel)
  extern __shared__ int base[];  // [G + 1][L]: first row of each (group, local expert); [G]: totals
  __shared__ int sh_rows[NWARPS][64];
  __shared__ int sh_n[MAXW];
  __shared__ int4 sh_early[NWARPS][EARLY_INT4S];
  __shared__ int sh_wsum[NWARPS];  // par: each warp's sum of totals
  const unsigned long long round = p.state[0] + 1;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int L = p.L, topk = p.topk, M = p.M, G = p.G, P = p.copy_pieces;
  const int total = G * M;
  const int item = (int)blockIdx.x * NWARPS + warp;
  const bool has_item = item < total * P;
  const int piece = item % P;
  int gg = 0, tt = 0;
  if (has_item) item_token(p, item / P, gg, tt);
  const char* tbl = p.sym + p.off_tables;
  constexpr bool ll = LL;  // one instance per table format: each keeps only its own registers
  const bool pre = p.table_prefetch != 0;
  // The expert offsets by every thread at once (p.par_scan, round 25): thread e holds expert e's
  // total, so a warp scan, the warps' sums and one barrier give every offset; else warp 0 scans
  // runs of experts from shared memory while the others wait (and with more experts than threads).
  const bool par = p.par_scan && L <= (int)blockDim.x;
  int my_total = 0, wincl = 0;  // par: this thread's expert's total, its inclusive scan in the warp
  auto warp_part = [&]() {
    if (!par) return;
    wincl = warp_incl_scan(my_total, lane);
    if (lane == 31) sh_wsum[warp] = wincl;
  };
  const bool have = p.early_load && has_item && gg == p.group && tt < xrows &&
                    ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(xscale)) & 15) == 0;
  if (have)
    early_load_piece(p, x + (long long)tt * p.row_bytes, xscale + (long long)tt * p.scale_bytes, piece, P, lane,
                     sh_early[warp]);
  // ll: this warp's item's entry (lane k), loaded before the polls; its tags are checked after
  // them (the id and weight halves and one flag are kept, not the whole 16 bytes: registers).
  unsigned id_pre = 0, w_pre = 0;
  bool pre_now = false;
  if (ll && has_item && lane < topk) {
    const ulonglong2 en = ld_tagged2(tbl + (long long)gg * p.table_bytes + ll_entry_off(p, tt, lane));
    id_pre = (unsigned)en.x, w_pre = (unsigned)en.y;
    pre_now = tagged_now(en, round);
  }
  if (blockIdx.x == 0 && tid < p.W) wait_flag(p, sigp(p, p.sym, sig_arrive(p, tid)), round, PH_DISPATCH_RECV, tid);
  if constexpr (ll) {
    // Group g's tagged count of this rank's local expert e.
    auto count_word = [&](int g, int e) {
      return tbl + (long long)g * p.table_bytes + ll_count_off(p) + (long long)(p.rank * L + e) * 8;
    };
    if (tid < G) {
      const char* h = tbl + (long long)tid * p.table_bytes;
      const int n = (int)(unsigned)poll_tagged(p, h, ld_tagged(h), round, tid * p.tp);
      sh_n[tid] = n < 0 ? 0 : (n > M ? M : n);
    }
    for (int e = tid; e < L; e += blockDim.x) {
      int acc = 0;
      for (int g0 = 0; g0 < G; g0 += LL_BATCH) {
        unsigned long long v[LL_BATCH];
#pragma unroll
        for (int u = 0; u < LL_BATCH; ++u)
          if (g0 + u < G) v[u] = ld_tagged(count_word(g0 + u, e));
#pragma unroll
        for (int u = 0; u < LL_BATCH; ++u)
          if (g0 + u < G) {
            const int g = g0 + u;
            base[g * L + e] = acc;
            acc += (int)(unsigned)poll_tagged(p, count_word(g, e), v[u], round, g * p.tp);
          }
      }
      base[G * L + e] = acc;
      if (e == tid) my_total = acc;
    }
    warp_part();
  } else if (tid < G) {
    wait_flag(p, sigp(p, p.sym, sig_table(p, tid)), round * p.direct_blocks, PH_DISPATCH_RECV, tid * p.tp, round);
    if (!pre) {  // the order before round 24, kept for the switch's A/B (one load after the
                 // barrier for both paths made ptxas spill 12 B in this 64-register kernel)
      const int n = *reinterpret_cast<const volatile int*>(tbl + (long long)tid * p.table_bytes);
      sh_n[tid] = n < 0 ? 0 : (n > M ? M : n);
    }
  }
  __syncthreads();
  if (warp == 0) stamp_exit(ST_PLAN_WAITED);  // the timeline's "waited": every table is in
  const int* tids = reinterpret_cast<const int*>(tbl + (long long)gg * p.table_bytes + table_token_off(p, tt));
  // With the switch, the headers, the counts and this warp's item's ids are loaded together,
  // after the one barrier: all were announced with the tables (before, each waited for the
  // one before it). An id past the group's n is loaded but not used.
  if constexpr (!ll) {
    if (pre) {
      if (tid < G) {
        const int n = *reinterpret_cast<const volatile int*>(tbl + (long long)tid * p.table_bytes);
        sh_n[tid] = n < 0 ? 0 : (n > M ? M : n);
      }
      if (has_item && lane < topk) id_pre = (unsigned)__ldcg(tids + lane);
    }
    const long long coff = 16 + (long long)M * topk * 8;  // count[E] of each table
    for (int e = tid; e < L; e += blockDim.x) {
      int acc = 0;
      for (int g = 0; g < G; ++g) {
        base[g * L + e] = acc;
        acc += __ldcg(reinterpret_cast<const int*>(tbl + (long long)g * p.table_bytes + coff) + p.rank * L + e);
      }
      base[G * L + e] = acc;
      if (e == tid) my_total = acc;
    }
    warp_part();
    __syncthreads();
  }
  if (par) {
    const int before = __reduce_add_sync(0xffffffffu, lane < warp ? sh_wsum[lane] : 0);
    if (tid < L) {
      const int off = before + wincl - my_total;
      for (int g = 0; g < G; ++g) base[g * L + tid] += off;
      if (blockIdx.x == 0) {
        tpe[tid] = my_total;
        offs[tid] = off;
        if (tid == L - 1) publish_round(p, offs, L, off + my_total, round, sh_n);
      }
    }
  } else if (warp == 0) {  // exclusive scan of the totals, as in the plan
    int e0, e1, off;
    const int incl = warp_scan_runs(base + G * L, L, lane, e0, e1, off);
    for (int e = e0; e < e1; ++e) {
      const int col = base[G * L + e];
      if (blockIdx.x == 0) {
        tpe[e] = col;
        offs[e] = off;
      }
      for (int g = 0; g < G; ++g) base[g * L + e] += off;
      off += col;
    }
    if (blockIdx.x == 0 && lane == 31) publish_round(p, offs, L, incl, round, sh_n);
  }
  __syncthreads();
  if (warp == 0) stamp_exit(ST_PLAN_BARRIER);  // the timeline's "barrier": the offsets are scanned
  const long long R = (long long)total * (topk < L ? topk : L);  // rows of the outputs
  if (!has_item) {
    stamp_exit(ST_COPY);
    return;
  }
  const long long uu = (long long)gg * M + tt;
  const bool live = tt < sh_n[gg] && (gg != p.group || tt < xrows);
  int nk = 0;
  for (int k0 = 0; k0 < topk; k0 += 32) {
    const int k = k0 + lane;
    int row = -1;
    float wv = 0.0f;
    if (k < topk && live) {
      int v;  // (rank << 16) | id, or -1
      if constexpr (ll) {
        if (k0 == 0 && pre_now) {
          v = (int)id_pre;
          wv = __uint_as_float(w_pre);
        } else {
          const char* src = tbl + (long long)gg * p.table_bytes + ll_entry_off(p, tt, k);
          const ulonglong2 en = poll_tagged(p, src, ld_tagged2(src), round, gg * p.tp);
          v = (int)(unsigned)en.x;
          wv = __uint_as_float((unsigned)en.y);
        }
      } else {
        v = pre && k0 == 0 ? (int)id_pre : __ldcg(tids + k);
      }
      const int e = v >= 0 ? (v & 0xffff) - p.rank * L : -1;
      if (e >= 0 && e < L) row = base[gg * L + e] + (v >> 16);
    }
    const bool ok = row >= 0 && row < R;  // range-checked: a timed-out round reads garbage
    if (piece == 0 && k < topk) {
      p.rowmap[uu * topk + k] = ok ? row : -1;
      if (ok) {
        sg[row] = gg;
        stok[row] = tt;
        sk[row] = k;
        if (weighted) weights[row] = ll ? wv : __ldcg(reinterpret_cast<const float*>(tids + topk) + k);
      }
    }
    const unsigned b = __ballot_sync(0xffffffffu, ok);
    if (ok) sh_rows[warp][nk + __popc(b & ((1u << lane) - 1))] = row;
    nk += __popc(b);
  }
  __syncwarp();
  if (live) stamp_exit(ST_DIRECT_ROWS);
  if (have) {
    early_store_piece(p, tokens, scales, sh_rows[warp], nk, piece, P, lane, sh_early[warp]);
  } else {
    copy_token_piece(p, tokens, scales, x, xscale, sh_rows[warp], nk, gg, tt, piece, P, round, lane);
  }
  stamp_exit(ST_COPY);
}

// ---------------------------------------------------------------------------------------
// dtype helpers
template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int N>
struct alignas(16) VecT {
  T v[N];
};
template <typename T, int N>
__device__ __forceinline__ void load_n(const T* ptr, float* f) {
  if constexpr (N * sizeof(T) % 16 == 0) {
    VecT<T, N> tmp;
    constexpr int NB = N * sizeof(T) / 16;
#pragma unroll
    for (int b = 0; b < NB; ++b) reinterpret_cast<int4*>(&tmp)[b] = reinterpret_cast<const int4*>(ptr)[b];
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = to_f<T>(tmp.v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = to_f<T>(ptr[i]);
  }
}
template <typename T, int N>
__device__ __forceinline__ void store_n(T* ptr, const float* f) {
  if constexpr (N * sizeof(T) % 16 == 0) {
    VecT<T, N> tmp;
#pragma unroll
    for (int i = 0; i < N; ++i) tmp.v[i] = from_f<T>(f[i]);
    constexpr int NB = N * sizeof(T) / 16;
#pragma unroll
    for (int b = 0; b < NB; ++b) reinterpret_cast<int4*>(ptr)[b] = reinterpret_cast<const int4*>(&tmp)[b];
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) ptr[i] = from_f<T>(f[i]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void load_raw(const T* ptr, VecT<T, N>& v) {
  if constexpr (N * sizeof(T) % 16 == 0) {
#pragma unroll
    for (int b = 0; b < (int)(N * sizeof(T) / 16); ++b)
      reinterpret_cast<int4*>(&v)[b] = reinterpret_cast<const int4*>(ptr)[b];
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v.v[i] = ptr[i];
  }
}

// The N floats of a vector. bf16 pairs are split by one shift and one mask per pair (the
// element-wise conversion extracts the high half first: two ALU ops for it instead of one).
template <typename T, int N>
__device__ __forceinline__ void unpack(const VecT<T, N>& v, float (&f)[N]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
    const unsigned* u = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = to_f<T>(v.v[i]);
  }
}

// acc += (wj *) row, chunk by chunk, element by element: the one place the contract's add
// (float32, no FMA) is written.
template <typename T, int N, int C, bool WEIGHTED>
__device__ __forceinline__ void add_row_scaled(float (&acc)[C][N], const VecT<T, N> (&raw)[C], float wj) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float f[N];
    unpack<T, N>(raw[c], f);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[c][i] = __fadd_rn(acc[c][i], WEIGHTED ? __fmul_rn(wj, f[i]) : f[i]);
  }
}
// Every sum starts from 0.0f (the contract's order: 0.0f + (-0.0f) is +0.0f, not the row's -0.0f).
template <int C, int N>
__device__ __forceinline__ void zero_sums(float (&acc)[C][N]) {
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int i = 0; i < N; ++i) acc[c][i] = 0.0f;
}
// The same with row j's weight from ws; ws = nullptr: unweighted.
template <typename T, int N, int C>
__device__ __forceinline__ void add_row(float (&acc)[C][N], const VecT<T, N> (&raw)[C], const float* ws, int j) {
  if (ws) add_row_scaled<T, N, C, true>(acc, raw, ws[j]);
  else add_row_scaled<T, N, C, false>(acc, raw, 1.0f);
}

// acc[c][i] = sum over j = 0..nk-1, in j order, of (w_j *) rows[j][h + c*32*N + i], float32
// without FMA (__fmul_rn / __fadd_rn): the contract's order. The loads of RB rows x C
// chunks are all issued before the first add, so a lane keeps RB*C vectors in flight.
template <typename T, int N, int C, int RB>
__device__ __forceinline__ void sum_rows(const T* const* rows, const float* ws, int nk, int h, int H,
                                         float (&acc)[C][N]) {
  zero_sums(acc);
  for (int j0 = 0; j0 < nk; j0 += RB) {
    VecT<T, N> raw[RB][C];
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (j0 + r < nk && h + c * 32 * N < H) load_raw<T, N>(rows[j0 + r] + h + c * 32 * N, raw[r][c]);
#pragma unroll
    for (int r = 0; r < RB; ++r)
      if (j0 + r < nk) add_row<T, N, C>(acc, raw[r], ws, j0 + r);
  }
}

// Chunks per lane per step: two 16-byte vectors when a chunk is one vector (or scalar).
template <typename T, int N>
constexpr int chunks_per_step() { return N * sizeof(T) >= 32 ? 1 : 2; }
constexpr int ROW_BATCH = 4;
// How the fused combine send loads its expert rows (Params::comb_loads): into registers
// (sum_rows), by cp.async into shared memory (sum_rows_pipelined), by bulk copies (sum_rows_bulk).
enum RowLoads : int { LOADS_REGS = 0, LOADS_ASYNC = 1, LOADS_BULK = 2 };

// Pipelined row sums (the fused combine send's, when its kernels have more than half the GPU;
// MOE_BACKEND_NVSHMEM_COMBINE_ASYNC=0/1 forces): the row loads go to shared memory by cp.async,
// ASYNC_STAGES - 1 (row batch, step) tasks ahead of the sum, so a warp keeps ~3x the bytes of
// sum_rows in flight without the registers. Prefill combine 240 -> 230 us; with 24 SMs slower
// (723 -> 754 us): there the SMs' issue slots are the limit, and each lane's cp.async and its
// address cost more of them than the loads saved (ncu: 63M against 41M instructions, round 27).
constexpr int ASYNC_STAGES = 3;
template <typename T, int N>
constexpr int vec_pieces() { return N * (int)sizeof(T) / 16; }  // 16-byte pieces of one chunk
// A lane's C chunks of one row from a shared-memory stage; at(c, pc): where the stage holds
// 16-byte piece pc of chunk c (the cp.async and bulk rings lay their rows out differently).
template <typename T, int N, int C, typename At>
__device__ __forceinline__ void read_staged(VecT<T, N> (&raw)[C], At&& at) {
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int pc = 0; pc < vec_pieces<T, N>(); ++pc) reinterpret_cast<int4*>(&raw[c])[pc] = *at(c, pc);
}
template <typename T, int N>
constexpr int async_warp_int4s() { return ASYNC_STAGES * ROW_BATCH * chunks_per_step<T, N>() * vec_pieces<T, N>() * 32; }


// The sums of sum_rows for every step h = h0 + lane*N + s*32*N*C (s = 0, 1, ... up to h1),
// handed to emit(h, acc) step by step: the same adds in the same order (row j ascending, from
// 0.0f, no FMA). Each lane reads back only the pieces it loaded itself, so no warp sync is
// needed; a lane's chunks at or past h1 are neither loaded nor to be emitted. buf: this warp's
// async_warp_int4s<T, N>() int4 of shared memory. Needs 16-byte aligned rows (N*sizeof(T) % 16 == 0).
template <typename T, int N, typename Emit>
__device__ __forceinline__ void sum_rows_pipelined(const T* const* rows, const float* ws, int nk, int h0, int h1,
                                                   int4* buf, Emit&& emit) {
  constexpr int C = chunks_per_step<T, N>(), P = vec_pieces<T, N>(), RB = ROW_BATCH, D = ASYNC_STAGES;
  constexpr int STAGE = RB * C * P * 32;
  const int lane = threadIdx.x & 31;
  const int nb = (nk + RB - 1) / RB;
  const int hl = h0 + lane * N;
  const int steps = h1 > h0 ? (h1 - h0 + 32 * N * C - 1) / (32 * N * C) : 0;  // empty slice: none
  const int ntasks = steps * nb;
  auto issue = [&](int q) {
    if (q < ntasks) {
      const int s = q / nb, j0 = (q % nb) * RB;
      const int h = hl + s * 32 * N * C;
      int4* st = buf + (q % D) * STAGE;
#pragma unroll
      for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c)
          if (j0 + r < nk && h + c * 32 * N < h1)
#pragma unroll
            for (int pc = 0; pc < P; ++pc)
              cp_async16(st + ((r * C + c) * P + pc) * 32 + lane,
                         reinterpret_cast<const int4*>(rows[j0 + r] + h + c * 32 * N) + pc);
    }
    cp_async_commit();  // empty groups too: the wait count below stays uniform
  };
#pragma unroll
  for (int q = 0; q < D - 1; ++q) issue(q);
  float acc[C][N];
  for (int q = 0; q < ntasks; ++q) {
    issue(q + D - 1);
    cp_async_wait<D - 1>();  // task q's group has landed
    const int s = q / nb, b = q % nb, j0 = b * RB;
    if (b == 0) zero_sums(acc);
    const int4* st = buf + (q % D) * STAGE;
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      if (j0 + r < nk) {
        VecT<T, N> raw[C];
        read_staged<T, N, C>(raw, [&](int c, int pc) { return &st[((r * C + c) * P + pc) * 32 + lane]; });
        add_row<T, N, C>(acc, raw, ws, j0 + r);
      }
    }
    if (b == nb - 1) emit(hl + s * 32 * N * C, acc);
  }
  cp_async_wait<0>();
}

// Row sums by bulk copies (the fused combine send's when its kernels have at most half the GPU;
// MOE_BACKEND_NVSHMEM_COMBINE_BULK=0/1 forces): a task (one step of the slice, one batch of
// ROW_BATCH rows) is one bulk copy per row, issued by the lane of that row's index into a stage
// of this warp's ring and counted by the stage's mbarrier, BULK_STAGES - 1 tasks ahead of the
// sum. The lanes then read their vectors at fixed offsets in the stage. The register and
// cp.async paths spent most of their issue slots on per-lane loads, addresses, bounds and
// branches: with 24 SMs the prefill combine issued 41M (registers) / 63M (cp.async)
// instructions for ~9M adds (ncu, world size 1). Same adds in the same order as sum_rows.
// ring: this warp's bulk_warp_bytes; bars: its BULK_STAGES mbarriers; seq: the tasks this warp
// has summed so far (its ring's position, carried from item to item).
constexpr int BULK_STAGES = 3;
template <typename T, int N>
constexpr int bulk_row_bytes() { return 32 * N * chunks_per_step<T, N>() * (int)sizeof(T); }
template <typename T, int N>
constexpr int bulk_warp_bytes() { return BULK_STAGES * ROW_BATCH * bulk_row_bytes<T, N>(); }

template <typename T, int N, typename Emit>
__device__ __forceinline__ void sum_rows_bulk(const T* const* rows, const float* ws, int nk, int h0, int h1,
                                              char* ring, unsigned long long* bars, unsigned& seq, Emit&& emit) {
  constexpr int C = chunks_per_step<T, N>(), P = vec_pieces<T, N>(), RB = ROW_BATCH, D = BULK_STAGES;
  constexpr int STEP = 32 * N * C, ROW = bulk_row_bytes<T, N>();
  const int lane = threadIdx.x & 31;
  const int nb = (nk + RB - 1) / RB;
  const int ntasks = h1 > h0 ? (h1 - h0 + STEP - 1) / STEP * nb : 0;  // empty slice: none
  int is = 0, ib = 0, q_issued = 0;  // the next task to issue: step is, row batch ib
  auto issue = [&]() {
    if (q_issued >= ntasks) return;
    const unsigned u = seq + q_issued;
    const int h = h0 + is * STEP, j0 = ib * RB;
    const unsigned bytes = (unsigned)(min(STEP, h1 - h) * (int)sizeof(T));
    const int nr = min(RB, nk - j0);
    unsigned long long* bar = bars + u % D;
    if (lane == 0) mbar_arrive_expect(bar, nr * bytes);
    if (lane < nr) bulk_load(ring + (u % D) * (RB * ROW) + lane * ROW, rows[j0 + lane] + h, bytes, bar);
    ++q_issued;
    if (++ib == nb) ib = 0, ++is;
  };
#pragma unroll
  for (int q = 0; q < D - 1; ++q) issue();
  float acc[C][N];
  int cs = 0, cb = 0;  // the task being summed: step cs, row batch cb
  for (int q = 0; q < ntasks; ++q) {
    __syncwarp();  // every lane has read task q - 1's stage, which the issue below refills
    issue();
    const unsigned u = seq + q;
    mbar_wait(bars + u % D, (u / D) & 1);
    const char* st = ring + (u % D) * (RB * ROW);
    if (cb == 0) zero_sums(acc);
    const int j0 = cb * RB;
    auto sum_stage = [&](auto weighted) {  // the weights' branch once per task, not per row
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        if (j0 + r < nk) {
          VecT<T, N> raw[C];
          read_staged<T, N, C>(raw, [&](int c, int pc) {
            return reinterpret_cast<const int4*>(st + r * ROW + ((c * 32 + lane) * P + pc) * 16);
          });
          add_row_scaled<T, N, C, decltype(weighted)::value>(acc, raw, weighted ? ws[j0 + r] : 1.0f);
        }
      }
    };
    if (ws) sum_stage(std::true_type{});
    else sum_stage(std::false_type{});
    if (cb == nb - 1) emit(h0 + lane * N + cs * STEP, acc);
    if (++cb == nb) cb = 0, ++cs;
  }
  seq += ntasks;
}

// ---------------------------------------------------------------------------------------
// Combine send: raise the round barrier at every rank, then one warp per source token held
// here sums its rows in k order (float32, no FMA), rounds to the transfer dtype and sends
// the partial once to every replica of the source group, slot [my rank][t], flag = round.
// Tokens are visited in (t, g) order so local and remote destinations interleave and the
// link is busy for the whole kernel.
// <= 96 registers (__maxnreg__; the put path would take ~120): one send block (512 x 96)
// must fit an SM beside one concurrent receive block (see launch_combine_recv). (Two blocks
// per SM at 64 registers, for the sequential prefill combine, spilled and measured slower:
// 240 vs 208 us, docs/KERNELS.md.)
// The next work item of a warp: from a counter (dynamic; every item claimed is in progress,
// so no warp ever waits for an item a not-yet-resident block holds) or grid-stride.
template <bool COUNTER>
__device__ __forceinline__ long long next_item(unsigned long long* counter, long long cur, long long stride,
                                               int lane) {
  if constexpr (COUNTER) {
    unsigned long long v = 0;
    if (lane == 0) v = atomicAdd(counter, 1ULL);
    return (long long)__shfl_sync(0xffffffffu, v, 0);
  } else {
    return cur + stride;
  }
}

// What a combine receive needs (the fused send kernel's receive half; unused otherwise).
// The host passes RecvArgs<void> around and types it at the launch.
template <typename TO>
struct RecvArgs {
  const int* ids;
  const int* nptr;
  int n_host, rows;
  TO* out;
};
template <typename TO>
RecvArgs<TO> typed(const RecvArgs<void>& a) {
  return {a.ids, a.nptr, a.n_host, a.rows, static_cast<TO*>(a.out)};
}

template <typename TX, typename TO, int N, int RB, bool COUNTER>
__device__ void combine_recv_items(const Params& p, const RecvArgs<TO>& ra, const TX** sh_src, int nwarps);
__device__ void combine_finish(const Params& p, unsigned long long round);

// FUSED (the default for arenas of more than 4096 source tokens, see create_ctx): the send
// items are taken from a counter (state[2]); a warp that finds none left goes on to the
// receive items (counter state[7]), so the receive starts where the send ends, in the same
// blocks, without a second launch; launched on the side stream like the overlapped receive,
// so the caller's stream never waits in it.
template <bool NVL, typename TY, typename TX, int N, bool FUSED, int LOADS = LOADS_REGS>
__global__ void __maxnreg__(96) combine_send_kernel(Params p, const TY* __restrict__ y,
                                                    const float* __restrict__ w, RecvArgs<TY> ra) {
  stamp_entry(ST_CSEND);
  constexpr int C = chunks_per_step<TY, N>();
  // LOADS_ASYNC: async_warp_int4s<TY, N>() int4 per warp. LOADS_BULK: bulk_warp_bytes<TY, N>()
  // per warp, then BULK_STAGES mbarriers per warp.
  extern __shared__ int4 async_smem[];
  __shared__ const TY* sh_rows[NWARPS][64];
  __shared__ float sh_w[NWARPS][64];
  const unsigned long long round = combine_round(p);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  char* ring = nullptr;
  unsigned long long* bars = nullptr;
  unsigned bulk_seq = 0;
  if constexpr (LOADS == LOADS_BULK) {
    char* base = reinterpret_cast<char*>(async_smem);
    ring = base + warp * bulk_warp_bytes<TY, N>();
    bars = reinterpret_cast<unsigned long long*>(base + NWARPS * bulk_warp_bytes<TY, N>()) + warp * BULK_STAGES;
    if (lane == 0) {
      for (int d = 0; d < BULK_STAGES; ++d) mbar_init(bars + d, 1);
      mbar_init_fence();
    }
    __syncwarp();
  }
  const int topk = p.topk, H = p.H, M = p.M, G = p.G;
  if (const int r = entering_peer(p); r >= 0) {
    // "entered" orders nothing of this kernel, like the dispatch's: a release store will do
    if (NVL && p.entry_release) st_release_sys(sigp(p, p.peer[r], sig_barrier(p, p.rank)), round);
    else raise_flag<NVL>(p, sig_barrier(p, p.rank), r, round);
  }

  const int S = call_slices(p);
  // Items (t, g, slice) only up to this round's largest source-token count (published by the
  // plan): past it no (g, t) has a row, and a fused combine would pay a work-counter atomic
  // for each of those empty items (G*M*S of them with a few tokens in a large arena).
  const long long nvisit = (long long)(p.state[8] < (unsigned long long)M ? p.state[8] : (unsigned long long)M);
  const long long total = (long long)G * nvisit * S;
  const long long stride = (long long)gridDim.x * NWARPS;
  stamp_exit(ST_CSEND_LOOP);
  for (long long i = FUSED ? next_item<true>(&p.state[2], 0, 0, lane) : (long long)warp * gridDim.x + blockIdx.x;
       i < total; i = next_item<FUSED>(&p.state[2], i, stride, lane)) {
    const int sl = (int)(i % S);
    const int t = (int)(i / S / G), g = (int)(i / S % G);
    const long long u = (long long)g * M + t;
    const int* rm = p.rowmap + u * topk;
    int nk = 0;
    for (int k0 = 0; k0 < topk; k0 += 32) {
      int k = k0 + lane;
      int row = k < topk ? rm[k] : -1;
      unsigned b = __ballot_sync(0xffffffffu, row >= 0);
      if (row >= 0) {
        int pos = nk + __popc(b & ((1u << lane) - 1));
        sh_rows[warp][pos] = y + (long long)row * H;
        sh_w[warp][pos] = w ? w[row] : 1.0f;
      }
      nk += __popc(b);
    }
    __syncwarp();
    if (nk == 0) continue;
    stamp_exit(ST_CSEND_ROWS);
    const long long dst_off = p.off_comb + ((long long)p.rank * M + t) * p.part_bytes;
    TX* stage = nullptr;
    if constexpr (!NVL) stage = reinterpret_cast<TX*>(p.sym + p.off_stage_comb + u * p.part_bytes);
    // put: the copy for this rank itself (replica self_q of group g) is stored straight into its
    // own arena, a local store on any transport; only the other replicas' copies are staged and
    // put (the staging's write and read-back cost the prefill combine ~117 MB of HBM traffic).
    const int self_q = !NVL && g == p.group ? p.replica : -1;  // this rank among group g's replicas
    const bool staged = !NVL && p.tp > (self_q >= 0 ? 1 : 0);
    int h0, h1;
    slice_range(H, S, sl, 32 * N * C, h0, h1);
    // The partial's elements [h, h + 32*N*C) of this lane's chunks, to every replica of group g.
    auto emit = [&](int h, float (&acc)[C][N]) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int hh = h + c * 32 * N;
        if (hh < h1) {
          if constexpr (NVL) {
            for (int q = 0; q < p.tp; ++q) store_n<TX, N>(reinterpret_cast<TX*>(p.peer[g * p.tp + q] + dst_off) + hh, acc[c]);
          } else {
            if (self_q >= 0) store_n<TX, N>(reinterpret_cast<TX*>(p.sym + dst_off) + hh, acc[c]);
            if (staged) store_n<TX, N>(stage + hh, acc[c]);
          }
        }
      }
    };
    if constexpr (LOADS == LOADS_BULK) {
      sum_rows_bulk<TY, N>(sh_rows[warp], w ? sh_w[warp] : nullptr, nk, h0, h1, ring, bars, bulk_seq, emit);
    } else if constexpr (LOADS == LOADS_ASYNC) {
      sum_rows_pipelined<TY, N>(sh_rows[warp], w ? sh_w[warp] : nullptr, nk, h0, h1,
                                async_smem + warp * async_warp_int4s<TY, N>(), emit);
    } else {
      for (int h = h0 + lane * N; h < h1; h += 32 * N * C) {
        float acc[C][N];
        sum_rows<TY, N, C, ROW_BATCH>(sh_rows[warp], w ? sh_w[warp] : nullptr, nk, h, h1, acc);
        emit(h, acc);
      }
    }
    __syncwarp();
    stamp_exit(ST_CSEND_SUMMED);
    if constexpr (NVL) {
      // The release store alone orders the warp's partial stores before the flag (cumulative
      // over the lanes' writes that __syncwarp ordered before it): no fence.sc.sys in front,
      // which cost decode combine 128 tokens 28.4 -> 25.4 us, prefill 230 -> 222 us (round 13).
      if (lane == 0) {
        stamp_exit(ST_CSEND_FENCED);  // no fence any more: the moment its flag is stored
        for (int q = 0; q < p.tp; ++q)
          st_release_sys(sigp(p, p.peer[g * p.tp + q], sig_comb(p, p.rank, t, sl, S)), round);
      }
    } else {
      uint64_t* sig = reinterpret_cast<uint64_t*>(sigp(p, p.sym, sig_comb(p, p.rank, t, sl, S)));
      for (int q = 0; q < p.tp; ++q) {
        if (q == self_q) {  // the release store orders the warp's local stores (__syncwarp above)
          if (lane == 0) st_release_sys(reinterpret_cast<unsigned long long*>(sig), round);
        } else if (h1 > h0)
          nvshmemx_putmem_signal_nbi_warp(p.sym + dst_off + (long long)h0 * sizeof(TX), stage + h0,
                                          (size_t)(h1 - h0) * sizeof(TX), sig, round, NVSHMEM_SIGNAL_SET,
                                          p.pe[g * p.tp + q]);
        else if (lane == 0)
          nvshmemx_signal_op(sig, round, NVSHMEM_SIGNAL_SET, p.pe[g * p.tp + q]);
      }
    }
    __syncwarp();
  }
  stamp_exit(ST_CSEND_ITEMS);
  if constexpr (FUSED) {
    __shared__ const TX* sh_src[NWARPS][MAXW];
    // Two rows per load batch: a token's partials come from at most W ranks (2 at EP2), and
    // the send's register budget holds.
    combine_recv_items<TX, TY, N, 2, true>(p, ra, sh_src[warp], NWARPS);
    if (blockIdx.x == 0 && threadIdx.x < p.W)
      wait_flag(p, sigp(p, p.sym, sig_barrier(p, threadIdx.x)), round, PH_COMBINE_RECV, threadIdx.x);
    combine_finish(p, round);
  }
  stamp_exit(ST_CSEND);
}

// ---------------------------------------------------------------------------------------
// Receive items of a combine: one warp per own token (and slice) sums the partials of the
// ranks holding its experts in rank order (float32, from 0.0f) and rounds to the output
// dtype; zeros for rows past n and tokens with no expert.
template <typename TX, typename TO, int N, int RB, bool COUNTER>
__device__ void combine_recv_items(const Params& p, const RecvArgs<TO>& ra, const TX** sh_src, int nwarps) {
  constexpr int C = chunks_per_step<TX, N>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int topk = p.topk, H = p.H, M = p.M, E = p.E, L = p.L;
  const unsigned long long round = combine_round(p);
  int n = ra.nptr ? *ra.nptr : ra.n_host;
  n = n < 0 ? 0 : (n > ra.rows ? ra.rows : n);
  const int S = call_slices(p);
  const long long items = (long long)ra.rows * S;
  const long long stride = (long long)gridDim.x * nwarps;
  // Grid-stride items with topk <= 32: the next item's ids (one per lane) are loaded before
  // this item's flags are waited for. An item was three dependent loads (ids, flags,
  // partials), and a warp of the receive beside the send takes several items.
  const bool prefetch = !COUNTER && p.recv_prefetch && topk <= 32;
  auto item_id = [&](long long j) -> int {
    const int tj = (int)(j / S);
    return j < items && tj < n && lane < topk ? ra.ids[(long long)tj * topk + lane] : -1;
  };
  long long i = COUNTER ? next_item<true>(&p.state[7], 0, 0, lane) : (long long)warp * gridDim.x + blockIdx.x;
  int id_next = prefetch ? item_id(i) : -1;
  for (; i < items; i = next_item<COUNTER>(&p.state[7], i, stride, lane)) {
    const int t = (int)(i / S), sl = (int)(i % S);
    unsigned long long mask = 0;
    if (prefetch) {
      const int id = id_next;
      id_next = item_id(i + stride);  // in flight while this item waits and sums
      if (id >= 0 && id < E) mask = 1ULL << (id / L);
    } else if (t < n) {
      for (int k = lane; k < topk; k += 32) {
        int id = ra.ids[(long long)t * topk + k];
        if (id >= 0 && id < E) mask |= 1ULL << (id / L);
      }
    }
    unsigned lo = __reduce_or_sync(0xffffffffu, (unsigned)(mask & 0xffffffffu));
    unsigned hi = __reduce_or_sync(0xffffffffu, (unsigned)(mask >> 32));
    mask = ((unsigned long long)hi << 32) | lo;
    // Every slice flag of every holding rank (the sender's slices need not match ours).
    for (int q = lane; q < p.W * S; q += 32) {
      const int r = q / S;
      if ((mask >> r) & 1) wait_flag(p, sigp(p, p.sym, sig_comb(p, r, t, q % S, S)), round, PH_COMBINE_RECV, r);
    }
    for (int r = lane; r < p.W; r += 32)
      if ((mask >> r) & 1)
        sh_src[__popcll(mask & ((1ULL << r) - 1))] =
            reinterpret_cast<const TX*>(p.sym + p.off_comb + ((long long)r * M + t) * p.part_bytes);
    __syncwarp();
    const int nr = __popcll(mask);
    int h0, h1;
    slice_range(H, S, sl, 32 * N * C, h0, h1);
    for (int h = h0 + lane * N; h < h1; h += 32 * N * C) {
      float acc[C][N];
      sum_rows<TX, N, C, RB>(sh_src, nullptr, nr, h, h1, acc);
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (h + c * 32 * N < h1) store_n<TO, N>(ra.out + (long long)t * H + h + c * 32 * N, acc[c]);
    }
    __syncwarp();
  }
}

// The last block to finish a combine receive advances the round counter. With the switch
// (p.finish_block0), block 0 sets it without counting: only the next round's dispatch kernels
// read it, and they start after this kernel has ended (stream order, or the join of the side
// stream it runs on), so every block's barrier, fence and counter atomic at its end go.
__device__ void combine_finish(const Params& p, unsigned long long round) {
  if (p.finish_block0) {
    if (blockIdx.x == 0 && threadIdx.x == 0) p.state[0] = round;
    return;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&p.state[3], 1ULL) == (unsigned long long)(gridDim.x - 1)) {
      p.state[3] = 0;
      p.state[0] = round;
      __threadfence();
    }
  }
}

// ---------------------------------------------------------------------------------------
// Combine receive: wait for every rank's barrier flag; one warp per own token sums the
// partials of the ranks holding its experts in rank order (float32, from 0.0f), rounds to
// the output dtype; zeros elsewhere. Then the round counter advances (combine_finish).
template <typename TX, typename TO, int N>
__global__ void __launch_bounds__(NTHREADS) combine_recv_kernel(Params p, RecvArgs<TO> ra) {
  stamp_entry(ST_CRECV);
  __shared__ const TX* sh_src[NWARPS][MAXW];
  const unsigned long long round = combine_round(p);
  if (const int r = entering_peer(p); r >= 0) wait_flag(p, sigp(p, p.sym, sig_barrier(p, r)), round, PH_COMBINE_RECV, r);
  combine_recv_items<TX, TO, N, ROW_BATCH, false>(p, ra, sh_src[threadIdx.x >> 5], (int)blockDim.x >> 5);
  combine_finish(p, round);
  stamp_exit(ST_CRECV);
}

// ---------------------------------------------------------------------------------------
// Host side

// Every check of the host side is MOE_CHECK(cond, parts...): its message is built by msg(),
// numbers by std::to_string, and handed to TORCH_CHECK as one string. On the GPU machine
// (torch 2.11) a TORCH_CHECK that streamed an integer into its message crashed the process
// (SIGSEGV) instead of raising; messages of strings only raised (round 12,
// results/gpu/2026-11-30-round12-ab).
static void add_part(std::string& s, const char* v) { s += v; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
static void add_part(std::string& s, T v) { s += std::to_string(v); }
template <typename... A>
static std::string msg(const A&... parts) {
  std::string s;
  (add_part(s, parts), ...);
  return s;
}
#define MOE_CHECK(cond, ...) TORCH_CHECK(cond, msg(__VA_ARGS__))

#define CUDA_OK(x)                                                                        \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    MOE_CHECK(e_ == cudaSuccess, "CUDA error: ", cudaGetErrorString(e_), " at " #x);   \
  } while (0)

// Kernels that run concurrently on one SM (send beside receive) need one SM configuration that
// fits both; the driver sizes it for the first kernel on the SM, and a receive needing more
// waits until the SM drains (seen with the overlapped combine receive, round 7). So kernels ask
// for the largest shared-memory carveout (our kernels stream through L2: L1 is not needed),
// except the two-kernel combine (send without the fused receive, and the receive): round 16
// measured it faster at the driver's default (128-token decode combine 25.6 -> 23.4 us, 1 token
// 16.4 -> 15.6, 512 tokens 60.3 -> 54.7); elsewhere the default measured no better (prefill
// 229.7 / 221.9 against 229.6 / 222.0 us), so the other kernels keep the largest.
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
  // Fused combine (default for arenas of more than 4096 source tokens, see create_ctx):
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
  // Copy-engine send (p.ce_send, see launch_ce_send): copies on `ce_copy`, each chunk's flags
  // raised by a kernel on `ce_flags` behind the chunk's event `ce_done[c]`; dispatch_recv joins
  // `ce_join` (ce_pending), and x / x_scale are held until then like for the receive.
  cudaStream_t ce_copy = nullptr, ce_flags = nullptr;
  std::vector<cudaEvent_t> ce_done;
  cudaEvent_t ce_join = nullptr;
  bool ce_pending = false;
  bool ce_forced = false;  // MOE_BACKEND_NVSHMEM_CE_SEND=1: for every token count
};

// The combine receive runs concurrently with the send only for arenas of at most this many
// source tokens (G*M). Measured (2 x H200, DeepSeek shape, results/gpu/2026-11-30-run6):
// overlapped vs sequential combine 17 vs 39 us (1 token) ... 64 vs 68 us (G*M = 1024), but
// 109 vs 85 us (2048) and 319 vs 260 us (8192): at prefill sizes the concurrent receive's
// small blocks (needed to fit beside the send) lag the send and finish ~100 us after it.
constexpr long long COMB_OVERLAP_MAX_TOKENS = 1024;
constexpr long long COMB_FUSED_MIN_TOKENS = 4096;

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
static int copy_pieces(const Params& p) {
  const long long by_work = (long long)p.num_sms * NWARPS / ((long long)p.G * p.M);
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

// Direct receive (round 16): nvlink, or put with the round-tagged table (round 26); the table fits one portion (written by
// direct_blocks send blocks); ranks and ids packed in 16 bits each; the sender's masks and the receiver's bases in
// shared memory; one warp per item within one block per SM.
constexpr size_t DIRECT_MAX_SMEM = 32 * 1024;
static size_t direct_send_smem(const Params& p) { return (size_t)p.E * ((p.M + 31) / 32) * 4; }
static bool direct_recv_fits(const Params& p, bool transport_ok) {
  const long long items = (long long)p.G * p.M * p.copy_pieces;
  return transport_ok && table_portions(p) == 1 && (long long)p.M * p.topk * 8 <= TABLE_PORTION_BYTES && p.M < 32768 &&
         p.E < 65536 && direct_send_smem(p) <= DIRECT_MAX_SMEM && (size_t)(p.G + 1) * p.L * 4 <= DIRECT_MAX_SMEM &&
         (items + NWARPS - 1) / NWARPS <= p.num_sms;
}

int64_t create_ctx(std::vector<int64_t> c) {
  MOE_CHECK(c.size() >= 37, "create_ctx: short config");
  auto* cx = new Ctx();
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
  const bool send_stream = c[i++] != 0;
  p->sym = reinterpret_cast<char*>(c[i++]);
  p->off_sig = c[i++]; p->off_tables = c[i++]; p->off_disp = c[i++]; p->off_comb = c[i++];
  p->off_stage_disp = c[i++]; p->off_stage_table = c[i++]; p->off_stage_comb = c[i++];
  p->state = reinterpret_cast<unsigned long long*>(c[i++]);
  p->cnt = reinterpret_cast<int*>(c[i++]);
  p->rowmap = reinterpret_cast<int*>(c[i++]);
  p->err_host = reinterpret_cast<int*>(c[i++]);
  MOE_CHECK(p->W <= MAXW && (int)c.size() == i + 2 * p->W, "create_ctx: bad config length");
  for (int r = 0; r < p->W; ++r) p->pe[r] = c[i++];
  for (int r = 0; r < p->W; ++r) p->peer[r] = reinterpret_cast<char*>(c[i++]);
  p->group = p->rank / p->tp;
  p->replica = p->rank % p->tp;
  const long long sources = (long long)p->G * p->M;
  p->copy_pieces = copy_pieces(*p);
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
  // Round 25: the direct receive loads an own token's piece before the tables are in, where a
  // piece fits the registers (EARLY_UNROLL vectors per lane) and rows and scales are 16-byte vectors.
  {
    const int n16 = p->row_bytes >> 4, per16 = (n16 + p->copy_pieces - 1) / p->copy_pieces;
    const bool fits = p->row_bytes % 16 == 0 && per16 <= 32 * EARLY_UNROLL && p->scale_bytes % 16 == 0 &&
                      p->scale_bytes <= 512;
    p->early_load = p->direct && fits && env_switch("MOE_BACKEND_NVSHMEM_EARLY_LOAD", true) ? 1 : 0;
  }
  p->par_scan = env_switch("MOE_BACKEND_NVSHMEM_PAR_SCAN", true) ? 1 : 0;
  // Overlap needs the waiting kernels (plan, copy) never to fill the GPU, or the send blocks
  // that feed them could not be scheduled: plan blocks of <= 256 threads, or kernels sized
  // for at most half the GPU's SMs (backend option num_sms), whatever the chunk.
  cudaPointerAttributes attr{};
  CUDA_OK(cudaPointerGetAttributes(&attr, p->sym));
  const int dev_sms = (int)num_sms(attr.device);
  cx->overlap = env_switch("MOE_BACKEND_NVSHMEM_OVERLAP", p->chunk <= 256 || 2 * p->num_sms <= dev_sms);
  cx->comb_overlap = env_switch("MOE_BACKEND_NVSHMEM_COMBINE_OVERLAP", sources <= COMB_OVERLAP_MAX_TOKENS);
  // The fused combine send's row loads (RowLoads): with the whole GPU by cp.async (prefill
  // 240 -> 230 us), with at most half of it by bulk copies (cp.async there was slower:
  // 723 -> 754 us with 24 SMs); COMBINE_BULK / COMBINE_ASYNC "0" / "1" force either.
  const bool few_sms = 2 * p->num_sms <= dev_sms;
  p->comb_loads = env_switch("MOE_BACKEND_NVSHMEM_COMBINE_BULK", few_sms, true)     ? LOADS_BULK
                  : env_switch("MOE_BACKEND_NVSHMEM_COMBINE_ASYNC", !few_sms, true) ? LOADS_ASYNC
                                                                                   : LOADS_REGS;
  // Fused combine: by default past COMB_FUSED_MIN_TOKENS source tokens (measured faster there,
  // slower at 2048-4096); "1" uses it for every arena past the overlap limit.
  cx->comb_fused = !cx->comb_overlap &&
                   env_switch("MOE_BACKEND_NVSHMEM_COMBINE_FUSED", sources > COMB_FUSED_MIN_TOKENS, true);
  // Copy-engine send (launch_ce_send): nvlink with the overlapped receive only, when nearly
  // every token has an expert at each other rank (>= CE_MIN_DENSITY; it sends every token to
  // every other group),
  // and not with CUDA_DEVICE_MAX_CONNECTIONS=1, where its queued flag kernels hold back the
  // receive (prefill 362 against 264 us, round 15). Used per call for >= CE_MIN_TOKENS tokens.
  // MOE_BACKEND_NVSHMEM_CE_SEND=0 never, =1 always (any token count and routing density);
  // MOE_BACKEND_NVSHMEM_CE_CHUNKS=k cuts the tokens into k chunks (default CE_CHUNKS).
  {
    const char* conns = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    const bool one_queue = conns && std::atoi(conns) == 1;
    const bool dense = dense_fraction(p->E, p->L, p->topk) >= CE_MIN_DENSITY;
    const bool can = p->nvl && cx->overlap;
    p->ce_send = can && env_switch("MOE_BACKEND_NVSHMEM_CE_SEND", dense && !one_queue, true);
    cx->ce_forced = p->ce_send && env_switch("MOE_BACKEND_NVSHMEM_CE_SEND", false, true);
  }
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
    const char* v = std::getenv("MOE_BACKEND_NVSHMEM_CE_CHUNKS");
    const int chunks = std::max(1, std::min(64, v && *v ? std::atoi(v) : CE_CHUNKS));
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)attr.device);
    CUDA_OK(cudaStreamCreateWithFlags(&cx->ce_copy, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&cx->ce_flags, cudaStreamNonBlocking));
    cx->ce_done.resize(chunks);
    for (auto& e : cx->ce_done) CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_OK(cudaEventCreateWithFlags(&cx->ce_join, cudaEventDisableTiming));
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
  return reinterpret_cast<int64_t>(cx);
}

void destroy_ctx(int64_t ctx) {
  Ctx* cx = reinterpret_cast<Ctx*>(ctx);
  cx->stash.clear();
  cx->keep_x = at::Tensor();
  cx->keep_s = at::Tensor();
  cx->comb_out = cx->comb_ids = cx->comb_ntok = cx->comb_y = cx->comb_w = at::Tensor();
  cx->keep_ids = cx->keep_w = cx->keep_n = at::Tensor();
  if (cx->ce_copy) cudaStreamDestroy(cx->ce_copy);
  if (cx->ce_flags) cudaStreamDestroy(cx->ce_flags);
  for (auto e : cx->ce_done) cudaEventDestroy(e);
  if (cx->ce_join) cudaEventDestroy(cx->ce_join);
  if (cx->send_side) cudaStreamDestroy(cx->send_side);
  if (cx->send_join) cudaEventDestroy(cx->send_join);
  if (cx->side) cudaStreamDestroy(cx->side);  // pending work still completes
  if (cx->fork) cudaEventDestroy(cx->fork);
  if (cx->join) cudaEventDestroy(cx->join);
  delete cx;
}

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

static size_t recv_smem(const Params& p) { return ((size_t)(p.chunk / 32) * p.L + 3 * (size_t)p.L) * 4; }

// Receive side of dispatch: allocate the outputs and launch the plan and copy kernels on
// `stream`.
static std::vector<at::Tensor> launch_dispatch_recv(const Params& p, const at::TensorOptions& dev, int64_t in_dtype_code,
                                                    bool weighted, const at::Tensor& x, const at::Tensor& xs,
                                                    cudaStream_t stream) {
  const int64_t R = (int64_t)p.G * p.M * std::min(p.topk, p.L);
  static const at::ScalarType codes[] = {at::kBFloat16, at::kHalf, at::kFloat, at::kFloat8_e4m3fn};
  MOE_CHECK(in_dtype_code >= 0 && in_dtype_code < 4, "dispatch_recv: bad dtype code ", in_dtype_code);
  at::Tensor tokens = at::empty({R, p.H}, dev.dtype(codes[in_dtype_code]));
  at::Tensor scales = at::empty({R, p.scale_bytes / 4}, dev.dtype(at::kFloat));
  at::Tensor weights = at::empty({weighted ? R : 0}, dev.dtype(at::kFloat));
  at::Tensor tpe = at::empty({p.L}, dev.dtype(at::kLong));
  at::Tensor offs = at::empty({p.L + 1}, dev.dtype(at::kLong));
  at::Tensor sg = at::empty({R}, dev.dtype(at::kInt));
  at::Tensor st = at::empty({R}, dev.dtype(at::kInt));
  at::Tensor sk = at::empty({R}, dev.dtype(at::kInt));
  const char* xp = reinterpret_cast<const char*>(x.data_ptr());
  const char* xsp = xs.defined() ? reinterpret_cast<const char*>(xs.data_ptr()) : nullptr;
  if (p.direct) {  // one kernel, one warp per item (create_ctx checked that they fit)
    static const bool carve_direct =
        max_shared_carveout(dispatch_direct_kernel<true>) && max_shared_carveout(dispatch_direct_kernel<false>);
    (void)carve_direct;
    const int blocks = (int)(((long long)p.G * p.M * p.copy_pieces + NWARPS - 1) / NWARPS);
    auto* kernel = p.ll_table ? dispatch_direct_kernel<true> : dispatch_direct_kernel<false>;
    kernel<<<blocks, NTHREADS, (size_t)(p.G + 1) * p.L * 4, stream>>>(
        p, reinterpret_cast<char*>(tokens.data_ptr()), scales.data_ptr<float>(),
        weighted ? weights.data_ptr<float>() : nullptr, tpe.data_ptr<int64_t>(), offs.data_ptr<int64_t>(),
        sg.data_ptr<int>(), st.data_ptr<int>(), sk.data_ptr<int>(), weighted ? 1 : 0, xp, xsp, (int)x.size(0));
    CUDA_OK(cudaGetLastError());
    return {tokens, scales, weights, tpe, offs, sg, st, sk};
  }
  size_t smem = recv_smem(p);
  static bool attr_set = false;
  if (smem > 48 * 1024 && !attr_set) {
    CUDA_OK(cudaFuncSetAttribute(dispatch_recv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    attr_set = true;
  }
  int threads = std::max(p.chunk, 256);  // phase-1 masks need one thread per token
  static const bool carve = max_shared_carveout(dispatch_recv_kernel) && max_shared_carveout(dispatch_copy_kernel<true>) &&
                            max_shared_carveout(dispatch_copy_kernel<false>);
  (void)carve;
  dispatch_recv_kernel<<<p.nchunks, threads, smem, stream>>>(
      p, reinterpret_cast<char*>(tokens.data_ptr()), scales.data_ptr<float>(), weighted ? weights.data_ptr<float>() : nullptr,
      tpe.data_ptr<int64_t>(), offs.data_ptr<int64_t>(), sg.data_ptr<int>(), st.data_ptr<int>(), sk.data_ptr<int>(),
      weighted ? 1 : 0);
  CUDA_OK(cudaGetLastError());
  // One warp per item while the items fit one block per SM (no work counter); else a counter
  // (then copy_pieces is 1).
  const long long need = ((long long)p.G * p.M * p.copy_pieces + NWARPS - 1) / NWARPS;
  const bool dynamic = need > (long long)p.num_sms;
  const int cblocks = (int)std::max(1LL, dynamic ? (long long)p.num_sms : need);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(cblocks);
  cfg.blockDim = dim3(NTHREADS);
  cfg.stream = stream;
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &pdl;
  cfg.numAttrs = copy_pdl(dynamic) ? 1 : 0;
  CUDA_OK(cudaLaunchKernelEx(&cfg, dynamic ? dispatch_copy_kernel<true> : dispatch_copy_kernel<false>, p,
                             reinterpret_cast<char*>(tokens.data_ptr()), scales.data_ptr<float>(),
                             reinterpret_cast<const char*>(x.data_ptr()),
                             xs.defined() ? reinterpret_cast<const char*>(xs.data_ptr()) : nullptr, (int)x.size(0)));
  return {tokens, scales, weights, tpe, offs, sg, st, sk};
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

static void launch_ce_send(Ctx& cx, const char* x, const char* scale, const int* nptr, int n,
                           unsigned long long dests) {
  const Params& p = cx.p;
  CUDA_OK(cudaStreamWaitEvent(cx.ce_copy, cx.fork, 0));
  CUDA_OK(cudaStreamWaitEvent(cx.ce_flags, cx.fork, 0));
  const int chunks = std::max(1, std::min((int)cx.ce_done.size(), (n + CE_MIN_CHUNK - 1) / CE_MIN_CHUNK));
  const int per = (n + chunks - 1) / chunks;
  const long long aligned_row = (p.row_bytes + 15) & ~15;
  for (int c = 0; c < chunks; ++c) {
    const int t0 = c * per, t1 = std::min(n, t0 + per);
    if (t0 >= t1 || c % p.tp != p.replica) continue;
    const size_t ntk = (size_t)(t1 - t0);
    for (unsigned long long m = dests; m; m &= m - 1) {
      char* dst = p.peer[__builtin_ctzll(m)] + p.off_disp + ((long long)p.group * p.M + t0) * p.slot_bytes;
      const char* src = x + (long long)t0 * p.row_bytes;
      if (p.slot_bytes == p.row_bytes)
        CUDA_OK(cudaMemcpyAsync(dst, src, ntk * p.row_bytes, cudaMemcpyDeviceToDevice, cx.ce_copy));
      else
        CUDA_OK(cudaMemcpy2DAsync(dst, p.slot_bytes, src, p.row_bytes, p.row_bytes, ntk, cudaMemcpyDeviceToDevice,
                                  cx.ce_copy));
      if (p.scale_bytes)
        CUDA_OK(cudaMemcpy2DAsync(dst + aligned_row, p.slot_bytes, scale + (long long)t0 * p.scale_bytes, p.scale_bytes,
                                  p.scale_bytes, ntk, cudaMemcpyDeviceToDevice, cx.ce_copy));
    }
    CUDA_OK(cudaEventRecord(cx.ce_done[c], cx.ce_copy));
    CUDA_OK(cudaStreamWaitEvent(cx.ce_flags, cx.ce_done[c], 0));
    ce_flag_kernel<<<1, 256, 0, cx.ce_flags>>>(p, t0, t1, nptr, dests);
    CUDA_OK(cudaGetLastError());
  }
  CUDA_OK(cudaEventRecord(cx.ce_join, cx.ce_flags));
  cx.ce_pending = true;
}

at::Tensor dispatch_send(const at::Tensor& x, const at::Tensor& ids, const std::optional<at::Tensor>& w,
                         const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& ntok, int64_t n_host,
                         int64_t ctx) {
  Ctx& cx = CX(ctx);
  const Params& p = cx.p;
  c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (cx.stashed || cx.comb_out.defined()) {  // a send whose receive never ran: join its side-stream work first
    CUDA_OK(cudaStreamWaitEvent(stream, cx.join, 0));
    cx.stash.clear();
    cx.stashed = false;
    cx.comb_out = cx.comb_ids = cx.comb_ntok = cx.comb_y = cx.comb_w = at::Tensor();
  }
  join_send_side(cx, stream);
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
  const int rows = x.size(0);
  const int per_replica = (p.M + p.tp - 1) / p.tp;
  int blocks = std::max(1, std::min(SEND_BLOCKS_PER_SM * p.num_sms, per_replica));
  const char* xp = reinterpret_cast<const char*>(x.data_ptr());
  const int* ip = ids.data_ptr<int>();
  const float* wp = w ? w->data_ptr<float>() : nullptr;
  const float* sp = scale ? scale->data_ptr<float>() : nullptr;
  const int* np = ntok ? ntok->data_ptr<int>() : nullptr;
  static const bool carve = max_shared_carveout(dispatch_send_kernel<true>) && max_shared_carveout(dispatch_send_kernel<false>);
  (void)carve;
  Params ps = p;
  const int n_send = np ? rows : std::max(0, std::min((int)n_host, rows));
  ps.ce_send = p.ce_send && overlap && (cx.ce_forced || n_send >= CE_MIN_TOKENS);  // needs the receive beside it
  if (ps.ce_send) blocks = std::min(blocks, table_blocks(p));  // the send kernel ships the table only
  const size_t send_smem = p.direct ? direct_send_smem(p) : 0;  // the direct table's masks
  if (p.nvl)
    dispatch_send_kernel<true><<<blocks, SEND_THREADS, send_smem, send_stream>>>(ps, xp, ip, wp, sp, np, (int)n_host, rows);
  else
    dispatch_send_kernel<false><<<blocks, SEND_THREADS, send_smem, send_stream>>>(ps, xp, ip, wp, sp, np, (int)n_host, rows);
  CUDA_OK(cudaGetLastError());
  if (send_stream != stream) CUDA_OK(cudaEventRecord(cx.send_join, send_stream));
  // The copy-engine send is enqueued before the receive, never after: streams share hardware
  // queues, and a flag kernel queued behind the receive's polling kernels did not start until
  // they timed out (round 15). Queued first, its items wait only for local copies.
  if (ps.ce_send) {
    const unsigned long long all = p.W >= 64 ? ~0ULL : ((1ULL << p.W) - 1ULL);
    launch_ce_send(cx, xp, reinterpret_cast<const char*>(sp), np, n_send, all & ~own_group_ranks(p));
  }
  if (overlap) {
    // Receive side on the side stream, concurrent with the send (see Ctx).
    CUDA_OK(cudaStreamWaitEvent(cx.side, cx.fork, 0));
    cx.stash = launch_dispatch_recv(p, x.options(), code, w.has_value(), x, cx.keep_s, cx.side);
    CUDA_OK(cudaEventRecord(cx.join, cx.side));
    cx.stashed = true;
  }
  return at::empty({0}, x.options().dtype(at::kInt));
}

std::vector<at::Tensor> dispatch_recv(const at::Tensor& dep, int64_t ctx, int64_t in_dtype_code, bool weighted) {
  Ctx& cx = CX(ctx);
  c10::cuda::CUDAGuard guard(dep.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (cx.stashed) {
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
  return launch_dispatch_recv(cx.p, dep.options(), in_dtype_code, weighted, x, xs, stream);
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
template <bool NVL, typename TY, typename TX, int N, bool FUSED, int LOADS>
static int launch_send_variant(const Params& p, const TY* y, const float* w, RecvArgs<TY> ra, int blocks,
                               cudaStream_t s) {
  constexpr int smem = LOADS == LOADS_ASYNC  ? NWARPS * async_warp_int4s<TY, N>() * 16
                       : LOADS == LOADS_BULK ? NWARPS * (bulk_warp_bytes<TY, N>() + BULK_STAGES * 8)
                                             : 0;
  static const int regs = [] {
    if (smem)
      CUDA_OK(cudaFuncSetAttribute(combine_send_kernel<NVL, TY, TX, N, FUSED, LOADS>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return ready_kernel(combine_send_kernel<NVL, TY, TX, N, FUSED, LOADS>, NTHREADS, FUSED);
  }();
  combine_send_kernel<NVL, TY, TX, N, FUSED, LOADS><<<blocks, NTHREADS, smem, s>>>(p, y, w, ra);
  return regs;
}

// Launches the combine send (fused with the receive when `rs` is given, with its rows loaded
// as p.comb_loads says when the chunks are 16-byte vectors); returns the registers one of its
// blocks takes.
template <bool NVL, typename TY, typename TX, int N>
static int launch_combine_send_n(const Params& p, const void* y, const float* w, const RecvArgs<void>* rs, cudaStream_t s) {
  const int blocks = std::max(1, std::min(p.num_sms, p.G * p.M));
  const TY* yp = reinterpret_cast<const TY*>(y);
  if (!rs) return launch_send_variant<NVL, TY, TX, N, false, LOADS_REGS>(p, yp, w, RecvArgs<TY>{}, blocks, s);
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
static int launch_combine_send(const Params& p, const void* y, const float* w, const RecvArgs<void>* rs, cudaStream_t s) {
  return p.H % 8 == 0 ? launch_combine_send_n<NVL, TY, TX, 8>(p, y, w, rs, s)
                      : launch_combine_send_n<NVL, TY, TX, 1>(p, y, w, rs, s);
}

template <bool NVL, typename TY>
static int launch_combine_send_x(const Params& p, const void* y, const float* w, const RecvArgs<void>* rs, cudaStream_t s) {
  if (p.xfer_code == 2) return launch_combine_send<NVL, TY, float>(p, y, w, rs, s);
  return launch_combine_send<NVL, TY, TY>(p, y, w, rs, s);
}

// The combine receive, alone (send_regs == 0: NTHREADS-thread blocks) or concurrently with a
// running send whose blocks take `send_regs` registers (COMB_OVERLAP_THREADS-thread blocks).
// Concurrent only when one send block and one receive block fit an SM's 64K registers
// together: the receive has <= SMs blocks, so it can never fill every SM twice over and the
// never-waiting send always finds room (no deadlock). Returns false (nothing launched) when
// they would not fit: the caller then runs the receive alone, later.
constexpr int COMB_OVERLAP_THREADS = 128;
template <typename TX, typename TO>
static bool launch_combine_recv(const Params& p, const RecvArgs<void>& ra, int send_regs, cudaStream_t s) {
  const int blocks = std::max(1, std::min(p.num_sms, p.M));
  const int threads = send_regs ? COMB_OVERLAP_THREADS : NTHREADS;
  if (p.H % 8 == 0) {
    static const int regs = ready_kernel(combine_recv_kernel<TX, TO, 8>, COMB_OVERLAP_THREADS, false);
    if (send_regs && send_regs + regs > 65536) return false;
    combine_recv_kernel<TX, TO, 8><<<blocks, threads, 0, s>>>(p, typed<TO>(ra));
  } else {
    static const int regs = ready_kernel(combine_recv_kernel<TX, TO, 1>, COMB_OVERLAP_THREADS, false);
    if (send_regs && send_regs + regs > 65536) return false;
    combine_recv_kernel<TX, TO, 1><<<blocks, threads, 0, s>>>(p, typed<TO>(ra));
  }
  return true;
}

// The receive's arguments from the op's tensors.
static RecvArgs<void> recv_args(const at::Tensor& ids, const std::optional<at::Tensor>& ntok, int64_t n_host,
                                const at::Tensor& out) {
  return {ids.data_ptr<int>(), ntok ? ntok->data_ptr<int>() : nullptr, (int)n_host, (int)out.size(0), out.data_ptr()};
}

static bool launch_combine_recv_any(const Params& p, const RecvArgs<void>& ra, int send_regs, cudaStream_t s) {
  bool launched;
  switch (p.out_code) {
    case 0:
      launched = p.xfer_code == 2 ? launch_combine_recv<float, __nv_bfloat16>(p, ra, send_regs, s)
                                  : launch_combine_recv<__nv_bfloat16, __nv_bfloat16>(p, ra, send_regs, s);
      break;
    case 1:
      launched = p.xfer_code == 2 ? launch_combine_recv<float, __half>(p, ra, send_regs, s)
                                  : launch_combine_recv<__half, __half>(p, ra, send_regs, s);
      break;
    default: launched = launch_combine_recv<float, float>(p, ra, send_regs, s); break;
  }
  CUDA_OK(cudaGetLastError());
  return launched;
}

// combine_send; with `out` (and the receive's ids / token count) and overlap on, also the
// receive, concurrently on the side stream (see Ctx); combine_recv then only joins. With the
// fused combine (default past 4096 source tokens), one kernel does both halves on the side stream.
at::Tensor combine_send(const at::Tensor& y, const std::optional<at::Tensor>& w, const at::Tensor& dep,
                        const std::optional<at::Tensor>& ids, const std::optional<at::Tensor>& ntok, int64_t n_host,
                        const std::optional<at::Tensor>& out, int64_t ctx) {
  Ctx& cx = CX(ctx);
  const Params& p = cx.p;
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
  const RecvArgs<void>* rs = fused ? &ra : nullptr;
  int send_regs = 0;
#define CS(NVL)                                                                               \
  switch (p.out_code) {                                                                       \
    case 0: send_regs = launch_combine_send_x<NVL, __nv_bfloat16>(p, yp, wp, rs, ks); break;  \
    case 1: send_regs = launch_combine_send_x<NVL, __half>(p, yp, wp, rs, ks); break;         \
    default: send_regs = launch_combine_send<NVL, float, float>(p, yp, wp, rs, ks); break;    \
  }
  if (p.nvl) { CS(true) } else { CS(false) }
#undef CS
  CUDA_OK(cudaGetLastError());
  at::Tensor dep_out = at::empty({0}, y.options().dtype(at::kInt));
  if (overlap) {
    CUDA_OK(cudaStreamWaitEvent(cx.side, cx.fork, 0));
    // Would it not fit beside the send, combine_recv runs it.
    if (!launch_combine_recv_any(p, ra, send_regs, cx.side)) return dep_out;
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
  launch_combine_recv_any(cx.p, recv_args(ids, ntok, n_host, out), 0, s);
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

// Latency floor of a GPU-initiated exchange (benchmark only, moe_backend/latency_floor.py):
// each rank stores `round` into its slot at every peer (NVLink store, release) and waits for
// every peer's store (acquire): in one launch, or a store launch then a wait launch on the
// same stream, the fewest any split dispatch can have. A wait past timeout_ns sets err[0].
struct PingPeers {
  unsigned long long* p[MAXW];
};
__global__ void ping_kernel(unsigned long long* flags, PingPeers peers, int W, int rank, unsigned long long round,
                            bool store, bool wait, long long timeout_ns, int* err) {
  const int r = threadIdx.x;
  if (r >= W || r == rank) return;
  if (store) st_release_sys(peers.p[r] + rank, round);
  if (wait) {
    const unsigned long long t0 = gtimer();
    while (ld_acquire_sys(flags + r) < round) {
      if ((long long)(gtimer() - t0) > timeout_ns) {
        atomicExch(err, 1);
        return;
      }
    }
  }
}

void ping(at::Tensor err, int64_t flags, std::vector<int64_t> peers, int64_t rank, int64_t round, int64_t launches,
          int64_t timeout_ns) {
  MOE_CHECK(!peers.empty() && peers.size() <= (size_t)MAXW, "ping: 1..", MAXW, " peers, got ", peers.size());
  MOE_CHECK(launches == 1 || launches == 2, "ping: launches must be 1 or 2, got ", launches);
  MOE_CHECK(err.is_cuda() && err.scalar_type() == at::kInt && err.numel() >= 1,
            "ping: err must be a CUDA int32 tensor");
  c10::cuda::CUDAGuard guard(err.device());
  cudaStream_t s = c10::cuda::getCurrentCUDAStream();
  PingPeers pp{};
  for (size_t r = 0; r < peers.size(); ++r) {
    MOE_CHECK(peers[r] != 0, "ping: rank ", r, " is not reachable through nvshmem_ptr (NVLink/P2P)");
    pp.p[r] = reinterpret_cast<unsigned long long*>(peers[r]);
  }
  auto* f = reinterpret_cast<unsigned long long*>(flags);
  const int W = (int)peers.size();
  int* e = err.data_ptr<int>();
  const auto rd = (unsigned long long)round;
  if (launches == 1) {
    ping_kernel<<<1, MAXW, 0, s>>>(f, pp, W, (int)rank, rd, true, true, timeout_ns, e);
  } else {
    ping_kernel<<<1, MAXW, 0, s>>>(f, pp, W, (int)rank, rd, true, false, timeout_ns, e);
    ping_kernel<<<1, MAXW, 0, s>>>(f, pp, W, (int)rank, rd, false, true, timeout_ns, e);
  }
  CUDA_OK(cudaGetLastError());
}


// SM-driven memory rates (benchmark only, moe_backend/sm_ceilings.py): `blocks` blocks of
// 1024 threads, at most one per SM, stream n16 16-byte words. Mode 0 stores to dst (this
// GPU's memory, or a peer's over NVLink), mode 1 loads from src and leaves one word per block
// in dst (so the loads are kept). PROBE_UNROLL words in flight per thread.
constexpr int PROBE_THREADS = 1024, PROBE_UNROLL = 8;
__global__ void __launch_bounds__(PROBE_THREADS, 1) rate_probe_kernel(int4* dst, const int4* __restrict__ src,
                                                                    long long n16, int mode) {
  const long long step = (long long)PROBE_THREADS * PROBE_UNROLL;
  const long long stride = (long long)gridDim.x * step;
  if (mode == 0) {
    const int4 v = make_int4((int)blockIdx.x, (int)threadIdx.x, 1, 2);
    for (long long i = blockIdx.x * step + threadIdx.x; i < n16; i += stride)
#pragma unroll
      for (int u = 0; u < PROBE_UNROLL; ++u)
        if (i + u * PROBE_THREADS < n16) dst[i + u * PROBE_THREADS] = v;
    return;
  }
  int acc = 0;
  for (long long i = blockIdx.x * step + threadIdx.x; i < n16; i += stride) {
    int4 v[PROBE_UNROLL];
#pragma unroll
    for (int u = 0; u < PROBE_UNROLL; ++u)
      v[u] = i + u * PROBE_THREADS < n16 ? __ldcg(src + i + u * PROBE_THREADS) : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < PROBE_UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0) atomicXor(reinterpret_cast<int*>(dst + blockIdx.x), acc);
}

// Mode 2 of the probe: the same stores by bulk copies (TMA) from shared memory, lane 0 of every
// warp issuing PROBE_BULK-byte copies of one shared buffer, at most PROBE_BULK_AHEAD unfinished
// reads of it: do bulk stores write faster than SM stores when few SMs are given (the 24-SM
// dispatch writes ~470 MB of expert rows)? The buffer holds mode 0's pattern (words 2, 3 = 1, 2).
constexpr int PROBE_BULK = 16384, PROBE_BULK_AHEAD = 4;
__global__ void __launch_bounds__(PROBE_THREADS, 1) bulk_store_probe_kernel(char* dst, long long nbytes) {
  __shared__ alignas(128) int4 buf[PROBE_BULK / 16];
  for (int i = threadIdx.x; i < PROBE_BULK / 16; i += blockDim.x) buf[i] = make_int4((int)blockIdx.x, i, 1, 2);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic-proxy writes, seen by the bulk copies
  __syncthreads();
  if ((threadIdx.x & 31) != 0) return;
  const unsigned sa = (unsigned)__cvta_generic_to_shared(buf);
  const long long nwarps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long c = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); c * PROBE_BULK < nbytes; c += nwarps) {
    const long long off = c * PROBE_BULK;
    const unsigned size = (unsigned)(nbytes - off < PROBE_BULK ? nbytes - off : PROBE_BULK);
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + off), "r"(sa), "r"(size)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(PROBE_BULK_AHEAD) : "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the writes done before the kernel ends
}

void rate_probe(int64_t dst, int64_t src, int64_t nbytes, int64_t mode, int64_t blocks, int64_t device) {
  MOE_CHECK(mode >= 0 && mode <= 2, "rate_probe: mode must be 0 (stores), 1 (loads) or 2 (bulk stores), got ", mode);
  MOE_CHECK(nbytes > 0 && nbytes % 16 == 0, "rate_probe: nbytes must be a positive multiple of 16, got ", nbytes);
  MOE_CHECK(blocks >= 1 && blocks <= num_sms(device), "rate_probe: blocks must be 1..", num_sms(device), ", got ",
            blocks);
  MOE_CHECK(dst != 0 && dst % 16 == 0 && (mode != 1 || (src != 0 && src % 16 == 0)),
            "rate_probe: dst (and src for loads) must be non-null 16-byte aligned device addresses");
  c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
  if (mode == 2)
    bulk_store_probe_kernel<<<(int)blocks, PROBE_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<char*>(dst), nbytes);
  else
    rate_probe_kernel<<<(int)blocks, PROBE_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<int4*>(dst), reinterpret_cast<const int4*>(src), nbytes / 16, (int)mode);
  CUDA_OK(cudaGetLastError());
}

// Timeline stamps (diagnostic): mode 1 resets them and turns them on, 0 turns them off; both
// return the stamps as they were (int64 [3 * NSTAMP], ns of %globaltimer: first entry, last
// entry, last exit per stamp; a first entry no block reached reads -1, the others 0).
// Synchronises the device.
at::Tensor timeline_stamps(int64_t mode) {
  MOE_CHECK(mode == 0 || mode == 1, "timeline_stamps: mode must be 0 or 1, got ", mode);
  MOE_CHECK(STAMPS_BUILT || mode == 0,
            "timeline_stamps: this build has no timeline stamps; rebuild with MOE_BACKEND_STAMPS=1 "
            "(rm moe_backend/_C*.so; MOE_BACKEND_STAMPS=1 python setup.py build_ext --inplace)");
  unsigned long long host[3 * NSTAMP];
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpyFromSymbol(host, g_stamps, sizeof(host)));
  at::Tensor out = at::empty({3 * NSTAMP}, at::TensorOptions().dtype(at::kLong));
  std::memcpy(out.data_ptr<int64_t>(), host, sizeof(host));
  if (mode == 1)
    for (int k = 0; k < NSTAMP; ++k) {
      host[3 * k] = ~0ULL;
      host[3 * k + 1] = host[3 * k + 2] = 0;
    }
  const int on = (int)mode;
  if (mode == 1) CUDA_OK(cudaMemcpyToSymbol(g_stamps, host, sizeof(host)));
  CUDA_OK(cudaMemcpyToSymbol(g_stamps_on, &on, sizeof(on)));
  CUDA_OK(cudaDeviceSynchronize());
  return out;
}

}  // namespace moe

TORCH_LIBRARY(moe_backend, m) {
  m.def("dispatch_send(Tensor x, Tensor topk_ids, Tensor? topk_weights, Tensor? x_scale, Tensor? num_tokens, "
        "int n_host, int ctx) -> Tensor");
  m.def("dispatch_recv(Tensor dep, int ctx, int in_dtype_code, bool weighted) -> Tensor[]");
  m.def("combine_send(Tensor expert_y, Tensor? weights, Tensor dep, Tensor? topk_ids, Tensor? num_tokens, int n_host, "
        "Tensor(a!)? out, int ctx) -> Tensor");
  m.def("combine_recv(Tensor dep, Tensor topk_ids, Tensor? num_tokens, int n_host, Tensor(a!) out, int ctx) -> ()");
  m.def("create_ctx(int[] cfg) -> int", moe::create_ctx);
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
  m.def("ping(Tensor(a!) err, int flags, int[] peers, int rank, int round, int launches, int timeout_ns) -> ()");
}

TORCH_LIBRARY_IMPL(moe_backend, CUDA, m) {
  m.impl("dispatch_send", moe::dispatch_send);
  m.impl("dispatch_recv", moe::dispatch_recv);
  m.impl("combine_send", moe::combine_send);
  m.impl("combine_recv", moe::combine_recv);
  m.impl("ping", moe::ping);
}

// A bare Python module: importing it runs the registrations above.
static struct PyModuleDef moe_module = {PyModuleDef_HEAD_INIT, "_C", "moe_backend native NVSHMEM kernels", -1, nullptr};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&moe_module); }
