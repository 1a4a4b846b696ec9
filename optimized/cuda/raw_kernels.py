"""Hand-written CUDA kernels (cupy.RawKernel sources) with their numpy twins.

The twin is the same algorithm, step for step, in numpy: the fake device runs it, so the CPU
tests check the algorithm (the blockwise online softmax of the attention kernel, the two-pass
row statistics of LayerNormalization) against the reference. The CUDA sources are UNTESTED ON
A GPU until a GPU session runs tests/optimized/cuda/test_gpu.py.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

THREADS = 128  # threads per block; also the attention kernel's key tile


@dataclass(frozen=True)
class RawSpec:
    name: str
    source: str
    twin: Callable  # twin(*arrays, **params): writes its outputs in place
    geometry: Callable  # geometry(*arrays, **params) -> (grid, block, scalar args, shared bytes)


# attention --------------------------------------------------------------------------------
ATTENTION_SOURCE = r"""
extern "C" __global__ void flash_attention_f32(
    const float* q, const float* k, const float* v, const float* bias, float* out,
    int S, int T, int H, int N, float scale, int causal, float mask_value, int has_bias)
{
    // one block per (query row, head, batch); the keys pass once, a tile of 128 at a time,
    // with a running max and sum (online softmax), so the S x T scores are never stored
    const int i = blockIdx.x, n = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
    const int past = T - S;
    const long bn = (long)b * N + n;
    const float* qi = q + (bn * S + i) * H;
    const float* kb = k + bn * T * H;
    const float* vb = v + bn * T * H;
    const float* bi = bias + (bn * S + i) * (long)T;
    __shared__ float qs[128];
    __shared__ float p[128];
    __shared__ float red[128];
    if (tid < H) qs[tid] = qi[tid];
    float m = -INFINITY, l = 0.f, acc = 0.f;
    __syncthreads();
    for (int j0 = 0; j0 < T; j0 += 128) {
        const int j = j0 + tid;
        float s = -INFINITY;
        if (j < T) {
            float dot = 0.f;
            for (int d = 0; d < H; ++d) dot += qs[d] * kb[(long)j * H + d];
            s = dot * scale;
            if (has_bias) s += bi[j];
            if (causal && j > i + past) s += mask_value;
        }
        red[tid] = s;
        __syncthreads();
        for (int w = 64; w > 0; w >>= 1) {
            if (tid < w) red[tid] = fmaxf(red[tid], red[tid + w]);
            __syncthreads();
        }
        const float m_new = fmaxf(m, red[0]);
        __syncthreads();
        const float e = j < T ? expf(s - m_new) : 0.f;
        p[tid] = e;
        red[tid] = e;
        __syncthreads();
        for (int w = 64; w > 0; w >>= 1) {
            if (tid < w) red[tid] += red[tid + w];
            __syncthreads();
        }
        const float corr = expf(m - m_new);
        l = l * corr + red[0];
        if (tid < H) {
            float a = acc * corr;
            const int count = min(128, T - j0);
            for (int jj = 0; jj < count; ++jj) a += p[jj] * vb[(long)(j0 + jj) * H + tid];
            acc = a;
        }
        m = m_new;
        __syncthreads();
    }
    if (tid < H) out[(bn * S + i) * H + tid] = acc / l;
}
"""


def attention_twin(q, k, v, bias, out, *, scale, causal, mask_value, has_bias, block=THREADS):
    """q [B,N,S,H], k/v [B,N,T,H] (float32), bias [B,N,S,T] -> out [B,N,S,H]: the CUDA
    kernel's tile loop with its running max m, running sum l and accumulator."""
    S, T = q.shape[2], k.shape[2]
    f = np.float32
    m = np.full(q.shape[:3] + (1,), -np.inf, f)
    l = np.zeros_like(m)
    acc = np.zeros(q.shape, f)
    rows = np.arange(S)[:, None] + (T - S)
    for j0 in range(0, T, block):
        j1 = min(T, j0 + block)
        s = np.matmul(q, np.swapaxes(k[:, :, j0:j1], -1, -2)) * f(scale)
        if has_bias:
            s = s + bias[:, :, :, j0:j1]
        if causal:
            s = s + np.where(np.arange(j0, j1)[None, :] > rows, f(mask_value), f(0))
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        p = np.exp(s - m_new)
        corr = np.exp(m - m_new)
        l = l * corr + p.sum(axis=-1, keepdims=True)
        acc = acc * corr + np.matmul(p, v[:, :, j0:j1])
        m = m_new
    out[...] = acc / l


def attention_geometry(q, k, v, bias, out, *, scale, causal, mask_value, has_bias):
    B, N, S, H = q.shape
    T = k.shape[2]
    scalars = (np.int32(S), np.int32(T), np.int32(H), np.int32(N), np.float32(scale),
               np.int32(causal), np.float32(mask_value), np.int32(has_bias))
    return (S, N, B), (THREADS,), scalars, 0


ATTENTION = RawSpec("flash_attention_f32", ATTENTION_SOURCE, attention_twin, attention_geometry)
ATTENTION_MAX_HEAD = THREADS


# LayerNormalization -----------------------------------------------------------------------
LAYER_NORM_SOURCE = r"""
__device__ float block_sum(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
        __syncthreads();
    }
    const float total = red[0];
    __syncthreads();
    return total;
}

extern "C" __global__ void layer_norm_f32(const float* x, const float* scale, const float* bias,
                                          float* y, int cols, float eps, int has_bias)
{
    // one block per row: the mean, then the variance of the centred row (two passes, as the
    // reference computes them), then the affine map
    __shared__ float red[128];
    const long row = blockIdx.x;
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
    const float mean = block_sum(s, red) / cols;
    float q = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { const float d = xr[c] - mean; q += d * d; }
    const float inv = rsqrtf(block_sum(q, red) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float r = (xr[c] - mean) * inv * scale[c];
        if (has_bias) r += bias[c];
        yr[c] = r;
    }
}
"""


def layer_norm_twin(x, scale, bias, y, *, cols, eps, has_bias):
    rows = x.reshape(-1, cols).astype(np.float32)
    mean = rows.mean(axis=1, keepdims=True, dtype=np.float32)
    centred = rows - mean
    inv = np.float32(1) / np.sqrt((centred * centred).mean(axis=1, keepdims=True) + np.float32(eps))
    r = centred * inv * scale.reshape(1, cols)
    if has_bias:
        r = r + bias.reshape(1, cols)
    y.reshape(-1, cols)[...] = r


def layer_norm_geometry(x, scale, bias, y, *, cols, eps, has_bias):
    return (x.size // cols,), (THREADS,), (np.int32(cols), np.float32(eps), np.int32(has_bias)), 0


LAYER_NORM = RawSpec("layer_norm_f32", LAYER_NORM_SOURCE, layer_norm_twin, layer_norm_geometry)


def default_scale(head_size: int) -> float:
    return 1.0 / math.sqrt(head_size)
