// rshmem/qualifiers.cuh — function qualifiers that let one header serve CUDA and host C++.
//
// Owns: RSHMEM_HOST_DEVICE / RSHMEM_DEVICE and the inline policy of the device API.
// Headers that hold code for both sides (wire encodings, patterns, layouts) mark their
// functions RSHMEM_HOST_DEVICE, so host C++ tests can include them unchanged; code that
// only exists on the GPU (inline PTX, fences) goes inside `#if RSHMEM_DEVICE_COMPILE`.
#pragma once

#if defined(__CUDACC__)
#define RSHMEM_HOST_DEVICE __host__ __device__ __forceinline__
#define RSHMEM_DEVICE __device__ __forceinline__
#else
#define RSHMEM_HOST_DEVICE inline
// Host C++ never calls device-only functions; it may still see their declarations.
#define RSHMEM_DEVICE inline
#endif

// True while compiling device code (nvcc's device pass), false in host passes and g++.
#if defined(__CUDA_ARCH__)
#define RSHMEM_DEVICE_COMPILE 1
#else
#define RSHMEM_DEVICE_COMPILE 0
#endif
