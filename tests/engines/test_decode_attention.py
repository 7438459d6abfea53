"""The per-row flash-decoding kernel (`rlfarm.engines.decode_attention`) against the masked matmuls it replaces on
CUDA, at a 7B layer's head layout (the decoder under refill: tests/engines/test_static_decoder.py)."""
import pytest
import torch

from rlfarm.engines.decode_attention import available, decode_attention
from rlfarm.engines.llama_attention import attend_cache

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() and available(torch.device("cuda"))),
                                                  reason="needs CUDA and Triton")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_attends_to_its_own_columns_as_the_masked_matmuls_do(dtype):
    # Qwen2.5-7B's layout (4 kv heads of 7 query heads, head dim 128); rows of very different lengths with left
    # padding, in a bucket view of a longer cache (strided), ends on and off the kernel's block and split edges
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, kv_heads, groups, dim, columns = 9, 4, 7, 128, 700
    cache = torch.randn(2, rows, kv_heads, columns + 64, dim, device="cuda", dtype=dtype, generator=gen)
    keys, values = cache[0, :, :, :columns], cache[1, :, :, :columns]
    column = torch.tensor([0, 5, 63, 64, 255, 256, 511, 640, 699], device="cuda")
    valid = torch.zeros(rows, columns + 64, dtype=torch.bool, device="cuda")
    for row, last in enumerate(column.tolist()):
        valid[row, min(row, last):last + 1] = True  # `row` pad columns first, then the written ones
    query = torch.randn(rows, kv_heads * groups, 1, dim, device="cuda", dtype=dtype, generator=gen)
    out = decode_attention(query, keys, values, valid[:, :columns], column, groups, dim ** -0.5)
    expected = attend_cache(query.float(), keys.float(), values.float(), valid[:, None, None, :columns], groups,
                            dim ** -0.5)
    assert out.shape == expected.shape == (rows, 1, kv_heads * groups * dim) and out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
