"""infer's torch dequantisation of GGUF blocks against the gguf package's numpy reference, and
the llama.cpp q/k row permutation round trip."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from infer.core.model.loader.gguf_quants import dequantize
from infer.core.model.loader.gguf_reader import unpermute

Q = gguf.GGMLQuantizationType


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.F16, Q.BF16, Q.F32, Q.Q5_0])
def test_dequantize_matches_gguf_reference(qtype):
    rng = np.random.default_rng(int(qtype))
    x = (rng.standard_normal((12, 96)) * 3).astype(np.float32)
    raw = x if qtype == Q.F32 else gguf.quants.quantize(x, qtype)
    ref = gguf.quants.dequantize(raw, qtype).reshape(12, 96)
    got = dequantize(torch.from_numpy(np.ascontiguousarray(raw)), qtype, (12, 96))
    assert got.dtype == torch.float32 and got.shape == (12, 96)
    np.testing.assert_array_equal(got.numpy(), ref)
    if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1):  # lossy, but close to the input
        assert np.abs(ref - x).max() < 0.2 * np.abs(x).max()


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows (reimplemented from its description)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("shape", [(8 * 6, 5), (8 * 6,)])
def test_unpermute_inverts_llama_cpp_permutation(shape):
    w = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    permuted = _llama_cpp_permute(w, 6)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(unpermute(torch.from_numpy(permuted), 6).numpy(), w)
