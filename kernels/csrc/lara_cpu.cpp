// Fused CPU LARA forward (eval and noise), one translation unit, C ABI (loaded by kernels/_cpu_fused.py).
//
// Why a plain C ABI and no torch headers: it compiles in seconds with the system g++ (no ninja, no
// pybind11, no 40 s of ATen headers in CI), and the same object can back an onnxruntime kernel.
//
// Why no -march=native: the .so may be cached in a container image built on one host and run on
// another. The file is compiled for baseline x86-64 (or the host's generic ISA elsewhere); lara_impl.h
// is compiled again inside `#pragma GCC target("avx2,fma")` and `("avx512f,avx512dq,...")`, and the widest
// the CPU has is picked at run time (__builtin_cpu_supports). Each variant is deterministic on its own;
// results of two variants differ in the last bits (FMA and reduction order), so a process always uses one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LARA_HAVE_X86 1
#else
#define LARA_HAVE_X86 0
#endif

namespace lara {

// All arguments of one call; tensors are contiguous float32 in the shapes of kernels.lara_attention.
struct Args {
  int64_t B, H, N, D, C;
  const float* q;           // [B, H, N, D], any strides for B, H, N; D contiguous
  const float* k;           // [B, H, N, D], idem
  const float* v;           // [B, H, N, D], idem
  int64_t qs[3], ks[3], vs[3];  // element strides of q, k, v over (B, H, N): views of a fused qkv need no copy
  const float* ql;          // [B, H, C, D]
  const float* kl;          // [B, H, C, D]
  const float* noise;       // [B or 1, H, C, D] or null (eval)
  int64_t noise_bstride;    // 0 when the noise broadcasts over the batch
  const uint8_t* mask;      // [B, N], 1 = padding, or null
  float alpha_coeff;
  float* out;               // [B, H, N, D], contiguous
};

}  // namespace lara

// -- generic variant: baseline ISA, scalar lanes the compiler may auto-vectorize --
#define LARA_NS generic
#define LARA_AVX2 0
#define LARA_AVX512 0
#include "lara_impl.h"
#undef LARA_NS
#undef LARA_AVX2
#undef LARA_AVX512

#if LARA_HAVE_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define LARA_NS avx2
#define LARA_AVX2 1
#define LARA_AVX512 0
#include "lara_impl.h"
#undef LARA_NS
#undef LARA_AVX2
#undef LARA_AVX512
#pragma GCC pop_options

// AVX-512 (16 lanes): twice the FMA width where the CPU has it, as torch's own GEMM uses there.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
#define LARA_NS avx512
#define LARA_AVX2 0
#define LARA_AVX512 1
#include "lara_impl.h"
#undef LARA_NS
#undef LARA_AVX2
#undef LARA_AVX512
#pragma GCC pop_options
#endif

namespace {

// 2: AVX-512 (F and DQ), 1: AVX2 + FMA, 0: neither. LARA_CPU_ISA=avx2 or generic caps it (to compare
// variants, or to match results computed on another machine).
int best_variant() {
#if LARA_HAVE_X86
  __builtin_cpu_init();
  int best = 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = 1;
  if (best == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) best = 2;
  if (const char* cap = std::getenv("LARA_CPU_ISA")) {
    if (std::strcmp(cap, "avx2") == 0) best = std::min(best, 1);
    if (std::strcmp(cap, "generic") == 0) best = 0;
  }
  return best;
#else
  return 0;
#endif
}

}  // namespace

extern "C" {

// The variant that runs on this CPU: 2 AVX-512, 1 AVX2/FMA, 0 generic (always 0 when forced generic).
int lara_cpu_variant(int force_generic) { return force_generic ? 0 : best_variant(); }

// ABI version: kernels/_cpu_fused.py refuses a cached library whose version differs.
int lara_cpu_abi_version() { return 2; }

// LARA forward with a caller's parallel-for (see lara::*::ParallelFor; null means OpenMP with
// num_threads threads). Returns 0 on success, a negative code for bad sizes (callers validate first).
// strides: 9 element strides, (B, H, N) of q, then of k, then of v.
int lara_cpu_forward_with(int64_t B, int64_t H, int64_t N, int64_t D, int64_t C, const float* q, const float* k,
                          const float* v, const int64_t* strides, const float* ql, const float* kl,
                          const float* noise, int64_t noise_bstride, const uint8_t* mask, float alpha_coeff,
                          float* out, int num_threads, int force_generic,
                          void (*par)(void*, void (*)(void*, size_t), size_t, void*), void* runner) {
  if (B < 0 || H < 0 || N < 0 || D < 1 || C < 1) return -1;
  if (num_threads < 1) num_threads = 1;
  lara::Args a{B, H, N, D, C, q, k, v, {}, {}, {}, ql, kl, noise, noise_bstride, mask, alpha_coeff, out};
  for (int i = 0; i < 3; ++i) {
    a.qs[i] = strides[i];
    a.ks[i] = strides[3 + i];
    a.vs[i] = strides[6 + i];
  }
#if LARA_HAVE_X86
  switch (lara_cpu_variant(force_generic)) {
    case 2: return lara::avx512::forward(a, num_threads, par, runner);
    case 1: return lara::avx2::forward(a, num_threads, par, runner);
    default: break;
  }
#endif
  (void)force_generic;
  return lara::generic::forward(a, num_threads, par, runner);
}

// LARA forward under OpenMP (the torch op's entry point, kernels/_cpu_fused.py).
int lara_cpu_forward(int64_t B, int64_t H, int64_t N, int64_t D, int64_t C, const float* q, const float* k,
                     const float* v, const int64_t* strides, const float* ql, const float* kl, const float* noise,
                     int64_t noise_bstride, const uint8_t* mask, float alpha_coeff, float* out, int num_threads,
                     int force_generic) {
  return lara_cpu_forward_with(B, H, N, D, C, q, k, v, strides, ql, kl, noise, noise_bstride, mask, alpha_coeff,
                               out, num_threads, force_generic, nullptr, nullptr);
}

}  // extern "C"
