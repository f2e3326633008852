// Portability header of the attention kernel: the kernel is written in HIP C++ and compiled by
// hipRTC/hipcc on AMD GPUs, or by NVRTC on NVIDIA GPUs, where this header supplies what HIP
// would. Everything platform-specific lives here or behind VA_NVIDIA / VA_AMD in the kernel.
//
// No system headers: NVRTC runs without a CUDA toolkit (and without cuda_bf16.h), so bf16 and
// f16 values travel as raw 16-bit patterns and are converted with explicit instructions.

#pragma once

// NVRTC (and nvcc) define __CUDACC_RTC__ / __CUDACC__; hipcc, clang's HIP mode and hipRTC
// define __HIP__ or __HIPCC_RTC__.
#if (defined(__CUDACC_RTC__) || defined(__CUDACC__)) && !defined(__HIP__)
#define VA_NVIDIA 1
#else
#define VA_AMD 1
#endif

typedef unsigned short va_u16;
typedef unsigned int va_u32;
typedef unsigned long long va_u64;
typedef long long va_i64;

// Spelled the same by both vendors.
#define VA_DEVICE __device__ __forceinline__
#define va_syncthreads() __syncthreads()

#if defined(VA_NVIDIA)
#define VA_WARP 32
// At most `threads` per block, registers for at least `blocks` blocks per multiprocessor.
#define __launch_bounds_va(threads, blocks) __launch_bounds__(threads, blocks)
// The parameter block stays in constant memory even where the kernel indexes into it.
#define VA_GRID_CONSTANT __grid_constant__
VA_DEVICE float va_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
VA_DEVICE bool va_any(bool predicate) { return __any_sync(0xffffffffu, predicate); }

#else // VA_AMD
#include <hip/hip_runtime.h>
#define VA_WARP 64
// HIP's second argument means something else (waves per execution unit): threads only.
#define __launch_bounds_va(threads, blocks) __launch_bounds__(threads)
#define VA_GRID_CONSTANT
VA_DEVICE float va_shfl_xor(float v, int mask) { return __shfl_xor(v, mask); }
VA_DEVICE bool va_any(bool predicate) { return __any(predicate); }
#endif

// ---- 16-bit floats as bit patterns -------------------------------------------------------

#if defined(VA_IS_F16)
VA_DEVICE float va_to_float(va_u16 x) {
#if defined(VA_NVIDIA)
    float f;
    asm("{ .reg .f16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(x));
    return f;
#else
    return (float)__builtin_bit_cast(_Float16, x);
#endif
}
// Two floats to a packed pair (lo in the low half), round to nearest even.
VA_DEVICE va_u32 va_pack2(float lo, float hi) {
#if defined(VA_NVIDIA)
    va_u32 r;
    asm("{ .reg .f16 a, b; cvt.rn.f16.f32 a, %1; cvt.rn.f16.f32 b, %2; mov.b32 %0, {a, b}; }" : "=r"(r) : "f"(lo), "f"(hi));
    return r;
#else
    va_u16 a = __builtin_bit_cast(va_u16, (_Float16)lo), b = __builtin_bit_cast(va_u16, (_Float16)hi);
    return (va_u32)a | ((va_u32)b << 16);
#endif
}
#else // bf16
VA_DEVICE float va_to_float(va_u16 x) { return __uint_as_float(((va_u32)x) << 16); }
#if defined(VA_AMD)
// f32 bits rounded to nearest even at bit 16 (the bf16 is the high half); NaN stays NaN.
VA_DEVICE va_u32 va_round_to_bf16_bits(float x) {
    va_u32 a = __float_as_uint(x);
    return (a & 0x7fffffffu) > 0x7f800000u ? (a | 0x400000u) : a + 0x7fffu + ((a >> 16) & 1u);
}
#endif
VA_DEVICE va_u32 va_pack2(float lo, float hi) {
#if defined(VA_NVIDIA)
    va_u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(lo), "f"(hi));
    return r;
#else
    return (va_round_to_bf16_bits(lo) >> 16) | (va_round_to_bf16_bits(hi) & 0xffff0000u);
#endif
}
#endif

VA_DEVICE va_u16 va_from_float(float x) { return (va_u16)(va_pack2(x, 0.0f) & 0xffffu); }

// 2^x with the hardware's approximation (within 2 ulp; subnormal results flush to 0).
VA_DEVICE float va_exp2(float x) {
#if defined(VA_NVIDIA)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

// ---- NVIDIA: asynchronous copies, ldmatrix, mma ----------------------------------------------

#if defined(VA_NVIDIA)
VA_DEVICE va_u32 va_smem_addr(const void* p) { return (va_u32)__cvta_generic_to_shared(p); }

// Copies `bytes` (0 to 16) from global to shared memory, zero-filling the rest of 16.
VA_DEVICE void va_copy16(void* smem, const void* gmem, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(va_smem_addr(smem)), "l"(gmem), "r"(bytes));
}
VA_DEVICE void va_copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> VA_DEVICE void va_copy_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

VA_DEVICE void va_ldmatrix_x4(va_u32 (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(va_smem_addr(smem)));
}
VA_DEVICE void va_ldmatrix_x4_trans(va_u32 (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(va_smem_addr(smem)));
}

// D = A (16x16, row) * B (16x8, col) + C, f32 accumulators.
VA_DEVICE void va_mma_16816(float (&c)[4], const va_u32 (&a)[4], va_u32 b0, va_u32 b1) {
#if defined(VA_IS_F16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
#endif
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif
