"""Switch the torch_npu emulation on (tests only; never installed with the plugin).

``install(generation)`` puts the emulated ``torch_npu`` package first on sys.path, imports it
(which registers ``torch.npu``) and tells infer's AscendPlatform that its device is the host
(``torch_device = "cpu"``, no page-locked staging memory). ``patch_probe(generation)``
additionally makes the probe find one emulated chip (for a server subprocess, through
sitecustomize.py). ``uninstall()`` undoes both.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHIPS = {"A2": "910B3", "A3": "910_9391"}
_saved: dict[str, object] = {}


def install(generation: str = "A2") -> object:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import torch_npu

    if not getattr(torch_npu, "EMULATED", False):
        raise RuntimeError(f"a real torch_npu ({torch_npu.__file__}) shadows the emulation")
    torch_npu.npu.DEVICE["name"] = f"Ascend{CHIPS[generation]}"
    from infer_ascend.platform import AscendPlatform

    _saved.setdefault("torch_device", AscendPlatform.torch_device)
    _saved.setdefault("pin", AscendPlatform.pin_host_memory)
    AscendPlatform.torch_device = "cpu"
    AscendPlatform.pin_host_memory = False
    return torch_npu


def patch_probe(generation: str = "A2") -> None:
    from infer_ascend import probe

    _saved.setdefault("probe", (probe.device_nodes, probe._npu_smi_chips, probe.cann_toolkit))
    probe.device_nodes = lambda dev=None: [Path("/dev/davinci0")]
    import torch_npu

    chips = [CHIPS[generation]] * int(torch_npu.npu.DEVICE["count"])
    probe._npu_smi_chips = lambda: (chips, "")
    probe.cann_toolkit = lambda env=None, default=None: HERE


def emulated_platform(generation: str = "A2") -> object:
    """An AscendPlatform for the emulated chips of ``generation``, its matrix bound."""
    import torch_npu
    from infer.core.plugins import get_plugin_host
    from infer_ascend.platform import create_platform
    from infer_ascend.probe import probe_from

    chips = [CHIPS[generation]] * int(torch_npu.npu.DEVICE["count"])
    platform = create_platform(probe_from(True, [Path("/dev/davinci0")], chips))
    platform.bind_matrix(get_plugin_host().matrix)
    return platform


def uninstall() -> None:
    import torch
    from infer_ascend import probe
    from infer_ascend.platform import AscendPlatform

    for name in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")
                 or m.startswith("infer_ascend.ops") or m == "infer_ascend.graph_runner"]:
        del sys.modules[name]
    if hasattr(torch, "npu"):
        del torch.npu
    if "torch_device" in _saved:
        AscendPlatform.torch_device = _saved.pop("torch_device")
        AscendPlatform.pin_host_memory = _saved.pop("pin")
    if "probe" in _saved:
        probe.device_nodes, probe._npu_smi_chips, probe.cann_toolkit = _saved.pop("probe")
    if str(HERE) in sys.path:
        sys.path.remove(str(HERE))
