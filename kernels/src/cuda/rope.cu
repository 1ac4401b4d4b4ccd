// rope (HF rotate_half layout): x [B, H, T, D], cos/sin [T, D/2] or [B, T, D/2] when
// per_batch != 0. One thread per (b, h, t, i < D/2) pair; inverse != 0 rotates by -theta
// (the backward pass). Needs common.cuh prepended (uses nothing from it).

extern "C" __global__ void rope_f32(
    const float* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
    float* __restrict__ out, const size_t b, const size_t h, const size_t t, const size_t d,
    const int per_batch, const int inverse) {
    const size_t half = d / 2;
    const size_t n = b * h * t * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t i = idx % half;
        const size_t rest = idx / half;
        const size_t ti = rest % t;
        const size_t bh = rest / t;
        const size_t cs = (per_batch ? (bh / h) * t * half : 0) + ti * half + i;
        const float c = cos[cs];
        const float s = sin[cs];
        const size_t base = (bh * t + ti) * d;
        const float x1 = x[base + i];
        const float x2 = x[base + i + half];
        if (inverse) {
            out[base + i] = x1 * c + x2 * s;
            out[base + i + half] = x2 * c - x1 * s;
        } else {
            out[base + i] = x1 * c - x2 * s;
            out[base + i + half] = x1 * s + x2 * c;
        }
    }
}
