// Shared device helpers for oxalign's NVRTC kernels: block-wide reductions in a fixed order
// (so results are reproducible for a given block size). Prepended to every kernel source by
// ops/cuda_launch.rs; NVRTC gets no include paths, so nothing here may #include.

#define OX_NEG_INF (__int_as_float(0xff800000))
#define OX_NAN (__int_as_float(0x7fffffff))

__device__ __forceinline__ float ox_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float ox_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide max of `v`, returned to every thread. `shared` holds 32 floats. blockDim.x must
// be a multiple of 32 (all launches use 256).
__device__ float ox_block_max(float v, float* shared) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = ox_warp_max(v);
    __syncthreads();  // `shared` may still be read from a previous reduction
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nwarps ? shared[lane] : OX_NEG_INF;
        w = ox_warp_max(w);
        if (lane == 0) shared[0] = w;
    }
    __syncthreads();
    return shared[0];
}

// Block-wide sum of `v`, returned to every thread; same contract as ox_block_max.
__device__ float ox_block_sum(float v, float* shared) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = ox_warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nwarps ? shared[lane] : 0.0f;
        w = ox_warp_sum(w);
        if (lane == 0) shared[0] = w;
    }
    __syncthreads();
    return shared[0];
}
