// token_logprobs: one block per row of logits [rows, vocab]. Forward writes
// z[y] - logsumexp(z) (NaN for an out-of-range target); backward writes
// g * (onehot(y) - softmax(z)). Needs common.cuh prepended.

extern "C" __global__ void token_logprobs_fwd_f32(
    const float* __restrict__ logits, const unsigned int* __restrict__ targets,
    float* __restrict__ out, const size_t vocab) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const float* z = logits + row * vocab;
    float m = OX_NEG_INF;
    for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) m = fmaxf(m, z[v]);
    m = ox_block_max(m, shared);
    float s = 0.0f;
    for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) s += expf(z[v] - m);
    s = ox_block_sum(s, shared);
    if (threadIdx.x == 0) {
        const unsigned int y = targets[row];
        out[row] = y < vocab ? z[y] - (m + logf(s)) : OX_NAN;
    }
}

extern "C" __global__ void token_logprobs_bwd_f32(
    const float* __restrict__ logits, const unsigned int* __restrict__ targets,
    const float* __restrict__ grad, float* __restrict__ out, const size_t vocab) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const float* z = logits + row * vocab;
    float* o = out + row * vocab;
    const float g = grad[row];
    if (g == 0.0f) {  // masked position: the same branch for the whole block
        for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) o[v] = 0.0f;
        return;
    }
    float m = OX_NEG_INF;
    for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) m = fmaxf(m, z[v]);
    m = ox_block_max(m, shared);
    float s = 0.0f;
    for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) s += expf(z[v] - m);
    s = ox_block_sum(s, shared);
    const float lse = m + logf(s);
    const unsigned int y = targets[row];
    for (size_t v = threadIdx.x; v < vocab; v += blockDim.x) {
        const float onehot = (v == (size_t)y) ? 1.0f : 0.0f;
        o[v] = g * (onehot - expf(z[v] - lse));
    }
}
