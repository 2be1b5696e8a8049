// padded_ops.cuh: the host side of the padded layout (padded_kernels.cuh); included by moe_kernels.cu
// after its arena context (Ctx, CX, settle_pending), so the padded kernels share the arena's Params,
// its timeout and error word, and settle the arena's pending side-stream work first.
#pragma once

namespace moe {

struct PadCtx {
  int64_t ctx;  // the arena's
  PadArgs a;
  long long bytes;     // the region's size
  size_t mask_smem;    // the dispatch's token masks
};

static PadCtx& PX(int64_t pad) {
  MOE_CHECK(pad != 0, "padded layout: the communicator was closed");
  return *reinterpret_cast<PadCtx*>(pad);
}

static long long up16(long long v) { return (v + 15) / 16 * 16; }

// The region: tokens, scales, weights, (t, k) of each of the L * G * M slots; the count words
// [L, W]; the combine's rows, weights and flags for each of this rank's (t, k) [M, topk].
// cfg: row_bytes, scale_bytes, out_bytes, f32_transfer, state pointer, partials (PADDED_PARTIALS).
static PadCtx pad_layout(const Params& p, const std::vector<int64_t>& cfg) {
  MOE_CHECK(cfg.size() == 6, "pad: config of 6 values expected");
  PadCtx px{};
  PadArgs& a = px.a;
  a.row_bytes = (int)cfg[0];
  a.scale_bytes = (int)cfg[1];
  a.out_bytes = (int)cfg[2];
  a.f32_transfer = (int)cfg[3];
  a.state = reinterpret_cast<unsigned long long*>(cfg[4]);
  a.partials = (int)cfg[5];
  a.part_bytes = a.f32_transfer ? p.H * 4 : a.out_bytes;
  a.mask_words = (p.M + 31) / 32;
  a.slices = a.send_slices = a.row_slices = 1;
  // The partials' send by bulk copies where a y chunk is a partial's (16 bytes each way) and a
  // token's rows fit a warp's buffer (round 83).
  a.send_bulk = a.partials && a.part_bytes == a.out_bytes && p.topk <= SEND_BULK_ROWS;
  MOE_CHECK(a.row_bytes % 16 == 0 && a.out_bytes % 16 == 0 && a.scale_bytes % 4 == 0,
            "pad: rows must be multiples of 16 bytes");
  MOE_CHECK(p.topk <= 32, "pad: topk <= 32");
  const long long slots = (long long)p.L * p.G * p.M, places = (long long)p.M * p.topk;
  long long off = 0;
  auto take = [&off](long long bytes) {
    const long long at = off;
    off += up16(bytes);
    return at;
  };
  a.off_tok = take(slots * a.row_bytes);
  a.off_scale = take(slots * a.scale_bytes);
  a.off_w = take(slots * 4);
  a.off_meta = take(slots * 8);
  a.off_cnt = take((long long)p.L * p.W * 8);
  a.off_crow = take(places * a.out_bytes);
  a.off_cw = take(places * 4);
  a.off_cflag = take(places * 8);
  a.off_tslots = take(a.partials ? places * p.G * 8 : 0);
  a.off_part = take(a.partials ? (long long)p.W * p.M * 2 * a.part_bytes : 0);
  px.bytes = off;
  px.mask_smem = (size_t)p.E * a.mask_words * 4;
  return px;
}

int64_t pad_region_bytes(int64_t ctx, std::vector<int64_t> cfg) { return pad_layout(CX(ctx).p, cfg).bytes; }

int64_t pad_create(int64_t ctx, int64_t base, std::vector<int64_t> cfg) {
  const Params& p = CX(ctx).p;
  auto px = std::make_unique<PadCtx>(pad_layout(p, cfg));
  px->ctx = ctx;
  px->a.base = reinterpret_cast<char*>(base);
  for (int r = 0; r < p.W; ++r) {
    px->a.peer[r] = static_cast<char*>(nvshmem_ptr(px->a.base, p.pe[r]));
    MOE_CHECK(px->a.peer[r] != nullptr, "pad: rank ", r, " is not reachable by nvshmem_ptr (the padded kernels need nvlink)");
  }
  MOE_CHECK(px->mask_smem <= 200 * 1024, "pad: the token masks (", px->mask_smem, " bytes) exceed shared memory");
  MOE_CHECK(((long long)p.L * p.G + 1) * 4 <= 40 * 1024, "pad: the combine's pair scan exceeds shared memory");
  CUDA_OK(cudaFuncSetAttribute(pad_dispatch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)px->mask_smem));
  if (px->a.send_bulk) {
    for (const void* k : {(const void*)pad_combine_partials_kernel<__nv_bfloat16, __nv_bfloat16>,
                          (const void*)pad_combine_partials_kernel<__half, __half>,
                          (const void*)pad_combine_partials_kernel<float, float>})
      CUDA_OK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SEND_BULK_SMEM));
  }
  return reinterpret_cast<int64_t>(px.release());
}

