// dispatch_kernels.cuh: the dispatch kernels: send (and its copy-engine flags), the receive's plan and copy, and
// the direct receive.
#pragma once

#include "device_common.cuh"

namespace moe {

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
// With SELF_SEND (p.own_group < 0) they get their copy too, so one GPU runs the cross-rank path.
// Register cap (<= 64, __launch_bounds__(.., 8)): SEND_BLOCKS_PER_SM send blocks plus one
// 512-thread copy block at 64 registers must fit one SM's 64K registers, or the overlapped
// copy cannot start until the send blocks retire (it did: 90 registers, tail 168 us).
constexpr int SEND_THREADS = 128;
constexpr int SEND_BLOCKS_PER_SM = 3;
// The send's token count: the device count when given, else the host's, clamped to x's rows.
__device__ __forceinline__ int send_count(const int* __restrict__ nptr, int n_host, int rows) {
  const int n = nptr ? *nptr : n_host;
  return n < 0 ? 0 : (n > rows ? rows : n);
}

// The send's inputs as dispatch_fused_kernel takes them (its put instance spills 12 B more
// than with separate pointers, 116 B, its nvlink instance the same 4 B). dispatch_send_kernel
// keeps separate restrict pointers: as this struct its put instance spilled 24 B more.
struct SendIn {
  const char* x;
  const int* ids;
  const float* w;      // null when unweighted
  const float* scale;  // fp8 only
  const int* nptr;     // the device token count, or null: n_host
  int n_host;
  int rows;            // x's rows
  __device__ __forceinline__ int count() const { return send_count(nptr, n_host, rows); }
};

// The send's work for the calling block (of any size): the entered flags, the table's share,
// then its tokens. Also the first half of dispatch_fused_kernel.
// ROWS: p.ll_rows (round-tagged rows, nvlink); LEAN: the fused dispatch's default instance
// (dispatch_fused_kernel: direct, no copy-engine send, the switches at their defaults); TLL,
// SMALL: the table's format and size where the instance fixes them (write_table_direct).
template <bool NVL, bool ROWS = false, bool LEAN = false, int TLL = -1, bool SMALL = false>
__device__ __forceinline__ void dispatch_send_body(const Params& p, const char* __restrict__ x,
                                                   const int* __restrict__ ids, const float* __restrict__ w,
                                                   const float* __restrict__ scale, int n, unsigned long long round) {
  const int tid = threadIdx.x, lane = tid & 31;
  const int E = p.E, L = p.L, topk = p.topk;

  // "Entered": orders nothing of this kernel (earlier kernels' accesses are complete), so a
  // release store without the full system fence on nvlink.
  if (const int r = entering_peer<LEAN>(p); r >= 0) {
    if constexpr (NVL) st_release_sys(sigp(p, p.peer[r], sig_arrive(p, p.rank)), round);
    else raise_flag<false>(p, sig_arrive(p, p.rank), r, round);
  }
  extern __shared__ unsigned send_smem[];  // direct receive only: the table's expert masks
  if (p.replica == 0) send_table<NVL, LEAN, TLL, SMALL>(p, ids, w, n, send_smem, round);
  if (!LEAN && p.ce_send) return;  // the tokens cross by copy engine (launch_ce_send)

  const int aligned_row = (p.row_bytes + 15) & ~15;
  // Block 0 ships the table first, so it takes the last token of each sweep (i = grid-1, ...)
  // and block 1 the first: a single token does not wait behind the table. The same for the
  // direct table's tb blocks: block tb takes the first token.
  const int tb = LEAN || p.direct ? min(p.direct_blocks, (int)gridDim.x) : 1;
  for (int i = (blockIdx.x + gridDim.x - tb) % gridDim.x;; i += gridDim.x) {
    const int t = p.replica + i * p.tp;
    if (t >= n) break;  // uniform over the block
    // Every warp derives the same destination mask from the token's ids.
    unsigned long long mask = 0;
#pragma unroll 1  // once for topk <= 32: no unrolled copies to jump over
    for (int k = lane; k < topk; k += 32) {
      int id = ids[(long long)t * topk + k];
      if (id >= 0 && id < E) mask |= 1ULL << (id / L);
    }
    unsigned lo = __reduce_or_sync(0xffffffffu, (unsigned)(mask & 0xffffffffu));
    unsigned hi = __reduce_or_sync(0xffffffffu, (unsigned)(mask >> 32));
    mask = (((unsigned long long)hi << 32) | lo) & ~p.own_ranks;
    if (!mask) continue;
    const long long slot_off = p.off_disp + ((long long)p.group * p.M + t) * p.slot_bytes;
    const char* xs = x + (long long)t * p.row_bytes;
    if constexpr (NVL) {
      if constexpr (ROWS) {  // round-tagged rows: the receive polls the words themselves, no flag
        const char* ss = reinterpret_cast<const char*>(scale) + (long long)t * p.scale_bytes;
        block_copy_tagged(p, slot_off, mask, xs, p.row_bytes, round);
        if (p.scale_bytes) block_copy_tagged(p, slot_off + 2LL * aligned_row, mask, ss, p.scale_bytes, round);
        continue;
      }
      block_copy_multi(p, slot_off, mask, xs, p.row_bytes);
      if (p.scale_bytes)
        block_copy_multi(p, slot_off + aligned_row, mask,
                         reinterpret_cast<const char*>(scale) + (long long)t * p.scale_bytes, p.scale_bytes);
      __syncthreads();  // every thread's stores of this token precede thread 0's fence + flags
      if (tid == 0) {
        // The release stores alone order the block's row stores (bar.sync before them), as the
        // table's announce does (p.token_release, the default).
        if (!LEAN && !p.token_release) __threadfence_system();
        for (unsigned long long m = mask; m; m &= m - 1)
          st_release_sys(sigp(p, p.peer[__ffsll((long long)m) - 1], sig_token(p, p.group, t)), round);
      }
    } else {
      uint64_t* sig = reinterpret_cast<uint64_t*>(sigp(p, p.sym, sig_token(p, p.group, t)));
      // A peer that NVSHMEM reaches by P2P stores (nvshmem_ptr non-null) takes its put straight
      // from x: such a put is the block's own loads and stores, from any device memory, so the
      // copy into staging (an HBM write, a barrier, a read back) buys nothing there. A peer over
      // a network transport (IB, EFA) needs a registered source: the symmetric staging. One put
      // with its signal carries the row only without scales (a second put's data would not be
      // ordered before the first's signal). Round 55; PUT_FROM_X=0 stages for every peer.
      unsigned long long staged = mask;
      if ((LEAN || p.put_from_x) && !p.scale_bytes) {
        for (unsigned long long m = mask; m; m &= m - 1) {
          const int r = __ffsll((long long)m) - 1;
          if (p.peer[r]) {
            staged &= ~(1ULL << r);
            nvshmemx_putmem_signal_nbi_block(p.sym + slot_off, xs, p.row_bytes, sig, round, NVSHMEM_SIGNAL_SET, p.pe[r]);
          }
        }
        if (!staged) continue;
      }
      char* st = p.sym + p.off_stage_disp + (long long)t * p.slot_bytes;
      block_copy(st, xs, p.row_bytes);
      if (p.scale_bytes)
        block_copy(st + aligned_row, reinterpret_cast<const char*>(scale) + (long long)t * p.scale_bytes, p.scale_bytes);
      __syncthreads();
      const int bytes = aligned_row + p.scale_bytes;
      for (unsigned long long m = staged; m; m &= m - 1)
        nvshmemx_putmem_signal_nbi_block(p.sym + slot_off, st, bytes, sig, round, NVSHMEM_SIGNAL_SET,
                                         p.pe[__ffsll((long long)m) - 1]);
    }
  }
}

template <bool NVL, bool ROWS = false>
__global__ void __launch_bounds__(SEND_THREADS, 8) dispatch_send_kernel(Params p, const char* __restrict__ x,
                                                                     const int* __restrict__ ids,
                                                                     const float* __restrict__ w,
                                                                     const float* __restrict__ scale,
                                                                     const int* __restrict__ nptr, int n_host, int rows) {
  stamp_entry(ST_SEND);
  dispatch_send_body<NVL, ROWS>(p, x, ids, w, scale, send_count(nptr, n_host, rows), p.state[0] + 1);
  stamp_exit(ST_SEND);
}

// Copy-engine send, per chunk of tokens [t0, t1): after the chunk's copies into every
// destination's slots have completed (stream order behind an event), raise the chunk's token
// flags there, so the receive's copy is the same as with the send kernel. The round comes
// from the device (the host does not know it: CUDA graphs replay the same launch).
// `one_fence` (round 38, CE_FLAG_FENCE): the kernel's one system fence orders the completed
// copies before every flag (a fence then a strong store is a release pattern), so the flags are
// relaxed stores; each a release store (=0) took 17-34 us for a ~1000-token chunk beside the
// receive's copy (a fence per store, 4 a thread, under the copy's memory traffic).
__global__ void __launch_bounds__(256) ce_flag_kernel(Params p, int t0, int t1, const int* __restrict__ nptr,
                                                      unsigned long long ranks, bool one_fence) {
  const unsigned long long round = p.state[0] + 1;
  if (nptr) t1 = min(t1, max(0, *nptr));
  __threadfence_system();
  for (int t = t0 + (int)threadIdx.x; t < t1; t += blockDim.x)
    for (unsigned long long m = ranks; m; m &= m - 1) {
      unsigned long long* flag = sigp(p, p.peer[__ffsll((long long)m) - 1], sig_token(p, p.group, t));
      if (one_fence) st_relaxed_sys(flag, round);
      else st_release_sys(flag, round);
    }
}

// Copy-engine send with its flags copied (Ctx::ce_flag_copy): this round's number, written into
// the own group's token flags of the own arena for the first `rows` tokens (slots no peer writes
// and the receive never reads: the own group's tokens come from x), which each chunk's copy
// stream then copies into its destinations' flags behind the chunk's rows. One block, launched as
// the send starts, waiting on nothing.
__global__ void __launch_bounds__(256) ce_round_fill_kernel(Params p, int rows) {
  const unsigned long long round = p.state[0] + 1;
  for (int t = (int)threadIdx.x; t < rows; t += blockDim.x) *sigp(p, p.sym, sig_token(p, p.group, t)) = round;
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
#pragma unroll 1
  for (int g = 0; g < p.G; ++g) nmax = sh_n[g] > nmax ? sh_n[g] : nmax;
  p.state[8] = (unsigned long long)nmax;
}

// The plan's read of the [gridDim.x chunks, L] count matrix: thread columns of W experts each
// (one W * 4-byte load a chunk), R threads a column sharing the chunks, BATCH loads in flight;
// adds chunk c's earlier chunks into before[e] and every chunk into totals[e] (shared).
template <int W, int BATCH>
__device__ __forceinline__ void sum_count_columns(const int* __restrict__ cnt, int L, int c, int tid, int* before,
                                                  int* totals) {
  using Vec = std::conditional_t<W == 4, int4, int>;
  static_assert(sizeof(Vec) == 4 * W, "W must be 1 or 4");
  const int LW = L / W, nch = (int)gridDim.x;
  const int cols = LW < (int)blockDim.x ? LW : (int)blockDim.x;
  const int R = (int)blockDim.x / cols;  // threads per column
  const int r0 = tid / cols;
  if (r0 >= R) return;
  const Vec* rows = reinterpret_cast<const Vec*>(cnt);
  for (int ew = tid % cols; ew < LW; ew += cols) {
    int b[W] = {}, tot[W] = {};
    for (int c0 = r0; c0 < nch; c0 += R * BATCH) {
      Vec v[BATCH];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int cc = c0 + j * R;
        v[j] = cc < nch ? __ldcg(&rows[(long long)cc * LW + ew]) : Vec{};
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int* vj = reinterpret_cast<const int*>(&v[j]);
#pragma unroll
        for (int w = 0; w < W; ++w) {
          tot[w] += vj[w];
          if (c0 + j * R < c) b[w] += vj[w];
        }
      }
    }
#pragma unroll
    for (int w = 0; w < W; ++w) {
      atomicAdd(&before[ew * W + w], b[w]);
      atomicAdd(&totals[ew * W + w], tot[w]);
    }
  }
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
      tids = table_ids(p, g, t);
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
  // and the expert offsets: the loads of a thread are independent (sum_count_columns), so
  // this costs a few L2 round trips, where a serial scan by one block cost one per chunk
  // batch, each slow while a concurrent send loads the memory system (docs/PERF_NOTES.md).
  // Round 33: four experts a thread by 16-byte loads where L % 4 == 0 (rows of L ints, 16-byte
  // aligned), so 4x as many threads share the chunks and each waits for 4x fewer load rounds.
  if (p.plan_vec && (L & 3) == 0) sum_count_columns<4, 8>(p.cnt, L, c, tid, before, totals);
  else sum_count_columns<1, 16>(p.cnt, L, c, tid, before, totals);
  __syncthreads();
  stamp_exit(ST_PLAN_SUMMED);
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
  stamp_exit(ST_PLAN_SCANNED);

