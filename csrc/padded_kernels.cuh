// padded_kernels.cuh: the padded layout's dispatch and combine (moe_backend/padded.py), nvlink only.
//
// The receive buffer holds a slot for every (local expert l, source group g, row i < M): slot
// (l * G + g) * M + i. A sender knows each of its rows' slots from its own routing (the row's rank
// among its group's rows for that expert: the bits below it in the expert's token mask), so it
// stores every row straight into place at the expert's rank and then one round-tagged count word a
// (local expert, sending rank): no table, no exchange of counts before the rows, no copy after
// them. The receive polls its L * W count words. The combine sends each slot's expert output back
// to its source row's (t, k) place, with a round-tagged flag; the source sums them in the
// contract's order (docs/CONTRACT.md): per rank in k order in float32, rounded to the transfer
// dtype, then over ranks.
#pragma once

#include "device_common.cuh"

namespace moe {

// The padded region's layout and this op's device state (set once by pad_create).
struct PadArgs {
  char* base;          // this rank's region
  char* peer[MAXW];    // every rank's region through nvshmem_ptr (this rank's included)
  long long off_tok, off_scale, off_w, off_meta, off_cnt, off_crow, off_cw, off_cflag;
  long long off_tslots;  // [G, M, topk] round-tagged words: source (g, t)'s slot here for each k (-1: not here)
  long long off_part;    // [W, M] partials of part_bytes, as round-tagged words (twice the bytes)
  int part_bytes;        // hidden * transfer dtype bytes
  int partials;          // combine: a partial per (source token, rank) summed here (PADDED_PARTIALS=1)
  int row_bytes;       // hidden * in_dtype bytes: a slot's token row (a multiple of 16)
  int scale_bytes;     // num_scales * 4 (fp8), else 0
  int out_bytes;       // hidden * out_dtype bytes: a combine row (a multiple of 16)
  int mask_words;      // 32-bit words of a token mask: ceil(M / 32)
  int f32_transfer;    // the partials are rounded to float32, not out_dtype
  int slices;          // combine receive: a row's 16-byte chunks cut into this many warp items
  int send_slices;     // PADDED_PARTIALS' send: a token's partial cut into this many warp items
  int send_bulk;       // PADDED_PARTIALS' send: a slice's rows by bulk copies (pad_layout: where it applies)
  int row_slices;      // dispatch: a row's 16-byte vectors cut into this many warp items
  unsigned long long* state;  // [0] latest dispatch round, [1] send blocks that have read it this
                              // launch, [2 + e] expert e's rows sent this round
};

enum PadPhase : int { PAD_SEND = 1, PAD_RECV = 2 };

struct PadIn {
  const char* x;
  const char* scale;
  const int* ids;    // [rows, topk]
  const float* w;    // [rows, topk] or null
  const int* ntok;   // device token count or null (then n_host)
  int n_host, rows;
};

template <typename In>  // PadIn or PadCombIn
__device__ __forceinline__ int pad_num_tokens(const In& in) {
  return in.ntok ? min(max(*in.ntok, 0), in.rows) : in.n_host;
}

// The loops over a mask's words stay rolled (a few words at decode sizes): the latency kernels'
// time goes to fetching their code (round 42), and unrolled copies of these loops (the tp > 1 keep
// mask, 32 steps of a division each) were a third of pad_dispatch_kernel's 2,920 instructions.

// The bits of mask word w that are this replica's tokens (t % tp == replica; bit b is token
// w * 32 + b): every tp-th from the replica's first. Out of line: attention TP only.
static __device__ __noinline__ unsigned pad_keep(int w, int tp, int replica) {
  unsigned keep = 0;
#pragma unroll 1
  for (int b = ((replica - w * 32) % tp + tp) % tp; b < 32; b += tp) keep |= 1u << b;
  return keep;
}

// Rows of a token mask this replica sends: tokens t with t % tp == replica.
__device__ __forceinline__ unsigned pad_mine(const unsigned* m, int words, int tp, int replica) {
  unsigned c = 0;
#pragma unroll 1
  for (int w = 0; w < words; ++w) c += __popc(tp > 1 ? m[w] & pad_keep(w, tp, replica) : m[w]);
  return c;
}

__device__ __forceinline__ unsigned pad_total(const unsigned* m, int words) {
  unsigned c = 0;
#pragma unroll 1
  for (int w = 0; w < words; ++w) c += __popc(m[w]);
  return c;
}

// Expert e's count word at its rank, from this rank: its group's rows for e (every replica sends
// the same total; the receive waits for each replica's word, which follows that replica's rows).
// RELEASE: after rows (their stores first); without, a relaxed store (no fence: a count with no
// rows of this replica before it orders nothing, and 250 fences of one block cost ~3 us).
template <bool RELEASE>
__device__ __forceinline__ void pad_send_count(const Params& p, const PadArgs& a, int e, unsigned total,
                                               unsigned long long round) {
  const int dst = e / p.L, l = e - dst * p.L;
  auto* word = reinterpret_cast<unsigned long long*>(a.peer[dst] + a.off_cnt + ((long long)l * p.W + p.rank) * 8);
  if constexpr (RELEASE) {
    if (dst == p.rank) st_release_gpu(word, tag_word(total, round));  // this GPU's readers only
    else st_release_sys(word, tag_word(total, round));
  }
  else st_relaxed_sys(word, tag_word(total, round));
}

// The padded kernels' warps in round order: warp w of block b is b + w * B, so consecutive items
// go to different SMs. With the dispatch's grid of a block a row item up to the SMs (pad_dispatch),
// each block's first warps take the items, one an SM where the call has no more items than SMs,
// and the last in this order (the receive's and the empty counts' threads) are the last blocks'
// last warps, the last to get a row item.
__device__ __forceinline__ int pad_round_warp() { return (threadIdx.x >> 5) * gridDim.x + blockIdx.x; }
// A thread's place counted from the last in that order (0: the last block's last lane): the small
// per-expert loops start there, on the warps least likely to have a row item.
__device__ __forceinline__ int pad_round_thread_from_last() {
  return gridDim.x * blockDim.x - 1 - (pad_round_warp() * 32 + (threadIdx.x & 31));
}

// The send: every block builds the routing's token masks per expert in shared memory; a warp per
// (t, k, slice) stores its slice of the row into its slot, an expert's last one raising its count;
// then the counts of experts with no row of this replica go, relaxed.
// `local_unordered`: this kernel also receives, so this GPU's experts' rows are read only after it
// ends (stream order makes them visible): their counts go relaxed with the empty experts', and
// their rows take neither the counter nor a fence.
// The round: thread 0 reads the latest at entry and, once the masks are built, takes the block's
// ticket (its operand depends on the read, so the read is done first) and hands the round to the
// block through shared memory. The block holding the grid's last ticket knows every block has read
// the round; it advances it at its end (pad_dispatch_kernel): no barrier and no atomic's round trip
// at any block's end. Returns the round; `ticket`: thread 0's.
__device__ __forceinline__ unsigned long long pad_send_part(const Params& p, const PadArgs& a, const PadIn& in,
                                                            bool local_unordered, unsigned long long& ticket) {
  extern __shared__ unsigned pad_mask[];  // [E][mask_words]: expert e's tokens
  __shared__ unsigned long long pad_round;
  const int tid = threadIdx.x, lane = tid & 31;
  const int nthreads = gridDim.x * blockDim.x;
  const int n = pad_num_tokens(in);
  const int W = a.mask_words;
  unsigned long long latest = 0;
  if (tid == 0) latest = *reinterpret_cast<volatile unsigned long long*>(&a.state[0]);  // used after the masks
  for (int i = tid; i < p.E * W; i += blockDim.x) pad_mask[i] = 0;
  __syncthreads();
  for (int i = tid; i < n * p.topk; i += blockDim.x) {
    const int e = in.ids[i], t = i / p.topk;
    if (e >= 0 && e < p.E) atomicOr(&pad_mask[e * W + (t >> 5)], 1u << (t & 31));
  }
  if (tid == 0) {
    pad_round = latest + 1;
    ticket = atomicAdd(&a.state[1], latest == ~0ULL ? 2ULL : 1ULL);  // 1: the round never reaches ~0
  }
  __syncthreads();
  const unsigned long long round = pad_round;
  stamp_exit(ST_PAD_MASKS);
  // Rows: item (t, k, slice) a warp, in the warps' round order (pad_round_warp); slice 0 also
  // stores the row's scales, weight and meta.
  const int gwarp = pad_round_warp(), nwarps = nthreads >> 5;
  const int S = a.row_slices, vecs = a.row_bytes >> 4, per = (vecs + S - 1) / S;
  // Scales of at most 512 bytes (a multiple of 16) ride as one vector a lane, loaded with the row.
  const bool scale_vec = in.scale && (a.scale_bytes & 15) == 0 && a.scale_bytes <= 512;
  for (int item = gwarp; item < n * p.topk * S; item += nwarps) {
    const int i = item / S, slice = item - i * S;
    const int t = i / p.topk, k = i - t * p.topk;
    if (t % p.tp != p.replica) continue;
    // Lane j holds the token's j-th expert (the partials' words need them all): one load a warp.
    const int ek = lane < p.topk ? in.ids[t * p.topk + lane] : -1;
    const int e = __shfl_sync(0xffffffffu, ek, k);
    if (e < 0 || e >= p.E) continue;
    const unsigned* m = pad_mask + e * W;
    const int slot = bit_rank<true>(m, 0, 1, t);
    const int dst = e / p.L, l = e - dst * p.L;
    const long long s = ((long long)l * p.G + p.group) * p.M + slot;
    char* base = a.peer[dst];
    // The slot's small words are loaded before the row's vectors: one load latency for all of them.
    const bool lead = slice == 0;
    const bool scale_lane = lead && scale_vec && lane * 16 < a.scale_bytes;
    int4 sv{};
    if (scale_lane) sv = reinterpret_cast<const int4*>(in.scale + (long long)t * a.scale_bytes)[lane];
    const float wv = lead && in.w && lane == 0 ? in.w[i] : 0.f;
    const int v0 = slice * per, v1 = min(vecs, v0 + per);
    if (v1 > v0)
      warp_copy_wide<16>(base + a.off_tok + s * a.row_bytes + v0 * 16LL, in.x + (long long)t * a.row_bytes + v0 * 16LL,
                         (v1 - v0) * 16, lane);
    stamp_exit(ST_PAD_COPIED);
    if (scale_lane) {
      reinterpret_cast<int4*>(base + a.off_scale + s * a.scale_bytes)[lane] = sv;
    } else if (lead && in.scale && !scale_vec) {  // other sizes by 4-byte words (a small loop)
      const int* src = reinterpret_cast<const int*>(in.scale + (long long)t * a.scale_bytes);
      int* dsc = reinterpret_cast<int*>(base + a.off_scale + s * a.scale_bytes);
#pragma unroll 1
      for (int j = lane; j < a.scale_bytes / 4; j += 32) dsc[j] = src[j];
    }
    if (lead && lane == 0) {
      if (in.w) reinterpret_cast<float*>(base + a.off_w)[s] = wv;
      reinterpret_cast<int2*>(base + a.off_meta)[s] = make_int2(t, k);
    }
    if (lead && a.partials) {
      // The token's slot here for every k, so the combine can sum the token's rows here into one
      // partial: written by the warp of the token's first k at this rank alone (the same words
      // came from each of its warps to this rank before).
      const bool at_dst = ek >= 0 && ek < p.E && ek / p.L == dst;
      const unsigned here = __ballot_sync(0xffffffffu, at_dst);
      if (__ffs(here) - 1 == k && lane < p.topk) {
        const int sk = at_dst ? bit_rank<true>(pad_mask + ek * W, 0, 1, t, ((ek - dst * p.L) * p.G + p.group) * p.M) : -1;
        // Round-tagged: the combine takes a token's words of this round only (no stale slots).
        reinterpret_cast<unsigned long long*>(base + a.off_tslots)[((long long)p.group * p.M + t) * p.topk + lane] =
            tag_word((unsigned)sk, round);
      }
    }
    if (local_unordered && dst == p.rank) continue;  // its count goes with the empty experts'
    __syncwarp();  // the lanes' stores before lane 0's release (cumulative)
    if (lane == 0) {
      // The expert's last row slice raises its count: the counter's acq_rel (system scope) puts
      // every warp's slices of that expert before the count's release. An expert of one item here
      // (a 1-token call's expert when rows are not cut) needs no counter.
      const unsigned long long items = (unsigned long long)pad_mine(m, W, p.tp, p.replica) * S;
      unsigned long long done = 0;
      // GPU scope where the expert is on this GPU (its rows and count are read here only, as the
      // count's own release); system scope where the rows crossed to a peer.
      if (items > 1 && dst == p.rank) done = atom_add_acq_rel_gpu(&a.state[2 + e]);
      else if (items > 1) done = atom_add_acq_rel_sys(&a.state[2 + e]);
      if (done + 1 == items) {
        if (items > 1) a.state[2 + e] = 0;  // no other warp touches it again this round
        pad_send_count<true>(p, a, e, pad_total(m, W), round);
      }
    }
  }
  stamp_exit(ST_PAD_ROWS);
  // Experts none of whose rows this replica sends (and, local_unordered, this GPU's): their counts,
  // after the rows and from the last threads in round order (a small call's warps with no row item),
  // so they do not hold back the first rows.
  for (int e = pad_round_thread_from_last(); e < p.E; e += nthreads) {
    const unsigned* m = pad_mask + e * W;
    if ((local_unordered && e / p.L == p.rank) || pad_mine(m, W, p.tp, p.replica) == 0)
      pad_send_count<false>(p, a, e, pad_total(m, W), round);
  }
  stamp_exit(ST_PAD_EMPTY_COUNTS);
  return round;
}

// Send then receive in the same blocks (the grid fits the GPU at once: every block is resident,
// so the receive's waits cannot hold back a block that still has rows to send). `phase`: PAD_SEND
// | PAD_RECV, both for a whole dispatch; a split one launches the send (it advances the round) and
// later the receive alone (it waits on the round the send advanced to).
__global__ void __launch_bounds__(NTHREADS) pad_dispatch_kernel(const __grid_constant__ Params p,
                                                                const __grid_constant__ PadArgs a,
                                                                const __grid_constant__ PadIn in, int* counts_out,
                                                                long long* tpe_out, int phase) {
  stamp_entry(ST_PAD_DISPATCH);
  const int tid = threadIdx.x;
  const int nthreads = gridDim.x * blockDim.x;
  unsigned long long ticket = 0;
  const unsigned long long round = (phase & PAD_SEND)
                                       ? pad_send_part(p, a, in, (phase & PAD_RECV) != 0, ticket)
                                       : *reinterpret_cast<volatile unsigned long long*>(&a.state[0]);
  // Receive: a thread a local expert waits for its W count words, from the last threads in round
  // order (a small call's warps with no row item, as the counts' stores: their waits overlap the rows).
  for (int l = pad_round_thread_from_last(); (phase & PAD_RECV) && l < p.L; l += nthreads) {
    long long total = 0;
    for (int r = 0; r < p.W; ++r) {
      const auto* word = reinterpret_cast<const unsigned long long*>(a.base + a.off_cnt + ((long long)l * p.W + r) * 8);
      unsigned long long v = 0;
      if (!bounded_poll(p, [&] { return tagged_now(v = ld_acquire_sys(word), round); }, PH_DISPATCH_RECV, r, round))
        v = 0;
      if (r % p.tp == 0) {
        counts_out[l * p.G + r / p.tp] = (int)(unsigned)v;
        total += (unsigned)v;
      }
    }
    tpe_out[l] = total;
  }
  stamp_exit(ST_PAD_COUNTS);
  // The block with the send's last ticket advances the round (every block has read it): the next
  // kernel to read it starts after this one ends (stream order).
  if ((phase & PAD_SEND) && tid == 0 && ticket == (unsigned long long)gridDim.x - 1) {
    a.state[1] = 0;
    a.state[0] = round;
  }
  stamp_exit(ST_PAD_DISPATCH);
}

template <typename OT>
__device__ __forceinline__ float pad_to_float(OT v) {
  if constexpr (std::is_same_v<OT, float>) return v;
  else if constexpr (std::is_same_v<OT, __nv_bfloat16>) return __bfloat162float(v);
  else return __half2float(v);
}
template <typename OT>
__device__ __forceinline__ OT pad_from_float(float v) {
  if constexpr (std::is_same_v<OT, float>) return v;
  else if constexpr (std::is_same_v<OT, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else return __float2half_rn(v);
}
// acc += w * y element by element in float32, w * y rounded first (no fused multiply-add: the
// contract's order); unweighted, y itself.
template <int VEC, typename OT>
__device__ __forceinline__ void pad_add_weighted(float (&acc)[VEC], const OT* y, bool weighted, float w) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    const float yv = pad_to_float(y[v]);
    acc[v] = __fadd_rn(acc[v], weighted ? __fmul_rn(yv, w) : yv);
  }
}

