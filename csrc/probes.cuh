// probes.cuh: benchmark-only kernels and their host calls: the latency floor of a flag exchange, the
// SM-count memory-rate probes, the cost of one dependent step, and the timeline stamps' switch.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "device_common.cuh"
#include "host_checks.h"

namespace moe {

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
  const unsigned sa = smem_addr(buf);
  const long long nwarps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long c = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); c * PROBE_BULK < nbytes; c += nwarps) {
    const long long off = c * PROBE_BULK;
    const unsigned size = (unsigned)(nbytes - off < PROBE_BULK ? nbytes - off : PROBE_BULK);
    bulk_store(dst + off, sa, size);
    bulk_commit();
    bulk_wait_read<PROBE_BULK_AHEAD>();
  }
  bulk_wait_all();  // the writes done before the kernel ends
}

// Modes 3-6: loads by bulk copies (TMA) into shared memory, in the shape of the few-SM combine
// send's ring (sum_rows_bulk): 16 warps a block, each with PROBE_LOAD_STAGES stages of
// PROBE_LOAD_STAGE bytes on one mbarrier, filled by copies of PIECE bytes (mode 3: 1 KB, the
// combine's row pieces until round 31; mode 4: the whole 4 KB stage in one copy; mode 5: 512 B;
// mode 6: 2 KB, the combine's row pieces since round 31), lane 0
// issuing a stage as soon as the one it refills has landed (192 KB in flight per SM). Does that
// ring load as fast as SM loads when few SMs are given, and how does the copies' size matter
// (round 30: 4 KB copies load slower than 1 KB ones)? Each stage's first word is XORed into the
// block's word of dst, so the loads are kept and checkable (the XOR over the blocks is the XOR
// of every stage's first word).
constexpr int PROBE_LOAD_WARPS = 16, PROBE_LOAD_STAGES = 3, PROBE_LOAD_STAGE = 4096;
constexpr int PROBE_LOAD_SMEM = PROBE_LOAD_WARPS * PROBE_LOAD_STAGES * PROBE_LOAD_STAGE;
template <int PIECE>
__global__ void __launch_bounds__(PROBE_LOAD_WARPS * 32, 1) bulk_load_probe_kernel(int4* dst, const char* src,
                                                                                   long long nbytes) {
  extern __shared__ int4 stages_raw[];  // 16-byte aligned, as the bulk copies want
  char* stages = reinterpret_cast<char*>(stages_raw);
  __shared__ unsigned long long bars[PROBE_LOAD_WARPS][PROBE_LOAD_STAGES];
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) != 0) return;
  for (int d = 0; d < PROBE_LOAD_STAGES; ++d) mbar_init(&bars[warp][d], 1);
  mbar_init_fence();
  const unsigned base = smem_addr(stages + warp * PROBE_LOAD_STAGES * PROBE_LOAD_STAGE);
  const long long nstages = (nbytes + PROBE_LOAD_STAGE - 1) / PROBE_LOAD_STAGE;
  const long long stride = (long long)gridDim.x * PROBE_LOAD_WARPS;
  int acc = 0;
  long long k = 0;  // this warp's stages so far: stage k goes to slot k % STAGES
  auto take = [&](long long j) {  // waits for this warp's j-th stage and keeps its first word
    const int slot = (int)(j % PROBE_LOAD_STAGES);
    mbar_wait(smem_addr(&bars[warp][slot]), (unsigned)((j / PROBE_LOAD_STAGES) & 1));
    acc ^= *reinterpret_cast<const volatile int*>(stages + (warp * PROBE_LOAD_STAGES + slot) * PROBE_LOAD_STAGE);
  };
  for (long long c = (long long)blockIdx.x * PROBE_LOAD_WARPS + warp; c < nstages; c += stride, ++k) {
    if (k >= PROBE_LOAD_STAGES) take(k - PROBE_LOAD_STAGES);
    const int slot = (int)(k % PROBE_LOAD_STAGES);
    const long long off = c * PROBE_LOAD_STAGE;
    const unsigned bytes = (unsigned)(nbytes - off < PROBE_LOAD_STAGE ? nbytes - off : PROBE_LOAD_STAGE);
    const unsigned bar = smem_addr(&bars[warp][slot]);
    mbar_arrive_expect(bar, bytes);
    for (unsigned i = 0; i < bytes; i += PIECE)
      bulk_load(base + slot * PROBE_LOAD_STAGE + i, src + off + i, bytes - i < PIECE ? bytes - i : PIECE, bar);
  }
  for (long long j = k > PROBE_LOAD_STAGES ? k - PROBE_LOAD_STAGES : 0; j < k; ++j) take(j);
  atomicXor(reinterpret_cast<int*>(dst + blockIdx.x), acc);
}

