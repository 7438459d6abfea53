"""The per-row flash-decoding kernel (`rlfarm.engines.decode_attention`) against the masked matmuls it replaces on
CUDA, at a 7B layer's head layout (the decoder under refill: tests/engines/test_static_decoder.py). Without a GPU
they run on the CPU under Triton's interpreter where Triton is installed and TRITON_INTERPRET=1 (float32 only)."""
import os

import pytest
import torch

from rlfarm.engines.decode_attention import Launch, available, decode_attention
from rlfarm.engines.llama_attention import attend_cache

CUDA = torch.cuda.is_available() and available(torch.device("cuda"))
INTERPRETED = not CUDA and os.environ.get("TRITON_INTERPRET") == "1" and available(torch.device("cpu"))
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
# interpreted runs are asked for by hand (CI's torch has no Triton): they drop the gpu mark that skips without CUDA
pytestmark = ([] if INTERPRETED else [pytest.mark.gpu]) + [
    pytest.mark.skipif(not (CUDA or INTERPRETED), reason="needs CUDA and Triton (or TRITON_INTERPRET=1)")]
KV_HEADS, GROUPS, DIM = 4, 7, 128  # Qwen2.5-7B's layout: 4 kv heads of 7 query heads, head dim 128


def ragged_cache(dtype, rows=9, columns=700, seed=0):
    """A bucket view of a longer cache (strided), rows of very different lengths with left padding, ends on and
    off the kernel's block and split edges."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    cache = torch.randn(2, rows, KV_HEADS, columns + 64, DIM, device=DEVICE, dtype=dtype, generator=gen)
    keys, values = cache[0, :, :, :columns], cache[1, :, :, :columns]
    column = torch.tensor([0, 5, 63, 64, 255, 256, 511, 640, 699][:rows], device=DEVICE)
    valid = torch.zeros(rows, columns + 64, dtype=torch.bool, device=DEVICE)
    for row, last in enumerate(column.tolist()):
        valid[row, min(row, last):last + 1] = True  # `row` pad columns first, then the written ones
    query = torch.randn(rows, KV_HEADS * GROUPS, 1, DIM, device=DEVICE, dtype=dtype, generator=gen)
    return query, keys, values, valid[:, :columns], column


def expected(query, keys, values, valid):
    return attend_cache(query.float(), keys.float(), values.float(), valid[:, None, None, :], GROUPS, DIM ** -0.5)


def tolerance(dtype):
    return 1e-5 if dtype == torch.float32 else 2e-2


@pytest.mark.parametrize("launch", [Launch(), Launch(block=32, warps=2, stages=2, busy_programs=4096),
                                    Launch(busy_programs=1)], ids=["default", "more-splits", "one-split"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_row_attends_to_its_own_columns_as_the_masked_matmuls_do(dtype, launch):
    # 9 rows: the default splits each row's columns over 3 programs and merges them, the second over more in smaller
    # blocks, the third writes each (row, kv head)'s result straight from its one program (no merge kernel)
    query, keys, values, valid, column = ragged_cache(dtype)
    out = decode_attention(query, keys, values, valid, column, GROUPS, DIM ** -0.5, launch=launch)
    want = expected(query, keys, values, valid)
    assert out.shape == want.shape == (len(column), 1, KV_HEADS * GROUPS * DIM) and out.dtype == dtype
    torch.testing.assert_close(out.float(), want, atol=tolerance(dtype), rtol=tolerance(dtype))
