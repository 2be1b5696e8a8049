// combine_kernels.cuh: the combine kernels: the row sums (registers, cp.async, bulk copies), the send (fused
// with the receive or not) and the receive.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "device_common.cuh"

namespace moe {

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
// FIRST: the sum's first row, added to 0.0f in place of acc (no zeroing of acc before it).
template <typename T, int N, int C, bool WEIGHTED, bool FIRST = false>
__device__ __forceinline__ void add_row_scaled(float (&acc)[C][N], const VecT<T, N> (&raw)[C], float wj) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float f[N];
    unpack<T, N>(raw[c], f);
#pragma unroll
    for (int i = 0; i < N; ++i)
      acc[c][i] = __fadd_rn(FIRST ? 0.0f : acc[c][i], WEIGHTED ? __fmul_rn(wj, f[i]) : f[i]);
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
// WEIGHTED: ws[j] scales row j (else ws is not read). PAD: a batch's rows past nk add +0.0f
// (zero vectors, weight 0): a sum that starts from +0.0f is never -0.0f, so adding +0.0f leaves
// every bit of it, and the batch runs with no branch around each row's adds (round 43: those
// branches' jumps over unrolled adds cost the latency kernels' first pass their fetches). The
// combine send pads; the receive does not: padded, its 128-token combine measured 16.1 -> 17.2 us
// (run 33 call 3, world size 1).
template <typename T, int N, int C, int RB, bool WEIGHTED, bool PAD>
__device__ __forceinline__ void sum_rows(const T* const* rows, const float* ws, int nk, int h, int H,
                                         float (&acc)[C][N]) {
  zero_sums(acc);
  for (int j0 = 0; j0 < nk; j0 += RB) {
    VecT<T, N> raw[RB][C];
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (j0 + r < nk && h + c * 32 * N < H) load_raw<T, N>(rows[j0 + r] + h + c * 32 * N, raw[r][c]);
        else if (PAD) raw[r][c] = VecT<T, N>{};
      }
#pragma unroll
    for (int r = 0; r < RB; ++r)
      if (PAD || j0 + r < nk)
        add_row_scaled<T, N, C, WEIGHTED>(acc, raw[r], WEIGHTED && j0 + r < nk ? ws[j0 + r] : 0.0f);
  }
}

// Chunks per lane per step: two 16-byte vectors when a chunk is one vector (or scalar).
template <typename T, int N>
constexpr int chunks_per_step() { return N * sizeof(T) >= 32 ? 1 : 2; }
constexpr int ROW_BATCH = 4;
// How the fused combine send loads its expert rows (Params::comb_loads): into registers
// (sum_rows), by cp.async into shared memory (sum_rows_pipelined), by bulk copies (sum_rows_bulk).
// LOADS_STEP_BULK: the two-kernel send's (round 84, sum_rows_step_bulk_items below).
enum RowLoads : int { LOADS_REGS = 0, LOADS_ASYNC = 1, LOADS_BULK = 2, LOADS_STEP_BULK = 3 };

// Pipelined row sums (the fused combine send's with MOE_BACKEND_NVSHMEM_COMBINE_BULK=0; the
// default with the whole GPU until run 43): the row loads go to shared memory by cp.async,
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

// Row sums by bulk copies (the fused combine send's by default; with at most half the GPU since
// round 27, with the whole GPU too since run 43; MOE_BACKEND_NVSHMEM_COMBINE_BULK=0 turns it off): a task (one bulk step of the slice, one batch
// of BULK_BATCH rows) is one bulk copy per row, issued by the lane of that row's index into a stage
// of this warp's ring and counted by the stage's mbarrier, BULK_STAGES - 1 tasks ahead of the
// sum. The lanes then read their vectors at fixed offsets in the stage. The register and
// cp.async paths spent most of their issue slots on per-lane loads, addresses, bounds and
// branches: with 24 SMs the prefill combine issued 41M (registers) / 63M (cp.async)
// instructions for ~9M adds (ncu, world size 1). Same adds in the same order as sum_rows.
// ring: this warp's (BulkRing below).
constexpr int BULK_STAGES = 3;
// A bulk step is BULK_WIDTH register steps wide (2 KB of bf16 a row), and a stage holds
// BULK_BATCH such rows: the same 4 KB a stage as 4 rows of 1 KB, with half the copies and half
// the steps' overhead per element (round 31: 24-SM prefill combine 361 -> 326 us at world
// size 1, 44.8M -> 41.2M instructions; the accumulators need more than 96 registers, which the
// bulk kernels have: one block per SM).
constexpr int BULK_WIDTH = 2, BULK_BATCH = ROW_BATCH / BULK_WIDTH;
static_assert(BULK_BATCH >= 1 && (BULK_BATCH & (BULK_BATCH - 1)) == 0,
              "sum_units_bulk spreads units by lane & (BULK_BATCH - 1)");
template <typename T, int N>
constexpr int bulk_chunks() { return BULK_WIDTH * chunks_per_step<T, N>(); }
template <typename T, int N>
constexpr int bulk_row_bytes() { return 32 * N * bulk_chunks<T, N>() * (int)sizeof(T); }
template <typename T, int N>
constexpr int bulk_warp_bytes() { return BULK_STAGES * BULK_BATCH * bulk_row_bytes<T, N>(); }