  // Phase 2: rows, metadata and the combine row map, one thread per token.
  if (g >= 0) {
    int* rm = p.rowmap + u * topk;
    for (int k = 0; k < topk; ++k) {
      int row = -1;
      if (tids) {
        int e = tids[k] - p.rank * L;
        if (e >= 0 && e < L) {
          row = bit_rank(msk, e, L, tid, bs[e]);  // the chunk's first row at e, then its earlier tokens there
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
// With the work counter and 16-byte aligned rows the row goes by bulk copies instead
// (copy_token_bulk, p.copy_bulk; round 33: the 4096-token DeepSeek copy 147 -> 139 us, DRAM
// 71% -> 75% of peak, at world size 1).
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

// Warp: where token (gg, tt)'s row is read from (the own group's from x, another group's from
// its slot once lane 0 saw its flag; with SELF_SEND every group's from its slot); null when
// there is nothing to copy (no rows, or a timeout).
// copy_token_piece keeps this inline: through the helper (and with its scale source computed
// right after, as there) its dynamic kernel spilled 16 B, twice tried.
__device__ __forceinline__ const char* token_source(const Params& p, const char* __restrict__ x, int nk, int gg, int tt,
                                                    unsigned long long round, int lane) {
  const bool own = gg == p.own_group;
  int arrived = own ? 1 : 0;
  if (!own && nk > 0 && lane == 0)
    arrived = wait_flag(p, sigp(p, p.sym, sig_token(p, gg, tt)), round, PH_DISPATCH_RECV, gg * p.tp + tt % p.tp);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  __syncwarp();  // lane 0's acquire orders the whole warp's reads of the slot
  if (nk == 0 || !arrived) return nullptr;
  return own ? x + (long long)tt * p.row_bytes : p.sym + p.off_disp + ((long long)gg * p.M + tt) * p.slot_bytes;
}
// Its scales: x_scale's row, or the slot's after the row.
__device__ __forceinline__ const char* token_scale_source(const Params& p, const char* __restrict__ xscale,
                                                          const char* src, int gg, int tt) {
  return gg == p.own_group ? xscale + (long long)tt * p.scale_bytes : src + ((p.row_bytes + 15) & ~15);
}

// Warp: a token's scales from ssrc into each of its nk expert rows.
__device__ __forceinline__ void copy_token_scales(const Params& p, float* __restrict__ scales, const char* ssrc,
                                                  const int* rows, int nk, int lane) {
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

// Warp, bulk copies (round 33): token (gg, tt)'s whole row loaded into the warp's shared buffer
// `buf` by one bulk copy (counted by the warp's mbarrier `bar`, phase `parity`), then written to
// each of its nk expert rows by one bulk store each, all issued by lane 0; the scales by the
// lanes. Each row is one sequential burst of writes, and the warp issues ~nk + 4 instructions
// for a row where the register copy issues ~10 per 512 bytes per row. The buffer is refilled
// only after the previous token's stores have read it. Needs 16-byte aligned rows (the caller
// checks); `parity` flips when a row was loaded.
__device__ __forceinline__ void copy_token_bulk(const Params& p, char* __restrict__ tokens, float* __restrict__ scales,
                                                const char* __restrict__ x, const char* __restrict__ xscale,
                                                const int* rows, int nk, int gg, int tt, unsigned long long round,
                                                int lane, unsigned buf, unsigned bar, unsigned& parity) {
  const char* src = token_source(p, x, nk, gg, tt, round, lane);
  if (!src) return;
  if (lane == 0) {
    const unsigned bytes = (unsigned)p.row_bytes;
    bulk_wait_read<0>();
    if (gg != p.own_group) fence_proxy_async_global();  // the bulk load reads what the flag's acquire made visible
    mbar_arrive_expect(bar, bytes);
    bulk_load(buf, src, bytes, bar);
    mbar_wait(bar, parity);
    for (int j = 0; j < nk; ++j) bulk_store(tokens + (long long)rows[j] * p.row_bytes, buf, bytes);
    bulk_commit();
  }
  parity ^= 1u;
  if (p.scale_bytes) copy_token_scales(p, scales, token_scale_source(p, xscale, src, gg, tt), rows, nk, lane);
}

// Warp: piece `piece` of P of a round-tagged slot (p.ll_rows; block_copy_tagged wrote it) into
// the nk expert rows `rows`, the last piece also the scales: each lane loads its words and polls
// those without this round's tag again (no flag: a word that carries the round carries its
// payload). After a timeout whatever the words hold is stored (the round is reported broken).
constexpr int LL_ROW_UNROLL = 2;  // payload vectors in flight per lane (two 16-byte words each)
__device__ __forceinline__ void copy_tagged_piece(const Params& p, char* __restrict__ tokens, float* __restrict__ scales,
                                                  const char* slot, const int* rows, int nk, int piece, int P,
                                                  unsigned long long round, int peer, int lane) {
  if (nk == 0) return;
  const int n16 = p.row_bytes >> 4, per16 = (n16 + P - 1) / P;
  const int c1 = min(n16, (piece + 1) * per16);
  auto payload = [&](const char* w, ulonglong2& a, ulonglong2& b) {
    a = poll_tagged(p, w, a, round, peer);
    b = poll_tagged(p, w + 16, b, round, peer);
    return make_int4((int)(unsigned)a.x, (int)(unsigned)a.y, (int)(unsigned)b.x, (int)(unsigned)b.y);
  };
  for (int c0 = piece * per16 + lane; c0 < c1; c0 += 32 * LL_ROW_UNROLL) {
    ulonglong2 a[LL_ROW_UNROLL], b[LL_ROW_UNROLL];
#pragma unroll
    for (int u = 0; u < LL_ROW_UNROLL; ++u)
      if (c0 + 32 * u < c1) {
        a[u] = ld_tagged2(slot + 32LL * (c0 + 32 * u));
        b[u] = ld_tagged2(slot + 32LL * (c0 + 32 * u) + 16);
      }
    int4 v[LL_ROW_UNROLL];
#pragma unroll
    for (int u = 0; u < LL_ROW_UNROLL; ++u)
      if (c0 + 32 * u < c1) v[u] = payload(slot + 32LL * (c0 + 32 * u), a[u], b[u]);
    for (int j = 0; j < nk; ++j) {
      int4* d = reinterpret_cast<int4*>(tokens + (long long)rows[j] * p.row_bytes);
#pragma unroll
      for (int u = 0; u < LL_ROW_UNROLL; ++u)
        if (c0 + 32 * u < c1) __stcs(d + c0 + 32 * u, v[u]);
    }
  }
  if (p.scale_bytes && piece == P - 1) {  // scales of <= 512 B, 16-byte vectors (create_ctx)
    int4 v{};
    if (lane < (p.scale_bytes >> 4)) {
      const char* w = slot + 2LL * p.row_bytes + 32LL * lane;
      ulonglong2 a = ld_tagged2(w), b = ld_tagged2(w + 16);
      v = payload(w, a, b);
    }
    store_scale_vec(p, scales, rows, nk, lane, v);
  }
}

// Warp: piece `piece` of P of token (gg, tt)'s row (the own group's from x, another group's
// from its slot after its flag) into the nk expert rows `rows`; the last piece also copies the
// scales. Nothing is copied after a timeout.
__device__ __forceinline__ void copy_token_piece(const Params& p, char* __restrict__ tokens, float* __restrict__ scales,
                                                 const char* __restrict__ x, const char* __restrict__ xscale,
                                                 const int* rows, int nk, int gg, int tt, int piece, int P,
                                                 unsigned long long round, int lane) {
  const bool own = gg == p.own_group;
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
  if (p.scale_bytes && piece == P - 1) copy_token_scales(p, scales, ssrc, rows, nk, lane);
}

// Bulk copy's shared memory: NWARPS mbarriers, then a 128-byte aligned row buffer per warp.
__host__ __device__ inline long long copy_bulk_row_stride(const Params& p) { return ((long long)p.row_bytes + 127) & ~127LL; }
__host__ __device__ inline long long copy_bulk_buffer_offset(const Params& p, int warp) {
  return 128 + (long long)warp * copy_bulk_row_stride(p);
}

// BULK (with DYNAMIC; copy_bulk_warps): the first `bulk_warps` warps copy by copy_token_bulk,
// each through its own row buffer in dynamic shared memory (after the warps' mbarriers); the
// others take no items.
template <bool DYNAMIC, bool BULK>
__global__ void __launch_bounds__(NTHREADS, 2) dispatch_copy_kernel(Params p, char* __restrict__ tokens,
                                                                    float* __restrict__ scales,
                                                                    const char* __restrict__ x,
                                                                    const char* __restrict__ xscale, int xrows,
                                                                    int bulk_warps) {
  grid_dependency_wait();  // launched early beside the plan (programmatic launch): its results first
  stamp_entry(ST_COPY);
  __shared__ int sh_rows[NWARPS][64];
  const unsigned long long round = p.state[0] + 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned buf = 0, bar = 0, parity = 0;
  if constexpr (BULK) {
    extern __shared__ __align__(128) unsigned long long bulk_smem[];
    if (warp >= bulk_warps) return;
    bar = smem_addr(bulk_smem + warp);
    buf = smem_addr(bulk_smem) + (unsigned)copy_bulk_buffer_offset(p, warp);
    if (lane == 0) {
      mbar_init(bulk_smem + warp, 1);
      mbar_init_fence();
    }
    __syncwarp();
  }
  const int topk = p.topk, M = p.M, G = p.G, own_g = p.own_group, P = DYNAMIC ? 1 : p.copy_pieces;
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
    const bool own = gg == own_g;
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
    if constexpr (BULK)
      copy_token_bulk(p, tokens, scales, x, xscale, sh_rows[warp], nk, gg, tt, round, lane, buf, bar, parity);
    else
      copy_token_piece(p, tokens, scales, x, xscale, sh_rows[warp], nk, gg, tt, piece, P, round, lane);
    __syncwarp();  // sh_rows is rewritten by the next token
    if constexpr (!DYNAMIC) break;
  }
  if constexpr (BULK)
    if (lane == 0) bulk_wait_all();  // the rows written before the kernel ends
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
// The two-part receive's instances (DYN, round 64): at 72 registers they spilled (11-50 local
// stores; the item loop keeps the scan's values live), at 96 the tagged-rows one 3 and the others
// none; one block an SM still fits, and the send has the other SMs.
constexpr int DIRECT_DYN_MAX_REGS = 96;
// The outputs of the direct receive (dispatch_direct_kernel, dispatch_fused_kernel).
struct DirectOut {
  char* tokens;
  float* scales;
  float* weights;  // null when unweighted
  int64_t* tpe;
  int64_t* offs;
  int* sg;
  int* stok;
  int* sk;
};

// The next item of a two-part receive (DYN, round 64) for the calling warp: a counter in state[9]
// whose high half is the round, so a round's first claim restarts it (no reset between rounds,
// whatever ran in them); past the round's items it keeps counting. One atomicAdd a claim: a CAS
// loop for every claim (round 64 as first built) serialised the ~2000 warps of the second part,
// ~130 us at 64 tokens (run 45). Only the claims that find an older round's count go on to the
// CAS that restarts it, once a round.
__device__ __forceinline__ int claim_item(const Params& p, unsigned long long round, int lane) {
  int it = 0;
  if (lane == 0) {
    unsigned long long* c = &p.state[9];
    constexpr unsigned long long HI = ~0xffffffffULL;
    const unsigned long long tag = (round & 0xffffffffULL) << 32;
    unsigned long long prev = atomicAdd(c, 1ULL);
    while ((prev & HI) != tag) {  // an older round's count: restart it at this round's item 1
      const unsigned long long cur = *reinterpret_cast<volatile unsigned long long*>(c);
      if ((cur & HI) == tag) {
        prev = atomicAdd(c, 1ULL);
      } else if (atomicCAS(c, cur, tag + 1) == cur) {
        prev = tag;  // item 0 is ours
      }
    }
    it = (int)(prev & 0xffffffffULL);
  }
  return __shfl_sync(0xffffffffu, it, 0);
}

// DYN (round 64, the two-part receive of a send-stream arena): no item of its own; after the
// scan each warp takes items by claim_item until the round's are gone, so two launches (a few
// blocks with the send, the rest behind the caller's work) share them.
template <bool LL, bool ROWS = false, bool LEAN = false, bool DYN = false>  // LEAN: see dispatch_fused_kernel
__device__ __forceinline__ void dispatch_direct_body(const Params& p, const DirectOut& o, const char* __restrict__ x,
                                                     const char* __restrict__ xscale, int xrows) {
  char* __restrict__ tokens = o.tokens;
  float* __restrict__ scales = o.scales;
  float* __restrict__ weights = o.weights;
  int64_t* __restrict__ tpe = o.tpe;
  int64_t* __restrict__ offs = o.offs;
  int* __restrict__ sg = o.sg;
  int* __restrict__ stok = o.stok;
  int* __restrict__ sk = o.sk;
  const bool weighted = weights != nullptr;
  extern __shared__ int base[];  // [G + 1][L]: first row of each (group, local expert); [G]: totals
  __shared__ int sh_rows[NWARPS][64];
  __shared__ int sh_n[MAXW];
  __shared__ int4 sh_early[NWARPS][EARLY_INT4S];
  __shared__ int sh_wsum[NWARPS];  // par: each warp's sum of totals
  const unsigned long long round = p.state[0] + 1;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int L = p.L, topk = p.topk, M = p.M, G = p.G, P = p.copy_pieces;
  const int total = G * M;
  // This warp's item. Spread (p.item_spread, round 37): item i is warp i / grid of block
  // (i + tb) % grid, so a token's P pieces are stored by P SMs, not all by one (the arena's
  // pieces fill the grid only at M tokens: with fewer, the rows were written by a few SMs),
  // and the table's tb blocks take the last items, whose receive comes after their write.
  const int nb = (int)gridDim.x, tb = p.direct_blocks < nb ? p.direct_blocks : nb;
  const int item = LEAN || p.item_spread ? warp * nb + ((int)blockIdx.x + nb - tb) % nb : (int)blockIdx.x * NWARPS + warp;
  const bool has_item = !DYN && item < total * P;
  int piece = item % P;
  int gg = 0, tt = 0;
  if (has_item) item_token(p, item / P, gg, tt);
  const char* tbl = p.sym + p.off_tables;
  constexpr bool ll = LL;  // one instance per table format: each keeps only its own registers
  const bool pre = LEAN || p.table_prefetch != 0;
  // The expert offsets by every thread at once (p.par_scan, round 25): thread e holds expert e's
  // total, so a warp scan, the warps' sums and one barrier give every offset; else warp 0 scans
  // runs of experts from shared memory while the others wait (and with more experts than threads).
  // LEAN: the host chose it only where L <= NTHREADS (lean_fused), so the runs' code is not in it.
  const bool par = LEAN || (p.par_scan && L <= (int)blockDim.x);
  int my_total = 0, wincl = 0;  // par: this thread's expert's total, its inclusive scan in the warp
  auto warp_part = [&]() {
    if (!par) return;
    wincl = warp_incl_scan(my_total, lane);
    if (lane == 31) sh_wsum[warp] = wincl;
  };
  const bool have = p.early_load && has_item && gg == p.own_group && tt < xrows &&
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
#pragma unroll 1  // one copy of the polls: a group count past the first batch is rare on the path
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
    const long long coff = table_count_off(p);  // count[E] of each table
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
#pragma unroll 1
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
#pragma unroll 1
      for (int g = 0; g < G; ++g) base[g * L + e] += off;
      off += col;
    }
    if (blockIdx.x == 0 && lane == 31) publish_round(p, offs, L, incl, round, sh_n);
  }
  __syncthreads();
  if (warp == 0) stamp_exit(ST_PLAN_BARRIER);  // the timeline's "barrier": the offsets are scanned
  const long long R = (long long)total * (topk < L ? topk : L);  // rows of the outputs
  if (!DYN && !has_item) return;
  // The warp's own item (DYN: none; each claimed one by claim_item, with nothing loaded before the
  // polls: no early piece, no prefetched ids), its rows and copy.
#pragma unroll 1
  for (int it = DYN ? claim_item(p, round, lane) : 0; !DYN || it < total * P; it = claim_item(p, round, lane)) {
    if constexpr (DYN) {
      piece = it % P;
      item_token(p, it / P, gg, tt);
      tids = reinterpret_cast<const int*>(tbl + (long long)gg * p.table_bytes + table_token_off(p, tt));
    }
    const long long uu = (long long)gg * M + tt;
    const bool live = tt < sh_n[gg] && (gg != p.own_group || tt < xrows);
    int nk = 0;
#pragma unroll 1
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
          v = !DYN && pre && k0 == 0 ? (int)id_pre : __ldcg(tids + k);
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
    } else if (ROWS && gg != p.own_group) {
      copy_tagged_piece(p, tokens, scales, p.sym + p.off_disp + uu * p.slot_bytes, sh_rows[warp], nk, piece, P, round,
                        gg * p.tp + tt % p.tp, lane);
    } else {
      copy_token_piece(p, tokens, scales, x, xscale, sh_rows[warp], nk, gg, tt, piece, P, round, lane);
    }
    if (live) stamp_exit(ST_DIRECT_COPIED);
    if constexpr (!DYN) break;
    __syncwarp();  // sh_rows[warp] is the next item's
  }
}

template <bool LL, bool ROWS = false, bool DYN = false>
__global__ void __maxnreg__(DYN ? DIRECT_DYN_MAX_REGS : DIRECT_MAX_REGS)
    dispatch_direct_kernel(Params p, DirectOut o, const char* __restrict__ x, const char* __restrict__ xscale, int xrows) {
  stamp_entry(ST_COPY);  // the timeline shows it as the copy (there is no plan kernel)
  dispatch_direct_body<LL, ROWS, false, DYN>(p, o, x, xscale, xrows);
  stamp_exit(ST_COPY);
}

// Fused dispatch (round 35; the direct receive on either transport, a whole dispatch on one stream: the
// Communicator's `dispatch`, not its split phases): one launch where there were two on two
// streams. Every block first does its share of the send (entered flags, table, tokens; the
// send kernel's work with this grid), then its direct-receive items. The grid is the direct
// receive's, at most one block per SM (create_ctx), so on an idle GPU every block is resident
// and no receive wait can hold back a send of this rank. Saves a launch and
// the fork and join of the side stream: DeepSeek decode at world size 1, 32 / 128 tokens
// 12.6 / 14.1 -> 10.8 / 12.3 us; 1 token 10.8 -> 10.6 (docs/PERF_NOTES.md, round 35).
// LEAN (round 42): the instance for the switches' defaults (lean_fused, moe_kernels.cu), with
// them and what every fused dispatch is (direct, no copy-engine send) fixed at compile time:
// the alternatives' code leaves the kernel (160 -> 143 KB of SASS), and a launch's first pass
// through it fetches less (DeepSeek decode at world size 1, 1 / 32 / 128 tokens: 0.1-0.6 us
// less; docs/PERF_NOTES.md, round 42).
// SMALL (round 43): a lean instance for calls whose x has at most NTHREADS / topk rows (the host
// knows): the table has one id a thread, and its other forms' code is not compiled in.
template <bool NVL, bool LL, bool ROWS = false, bool LEAN = false, bool SMALL = false>
__global__ void __maxnreg__(DIRECT_MAX_REGS) dispatch_fused_kernel(Params p, SendIn in, DirectOut o) {
  stamp_entry(ST_SEND);
  dispatch_send_body<NVL, ROWS, LEAN, LL ? 1 : 0, SMALL>(p, in.x, in.ids, in.w, in.scale, in.count(), p.state[0] + 1);
  __syncthreads();  // the send's table masks (dynamic shared memory) are the receive's bases next
  stamp_exit(ST_RECV_START);
  dispatch_direct_body<LL, ROWS, LEAN>(p, o, in.x, reinterpret_cast<const char*>(in.scale), in.rows);
  stamp_exit(ST_COPY);
}

}  // namespace moe
