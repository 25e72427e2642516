"""Make the shared test helpers (kernel_utils, engine_utils) importable under importlib mode."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