template <int PIECE>
static void launch_bulk_load_probe(int64_t dst, int64_t src, int64_t nbytes, int64_t blocks) {
  static const bool sized = [] {  // more than the default 48 KB of dynamic shared memory, once
    CUDA_OK(cudaFuncSetAttribute(bulk_load_probe_kernel<PIECE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 PROBE_LOAD_SMEM));
    return true;
  }();
  (void)sized;
  const cudaStream_t s = c10::cuda::getCurrentCUDAStream();
  bulk_load_probe_kernel<PIECE><<<(int)blocks, PROBE_LOAD_WARPS * 32, PROBE_LOAD_SMEM, s>>>(
      reinterpret_cast<int4*>(dst), reinterpret_cast<const char*>(src), nbytes);
}

void rate_probe(int64_t dst, int64_t src, int64_t nbytes, int64_t mode, int64_t blocks, int64_t device) {
  MOE_CHECK(mode >= 0 && mode <= 6,
            "rate_probe: mode must be 0 (stores), 1 (loads), 2 (bulk stores), 3 (1 KB bulk loads), 4 (4 KB bulk "
            "loads), 5 (512 B bulk loads) or 6 (2 KB bulk loads), got ",
            mode);
  const bool loads = mode == 1 || mode >= 3;
  MOE_CHECK(nbytes > 0 && nbytes % 16 == 0, "rate_probe: nbytes must be a positive multiple of 16, got ", nbytes);
  MOE_CHECK(blocks >= 1 && blocks <= num_sms(device), "rate_probe: blocks must be 1..", num_sms(device), ", got ",
            blocks);
  MOE_CHECK(dst != 0 && dst % 16 == 0 && (!loads || (src != 0 && src % 16 == 0)),
            "rate_probe: dst (and src for loads) must be non-null 16-byte aligned device addresses");
  c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
  if (mode == 3)
    launch_bulk_load_probe<1024>(dst, src, nbytes, blocks);
  else if (mode == 4)
    launch_bulk_load_probe<PROBE_LOAD_STAGE>(dst, src, nbytes, blocks);
  else if (mode == 5)
    launch_bulk_load_probe<512>(dst, src, nbytes, blocks);
  else if (mode == 6)
    launch_bulk_load_probe<2048>(dst, src, nbytes, blocks);
  else if (mode == 2)
    bulk_store_probe_kernel<<<(int)blocks, PROBE_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<char*>(dst), nbytes);
  else
    rate_probe_kernel<<<(int)blocks, PROBE_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<int4*>(dst), reinterpret_cast<const int4*>(src), nbytes / 16, (int)mode);
  CUDA_OK(cudaGetLastError());
}

// Host cost of a launch by the size of its by-value arguments (benchmark only,
// scripts/profile_host.py): every kernel of the backend takes the ~1 KB `Params` by value;
// is that what makes its launches dearer than aten's? Returns the median host ns of `iters`
// launches of an empty one-thread kernel, for arguments of 8 bytes and of sizeof(Params). The
// stream is synchronised every 8 launches, so no launch ever waits for queue room.
__global__ void empty_small_kernel(int* p) {
  if (p == nullptr && threadIdx.x == 1) __trap();  // never: keeps the argument live
}
__global__ void empty_params_kernel(Params p) {
  if (p.W < 0 && threadIdx.x == 1) __trap();
}

std::vector<double> launch_cost(int64_t iters, int64_t device) {
  MOE_CHECK(iters >= 1 && iters <= 100000, "launch_cost: iters must be 1..100000, got ", iters);
  c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
  cudaStream_t s = c10::cuda::getCurrentCUDAStream();
  Params p{};
  p.W = 1;
  int* dummy = reinterpret_cast<int*>(&p);  // host pointer: the kernel only tests it for null
  std::vector<double> medians;
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<double> ns;
    for (int64_t i = 0; i < iters + 20; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      if (variant == 0)
        empty_small_kernel<<<1, 32, 0, s>>>(dummy);
      else
        empty_params_kernel<<<1, 32, 0, s>>>(p);
      const auto t1 = std::chrono::steady_clock::now();
      CUDA_OK(cudaGetLastError());
      if (i % 8 == 7) CUDA_OK(cudaStreamSynchronize(s));  // queue never near full
      if (i >= 20) ns.push_back((double)std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
    }
    std::sort(ns.begin(), ns.end());
    medians.push_back(ns[ns.size() / 2]);
  }
  CUDA_OK(cudaStreamSynchronize(s));
  medians.push_back((double)sizeof(Params));
  return medians;
}