void pad_destroy(int64_t pad) { delete &PX(pad); }

// The receive buffers as tensors (views of the region: valid while it is allocated).
std::vector<at::Tensor> pad_views(int64_t pad, int64_t device) {
  const PadCtx& px = PX(pad);
  const Params& p = CX(px.ctx).p;
  const PadArgs& a = px.a;
  const long long slots = (long long)p.L * p.G * p.M;
  auto at = [&](long long off, at::ScalarType t, at::IntArrayRef sizes) {
    return at::from_blob(a.base + off, sizes, at::TensorOptions().dtype(t).device(at::kCUDA, (int)device));
  };
  return {at(a.off_tok, at::kByte, {slots, a.row_bytes}), at(a.off_scale, at::kFloat, {slots, a.scale_bytes / 4}),
          at(a.off_w, at::kFloat, {slots}), at(a.off_meta, at::kInt, {slots, 2})};
}

// Warps for `items` one-warp items: whole blocks, at most the arena's SMs (every block resident:
// the kernels' waits need every block of both phases running).
static int pad_blocks(const Params& p, long long items) {
  const long long b = (items + NWARPS - 1) / NWARPS;
  return (int)std::max(1LL, std::min<long long>(b, p.num_sms));
}

// One launch of pad_dispatch_kernel: `phase` PAD_SEND and/or PAD_RECV; with PAD_RECV it returns the
// outputs [counts, tokens_per_expert], else nothing (a send allocates none).
static std::vector<at::Tensor> launch_pad_dispatch(const PadArgs& a, const Params& p, const PadIn& in, int blocks,
                                                   size_t smem, int phase, const at::TensorOptions& dev,
                                                   cudaStream_t stream) {
  at::Tensor counts, tpe;
  if (phase & PAD_RECV) {
    counts = at::empty({p.L, p.G}, dev.dtype(at::kInt));
    tpe = at::empty({p.L}, dev.dtype(at::kLong));
  }
  pad_dispatch_kernel<<<blocks, NTHREADS, smem, stream>>>(
      p, a, in, counts.defined() ? counts.data_ptr<int>() : nullptr,
      tpe.defined() ? reinterpret_cast<long long*>(tpe.data_ptr<int64_t>()) : nullptr, phase);
  CUDA_OK(cudaGetLastError());
  if (!(phase & PAD_RECV)) return {};
  return {counts, tpe};
}

// phase 3: a whole dispatch, returns [counts, tokens_per_expert]; 1: the send alone, returns [].
std::vector<at::Tensor> pad_dispatch(const at::Tensor& x, const at::Tensor& ids, const std::optional<at::Tensor>& w,
                                     const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& ntok,
                                     int64_t n_host, int64_t pad, int64_t phase) {
  MOE_CHECK(phase == PAD_SEND || phase == (PAD_SEND | PAD_RECV), "pad_dispatch: phase must be 1 or 3, got ", phase);
  PadCtx& px = PX(pad);
  Ctx& cx = CX(px.ctx);
  c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  settle_pending(cx, stream);
  // The kernel's row and scale vectors need 16-byte starts (the Communicator copies inputs that
  // do not have them: validate.vector_aligned).
  MOE_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                (!scale || reinterpret_cast<uintptr_t>(scale->data_ptr()) % 16 == 0),
            "pad_dispatch: x and x_scale must start on a 16-byte boundary");
  const PadIn in{reinterpret_cast<const char*>(x.data_ptr()),
                 scale ? reinterpret_cast<const char*>(scale->data_ptr()) : nullptr,
                 ids.data_ptr<int>(), w ? w->data_ptr<float>() : nullptr,
                 ntok ? ntok->data_ptr<int>() : nullptr, (int)n_host, (int)x.size(0)};
  const long long rows = std::max<long long>((ntok ? x.size(0) : n_host) * cx.p.topk, 1);
  // Calls of at least a row per SM: each row cut into slices (a warp each) until the call fills
  // the arena's SMs, no more slices than passes of warp_copy (128 vectors: 4 loads a lane in
  // flight). Run 48 call 4 (H200): 7 slices took the 32-token padded dispatch from 10.8 to 10.1 us;
  // at 1 token (8 rows) they cost 0.6 (the rows phase did not shrink, the experts took counters).
  PadArgs a = px.a;
  a.row_slices = rows < cx.p.num_sms ? 1
                 : (int)std::max(1LL, std::min<long long>((long long)cx.p.num_sms * NWARPS / rows,
                                                           (a.row_bytes / 16 + 127) / 128));
  // A block a row item up to the SMs (round order gives block b items b, b + B, ...): each SM's
  // load and store rate shared by as few rows as the call allows (round 86; in NWARPS-item blocks
  // the 8-token call's 64 rows took 4 SMs, 8.4 us against 6.5 at 1 token and 7.0 at 32).
  const long long items = rows * a.row_slices;
  const int blocks = (int)std::min<long long>(items, cx.p.num_sms);
  return launch_pad_dispatch(a, cx.p, in, blocks, px.mask_smem, (int)phase, ids.options(), stream);
}

