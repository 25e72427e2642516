"""The core never imports a vendor library or names a device.

Checked on the syntax tree, so comments and docstrings (which may explain what a plugin does)
are never flagged, and neither are words that merely contain a device name
(``disable_cuda_graph`` is an SGLang setting, not a device):
  * imports of vendor libraries (torch_npu, aiter, habana_frameworks, flashinfer, triton, ...);
  * attribute access of a device namespace or method (``torch.cuda``, ``x.npu()``, ``torch.hpu``);
  * dynamic imports of them (``importlib.import_module("triton")``);
  * string literals that are a device type or a collective backend (``"cuda"``, ``"cuda:0"``,
    ``"nccl"``, ``"npu"``, ``"hpu"``, ...), including pieces of f-strings.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "core"
VENDOR_MODULES = {"torch_npu", "aiter", "habana_frameworks", "flashinfer", "triton", "sgl_kernel",
                  "deep_gemm", "vllm", "intel_extension_for_pytorch", "mindspore", "amdsmi",
                  "pynvml", "cupy"}
DEVICE_ATTRS = {"cuda", "npu", "hpu", "xpu", "mps", "cudnn", "hip", "mlu", "musa"}
DEVICE_STRING = re.compile(r"^(cuda|npu|hpu|xpu|mps|mlu|musa|hip|rocm)(:\d+)?$|^(nccl|hccl|rccl|xccl)$",
                           re.IGNORECASE)
# The flag inventory (SGLang's flag table verbatim, choices such as --device npu) is data about the
# command line, core/config/flags.json, not code: it is not scanned.


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                ids.add(id(body[0].value))
    return ids


def _dynamic_import(call: ast.Call) -> str | None:
    """``importlib.import_module("triton")`` / ``__import__("aiter")`` of a vendor module."""
    fn = call.func
    name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
    if name in ("import_module", "__import__", "find_spec") and call.args \
            and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        module = call.args[0].value
        return module if module.split(".")[0] in VENDOR_MODULES else None
    return None


def violations(source: str, check_strings: bool = True) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    docstrings = _docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in VENDOR_MODULES:
                    found.append((node.lineno, f"imports {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in VENDOR_MODULES:
                found.append((node.lineno, f"imports from {node.module}"))
        elif isinstance(node, ast.Attribute) and node.attr in DEVICE_ATTRS:
            found.append((node.lineno, f"uses .{node.attr}"))
        elif check_strings and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            text = node.value.strip()
            if DEVICE_STRING.match(text):
                found.append((node.lineno, f"names {text!r}"))
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            found.append((node.lineno, f"imports {_dynamic_import(node)} dynamically"))
    return found


def core_files() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(CORE.parent)))
def test_core_module_is_device_free(path):
    found = violations(path.read_text())
    assert not found, "\n".join(f"{path}:{line}: {what}" for line, what in found)


def test_core_files_are_found():
    assert len(core_files()) > 10


@pytest.mark.parametrize("bad", [
    "import torch_npu",
    "from flashinfer import BatchDecodeWithPagedKVCacheWrapper",
    "import triton.language as tl",
    "import torch\nx = torch.cuda.is_available()",
    "y = t.npu()",
    "torch.distributed.init_process_group('nccl')",
    "d = torch.device('cuda:0')",
    "d = f'{\"hpu\"}'",
    "backend = \"HCCL\"",
    "import importlib\nm = importlib.import_module('aiter.ops')",
])
def test_checker_catches(bad):
    assert violations(bad)


@pytest.mark.parametrize("good", [
    '"""Runs on cuda, npu or hpu through the Platform object; never torch.cuda."""',
    "# torch.cuda is never used here\nx = 1",
    "args.disable_cuda_graph = True",
    "name = '--cuda-graph-max-bs'",
    "msg = 'install a plugin for your accelerator'",
    "device = platform.torch_device",
    "if args.attention_backend == 'flashinfer': pass",
    "def f():\n    '''Uses \"nccl\" on NVIDIA.'''\n    return platform.dist_backend",
])
def test_checker_allows(good):
    assert not violations(good)
