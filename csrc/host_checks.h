// host_checks.h: the host side's error checks (MOE_CHECK, CUDA_OK).
#pragma once

#include <cuda_runtime.h>
#include <torch/library.h>

#include <string>
#include <type_traits>

namespace moe {

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

}  // namespace moe