struct PadCombIn {
  const char* y;       // [L, G * M, hidden] out_dtype
  const float* w;      // [L, G * M] or null
  const int* counts;   // [L, G] (the dispatch's)
  const int* ids;      // this rank's dispatched topk_ids [rows, topk]
  const int* ntok;
  int n_host, rows;
};

// Lane k's expert of token t: -1 where dropped, k >= topk, or t past the live rows.
__device__ __forceinline__ int pad_lane_expert(const Params& p, const PadCombIn& in, int t, int n, int lane) {
  if (t >= n || lane >= p.topk) return -1;
  const int e = in.ids[t * p.topk + lane];
  return e < p.E ? e : -1;
}

// Every block scans the per-(expert, group) counts into pair_first (each pair's first item of the
// filled slots, pair-major; pair_first[pairs] = their total) in shared memory; returns the total.
__device__ __forceinline__ int pad_scan_pairs(const int* counts, int pairs, int* pair_first, int* warp_sums) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int carry = 0;
  for (int base = 0; base < pairs; base += NTHREADS) {
    const int v = base + tid < pairs ? counts[base + tid] : 0;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int w = lane < NWARPS ? warp_sums[lane] : 0;
#pragma unroll
      for (int o = 1; o < NWARPS; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += y;
      }
      if (lane < NWARPS) warp_sums[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    if (base + tid < pairs) pair_first[base + tid] = carry + x - v + (warp > 0 ? warp_sums[warp - 1] : 0);
    carry += warp_sums[NWARPS - 1];
    __syncthreads();  // warp_sums is rewritten by the next chunk
  }
  if (tid == 0) pair_first[pairs] = carry;
  __syncthreads();
  return carry;
}

