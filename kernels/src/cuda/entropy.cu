// entropy: one block per row of logits [rows, vocab]. Forward writes
// H = ln s - w / s with s = sum e^(z-m), w = sum e^(z-m)(z-m); backward writes
// -g p_v ((z_v - m) - w / s). Needs common.cuh prepended.

__device__ void ox_entropy_stats(const float* z, size_t vocab, float* shared,
                                 float* m_out, float* s_out, float* w_out) {
    float m = OX_NEG_INF;
    for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) m = fmaxf(m, z[v]);
    m = ox_block_max(m, shared);
    float s = 0.0f, w = 0.0f;
    for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) {
        const float d = z[v] - m;
        const float e = expf(d);
        s += e;
        w += e * d;
    }
    *m_out = m;
    *s_out = ox_block_sum(s, shared);
    *w_out = ox_block_sum(w, shared);
}

extern "C" __global__ void entropy_fwd_f32(
    const float* __restrict__ logits, float* __restrict__ out, const size_t vocab) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    float m, s, w;
    ox_entropy_stats(logits + row * vocab, vocab, shared, &m, &s, &w);
    if (threadIdx.x == 0) out[row] = logf(s) - w / s;
}

extern "C" __global__ void entropy_bwd_f32(
    const float* __restrict__ logits, const float* __restrict__ grad,
    float* __restrict__ out, const size_t vocab) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const float* z = logits + row * vocab;
    float* o = out + row * vocab;
    const float g = grad[row];
    if (g == 0.0f) {
        for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) o[v] = 0.0f;
        return;
    }
    float m, s, w;
    ox_entropy_stats(z, vocab, shared, &m, &s, &w);
    const float mean_shifted = w / s;
    const float scale = -g / s;
    for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) {
        const float d = z[v] - m;
        o[v] = scale * expf(d) * (d - mean_shifted);
    }
}
