"""A third-party infer plugin: the attention backend ``sample_sdpa`` for the CPU platform.

It is shipped exactly as a built-in plugin is: an ``infer.plugins`` entry point naming this
module, ``INFER_API_VERSION``, and ``register_*`` hooks. The backend reads the paged KV cache
through the block table and computes causal attention with torch's scaled_dot_product_attention.
"""

from __future__ import annotations

from typing import Any

from infer.core.hookspecs import hookimpl
from infer.core.support import Entry, Status

INFER_API_VERSION = 1
BACKEND = "sample_sdpa"


@hookimpl
def register_attention_backends(register: Any) -> None:
    from infer_sample_attn.backend import SampleSdpaBackend

    register(BACKEND, SampleSdpaBackend, platforms=["cpu"])


@hookimpl
def register_support_matrix(register: Any) -> None:
    register("cpu", [Entry(flag="--attention-backend", value=BACKEND, status=Status.SUPPORTED)])