// The pair of filled-slot item `item`: the last pair whose first item is <= item (a non-empty one).
__device__ __forceinline__ int pad_find_pair(const int* pair_first, int pairs, int item) {
  int lo = 0, hi = pairs;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (pair_first[mid] <= item) lo = mid;
    else hi = mid;
  }
  return lo;
}

// Send each slot's row back to its source row's (t, k) place at every rank of its group, then
// (same blocks) sum this rank's rows as the contract orders. topk <= 32 (a lane a k).
template <typename OT>
__global__ void __launch_bounds__(NTHREADS) pad_combine_kernel(const __grid_constant__ Params p,
                                                               const __grid_constant__ PadArgs a,
                                                               const __grid_constant__ PadCombIn in, OT* out) {
  __shared__ int order[NWARPS][32], order_rank[NWARPS][32], warp_sums[NWARPS];
  extern __shared__ int pair_first[];  // [L * G + 1]: each pair's first filled-slot item
  stamp_entry(ST_PAD_COMBINE);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned long long round = *reinterpret_cast<volatile unsigned long long*>(&a.state[0]);
  const int gwarp = (blockIdx.x * blockDim.x + tid) >> 5, nwarps = (gridDim.x * blockDim.x) >> 5;
  const int2* meta = reinterpret_cast<const int2*>(a.base + a.off_meta);
  // The filled slots as items 0..total-1 (pair-major), a warp each: consecutive rows of a pair go to
  // consecutive warps (a release per row: none behind another in one warp where warps suffice).
  const int pairs = p.L * p.G;
  const int total = pad_scan_pairs(in.counts, pairs, pair_first, warp_sums);
  stamp_exit(ST_PAD_SCANNED);
  for (int item = gwarp; item < total; item += nwarps) {
    const int pair = pad_find_pair(pair_first, pairs, item), i = item - pair_first[pair];
    {
      const int g = pair % p.G;
      const long long s = (long long)pair * p.M + i;
      const int2 tk = meta[s];
      const long long at = (long long)tk.x * p.topk + tk.y;
      for (int j = 0; j < p.tp; ++j) {
        char* base = a.peer[g * p.tp + j];
        warp_copy(base + a.off_crow + at * a.out_bytes, in.y + s * a.out_bytes, a.out_bytes, lane);
        if (lane == 0 && in.w) reinterpret_cast<float*>(base + a.off_cw)[at] = in.w[s];
        __syncwarp();
        if (lane == 0) {
          auto* flag = reinterpret_cast<unsigned long long*>(base + a.off_cflag) + at;
          if (g * p.tp + j == p.rank) st_release_gpu(flag, round);
          else st_release_sys(flag, round);
        }
      }
    }
  }
  stamp_exit(ST_PAD_SENT);
  // Receive: item (t, slice) a warp; rows t >= n are zero.
  const int n = pad_num_tokens(in);
  constexpr int VEC = 16 / sizeof(OT);
  const int chunks = a.out_bytes / 16, per = (chunks + a.slices - 1) / a.slices;
  const int H = a.out_bytes / (int)sizeof(OT);
  const bool weighted = in.w != nullptr;  // every rank passes weights or none
  for (int item = gwarp; item < in.rows * a.slices; item += nwarps) {
    const int t = item / a.slices, c0 = (item - t * a.slices) * per, c1 = min(chunks, c0 + per);
    const int e = pad_lane_expert(p, in, t, n, lane);
    const int r = e >= 0 ? e / p.L : 0;
    // The contract's order: by rank, then k; this lane's place among the valid ks.
    int pos = 0;
    for (int q = 0; q < p.topk; ++q) {
      const int eq = __shfl_sync(0xffffffffu, e, q);
      if (eq >= 0 && (eq / p.L < r || (eq / p.L == r && q < lane))) ++pos;
    }
    const int nk = __popc(__ballot_sync(0xffffffffu, e >= 0));
    if (e >= 0) {
      const auto* flag = reinterpret_cast<const unsigned long long*>(a.base + a.off_cflag) + (long long)t * p.topk + lane;
      bounded_poll(p, [&] { return ld_acquire_sys(flag) == round; }, PH_COMBINE_RECV, r, round);
      order[warp][pos] = lane;
      order_rank[warp][pos] = r;
    }
    __syncwarp();  // the acquires and the order before every lane's reads
    const char* rows = a.base + a.off_crow + (long long)t * p.topk * a.out_bytes;
    const float* wk = reinterpret_cast<const float*>(a.base + a.off_cw) + (long long)t * p.topk;
    for (int c = c0 + lane; c < c1; c += 32) {
      float tot[VEC], acc[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) tot[v] = acc[v] = 0.0f;
      for (int j = 0; j < nk; ++j) {
        const int k = order[warp][j];
        const int4 raw = __ldcg(reinterpret_cast<const int4*>(rows + (long long)k * a.out_bytes) + c);
        const OT* y = reinterpret_cast<const OT*>(&raw);
        pad_add_weighted<VEC>(acc, y, weighted, weighted ? __ldcg(wk + k) : 1.0f);
        if (j + 1 == nk || order_rank[warp][j + 1] != order_rank[warp][j]) {  // this rank's partial is done
#pragma unroll
          for (int v = 0; v < VEC; ++v) {
            tot[v] = __fadd_rn(tot[v], a.f32_transfer ? acc[v] : pad_to_float(pad_from_float<OT>(acc[v])));
            acc[v] = 0.0f;
          }
        }
      }
      OT res[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) res[v] = pad_from_float<OT>(tot[v]);
      reinterpret_cast<int4*>(out + (long long)t * H)[c] = *reinterpret_cast<const int4*>(res);
    }
    __syncwarp();  // `order` is rewritten by the next item
  }
  stamp_exit(ST_PAD_COMBINE);
}