// What one dependent step of the kernels' chains costs (benchmark only, scripts/step_costs.py):
// the prefill plan and the send's table are chains of a few such steps (a load round, a block
// barrier, a store and its system-scope release), each step ~3 us in their timelines (round 41).
// `blocks` blocks of STEP_THREADS threads run `reps` steps of one kind one after another; each
// block writes its ns per step (from %globaltimer around the loop) to out[block]. `scratch`
// starts with `chain_words` int64 of load chain laid out by the caller: word b is block b's
// first index, and every word a chain visits holds the index of the next (a few lines in L2, or
// lines spread wider than the L2 for memory; the kernel follows them unchecked, so the layout
// must stay inside the chain); then each block's own words (STEP_BLOCK_WORDS each). Steps:
enum StepKind {
  STEP_TIMER = 0,          // nothing: the loop and the timer's own cost
  STEP_LOAD_CHAIN,         // one load whose address is the previous load's value (ld.global.cg)
  STEP_ACQUIRE_CHAIN,      // the same by ld.acquire.sys (the polls' load)
  STEP_STORE_FENCE_SYS,    // a store, then fence.sc.sys (__threadfence_system)
  STEP_STORE_FENCE_GPU,    // a store, then fence.sc.gpu (__threadfence)
  STEP_RELEASE_STORE_SYS,  // st.release.sys (the token flags)
  STEP_RELEASE_ADD_SYS,    // red.release.sys.add (the table portions' announce)
  STEP_ATOMIC_CHAIN,       // atomicAdd whose address depends on the previous one's result
  STEP_BLOCK_BARRIER,      // __syncthreads of the whole block
  STEP_PORTION,            // the table portion's shape: every thread stores 64 B, barrier, thread 0's
                           // release add, barrier (8 KB a step for 128 threads)
  STEP_CODE_FIRST,         // one pass through STEP_CODE_OPS straight-line dependent multiply-adds (~32 KB
                           // of code) the SM has not run yet: its instruction fetches; per op (reps ignored)
  STEP_CODE_AGAIN,         // the same code run once untimed, then `reps` timed passes: per op, warm
  STEP_JUMPS_FIRST,        // one pass through JUMP_STEPS hot steps, each a taken branch over 64 never-run
                           // ops (1 KB) to the next: branchy code's fetches; per hot step
  STEP_JUMPS_AGAIN,        // the same run once untimed, then `reps` timed passes: per hot step, warm
  STEP_CODE_EVICT,         // EVICT_FUNCS x STEP_CODE_OPS straight-line ops of their own (~256 KB), run once
                           // by each block: run on every SM before a first pass, it evicts the SMs'
                           // instruction caches of the probe's code; per op
  STEP_JUMPS_64B,          // STEP_JUMPS_FIRST with jumps over 64 B, 256 B and 4 KB of code: which
  STEP_JUMPS_256B,         // jumps land on code the fetch has not yet brought
  STEP_JUMPS_4KB,
  STEP_KINDS
};
constexpr int STEP_CODE_OPS = 2048;
// Straight-line code: each op x * x + its own constant (one 16-byte IMAD; squaring, so the
// compiler cannot fold the chain into one affine map as it could x * a + b).
__device__ __forceinline__ unsigned straight_code(unsigned x) {
#pragma unroll
  for (int i = 0; i < STEP_CODE_OPS; ++i) x = x * x + (unsigned)(i * 2654435761u + 1u);
  return x;
}
// Branchy code (round 42): the hot path jumps over a never-run block of GAP ops (16 B each) at
// every step, so each step lands on code GAP * 16 B further on, as a kernel's path through code
// it skips does. `never` is a runtime value the chain's values do not take (were it taken, the
// step would only run its block too). ptxas lays the blocks out in source order whatever the
// branch hints (__builtin_expect, [[unlikely]]: the same SASS).
constexpr int JUMP_STEPS = 64;
template <int GAP>
__device__ __forceinline__ unsigned jump_code(unsigned x, unsigned never) {
#pragma unroll
  for (int j = 0; j < JUMP_STEPS; ++j) {
    if (x == never) {
#pragma unroll
      for (int i = 0; i < GAP; ++i) x = x * x + (unsigned)(i * 40503u + (unsigned)j * 977u + 3u);
    }
    x = x * x + (unsigned)(j * 2654435761u + 7u);
  }
  return x;
}
// The evictor's code: EVICT_FUNCS functions of straight-line ops, each with constants of its own.
constexpr int EVICT_FUNCS = 8;
template <int F>
__device__ __noinline__ unsigned evict_code(unsigned x) {
#pragma unroll
  for (int i = 0; i < STEP_CODE_OPS; ++i) x = x * x + (unsigned)(i * 2246822519u + F * 374761393u + 1u);
  return x;
}
__device__ __forceinline__ unsigned evict_all(unsigned x) {
  x = evict_code<0>(x), x = evict_code<1>(x), x = evict_code<2>(x), x = evict_code<3>(x);
  x = evict_code<4>(x), x = evict_code<5>(x), x = evict_code<6>(x), x = evict_code<7>(x);
  static_assert(EVICT_FUNCS == 8, "evict_all calls each function once");
  return x;
}
constexpr int STEP_THREADS = 128;
// Per block: 16 words (counters, release targets), then the portion's 8 KB of rows.
constexpr long long STEP_BLOCK_WORDS = 16 + STEP_THREADS * 8;
__host__ __device__ inline long long step_own_offset(long long chain_words) { return (chain_words + 1) & ~1LL; }
__global__ void __launch_bounds__(STEP_THREADS) step_probe_kernel(int kind, int reps, long long* chain,
                                                                  long long chain_words, double* out) {
  const int tid = threadIdx.x;
  // Each block its own words past the chain (16-byte aligned): counters, release targets, rows.
  long long* own = chain + step_own_offset(chain_words) + (long long)blockIdx.x * STEP_BLOCK_WORDS;
  long long idx = chain_words > (long long)blockIdx.x ? chain[blockIdx.x] : 0;
  __syncthreads();
  if (kind == STEP_CODE_FIRST || kind == STEP_CODE_AGAIN) {  // thread 0 of each block; per op
    unsigned x = (unsigned)idx + blockIdx.x;
    if (kind == STEP_CODE_AGAIN && tid == 0) x = straight_code(x);
    const unsigned long long c0 = gtimer();
    const int passes = kind == STEP_CODE_FIRST ? 1 : reps;
    if (tid == 0)
      for (int r = 0; r < passes; ++r) x = straight_code(x);
    const unsigned long long c1 = gtimer();
    if (tid == 0) out[blockIdx.x] = x == 0x9e3779b9u ? -1.0 : (double)(c1 - c0) / ((double)passes * STEP_CODE_OPS);
    return;
  }
  if (kind >= STEP_JUMPS_FIRST) {  // thread 0; per step
    unsigned x = (unsigned)idx + blockIdx.x + 1u;
    const unsigned never = (unsigned)chain_words ^ 0x9e3779b9u;
    if (kind == STEP_JUMPS_AGAIN && tid == 0) x = jump_code<64>(x, never);
    const int passes = kind == STEP_JUMPS_AGAIN ? reps : 1;
    const unsigned long long c0 = gtimer();
    if (tid == 0) {
      switch (kind) {
        case STEP_CODE_EVICT: x = evict_all(x); break;
        case STEP_JUMPS_64B: x = jump_code<4>(x, never); break;
        case STEP_JUMPS_256B: x = jump_code<16>(x, never); break;
        case STEP_JUMPS_4KB: x = jump_code<256>(x, never); break;
        default:
          for (int r = 0; r < passes; ++r) x = jump_code<64>(x, never);
      }
    }
    const unsigned long long c1 = gtimer();
    const double steps = kind == STEP_CODE_EVICT ? (double)EVICT_FUNCS * STEP_CODE_OPS : (double)passes * JUMP_STEPS;
    if (tid == 0) out[blockIdx.x] = x == 0x9e3779b9u ? -1.0 : (double)(c1 - c0) / steps;
    return;
  }
  const unsigned long long t0 = gtimer();
  for (int r = 0; r < reps; ++r) {
    switch (kind) {
      case STEP_LOAD_CHAIN:
        if (tid == 0) idx = __ldcg(chain + idx);
        break;
      case STEP_ACQUIRE_CHAIN:
        if (tid == 0) idx = (long long)ld_acquire_sys(reinterpret_cast<const unsigned long long*>(chain + idx));
        break;
      case STEP_STORE_FENCE_SYS:
        if (tid == 0) {
          own[r & 7] = r;
          __threadfence_system();
        }
        break;
      case STEP_STORE_FENCE_GPU:
        if (tid == 0) {
          own[r & 7] = r;
          __threadfence();
        }
        break;
      case STEP_RELEASE_STORE_SYS:
        if (tid == 0) st_release_sys(reinterpret_cast<unsigned long long*>(own + (r & 7)), (unsigned long long)r);
        break;
      case STEP_RELEASE_ADD_SYS:
        if (tid == 0) red_add_release_sys(reinterpret_cast<unsigned long long*>(own + (r & 7)), 1ULL);
        break;
      case STEP_ATOMIC_CHAIN:
        if (tid == 0) idx = (long long)atomicAdd(reinterpret_cast<unsigned long long*>(own + (idx & 7)), 1ULL);
        break;
      case STEP_BLOCK_BARRIER:
        __syncthreads();
        break;
      case STEP_PORTION: {
        int4* row = reinterpret_cast<int4*>(own + 16) + tid * 4;
#pragma unroll
        for (int u = 0; u < 4; ++u) row[u] = make_int4(r, tid, u, 1);
        __syncthreads();
        if (tid == 0) red_add_release_sys(reinterpret_cast<unsigned long long*>(own), 1ULL);
        __syncthreads();
        break;
      }
      default:
        break;
    }
  }
  const unsigned long long t1 = gtimer();
  if (tid == 0) {
    out[blockIdx.x] = (double)(t1 - t0) / reps;
    if (idx == -12345) out[blockIdx.x] = -1.0;  // never (chain words are indices): keeps the chain live
  }
}

