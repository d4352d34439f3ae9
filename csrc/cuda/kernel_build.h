// The kernels and what wraps them (reduce_kernels.h, kernel_common.cuh, CudaReducer) live in an
// inline namespace named after their build: `device` for the GPU. The CPU tests compile the very
// same sources for the host under another name
// (csrc/testing/cuda/kernels_on_host.h), so both builds link into one module without their
// inline functions and classes colliding. Callers just write ringcomm::launchReduce.
#pragma once

#ifndef RC_KERNEL_BUILD
#define RC_KERNEL_BUILD device
#endif