template <typename T, int N>
struct alignas(N * sizeof(T) >= 16 ? 16 : N * sizeof(T)) PadVec {
  T v[N];
};

// A token's partial of 16-byte chunk c (`acc`, VEC elements) rounded to the transfer dtype XT and
// stored as round-tagged words at every rank of its source group g: no flag, no release.
template <typename XT, int VEC>
__device__ __forceinline__ void pad_store_partial(const Params& p, const PadArgs& a, int g, int t, int c,
                                                  const float (&acc)[VEC], unsigned long long round) {
  PadVec<XT, VEC> part;
#pragma unroll
  for (int v = 0; v < VEC; ++v) part.v[v] = pad_from_float<XT>(acc[v]);
  const int4 word = *reinterpret_cast<const int4*>(&part);
  for (int j = 0; j < p.tp; ++j) {
    char* dst = a.peer[g * p.tp + j] + a.off_part + ((long long)p.rank * p.M + t) * 2LL * a.part_bytes;
    st_tagged_int4(dst + (long long)c * 32, word, round);
  }
}

// The partials' send by bulk copies (round 83): a warp's buffer holds SEND_BULK_ROWS rows of a
// sub-slice of SEND_BULK_CHUNKS 16-byte chunks (8 KB; 128 KB a block), so a slice's rows (at world
// size 1: 8 rows of 56 chunks) arrive in one load latency, where registers hold one pass of 32
// chunks (two latencies a slice). Small calls only (pad_combine: half the GPU's warps or fewer
// sending); with every warp sending, an SM's bulk copies queue behind one another.
constexpr int SEND_BULK_ROWS = 8, SEND_BULK_CHUNKS = 64;
constexpr int SEND_BULK_SMEM = NWARPS * SEND_BULK_ROWS * SEND_BULK_CHUNKS * 16;

