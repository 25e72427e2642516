from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))

from conftest import make_core, tiny_model  # noqa: E402,F401
