"""kernels.matmul_nbits_pack on 4-bit [K, N] codes (the QDQ weight form): csrc/nbits_pack.c
transposes tiles of 32 source rows by 64 columns in AVX-512 or AVX2 registers and does the
edges byte by byte, so shapes here run past several tiles with every kind of edge (K odd, K
and N not multiples of the tile), on every instruction level the machine has. The expected
layout is built code by code from its definition: weight row j holds codes (i, j) for i along
K, two a byte, the first in the low nibble, then zeros to the end of its last block."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimized import kernels

from .conftest import ISA_LEVELS


def packed_4bit(codes: np.ndarray) -> np.ndarray:
    """A 4-bit tensor's raw data: the codes in row-major order, two a byte, low nibble first."""
    flat = codes.reshape(-1).astype(np.uint8) & 15
    flat = np.append(flat, np.zeros(flat.size % 2, np.uint8))
    return flat[0::2] | (flat[1::2] << 4)


def expected_rows(codes_kn: np.ndarray, block_size: int, offset: int) -> np.ndarray:
    k, n = codes_kn.shape
    row_bytes = -(-k // block_size) * block_size // 2
    rows = np.zeros((n, row_bytes), np.uint8)
    for j in range(n):
        for i in range(k):
            rows[j, i // 2] |= ((int(codes_kn[i, j]) + offset) & 15) << (4 * (i % 2))
    return rows


def check_pack(k, n, block_size, signed, seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(-8, 8, (k, n)) if signed else rng.integers(0, 16, (k, n))
    packed = kernels.matmul_nbits_pack(packed_4bit(codes), k=k, n=n, bits=4,
                                       block_size=block_size, signed=signed)
    assert packed.shape == (n, -(-k // block_size), block_size // 2)
    np.testing.assert_array_equal(packed.reshape(n, -1),
                                  expected_rows(codes, block_size, 8 if signed else 0))


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 200), pairs=st.integers(1, 90),
       block_size=st.sampled_from([16, 32, 64, 128]), signed=st.booleans(),
       seed=st.integers(0, 2**16))
@pytest.mark.parametrize("level", ISA_LEVELS)
def test_pack_4bit_matches_the_layout(level, k, pairs, block_size, signed, seed):
    with kernels.isa_limit(level):
        check_pack(k, 2 * pairs, block_size, signed, seed)


@pytest.mark.parametrize("level", ISA_LEVELS)
@pytest.mark.parametrize("k,n", [(32, 64), (64, 128), (96, 192), (33, 66), (127, 130),
                                 (160, 62), (31, 256), (256, 100), (544, 192), (700, 258),
                                 (1024, 320), (1120, 130)])
def test_pack_4bit_whole_tiles_and_edges(level, k, n):
    """Whole tiles only, one code row or column pair past them, shapes with no whole tile
    along one axis (K < 32, N < 64), and K over one chunk of 512 rows (in blocks of 128 rows
    and fewer) with a strip of 32 byte columns or one byte column left past the 64-byte ones."""
    with kernels.isa_limit(level):
        check_pack(k, n, 32, signed=True, seed=k * n)


@pytest.mark.parametrize("level", ISA_LEVELS)
@pytest.mark.parametrize("offset", [0, 16, 1])
@pytest.mark.parametrize("k,n", [(1024, 128), (640, 192), (1056, 64)])
def test_pack_4bit_into_memory_on_and_off_a_cache_line(level, offset, k, n):
    """AVX-512 writes a block of 128 source rows to each weight row as one 64-byte line,
    streamed past the caches where B starts on a cache line and its rows are whole lines
    (K a multiple of 128), else stored under a byte mask (the last block of a chunk, fewer
    rows): B at offsets 0, 16 (NumPy's large arrays) and 1 from a line gives the same bytes."""
    rng = np.random.default_rng(k + n + offset)
    codes = rng.integers(0, 16, (k, n))
    size = n * k // 2
    memory = np.full(size + 128, 0xAB, np.uint8)
    start = -memory.ctypes.data % 64 + offset
    out = memory[start:start + size]
    with kernels.isa_limit(level):
        got = kernels.matmul_nbits_pack(packed_4bit(codes), k=k, n=n, bits=4, block_size=32,
                                        out=out)
    assert np.shares_memory(got, memory)
    np.testing.assert_array_equal(got.reshape(n, -1), expected_rows(codes, 32, 0))
    assert (memory[:start] == 0xAB).all() and (memory[start + size:] == 0xAB).all()


@settings(max_examples=40, deadline=None)
@given(blocks=st.integers(1, 40), n=st.integers(1, 300), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("level", ISA_LEVELS)
def test_scales_are_transposed(level, blocks, n, seed):
    """kernels.matmul_nbits_scales: [blocks, N] to [N, blocks], 8 x 8 blocks in registers and
    the edges one by one (every remainder of both sides modulo 8 is drawn)."""
    scales = np.random.default_rng(seed).standard_normal((blocks, n), dtype=np.float32)
    with kernels.isa_limit(level):
        np.testing.assert_array_equal(kernels.matmul_nbits_scales(scales), scales.T)


def test_scales_of_a_view_and_bad_scales():
    scales = np.arange(24 * 70, dtype=np.float32).reshape(24, 70)
    np.testing.assert_array_equal(kernels.matmul_nbits_scales(scales[::2, 3:]), scales[::2, 3:].T)
    with pytest.raises(TypeError, match="2-D float32"):
        kernels.matmul_nbits_scales(scales.astype(np.float16))
    with pytest.raises(TypeError, match="2-D float32"):
        kernels.matmul_nbits_scales(scales.reshape(-1))


def test_pack_and_scales_into_given_arrays():
    """out= writes B (or the scales) into the given array, as a fresh one would hold them; an
    array of another size or type, read-only, or overlapping the input is refused by name."""
    rng = np.random.default_rng(3)
    codes = packed_4bit(rng.integers(0, 16, (64, 128)))
    expected = kernels.matmul_nbits_pack(codes, k=64, n=128, bits=4, block_size=32)
    out = np.full(expected.size, 0xAB, np.uint8)
    got = kernels.matmul_nbits_pack(codes, k=64, n=128, bits=4, block_size=32, out=out)
    assert np.shares_memory(got, out)
    np.testing.assert_array_equal(got, expected)
    for bad, error in [(np.empty(expected.size + 1, np.uint8), "shape"),
                       (np.empty(expected.size, np.uint8)[::-1], "shape"),
                       (codes, "overlap")]:
        with pytest.raises(ValueError, match=error):
            kernels.matmul_nbits_pack(codes, k=64, n=128, bits=4, block_size=32, out=bad)
    with pytest.raises(TypeError, match="uint8"):
        kernels.matmul_nbits_pack(codes, k=64, n=128, bits=4, block_size=32,
                                  out=np.empty(expected.size // 4, np.float32))
    frozen = np.empty(expected.size, np.uint8)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="writeable"):
        kernels.matmul_nbits_pack(codes, k=64, n=128, bits=4, block_size=32, out=frozen)
    both = np.zeros(2 * codes.size, np.uint8)
    both[:codes.size] = codes
    with pytest.raises(ValueError, match="overlap"):  # half of out is codes' second half
        kernels.matmul_nbits_pack(both[:codes.size], k=64, n=128, bits=4, block_size=32,
                                  out=both[codes.size // 2:][:expected.size])
    scales = rng.standard_normal((9, 20), dtype=np.float32)
    out = np.empty((20, 9), np.float32)
    assert kernels.matmul_nbits_scales(scales, out=out) is out
    np.testing.assert_array_equal(out, scales.T)
    with pytest.raises(ValueError, match="shape"):
        kernels.matmul_nbits_scales(scales, out=np.empty((9, 20), np.float32))
    square = rng.standard_normal((8, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="overlap"):
        kernels.matmul_nbits_scales(square, out=square)


def expected_rows_8bit(codes_kn: np.ndarray, block_size: int, offset: int) -> np.ndarray:
    """8-bit MatMulNBits rows built code by code: row j holds (codes[i, j] + offset) mod 256
    at byte i, then zeros to the end of its last block."""
    k, n = codes_kn.shape
    rows = np.zeros((n, -(-k // block_size) * block_size), np.uint8)
    for j in range(n):
        for i in range(k):
            rows[j, i] = (int(codes_kn[i, j]) + offset) & 255
    return rows


@pytest.mark.parametrize("k,n", [(16, 32), (32, 64), (48, 96), (17, 33), (31, 63), (47, 100),
                                 (5, 7), (64, 31), (15, 32)])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("level", ISA_LEVELS)
def test_pack_8bit_whole_tiles_and_edges(k, n, signed, level):
    """8-bit [K, N] codes: tiles of 16 rows by 32 columns in AVX2 registers, edge rows and
    columns byte by byte; signed codes move by 128."""
    rng = np.random.default_rng(k * 1000 + n)
    codes = rng.integers(-128, 128, (k, n)) if signed else rng.integers(0, 256, (k, n))
    raw = (codes.reshape(-1) & 255).astype(np.uint8)
    for block_size in (16, 64):
        with kernels.isa_limit(level):
            packed = kernels.matmul_nbits_pack(raw, k=k, n=n, bits=8, block_size=block_size,
                                               signed=signed)
        assert packed.shape == (n, -(-k // block_size), block_size)
        np.testing.assert_array_equal(packed.reshape(n, -1),
                                      expected_rows_8bit(codes, block_size, 128 if signed else 0))