// The receive of a split padded dispatch: waits for this round's count words (the send's round).
std::vector<at::Tensor> pad_recv(const at::Tensor& like, int64_t pad) {
  PadCtx& px = PX(pad);
  const Params& p = CX(px.ctx).p;
  c10::cuda::CUDAGuard guard(like.device());
  const PadIn in{nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0};
  const int blocks = (int)std::min<long long>((p.L + NTHREADS - 1) / NTHREADS, p.num_sms);
  return launch_pad_dispatch(px.a, p, in, blocks, 0, PAD_RECV, like.options(), c10::cuda::getCurrentCUDAStream());
}

void pad_combine(const at::Tensor& y, const std::optional<at::Tensor>& w, const at::Tensor& counts,
                 const at::Tensor& ids, const std::optional<at::Tensor>& ntok, int64_t n_host, at::Tensor& out,
                 int64_t pad) {
  PadCtx& px = PX(pad);
  Ctx& cx = CX(px.ctx);
  const Params& p = cx.p;
  c10::cuda::CUDAGuard guard(y.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  settle_pending(cx, stream);
  PadArgs a = px.a;
  // Each output row cut into slices (a warp each) until the call fills the arena's SMs, a slice
  // at least a 16-byte chunk a lane.
  const long long rows = std::max<long long>(out.size(0), 1);
  const long long chunks = (a.partials ? a.part_bytes : a.out_bytes) / 16;
  a.slices = (int)std::max(1LL, std::min<long long>((long long)p.num_sms * NWARPS / rows, chunks / 32));
  // The partials' send likewise over its items, every (source group, token < M): a warp each
  // where the GPU has them (run 47 call 3: sized by the live rows, a 1-token call left each warp
  // 13 empty tokens to skip one after another, 10.5 us against 8.3 at 32 tokens).
  const long long sent = (long long)p.G * p.M;
  a.send_slices = (int)std::max(1LL, std::min<long long>((long long)p.num_sms * NWARPS / sent, chunks / 32));
  // Bulk copies only where the call's live send items (about G * rows * S) take at most half the
  // GPU's warps: with every warp sending (128 tokens at world size 1) each SM's bulk copies queue
  // behind one another and the register path's two passes were 1.0 us faster with the rows in L2
  // (run 51 call 5; 0.3-0.8 us slower at 1 and 32 tokens).
  a.send_bulk = a.send_bulk && 2LL * p.G * rows * a.send_slices <= (long long)p.num_sms * NWARPS;
  const PadCombIn in{reinterpret_cast<const char*>(y.data_ptr()), w ? w->data_ptr<float>() : nullptr,
                     counts.data_ptr<int>(), ids.data_ptr<int>(), ntok ? ntok->data_ptr<int>() : nullptr,
                     (int)n_host, (int)out.size(0)};
  const int blocks = pad_blocks(p, std::max({(long long)p.L * p.G, out.size(0) * (long long)a.slices,
                                               a.partials ? sent * a.send_slices : 0LL}));
  // The per-row flags' combine scans the counts into pair_first (pad_create checks it fits); the
  // partials' combine takes its items from the dispatch's slot words, no scan.
  const size_t scan_smem = a.partials ? (a.send_bulk ? SEND_BULK_SMEM : 0) : ((size_t)p.L * p.G + 1) * 4;
  auto launch = [&](auto kernel, auto* o) { kernel<<<blocks, NTHREADS, scan_smem, stream>>>(p, a, in, o); };
  auto* bf = reinterpret_cast<__nv_bfloat16*>(out.data_ptr());
  auto* hf = reinterpret_cast<__half*>(out.data_ptr());
  float* f32 = reinterpret_cast<float*>(out.data_ptr());
  const bool x32 = a.f32_transfer != 0;
  switch (out.scalar_type()) {
    case at::kBFloat16:
      if (!a.partials) launch(pad_combine_kernel<__nv_bfloat16>, bf);
      else if (x32) launch(pad_combine_partials_kernel<__nv_bfloat16, float>, bf);
      else launch(pad_combine_partials_kernel<__nv_bfloat16, __nv_bfloat16>, bf);
      break;
    case at::kHalf:
      if (!a.partials) launch(pad_combine_kernel<__half>, hf);
      else if (x32) launch(pad_combine_partials_kernel<__half, float>, hf);
      else launch(pad_combine_partials_kernel<__half, __half>, hf);
      break;
    case at::kFloat:
      if (!a.partials) launch(pad_combine_kernel<float>, f32);
      else launch(pad_combine_partials_kernel<float, float>, f32);
      break;
    default:
      MOE_CHECK(false, "pad_combine: out dtype must be bfloat16, float16 or float32");
  }
  CUDA_OK(cudaGetLastError());
}

}  // namespace moe
