// Test-only: CUDA's kernel language on the CPU, so the CPU tests execute the kernels that ship.
// The very sources of csrc/cuda (reduce_kernels.cu, wire_kernels.cu, cuda_reducer.cc) are
// compiled a second time by the host compiler with this header included first
// (`-x c++ -include testing/cuda/kernels_on_host.h`); nothing of the kernels is copied.
//
// - __global__, __device__, __launch_bounds__ mean nothing; threadIdx, blockIdx, blockDim and
//   gridDim are per-thread variables the grid runner sets; the 16-byte vector type (uint4) and
//   the 16-bit conversions are the CUDA toolkit's own, host side, so uint4 is 16-byte aligned as
//   on the GPU and a misaligned vector access is undefined behaviour here too.
// - The kernels' one launch point (RC_LAUNCH_ON_HOST in kernel_common.cuh) runs every block and
//   thread of the grid that the real launch sizing chose, one thread at a time in a shuffled
//   order (the kernels use no shared memory and no barriers, so any order must give the same
//   result), as stream work of the runtime below.
// - The CUDA runtime calls of the kernels' host side (device, attributes, occupancy, last
//   error, copies) go to hostkern functions: device properties are set by the test (an H200's
//   132 SMs, an A100's 108, ...); the rest defaults to running at once on the calling thread
//   and can be pointed at the host implementation of CUDA (host_gpu.h), so that kernels run in
//   stream order there and share its per-thread error state.
#pragma once

#define RC_KERNEL_BUILD on_host  // kernel_build.h: the host build's own symbols

// Our own threadIdx & co. (below) instead of the toolkit's device builtins.
#define __DEVICE_LAUNCH_PARAMETERS_H__
#define __global__
#define __device__
#define __host__

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#undef __launch_bounds__
#define __launch_bounds__(...)

#include "cpu/half.h"  // bitsToFloat, floatToBits
#include "testing/cuda/kernel_runtime.h"

#define threadIdx (::ringcomm::hostkern::position().thread)
#define blockIdx (::ringcomm::hostkern::position().block)
#define blockDim (::ringcomm::hostkern::position().blockSize)
#define gridDim (::ringcomm::hostkern::position().gridSize)
#define __uint_as_float ::ringcomm::bitsToFloat  // device intrinsics
#define __float_as_uint ::ringcomm::floatToBits

#define RC_LAUNCH_ON_HOST(kernel, blocks, threads, stream, params) \
  ::ringcomm::hostkern::launch(kernel, blocks, threads, stream, params)

#define cudaGetDevice ::ringcomm::hostkern::getDevice
#define cudaSetDevice ::ringcomm::hostkern::setDevice
#define cudaGetLastError ::ringcomm::hostkern::getLastError
#define cudaDeviceGetAttribute ::ringcomm::hostkern::deviceGetAttribute
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor \
  ::ringcomm::hostkern::occupancyMaxActiveBlocksPerMultiprocessor
#define cudaMemcpyAsync ::ringcomm::hostkern::memcpyAsync
#define cudaThreadExchangeStreamCaptureMode ::ringcomm::hostkern::exchangeCaptureMode
#define cudaGetErrorName ::ringcomm::hostkern::errorName
#define cudaGetErrorString ::ringcomm::hostkern::errorString
