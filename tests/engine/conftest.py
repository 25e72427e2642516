from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import make_tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(directory, transformers model) of a tiny random fp32 Llama with a BPE tokenizer."""
    d = tmp_path_factory.mktemp("tiny_llama")
    hf = make_tiny_llama(d)
    return d, hf


@pytest.fixture(scope="session")
def make_core(tiny_model):
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    def make(**flags):
        flags.setdefault("max_total_tokens", 8192)
        flags.setdefault("dtype", "float32")
        return EngineCore(ServerArgs(model_path=str(tiny_model[0]), **flags))  # through the gate

    return make
