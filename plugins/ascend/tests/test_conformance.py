"""The core's conformance kit (infer.core.testing) over every op this plugin registers for the
ascend platform, through the torch_npu emulation (on an NPU with INFER_ASCEND_HARDWARE=1: the
real ops). Float16/bfloat16 and page size 128: the fused attention takes no float32 and
PageAttention blocks are multiples of 128 (each op refuses what its kernel cannot take; the kit
lists refusals). The kit's graph-runner check builds its engine with a fixed page size of 16,
which the ascend attention backend refuses at build time, so that kind is left out here;
tests/test_graph_runner.py checks ACL-graph replay against eager decode instead. Under the
emulation the communicators are checked on one rank: the kit's two-rank check forms the "hccl"
group in fresh processes before it imports the communicator, and only the real torch_npu is
loaded by ``import torch`` itself (device-backend autoload); tests/test_parallel.py forms the
"hccl" group over two processes after importing torch_npu (the emulated one registers it).
The ``modelslim`` linear method is left out: each of its layers is what the checkpoint's
quant_model_description.json says (int8 tensors and scales written by msModelSlim), so it has no
dense weight for the kit to fill; tests/test_modelslim.py checks it on such a checkpoint."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from infer.core.plugins import get_plugin_host
from infer.core.testing import KINDS, conformance_test

from .conftest import HARDWARE


class _EmulatedHost:
    """The plugin host, except that ``select("ascend")`` answers the emulated chip (the real
    probe, which looks for /dev/davinci*, is left alone for the rest of the test session)."""

    def __init__(self) -> None:
        self._host = get_plugin_host()
        reg = self._host.registries
        self.registries = replace(reg, linear={k: v for k, v in reg.linear.items()
                                               if k != "modelslim"})
        self.platform = None

    def select(self, name: str | None = None):  # noqa: ANN201
        if HARDWARE:
            return self._host.select(name)
        import ascend_emulation

        if self.platform is None:
            self.platform = ascend_emulation.emulated_platform("A2")
        return self.platform

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._host, name)


pytestmark = pytest.mark.usefixtures("npu_emulation")

test_conformance = conformance_test("ascend", host=_EmulatedHost(),
                                    kinds=tuple(k for k in KINDS if k != "graph_runner"),
                                    dtypes=(torch.float16, torch.bfloat16), page_sizes=(128,),
                                    ranks=(1, 2) if HARDWARE else (1,))