// A warp's ring of bulk stages (sum_rows_bulk, sum_units_bulk), carried from item to item and
// from the send items to the receive items: between items every task issued has been summed,
// so one slot serves both cursors there. Slot and parities in registers, the addresses as
// shared-memory addresses: no division by the ring's size, no address conversion per task.
struct BulkRing {
  unsigned stages_sa;  // BULK_STAGES stages of BULK_BATCH rows of bulk_row_bytes, shared-memory address
  unsigned bars_sa;    // one mbarrier per stage (8 bytes each), shared-memory address
  int slot;            // the stage the next task is issued to and summed from
  unsigned parity;     // bit d: the phase parity stage d completes next
};
__device__ __forceinline__ int next_slot(int d) { return d + 1 == BULK_STAGES ? 0 : d + 1; }
// Waits for the task in the ring's slot, moves the ring on and returns that task's stage as a
// shared-memory address (read by lds16: no generic-to-shared conversion per task).
__device__ __forceinline__ unsigned ring_take(BulkRing& ring, int stage_bytes) {
  const int slot = ring.slot;
  mbar_wait(ring.bars_sa + slot * 8, (ring.parity >> slot) & 1u);
  ring.parity ^= 1u << slot;
  ring.slot = next_slot(slot);
  return ring.stages_sa + slot * stage_bytes;
}
// A lane's C chunks of one staged row; row: the row's shared address plus this lane's
// offset, so every read is that register plus an immediate.
template <typename T, int N, int C>
__device__ __forceinline__ void read_stage(VecT<T, N> (&raw)[C], unsigned row) {
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int pc = 0; pc < vec_pieces<T, N>(); ++pc)
      reinterpret_cast<int4*>(&raw[c])[pc] = lds16(row + (c * 32 * vec_pieces<T, N>() + pc) * 16);
}

// One item's bulk row sums (WT: weighted). Steps outer, row batches inner, so a step's first
// batch (its first row added to 0.0f in place of zeroing the sums) and its emit are known by
// the loop, not tested per task. Lane j holds row j's address for the whole item, so a task's
// copies are issued by the lanes of its rows from registers, at a running byte offset, the
// full row but in the slice's last step. (Round 32: round 31's task loop spent ~140
// instructions a task beside the ~136 of its sums, ncu.)
template <typename T, int N, bool WT, typename Emit>
__device__ __forceinline__ void sum_rows_bulk_items(const T* const* rows, const float* ws, int nk, int h0, int h1,
                                                    BulkRing& ring, Emit&& emit) {
  constexpr int C = bulk_chunks<T, N>(), RB = BULK_BATCH, D = BULK_STAGES;
  constexpr int STEP = 32 * N * C, ROW = bulk_row_bytes<T, N>();
  const int lane = threadIdx.x & 31;
  const int nb = (nk + RB - 1) / RB;
  const int steps = h1 > h0 ? (h1 - h0 + STEP - 1) / STEP : 0;  // empty slice: none
  const unsigned last_bytes = steps ? (unsigned)((h1 - h0 - (steps - 1) * STEP) * (int)sizeof(T)) : 0u;
  // Rows lane and lane + 32 (topk may reach 64): a batch's rows lie in one such half. As
  // integers: a lane without such a row moves its 0 on like the others, never to copy from it.
  unsigned long long row_lo = lane < nk ? reinterpret_cast<unsigned long long>(rows[lane] + h0) : 0ull;
  unsigned long long row_hi = lane + 32 < nk ? reinterpret_cast<unsigned long long>(rows[lane + 32] + h0) : 0ull;
  int left = steps * nb, j0 = 0, islot = ring.slot;  // issue cursor: tasks not yet issued, batch's first row, stage
  auto issue = [&]() {
    if (left == 0) return;
    const unsigned bytes = left <= nb ? last_bytes : (unsigned)ROW;  // the last nb tasks: the last step
    const unsigned bar = ring.bars_sa + islot * 8;
    const int r = lane - (j0 & 31);  // this lane's row in the batch
    if (lane == 0) mbar_arrive_expect(bar, min(RB, nk - j0) * bytes);
    if (r >= 0 && r < RB && j0 + r < nk)
      bulk_load(ring.stages_sa + (islot * RB + r) * ROW, reinterpret_cast<const void*>(j0 < 32 ? row_lo : row_hi), bytes,
                bar);
    --left;
    islot = next_slot(islot);
    if ((j0 += RB) >= nk) {  // the step's last batch: every row moves on to the next step
      j0 = 0;
      row_lo += ROW;
      row_hi += ROW;
    }
  };
#pragma unroll
  for (int q = 0; q < D - 1; ++q) issue();
  const unsigned lane_off = (unsigned)lane * vec_pieces<T, N>() * 16;
  float acc[C][N];
  // Task b of a step: its batch's rows summed. full: a batch of RB rows, so no row is tested;
  // first: the step's first batch (its first row added to 0.0f in place of the sums).
  auto task = [&](int b, auto full, auto first) {
    __syncwarp();  // every lane has read the previous task's stage, which the issue below refills
    issue();
    const unsigned st = ring_take(ring, RB * ROW) + lane_off;
    const int j0 = b * RB;
    VecT<T, N> raw[C];
    read_stage<T, N, C>(raw, st);
    add_row_scaled<T, N, C, WT, decltype(first)::value>(acc, raw, WT ? ws[j0] : 1.0f);
#pragma unroll
    for (int r = 1; r < RB; ++r) {
      if (decltype(full)::value || j0 + r < nk) {
        read_stage<T, N, C>(raw, st + r * ROW);
        add_row_scaled<T, N, C, WT>(acc, raw, WT ? ws[j0 + r] : 1.0f);
      }
    }
  };
  // A step's tasks: nfull full batches, then one of nk % RB rows; the step's first and the
  // later ones apart, so the hot loop (full, not first) tests neither.
  const int nfull = nk / RB;
  constexpr std::true_type yes{};
  constexpr std::false_type no{};
  for (int s = 0; s < steps; ++s) {
    if (nfull > 0) {
      task(0, yes, yes);
      for (int b = 1; b < nfull; ++b) task(b, yes, no);
      if (nfull < nb) task(nfull, no, no);
    } else {
      task(0, no, yes);
    }
    emit(h0 + lane * N + s * STEP, acc);
  }
}
// ws: the rows' weights, read only when `weighted` (a shared array: a pointer that may be null
// cost each task its conversion to a shared address and the null test).
template <typename T, int N, typename Emit>
__device__ __forceinline__ void sum_rows_bulk(const T* const* rows, const float* ws, bool weighted, int nk, int h0,
                                              int h1, BulkRing& ring, Emit&& emit) {
  if (weighted) sum_rows_bulk_items<T, N, true>(rows, ws, nk, h0, h1, ring, emit);
  else sum_rows_bulk_items<T, N, false>(rows, ws, nk, h0, h1, ring, emit);
}

