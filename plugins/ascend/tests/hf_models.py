"""The core's tiny Hugging Face model builders (``tests/model/hf_tiny.py``), loaded by path: the
core's tests are not a package these tests can import."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("hf_tiny", ROOT / "tests" / "model" / "hf_tiny.py")
hf_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_tiny)
