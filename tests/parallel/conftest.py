"""The parallel tests spawn ranks that import their worker code by module name, so this folder
(and tests/model, for the paged driver and tiny checkpoints) go on sys.path: spawned children
inherit it, and pytest's importlib mode gives test modules names a child cannot import."""

import sys
from pathlib import Path

HERE = Path(__file__).parent
for folder in (HERE, HERE.parent / "model"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
