// Hopper (sm_90a) synchronization for warp specialization: asynchronous barriers in shared
// memory (mbarrier) between the copying warpgroup and the computing ones, named barriers that
// take turns between the computing warpgroups, and the reallocation of registers from the one
// to the others.

#pragma once

// An mbarrier whose phase completes after `count` arrivals.
VA_DEVICE void va_mbarrier_init(va_u64* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(va_smem_addr(bar)), "r"(count) : "memory");
}

// Waits until the barrier's phase of parity `parity` has completed (a fresh barrier is in phase
// 0, so waiting for parity 1 returns at once: the usual start of a producer's "empty" wait).
// The waiting warp sleeps in the instruction (up to the time hint, 10 ms) instead of spinning
// on issue slots the computing warps need.
#define VA_WAIT_HINT_NS 10000000
VA_DEVICE void va_mbarrier_wait(va_u64* bar, int parity) {
    va_u32 done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3; selp.u32 %0, 1, 0, p; }\n"
                     : "=r"(done)
                     : "r"(va_smem_addr(bar)), "r"(parity), "r"(VA_WAIT_HINT_NS)
                     : "memory");
    } while (!done);
}

VA_DEVICE void va_mbarrier_arrive(va_u64* bar) {
    asm volatile("{ .reg .b64 state; mbarrier.arrive.shared::cta.b64 state, [%0]; }\n" ::"r"(va_smem_addr(bar)) : "memory");
}

// One arrival on `bar` once all of this thread's earlier cp.async copies have landed.
VA_DEVICE void va_copy_arrive(va_u64* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(va_smem_addr(bar)) : "memory");
}

VA_DEVICE void va_copy_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Named barrier `id` (1 to 15; 0 is __syncthreads) for `threads` threads: `sync` waits for the
// rest, `arrive` counts this warp without waiting.
VA_DEVICE void va_named_sync(int id, int threads) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }
VA_DEVICE void va_named_arrive(int id, int threads) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }

// Gives registers back (the copying warpgroup) or takes them (the computing ones); every warp of
// the warpgroup executes it. ptxas allocates the code after it within the new count.
template <int REGISTERS> VA_DEVICE void va_registers_release() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS)); }
template <int REGISTERS> VA_DEVICE void va_registers_claim() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS)); }

// ---- The tensor memory accelerator (TMA) -----------------------------------------------------

// A tensor map (CUtensorMap) as the host encoded it, passed as a __grid_constant__ parameter.
struct alignas(64) VaTensorMap {
    va_u64 bits[16];
};

// One arrival on `bar` that also expects `bytes` more to land (by TMA) before its phase completes.
VA_DEVICE void va_mbarrier_arrive_expect_tx(va_u64* bar, int bytes) {
    asm volatile("{ .reg .b64 state; mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1; }\n" ::"r"(va_smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// The box of `map` at element coordinates (x, y, z) into shared memory at `dst`, counted on
// `bar` as it lands.
VA_DEVICE void va_tma_load_3d(void* dst, const VaTensorMap* map, int x, int y, int z, va_u64* bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
                     va_smem_addr(dst)),
                 "l"(reinterpret_cast<va_u64>(map)), "r"(x), "r"(y), "r"(z), "r"(va_smem_addr(bar))
                 : "memory");
}

VA_DEVICE void va_prefetch_tensor_map(const VaTensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<va_u64>(map)) : "memory");
}