// Unweighted sums of a few rows by bulk copies over units (the fused combine's receive half:
// a token's partials, one per holding rank): the item's (step, row) pairs in step-major
// order, row fastest, BULK_BATCH units a task whatever the row count, so one or two partials
// still fill a stage (a task of sum_rows_bulk holds rows of one step only). Lanes 0..BULK_BATCH-1
// find their units in parallel; stage and parity come from the ring's registers; a step's
// first row is added to 0.0f in place of zeroing the sums. Same adds in the same order as
// sum_rows: row j ascending from 0.0f, emit(h, acc) after each step's last row. (As the send's
// loads, with weights, these tasks were slower than sum_rows_bulk's: 24-SM prefill combine
// 457 -> 476-520 us at world size 1, round 28.) The issue / ring_take loop is sum_rows_bulk's;
// a shared helper for it reordered the measured send kernel's SASS, so both keep their own.
template <typename T, int N, typename Emit>
__device__ __forceinline__ void sum_units_bulk(const T* const* rows, int nk, int h0, int h1, BulkRing& ring,
                                               Emit&& emit) {
  constexpr int C = bulk_chunks<T, N>(), P = vec_pieces<T, N>(), RB = BULK_BATCH, D = BULK_STAGES;
  constexpr int STEP = 32 * N * C, ROW = bulk_row_bytes<T, N>();
  const int lane = threadIdx.x & 31;
  const int steps = h1 > h0 ? (h1 - h0 + STEP - 1) / STEP : 0;  // empty slice: none
  const int nu = steps * nk;
  const int ntasks = (nu + RB - 1) / RB;
  const unsigned last_bytes = steps ? (unsigned)((h1 - h0 - (steps - 1) * STEP) * (int)sizeof(T)) : 0u;
  int iv = 0, is = 0, ij = 0, islot = ring.slot;  // the next task to issue: unit iv = (step is, row ij)
  auto issue = [&]() {
    if (iv >= nu) return;
    // Lane r < RB takes unit iv + r: its step s and row j, its bytes (only the last step may be short).
    int j = ij + (lane & (RB - 1)), s = is;
    while (j >= nk) j -= nk, ++s;
    const bool mine = lane < RB && iv + lane < nu;
    const unsigned bytes = mine ? (s == steps - 1 ? last_bytes : (unsigned)ROW) : 0u;
    const unsigned total = __reduce_add_sync(0xffffffffu, bytes);
    const unsigned bar = ring.bars_sa + islot * 8;
    if (lane == 0) mbar_arrive_expect(bar, total);
    if (mine) bulk_load(ring.stages_sa + (islot * RB + lane) * ROW, rows[j] + h0 + s * STEP, bytes, bar);
    iv += RB;
    for (ij += RB; ij >= nk; ij -= nk) ++is;
    islot = next_slot(islot);
  };
#pragma unroll
  for (int q = 0; q < D - 1; ++q) issue();
  float acc[C][N];
  int cs = 0, cj = 0;  // the unit being summed: step cs, row cj
  for (int q = 0; q < ntasks; ++q) {
    __syncwarp();  // every lane has read the previous task's stage, which the issue below refills
    issue();
    const unsigned st = ring_take(ring, RB * ROW) + (unsigned)lane * P * 16;
    // Not unrolled: each unit may end a step (four copies of the emit's stores).
#pragma unroll 1
    for (int r = 0; r < RB; ++r) {
      if (q * RB + r < nu) {
        VecT<T, N> raw[C];
        read_stage<T, N, C>(raw, st + r * ROW);
        if (cj == 0) add_row_scaled<T, N, C, false, true>(acc, raw, 1.0f);
        else add_row_scaled<T, N, C, false>(acc, raw, 1.0f);
        if (cj == nk - 1) emit(h0 + lane * N + cs * STEP, acc);
        if (++cj == nk) cj = 0, ++cs;
      }
    }
  }
}

// Row sums of the two-kernel send (round 84, LOADS_STEP_BULK; where step_bulk_call says): a
// register step's rows (1 KB each) come by one bulk copy a row, all of the item's rows (topk <=
// STEP_BULK_ROWS) into this warp's 8 KB buffer, counted by one mbarrier: one load latency a step,
// where sum_rows' batches of ROW_BATCH rows take two (round 83 did the same for the padded
// combine's send, pad_combine_partials_kernel's send_bulk: 0.4-0.8 us less at 1-32 tokens). Same adds in the same order as sum_rows: row j ascending,
// the first added to 0.0f. parity: the phase this warp's barrier completes next, carried from
// item to item (it flips once a step).
constexpr int STEP_BULK_ROWS = 8;
template <typename T, int N>
constexpr int step_bulk_row_bytes() { return 32 * N * chunks_per_step<T, N>() * (int)sizeof(T); }
template <typename T, int N>
constexpr int step_bulk_smem() { return NWARPS * STEP_BULK_ROWS * step_bulk_row_bytes<T, N>(); }
template <typename T, int N, bool WT, typename Emit>
__device__ __forceinline__ void sum_rows_step_bulk_items(const T* const* rows, const float* ws, int nk, int h0, int h1,
                                                         unsigned buf_sa, unsigned bar_sa, unsigned& parity,
                                                         Emit&& emit) {
  static_assert(N * sizeof(T) % 16 == 0, "bulk copies move whole 16-byte pieces");
  constexpr int C = chunks_per_step<T, N>(), STEP = 32 * N * C, ROW = step_bulk_row_bytes<T, N>();
  const int lane = threadIdx.x & 31;
  const T* const mine = lane < nk ? rows[lane] : nullptr;  // lane j copies row j
  const unsigned lane_sa = buf_sa + (unsigned)lane * vec_pieces<T, N>() * 16;
  for (int h = h0; h < h1; h += STEP) {
    const unsigned bytes = (unsigned)((h1 - h < STEP ? h1 - h : STEP) * (int)sizeof(T));
    bulk_rows_one_wait(buf_sa, ROW, mine + h, bytes, nk, bar_sa, parity);
    float acc[C][N];
    VecT<T, N> raw[C];
    read_stage<T, N, C>(raw, lane_sa);
    add_row_scaled<T, N, C, WT, true>(acc, raw, WT ? ws[0] : 1.0f);
#pragma unroll 1
    for (int j = 1; j < nk; ++j) {
      read_stage<T, N, C>(raw, lane_sa + j * ROW);
      add_row_scaled<T, N, C, WT>(acc, raw, WT ? ws[j] : 1.0f);
    }
    emit(h + lane * N, acc);  // lanes past h1 read stale bytes; emit stores nothing past h1
    __syncwarp();             // every lane has read the buffer the next step's copies refill
  }
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
// 240 vs 208 us, docs/PERF_NOTES.md.) With bulk loads, 128: that kernel is fused (no receive
// beside it) and its ring's shared memory holds one block per SM anyway; the wide bulk steps'
// sums spilled at 96.
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

// The rows (and weights, 1 without) of a work item held here (its row map rm: topk rows or -1),
// in k order, into rows[] / ws[] (shared, one warp's); returns how many. The warp's lanes read
// the row map together.
// ROLLED: the loop kept as one body (it runs once for topk <= 32; round 43: its unrolled copies
// were ~570 instructions the decode send jumped over); the fused send's shared-memory row loads
// keep it unrolled, where rolling it spilled.
template <typename TY, bool ROLLED>
__device__ __forceinline__ int gather_rows(const int* rm, int topk, int H, const TY* y, const float* w, const TY** rows,
                                           float* ws, int lane) {
  int nk = 0;
  auto gather = [&](int k0) {
    int k = k0 + lane;
    int row = k < topk ? rm[k] : -1;
    unsigned b = __ballot_sync(0xffffffffu, row >= 0);
    if (row >= 0) {
      int pos = nk + __popc(b & ((1u << lane) - 1));
      rows[pos] = y + (long long)row * H;
      ws[pos] = w ? w[row] : 1.0f;
    }
    nk += __popc(b);
  };
  if constexpr (ROLLED) {
#pragma unroll 1
    for (int k0 = 0; k0 < topk; k0 += 32) gather(k0);
  } else {
    for (int k0 = 0; k0 < topk; k0 += 32) gather(k0);
  }
  __syncwarp();
  return nk;
}

// ---------------------------------------------------------------------------------------
// Round-tagged partials (Params::ll_comb): a vector of N values at element h of a partial sits at
// byte 2 * h * sizeof(T) of its tagged copy, each 4 payload bytes in the low half of an 8-byte
// word whose high half is the round. Only for whole 16-byte vectors (TAGGED_VEC). The two-kernel
// combine has instances of each form (TAGGED: the send's emit stores tagged words and raises no
// flag, the receive sums by sum_tagged_rows), the arena's chosen at launch: TAG_EVERY for arenas
// of at most LL_COMBINE tokens, TAG_BY_CALL (round 59) for larger ones with the room, where both
// forms share one kernel and each call chooses (call_tagged). Round 49 measured such a kernel's
// plain path 0.4-0.8 us slower at world size 1 (code it does not run, round 42); run 43 at EP2
// measured what tagging gains the 1- and 32-token calls of the 128-token arena (1.4-1.5 us).
template <typename T, int N>
constexpr bool TAGGED_VEC = N * sizeof(T) % 16 == 0;
template <typename T, int N>
__device__ __forceinline__ void store_tagged_n(char* dst, const float* f, unsigned long long round) {
  VecT<T, N> tmp;
#pragma unroll
  for (int i = 0; i < N; ++i) tmp.v[i] = from_f<T>(f[i]);
#pragma unroll
  for (int b = 0; b < (int)(N * sizeof(T) / 16); ++b)
    st_tagged_int4(dst + 32 * b, reinterpret_cast<const int4*>(&tmp)[b], round);
}
// The rank of the j-th set bit of mask (a timed-out poll's report).
__device__ __forceinline__ int nth_rank(unsigned long long mask, int j) {
  for (; j > 0; --j) mask &= mask - 1;
  return __ffsll((long long)mask) - 1;
}

// sum_rows' unweighted sum for the tagged partials at src[0..nr) (their ranks: the set bits of
// mask), in the same order: acc[c] over elements [h + c*32*N, ...) below h1. TAGGED_RB ranks'
// words are loaded together; while any carries an older round, all are loaded again (one rolled
// poll: a poll per word, inlined, tripled the receive's code).
constexpr int TAGGED_RB = 2;
template <typename TX, int N, int C>
__device__ __forceinline__ void sum_tagged_rows(const Params& p, const char* const* src, unsigned long long mask,
                                                int nr, int h, int h1, unsigned long long round, float (&acc)[C][N]) {
  constexpr int NW = N * sizeof(TX) / 8;  // 16-byte words of two tagged words per vector
  zero_sums(acc);
#pragma unroll 1
  for (int j0 = 0; j0 < nr; j0 += TAGGED_RB) {
    ulonglong2 wv[TAGGED_RB][C][NW];
    auto load = [&] {
      bool now = true;
#pragma unroll
      for (int r = 0; r < TAGGED_RB; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
          for (int u = 0; u < NW; ++u) {
            const bool live = j0 + r < nr && h + c * 32 * N < h1;
            wv[r][c][u] = live ? ld_tagged2(src[j0 + r] + 2LL * (h + c * 32 * N) * sizeof(TX) + 16 * u)
                               : make_ulonglong2(0, 0);
            now = now && (!live || tagged_now(wv[r][c][u], round));
          }
      return now;
    };
    bounded_poll(p, load, PH_COMBINE_RECV, nth_rank(mask, j0), round);
#pragma unroll
    for (int r = 0; r < TAGGED_RB; ++r) {
      if (j0 + r >= nr) break;
      VecT<TX, N> raw[C];
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int u = 0; u < NW; ++u) {
          reinterpret_cast<unsigned*>(&raw[c])[2 * u] = (unsigned)wv[r][c][u].x;
          reinterpret_cast<unsigned*>(&raw[c])[2 * u + 1] = (unsigned)wv[r][c][u].y;
        }
      add_row_scaled<TX, N, C, false>(acc, raw, 1.0f);
    }
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

template <typename TX, typename TO, int N, int RB, bool COUNTER, int TAGGED>
__device__ __forceinline__ void combine_recv_items(const Params& p, const RecvArgs<TO>& ra, const TX** sh_src, int nwarps,
                                                   BulkRing& ring, bool bulk);
__device__ void combine_finish(const Params& p, unsigned long long round);

// The combine send's work, for combine_send_kernel below. FUSED (the fused combine, the default
// for arenas past the overlap limit, see create_ctx): the send items are taken from a
// counter (state[2]); a warp that finds none left goes on to the receive items (counter
// state[7]), so the receive starts where the send ends, in the same blocks, without a second
// launch; launched on the side stream like the overlapped receive, so the caller's stream never
// waits in it.
template <bool NVL, typename TY, typename TX, int N, bool FUSED, int LOADS, int TAGGED>
__device__ __forceinline__ void combine_send_body(const Params& p, const TY* __restrict__ y, const float* __restrict__ w,
                                                  const RecvArgs<TY>& ra) {
  launch_dependents();  // a receive launched behind it by PDL (combine_whole) may start now
  constexpr int C = chunks_per_step<TY, N>();
  // LOADS_ASYNC: async_warp_int4s<TY, N>() int4 per warp. LOADS_BULK: bulk_warp_bytes<TY, N>()
  // per warp, then BULK_STAGES mbarriers per warp.
  extern __shared__ int4 async_smem[];
  __shared__ const TY* sh_rows[NWARPS][64];
  __shared__ float sh_w[NWARPS][64];
  const unsigned long long round = combine_round(p);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  BulkRing ring{};  // LOADS_BULK: this warp's, for its send items and then its receive items
  if constexpr (LOADS == LOADS_BULK) {
    char* base = reinterpret_cast<char*>(async_smem);
    ring.stages_sa = smem_addr(base + warp * bulk_warp_bytes<TY, N>());
    auto* bars = reinterpret_cast<unsigned long long*>(base + NWARPS * bulk_warp_bytes<TY, N>()) + warp * BULK_STAGES;
    ring.bars_sa = smem_addr(bars);
    if (lane == 0) {
      for (int d = 0; d < BULK_STAGES; ++d) mbar_init(bars + d, 1);
      mbar_init_fence();
    }
    __syncwarp();
  }
  // LOADS_STEP_BULK: this warp's buffer of STEP_BULK_ROWS rows, then its mbarrier.
  unsigned step_buf_sa = 0, step_bar_sa = 0, step_parity = 0;
  if constexpr (LOADS == LOADS_STEP_BULK) {
    char* base = reinterpret_cast<char*>(async_smem);
    step_buf_sa = smem_addr(base + warp * (STEP_BULK_ROWS * step_bulk_row_bytes<TY, N>()));
    auto* bar = reinterpret_cast<unsigned long long*>(base + step_bulk_smem<TY, N>()) + warp;
    step_bar_sa = smem_addr(bar);
    if (lane == 0) {
      mbar_init(bar, 1);
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
  // Round-tagged partials (TAGGED: the arena's instance, Params::ll_comb; by call for TAG_BY_CALL):
  // the two-kernel nvlink combine (row loads by registers or a step's bulk copies), whole 16-byte vectors.
  static_assert(!TAGGED || (!FUSED && (LOADS == LOADS_REGS || LOADS == LOADS_STEP_BULK) && TAGGED_VEC<TX, N>),
                "no tagged form here");
  static_assert(LOADS != LOADS_STEP_BULK || !FUSED, "step bulk loads: the two-kernel send's");
  const bool tagged = call_tagged<TAGGED>(p);
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
    constexpr bool rolled = LOADS == LOADS_REGS || LOADS == LOADS_STEP_BULK;
    const int nk = gather_rows<TY, rolled>(p.rowmap + u * topk, topk, H, y, w, sh_rows[warp], sh_w[warp], lane);
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
    // Replica 0's copy found once per item (the compiler unrolled the replica loop, and loaded
    // each replica's address per chunk); the others, when tp > 1, in a loop.
    TX* const dst0 = NVL ? reinterpret_cast<TX*>(p.peer[g * p.tp] + dst_off) : nullptr;
    const long long tag_off = tagged ? comb_tagged_off(p, p.rank, t) : 0;
    // put (round 63): the other replicas' tagged words staged after the plain partials' staging,
    // slot (g, t) for t < ll_comb (a tagged call has no more tokens), then put with no signal.
    const long long tag_slot = (long long)G * M + 2LL * ((long long)g * p.ll_comb + t);  // in part_bytes
    char* const tag_stage = !NVL && tagged ? p.sym + p.off_stage_comb + tag_slot * p.part_bytes : nullptr;
    auto emit = [&]<int CC>(int h, float (&acc)[CC][N]) {  // CC: the step's chunks (bulk_chunks with bulk loads)
#pragma unroll
      for (int c = 0; c < CC; ++c) {
        const int hh = h + c * 32 * N;
        if (hh < h1) {
          if (tagged) {
            if constexpr (NVL) {
#pragma unroll 1
              for (int q = 0; q < p.tp; ++q)
                store_tagged_n<TX, N>(p.peer[g * p.tp + q] + tag_off + 2LL * hh * sizeof(TX), acc[c], round);
            } else {
              if (self_q >= 0) store_tagged_n<TX, N>(p.sym + tag_off + 2LL * hh * sizeof(TX), acc[c], round);
              if (staged) store_tagged_n<TX, N>(tag_stage + 2LL * hh * sizeof(TX), acc[c], round);
            }
          } else if constexpr (NVL) {
            store_n<TX, N>(dst0 + hh, acc[c]);
#pragma unroll 1
            for (int q = 1; q < p.tp; ++q) store_n<TX, N>(reinterpret_cast<TX*>(p.peer[g * p.tp + q] + dst_off) + hh, acc[c]);
          } else {
            if (self_q >= 0) store_n<TX, N>(reinterpret_cast<TX*>(p.sym + dst_off) + hh, acc[c]);
            if (staged) store_n<TX, N>(stage + hh, acc[c]);
          }
        }
      }
    };
    if constexpr (LOADS == LOADS_STEP_BULK) {
      if (w)
        sum_rows_step_bulk_items<TY, N, true>(sh_rows[warp], sh_w[warp], nk, h0, h1, step_buf_sa, step_bar_sa,
                                              step_parity, emit);
      else
        sum_rows_step_bulk_items<TY, N, false>(sh_rows[warp], sh_w[warp], nk, h0, h1, step_buf_sa, step_bar_sa,
                                               step_parity, emit);
    } else if constexpr (LOADS == LOADS_BULK) {
      sum_rows_bulk<TY, N>(sh_rows[warp], sh_w[warp], w != nullptr, nk, h0, h1, ring, emit);
    } else if constexpr (LOADS == LOADS_ASYNC) {
      sum_rows_pipelined<TY, N>(sh_rows[warp], w ? sh_w[warp] : nullptr, nk, h0, h1,
                                async_smem + warp * async_warp_int4s<TY, N>(), emit);
    } else {
      // One loop per weighting, each with its adds in one stretch of code.
      auto sum_emit = [&]<bool WEIGHTED>() {
        for (int h = h0 + lane * N; h < h1; h += 32 * N * C) {
          float acc[C][N];
          sum_rows<TY, N, C, ROW_BATCH, WEIGHTED, true>(sh_rows[warp], sh_w[warp], nk, h, h1, acc);
          emit(h, acc);
        }
      };
      if (w) sum_emit.template operator()<true>();
      else sum_emit.template operator()<false>();
    }
    __syncwarp();
    stamp_exit(ST_CSEND_SUMMED);
    if (tagged) {
      // No flag: the words carry their round. put: the staged words to the other replicas.
      if constexpr (!NVL) {
        if (staged && h1 > h0)
          for (int q = 0; q < p.tp; ++q)
            if (q != self_q)
              nvshmemx_putmem_nbi_warp(p.sym + tag_off + 2LL * h0 * sizeof(TX), tag_stage + 2LL * h0 * sizeof(TX),
                                       2 * (size_t)(h1 - h0) * sizeof(TX), p.pe[g * p.tp + q]);
      }
    } else if constexpr (NVL) {
      // The release store alone orders the warp's partial stores before the flag (cumulative
      // over the lanes' writes that __syncwarp ordered before it): no fence.sc.sys in front,
      // which cost decode combine 128 tokens 28.4 -> 25.4 us, prefill 230 -> 222 us (round 13).
      if (lane == 0) {
        stamp_exit(ST_CSEND_FENCED);  // no fence any more: the moment its flag is stored
        for (int q = 0; q < p.tp; ++q) release_flag_at(p, g * p.tp + q, sig_comb(p, p.rank, t, sl, S), round);
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
    // With bulk row loads, the receive items' partials come by bulk copies too (p.bulk_recv),
    // through the same ring, when both dtypes' steps are one ring row.
    constexpr bool can_bulk = LOADS == LOADS_BULK && bulk_row_bytes<TX, N>() == bulk_row_bytes<TY, N>();
    combine_recv_items<TX, TY, N, 2, true, TAG_NONE>(p, ra, sh_src[warp], NWARPS, ring, can_bulk && p.bulk_recv);
    if (blockIdx.x == 0 && threadIdx.x < p.W)
      wait_flag(p, sigp(p, p.sym, sig_barrier(p, threadIdx.x)), round, PH_COMBINE_RECV, threadIdx.x);
    combine_finish(p, round);
  }
}

// The combine send: the two-kernel combine's (arenas up to the overlap limit, or COMBINE_FUSED=0;
// in decode-sized ones a latency kernel), its parameter lines fetched together at entry (round 48:
// decode combine 0.3-0.8 us faster), or with FUSED the fused combine's (send items, then receive
// items; prefill-sized arenas), without that warm-up (the form rounds 56-57 measured). Rounds 48-56
// had the fused form 19 us slower with __grid_constant__ parameters (192 vs 173 us at world size 1,
// prefill); run 42 found why: each receive warp ran its sums split (lane 0 apart from lanes 1-31,
// after lane 0's flag poll). The receive now waits as a whole warp (wait_flags_warp).
template <bool NVL, typename TY, typename TX, int N, int LOADS = LOADS_REGS, int TAGGED = TAG_NONE, bool FUSED = false>
__global__ void __maxnreg__(LOADS == LOADS_BULK ? 128 : 96)
    combine_send_kernel(const __grid_constant__ Params p, const TY* __restrict__ y, const float* __restrict__ w,
                        const __grid_constant__ RecvArgs<TY> ra) {
  stamp_entry(ST_CSEND);
  if constexpr (!FUSED) warm_param_lines(p, ra);  // ra's line holds y and w too
  combine_send_body<NVL, TY, TX, N, FUSED, LOADS, TAGGED>(p, y, w, ra);
  stamp_exit(ST_CSEND);
}

// ---------------------------------------------------------------------------------------
// Receive items of a combine: one warp per own token (and slice) sums the partials of the
// ranks holding its experts in rank order (float32, from 0.0f) and rounds to the output
// dtype; zeros for rows past n and tokens with no expert.
// bulk: the partials of items with at least one come by bulk copies through this warp's ring
// (sum_units_bulk); otherwise by registers (sum_rows).
template <typename TX, typename TO, int N, int RB, bool COUNTER, int TAGGED>
__device__ __forceinline__ void combine_recv_items(const Params& p, const RecvArgs<TO>& ra, const TX** sh_src, int nwarps,
                                                   BulkRing& ring, bool bulk) {
  constexpr int C = chunks_per_step<TX, N>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int topk = p.topk, H = p.H, M = p.M, E = p.E, L = p.L;
  const unsigned long long round = combine_round(p);
  int n = ra.nptr ? *ra.nptr : ra.n_host;
  n = n < 0 ? 0 : (n > ra.rows ? ra.rows : n);
  const int S = call_slices(p);
  static_assert(!TAGGED || (!COUNTER && TAGGED_VEC<TX, N>), "no tagged form here");
  const bool tagged = call_tagged<TAGGED>(p);
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
#pragma unroll 1
      for (int k = lane; k < topk; k += 32) {
        int id = ra.ids[(long long)t * topk + k];
        if (id >= 0 && id < E) mask |= 1ULL << (id / L);
      }
    }
    unsigned lo = __reduce_or_sync(0xffffffffu, (unsigned)(mask & 0xffffffffu));
    unsigned hi = __reduce_or_sync(0xffffffffu, (unsigned)(mask >> 32));
    mask = ((unsigned long long)hi << 32) | lo;
    // The flags of the holding ranks' partials, the warp waiting as one (wait_flags_warp: the
    // same loop trips in every lane). The send cuts a partial into the call's S slices by steps
    // of its output dtype's chunks (TO's); where the partial's dtype has the same chunks, the
    // sender's slice sl is exactly this item's range: one flag a rank. Otherwise (float32
    // partials of 16-bit outputs) every slice flag of every holding rank. Tagged partials have
    // none: their words are polled as they are summed.
    if (!tagged) {
      constexpr bool same_slices = chunks_per_step<TX, N>() == chunks_per_step<TO, N>();
      const int nq = same_slices ? p.W : p.W * S;
#pragma unroll 1
      for (int q0 = 0; q0 < nq; q0 += 32) {
        const int q = q0 + lane, r = same_slices ? q : q / S;
        const bool need = q < nq && ((mask >> r) & 1);
        wait_flags_warp(p, need ? sigp(p, p.sym, sig_comb(p, r, t, same_slices ? sl : q % S, S)) : nullptr, round,
                        PH_COMBINE_RECV, r);
      }
    }
#pragma unroll
    for (int j = 0; j < MAXW / 32; ++j) {  // a lane's ranks lane, lane + 32: no loop a lane could leave early
      const int r = lane + 32 * j;
      if (r < p.W && ((mask >> r) & 1))
        sh_src[__popcll(mask & ((1ULL << r) - 1))] = reinterpret_cast<const TX*>(
            p.sym + (tagged ? comb_tagged_off(p, r, t) : p.off_comb + ((long long)r * M + t) * p.part_bytes));
    }
    __syncwarp();
    const int nr = __popcll(mask);
    int h0, h1;
    slice_range(H, S, sl, 32 * N * C, h0, h1);
    auto store_out = [&]<int CC>(int h, float (&acc)[CC][N]) {
#pragma unroll
      for (int c = 0; c < CC; ++c)
        if (h + c * 32 * N < h1) store_n<TO, N>(ra.out + (long long)t * H + h + c * 32 * N, acc[c]);
    };
    auto sum_plain = [&] {
      if (bulk && nr > 0) {
        fence_proxy_async_global();  // the bulk copies (async proxy) read what the flags' acquire made visible
        sum_units_bulk<TX, N>(sh_src, nr, h0, h1, ring, store_out);
      } else {
        for (int h = h0 + lane * N; h < h1; h += 32 * N * C) {
          float acc[C][N];
          sum_rows<TX, N, C, RB, false, false>(sh_src, nullptr, nr, h, h1, acc);
          store_out(h, acc);
        }
      }
    };
    if constexpr (TAGGED != TAG_NONE) {  // sum_tagged_rows needs whole 16-byte vectors (TAGGED_VEC)
      if (tagged) {
        for (int h = h0 + lane * N; h < h1; h += 32 * N * C) {
          float acc[C][N];
          sum_tagged_rows<TX, N, C>(p, reinterpret_cast<const char* const*>(sh_src), mask, nr, h, h1, round, acc);
          store_out(h, acc);
        }
      } else {
        sum_plain();
      }
    } else {
      sum_plain();
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
template <typename TX, typename TO, int N, int TAGGED = TAG_NONE>
__global__ void __launch_bounds__(NTHREADS)
    combine_recv_kernel(const __grid_constant__ Params p, const __grid_constant__ RecvArgs<TO> ra) {
  stamp_entry(ST_CRECV);
  warm_param_lines(p, ra);
  __shared__ const TX* sh_src[NWARPS][MAXW];
  const unsigned long long round = combine_round(p);
  if (const int r = entering_peer(p); r >= 0) wait_flag(p, sigp(p, p.sym, sig_barrier(p, r)), round, PH_COMBINE_RECV, r);
  BulkRing none{};
  combine_recv_items<TX, TO, N, ROW_BATCH, false, TAGGED>(p, ra, sh_src[threadIdx.x >> 5], (int)blockDim.x >> 5, none,
                                                          false);
  combine_finish(p, round);
  // Launched by PDL behind the send (combine_whole), this grid may otherwise end before the
  // send does; waiting here makes its end imply the send's, so later work on the stream (that
  // may overwrite the send's inputs) is ordered after both. A no-op without PDL.
  grid_dependency_wait();
  stamp_exit(ST_CRECV);
}

}  // namespace moe