// PADDED_PARTIALS=1: the contiguous combine's structure in the padded layout. Item (source group g,
// token t, slice) a warp: the token's slots here come from the dispatch's round-tagged slot words
// (a token with none this round skips at once: no scan of the counts, no lead slot to find); the
// warp sums the token's rows here in k order (float32, weighted: w * y rounded first, no fused
// multiply-add), rounds the partial to the transfer dtype and stores it as round-tagged words at
// every rank of the token's group: no flag, no release. The source's warps poll the words of the
// ranks its token's experts are on and sum them in rank order. Items go to warps across blocks
// first (one token's slices on many SMs).
template <typename OT, typename XT>
__global__ void __launch_bounds__(NTHREADS) pad_combine_partials_kernel(const __grid_constant__ Params p,
                                                                        const __grid_constant__ PadArgs a,
                                                                        const __grid_constant__ PadCombIn in,
                                                                        OT* out) {
  stamp_entry(ST_PAD_COMBINE);
  constexpr int VEC = 16 / sizeof(XT);  // elements of a 16-byte transfer chunk (32 bytes tagged)
  constexpr int BATCH = 8;              // rows' loads in flight before their sums (topk 8: all)
  using YV = PadVec<OT, VEC>;
  const int lane = threadIdx.x & 31;
  const unsigned long long round = *reinterpret_cast<volatile unsigned long long*>(&a.state[0]);
  const int gwarp = pad_round_warp(), nwarps = (gridDim.x * blockDim.x) >> 5;
  const auto* tslots = reinterpret_cast<const unsigned long long*>(a.base + a.off_tslots);
  // send_bulk: this warp's buffer and mbarrier (its phase parity flips once a sub-slice).
  extern __shared__ __align__(16) unsigned char send_buf[];
  __shared__ __align__(8) unsigned long long send_bar[NWARPS];
  const unsigned buf_sa = smem_addr(send_buf + (threadIdx.x >> 5) * (SEND_BULK_ROWS * SEND_BULK_CHUNKS * 16));
  const unsigned bar_sa = smem_addr(&send_bar[threadIdx.x >> 5]);
  unsigned parity = 0;
  if (sizeof(OT) == sizeof(XT) && a.send_bulk) {
    if (lane == 0) {
      mbar_init(&send_bar[threadIdx.x >> 5], 1);
      mbar_init_fence();
    }
    __syncwarp();
  }
  stamp_exit(ST_PAD_SCANNED);
  const int chunks = a.part_bytes / 16;
  const int H = a.out_bytes / (int)sizeof(OT);
  const bool weighted = in.w != nullptr;
  const int S = a.send_slices, sper = (chunks + S - 1) / S;
  for (int item = gwarp; item < p.G * p.M * S; item += nwarps) {
    const int gt = item / S, slice = item - gt * S, g = gt / p.M, t = gt - g * p.M;
    int mine = -1;
    if (lane < p.topk) {
      const unsigned long long v = __ldcg(tslots + (long long)gt * p.topk + lane);
      if (tagged_now(v, round)) mine = (int)(unsigned)v;
    }
    const unsigned here = __ballot_sync(0xffffffffu, mine >= 0);
    if (!here) continue;
    stamp_exit(ST_PAD_SLOTS_IN);
    const int nk = __popc(here);
    const float wmine = weighted && mine >= 0 ? in.w[mine] : 1.0f;
    const int c1 = min(chunks, (slice + 1) * sper);
    if constexpr (sizeof(OT) == sizeof(XT)) {  // a y chunk is a partial's chunk: 16 bytes
      if (a.send_bulk) {  // nk <= topk <= SEND_BULK_ROWS
        // Lane u < nk copies the u-th live k's row (k ascending: the contract's order).
        unsigned rest = here;  // lane u: drop the u lowest live ks, take the next
        for (int i = 0; i < lane && rest; ++i) rest &= rest - 1;
        const int ku = lane < nk ? __ffs(rest) - 1 : 0;
        const int sku = __shfl_sync(0xffffffffu, mine, ku);
        const float wu = __shfl_sync(0xffffffffu, wmine, ku);
        float wv[SEND_BULK_ROWS];
#pragma unroll
        for (int u = 0; u < SEND_BULK_ROWS; ++u) wv[u] = __shfl_sync(0xffffffffu, wu, u);
        const char* src = in.y + (long long)(lane < nk ? sku : 0) * a.out_bytes;
        for (int s0 = slice * sper; s0 < c1; s0 += SEND_BULK_CHUNKS) {
          const int s1 = min(c1, s0 + SEND_BULK_CHUNKS);
          const unsigned bytes = (unsigned)(s1 - s0) * 16u;
          bulk_rows_one_wait(buf_sa, SEND_BULK_CHUNKS * 16, src + (long long)s0 * 16, bytes, nk, bar_sa, parity);
          stamp_exit(ST_PAD_ROWS_IN);
          for (int c = s0 + lane; c < s1; c += 32) {
            float acc[VEC];
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[v] = 0.0f;
#pragma unroll
            for (int u = 0; u < SEND_BULK_ROWS; ++u) {
              if (u >= nk) break;
              const int4 raw = lds16(buf_sa + (u * SEND_BULK_CHUNKS + (c - s0)) * 16);
              pad_add_weighted<VEC>(acc, reinterpret_cast<const YV*>(&raw)->v, weighted, wv[u]);
            }
            pad_store_partial<XT>(p, a, g, t, c, acc, round);
          }
          __syncwarp();  // every lane has read the buffer the next sub-slice's copies refill
        }
        continue;
      }
    }
    for (int cb = slice * sper; cb < c1; cb += 32) {
      const int c = cb + lane;
      const bool live = c < c1;  // every lane takes the shuffles below (full-mask)
      float acc[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[v] = 0.0f;
      unsigned left = here;  // the same on every lane
      for (int j0 = 0; j0 < nk; j0 += BATCH) {
        YV y[BATCH];
        float wv[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
          const int k = left ? __ffs(left) - 1 : 0;
          left &= left - 1;
          const int sk = __shfl_sync(0xffffffffu, mine, k);
          wv[u] = __shfl_sync(0xffffffffu, wmine, k);
          if (live && j0 + u < nk) y[u] = reinterpret_cast<const YV*>(in.y + (long long)sk * a.out_bytes)[c];
        }
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
          if (!live || j0 + u >= nk) continue;
          pad_add_weighted<VEC>(acc, y[u].v, weighted, wv[u]);
        }
      }
      if (!live) continue;
      pad_store_partial<XT>(p, a, g, t, c, acc, round);
    }
  }
  stamp_exit(ST_PAD_SENT);
  // Receive: item (t, slice) a warp; rows t >= n are zero. Where the call's live sends (about
  // G * rows * S items, on the first warps) and its receive items fit the grid together, the receive
  // takes the last warps: its waits start beside the sends, not after them. Else the first (at world
  // size 1 item i then polls what send item i stored: run 50 call 6 put the last warps 0.6 us behind
  // at 128 tokens).
  const int n = pad_num_tokens(in);
  const int per = (chunks + a.slices - 1) / a.slices;
  const bool beside = (long long)p.G * in.rows * S + (long long)in.rows * a.slices <= nwarps;
  for (int item = beside ? nwarps - 1 - gwarp : gwarp; item < in.rows * a.slices; item += nwarps) {
    const int t = item / a.slices, c0 = (item - t * a.slices) * per, c1 = min(chunks, c0 + per);
    const int e = pad_lane_expert(p, in, t, n, lane);
    // The ranks holding the token's experts (W <= 64), ascending: the contract's order.
    const unsigned long long bit = e >= 0 ? 1ULL << (e / p.L) : 0ULL;
    const unsigned long long ranks =
        (unsigned long long)__reduce_or_sync(0xffffffffu, (unsigned)bit) |
        ((unsigned long long)__reduce_or_sync(0xffffffffu, (unsigned)(bit >> 32)) << 32);
    for (int c = c0 + lane; c < c1; c += 32) {
      float tot[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) tot[v] = 0.0f;
      for (unsigned long long left = ranks; left; left &= left - 1) {
        const int r = __ffsll((long long)left) - 1;
        const char* src = a.base + a.off_part + ((long long)r * p.M + t) * 2LL * a.part_bytes + (long long)c * 32;
        ulonglong2 lo = ld_tagged2(src), hi = ld_tagged2(src + 16);
        if (!(tagged_now(lo, round) && tagged_now(hi, round)))
          bounded_poll(p, [&] {
            lo = ld_tagged2(src);
            hi = ld_tagged2(src + 16);
            return tagged_now(lo, round) && tagged_now(hi, round);
          }, PH_COMBINE_RECV, r, round);
        const int4 word = make_int4((int)(unsigned)lo.x, (int)(unsigned)lo.y, (int)(unsigned)hi.x, (int)(unsigned)hi.y);
        const PadVec<XT, VEC> part = *reinterpret_cast<const PadVec<XT, VEC>*>(&word);
#pragma unroll
        for (int v = 0; v < VEC; ++v) tot[v] = __fadd_rn(tot[v], pad_to_float(part.v[v]));
      }
      YV res;
#pragma unroll
      for (int v = 0; v < VEC; ++v) res.v[v] = pad_from_float<OT>(tot[v]);
      reinterpret_cast<YV*>(out + (long long)t * H)[c] = res;
    }
  }
  stamp_exit(ST_PAD_COMBINE);
}

}  // namespace moe