// Launches the probe on the current stream: `scratch` must hold the chain, then blocks *
// STEP_BLOCK_WORDS int64 of per-block words; `out` blocks float64.
void step_cost(at::Tensor scratch, int64_t chain_words, at::Tensor out, int64_t kind, int64_t reps, int64_t blocks) {
  MOE_CHECK(kind >= 0 && kind < STEP_KINDS, "step_cost: kind must be 0..", STEP_KINDS - 1, ", got ", kind);
  MOE_CHECK(reps >= 1 && reps <= (1 << 20), "step_cost: reps must be 1..", 1 << 20, ", got ", reps);
  MOE_CHECK(scratch.is_cuda() && scratch.scalar_type() == at::kLong && scratch.is_contiguous(),
            "step_cost: scratch must be a contiguous CUDA int64 tensor");
  MOE_CHECK(blocks >= 1 && blocks <= num_sms(scratch.device().index()), "step_cost: blocks must be 1..",
            num_sms(scratch.device().index()), ", got ", blocks);
  MOE_CHECK(chain_words >= 0 && scratch.numel() >= step_own_offset(chain_words) + blocks * STEP_BLOCK_WORDS,
            "step_cost: scratch must hold the chain (rounded up to even) + blocks * ", STEP_BLOCK_WORDS,
            " int64, has ", scratch.numel());
  MOE_CHECK((kind != STEP_LOAD_CHAIN && kind != STEP_ACQUIRE_CHAIN) || chain_words >= blocks,
            "step_cost: the load chains need chain_words >= blocks (word b: block b's first index)");
  MOE_CHECK((reinterpret_cast<uintptr_t>(scratch.data_ptr()) & 15) == 0, "step_cost: scratch must be 16-byte aligned");
  MOE_CHECK(out.is_cuda() && out.scalar_type() == at::kDouble && out.numel() >= blocks && out.device() == scratch.device(),
            "step_cost: out must be a CUDA float64 tensor of >= blocks elements on scratch's device");
  c10::cuda::CUDAGuard guard(scratch.device());
  step_probe_kernel<<<(int)blocks, STEP_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
      (int)kind, (int)reps, reinterpret_cast<long long*>(scratch.data_ptr()), chain_words, out.data_ptr<double>());
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
