"""GGUF files: config, tokenizer and chat template from the metadata, tensors renamed to
Hugging Face names and dequantised.

llama.cpp stores Llama's q/k projection rows interleaved for its rotary layout; they are put back
in Hugging Face order (``unpermute``) on the dequantised weight and on the raw block rows alike.
Tensors are yielded unread (``GGUFTensor``): a rank reads and dequantises only its slice, and a
quantized slice carries ``gguf_qtype`` and ``gguf_raw`` (uint8 [rows, bytes_per_row]) as
attributes, for the linear layers' GGUF seam.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import torch
from infer.core.model.loader.weights import GGUFTensor
from tqdm.auto import tqdm

_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_EXPERTS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
            "ffn_down_exps.weight": "down_proj"}
_BLK = re.compile(r"blk\.(\d+)\.(.+)$")


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: rows grouped [head, D/2, 2] -> [head, 2, D/2]."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class GGUFCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.reader = gguf.GGUFReader(str(self.path))
        self.arch = self.field("general.architecture")

    def field(self, key: str, default: Any = None) -> Any:
        f = self.reader.fields.get(key)
        return default if f is None else f.contents()

    @property
    def chat_template(self) -> str | None:
        return self.field("tokenizer.chat_template")

    def hf_config(self, trust_remote_code: bool = False) -> Any:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(self.path.parent), gguf_file=self.path.name,
                                          trust_remote_code=trust_remote_code)

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.path.parent), gguf_file=self.path.name)

    def _hf_name(self, name: str, moe_module: str) -> str | None:
        if name in _GLOBAL:
            return _GLOBAL[name]
        m = _BLK.match(name)
        if m is None:
            return None
        prefix, rest = f"model.layers.{m[1]}.", m[2]
        if rest in _LAYER:
            return prefix + _LAYER[rest]
        if rest == "ffn_gate_inp.weight":
            return f"{prefix}{moe_module}.gate.weight"
        if rest in _EXPERTS:
            return f"{prefix}{moe_module}.experts.*.{_EXPERTS[rest]}.weight"
        return None

    def tensors(self, config: Any, progress: bool = True) -> Iterator[tuple[str, GGUFTensor]]:
        """(Hugging Face name, lazy tensor) pairs, read and dequantised only when a layer
        materializes its slice (``infer.core.model.loader.weights``); stacked expert tensors
        [E, ...] are yielded per expert. Unknown tensor names are an error."""
        moe_module = "block_sparse_moe" if config.model_type == "mixtral" else "mlp"
        permute = self.arch == "llama"
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        for t in tqdm(self.reader.tensors, desc="Loading GGUF", unit="tensor", disable=not progress):
            name = self._hf_name(t.name, moe_module)
            if name is None:
                raise KeyError(f"GGUF tensor {t.name!r} ({self.arch}) has no Hugging Face mapping")
            shape = tuple(int(s) for s in reversed(t.shape))  # numpy order [out, in]
            n_perm = heads if ".q_proj." in name else kv_heads if ".k_proj." in name else 0
            tensor = GGUFTensor(name, t.data, gguf.GGMLQuantizationType(t.tensor_type), shape,
                                unpermute_heads=n_perm if permute else 0)
            if "*" in name:
                for e in range(shape[0]):
                    yield name.replace("*", str(e)), tensor[e]
                continue
            yield name, tensor
