"""A tiny random Llama as a GGUF file with Q4_1 / Q8_0 linear weights, the blocks the CPU plugin's
native kernels (and its native decode graph) run. The Hugging Face tiny configs (tests/model)
are float32 safetensors, which stay dense; this writes the same kind of model in llama.cpp's
format, with sizes whose tensor-parallel splits fall on 32-weight block boundaries.

The q/k rows are written as they are drawn (not in llama.cpp's rotary permutation): the reader
un-permutes them, which gives another random model, the same for every rank and rank count.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def save_tiny_gguf(path: Path, *, hidden: int = 128, heads: int = 4, kv_heads: int = 2,
                   inter: int = 256, layers: int = 2, vocab: int = 97, seed: int = 0,
                   context: int = 512) -> Path:
    """Write the model to ``path`` (a .gguf file) and return it. Projections are Q4_1 blocks,
    the down projection Q8_0 (one type per stacked weight); norms and the tied embedding float32."""
    rng = np.random.default_rng(seed)
    d = hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(d)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_token_merges([])

    def dense(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def add(name: str, x: np.ndarray, qtype: Q = Q.F32) -> None:
        if qtype == Q.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    add("token_embd.weight", dense(vocab, hidden, 1.0))
    add("output_norm.weight", 1 + 0.1 * dense(1, hidden, 1.0)[0])
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", 1 + 0.1 * dense(1, hidden, 1.0)[0])
        add(f"blk.{i}.ffn_norm.weight", 1 + 0.1 * dense(1, hidden, 1.0)[0])
        s_in, s_att, s_inter = hidden ** -0.5, (heads * d) ** -0.5, inter ** -0.5
        add(f"blk.{i}.attn_q.weight", dense(heads * d, hidden, s_in), Q.Q4_1)
        add(f"blk.{i}.attn_k.weight", dense(kv_heads * d, hidden, s_in), Q.Q4_1)
        add(f"blk.{i}.attn_v.weight", dense(kv_heads * d, hidden, s_in), Q.Q4_1)
        add(f"blk.{i}.attn_output.weight", dense(hidden, heads * d, s_att), Q.Q4_1)
        add(f"blk.{i}.ffn_gate.weight", dense(inter, hidden, s_in), Q.Q4_1)
        add(f"blk.{i}.ffn_up.weight", dense(inter, hidden, s_in), Q.Q4_1)
        add(f"blk.{i}.ffn_down.weight", dense(hidden, inter, s_inter), Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
