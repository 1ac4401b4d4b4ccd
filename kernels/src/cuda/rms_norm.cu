// rms_norm: y = x * w / sqrt(mean(x^2) + eps) over rows of x [rows, dim], one block per row;
// the weight gradient is reduced in two deterministic stages (row chunks, then chunks in
// order). Needs common.cuh prepended.

extern "C" __global__ void rms_norm_fwd_f32(
    const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
    const size_t dim, const float eps) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const float* xr = x + row * dim;
    float ss = 0.0f;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = ox_block_sum(ss, shared);
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) y[row * dim + i] = xr[i] * r * w[i];
}

// dx_i = r w_i g_i - (r^3 / D) x_i sum_j g_j w_j x_j
extern "C" __global__ void rms_norm_bwd_x_f32(
    const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ g,
    float* __restrict__ dx, const size_t dim, const float eps) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const float* xr = x + row * dim;
    const float* gr = g + row * dim;
    float ss = 0.0f, dot = 0.0f;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) {
        ss += xr[i] * xr[i];
        dot += gr[i] * w[i] * xr[i];
    }
    ss = ox_block_sum(ss, shared);
    dot = ox_block_sum(dot, shared);
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    const float c = r * r * r / (float)dim * dot;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x)
        dx[row * dim + i] = r * w[i] * gr[i] - c * xr[i];
}

// rinv[row] = 1 / sqrt(mean(x[row]^2) + eps)
extern "C" __global__ void rms_norm_rinv_f32(
    const float* __restrict__ x, float* __restrict__ rinv, const size_t dim, const float eps) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const float* xr = x + row * dim;
    float ss = 0.0f;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = ox_block_sum(ss, shared);
    if (threadIdx.x == 0) rinv[row] = 1.0f / sqrtf(ss / (float)dim + eps);
}

// partial[chunk, i] = sum over the chunk's rows of g[row, i] x[row, i] rinv[row].
// grid = (ceil(dim / blockDim.x), n_chunks).
extern "C" __global__ void rms_norm_bwd_w_partial_f32(
    const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ rinv,
    float* __restrict__ partial, const size_t rows, const size_t dim,
    const size_t rows_per_chunk) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t chunk = blockIdx.y;
    if (i >= dim) return;
    const size_t start = chunk * rows_per_chunk;
    size_t end = start + rows_per_chunk;
    if (end > rows) end = rows;
    float acc = 0.0f;
    for (size_t r = start; r < end; ++r) acc += g[r * dim + i] * x[r * dim + i] * rinv[r];
    partial[chunk * dim + i] = acc;
}

// dw[i] = sum over chunks, in chunk order, of partial[chunk, i].
extern "C" __global__ void rms_norm_bwd_w_reduce_f32(
    const float* __restrict__ partial, float* __restrict__ dw, const size_t n_chunks,
    const size_t dim) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= dim) return;
    float acc = 0.0f;
    for (size_t c = 0; c < n_chunks; ++c) acc += partial[c * dim + i];
    dw[i] = acc;
}
