"""The scheduler, request and cache layers never import torch (they decide; the runner computes)."""

from __future__ import annotations

import subprocess
import sys


def test_scheduler_and_cache_do_not_import_torch():
    code = ("import sys\n"
            "import infer.core.engine.scheduler, infer.core.engine.scheduler_policy\n"
            "import infer.core.cache.radix_cache, infer.core.cache.manager, infer.core.cache.naive_cache\n"
            "import infer.core.engine.detokenizer, infer.core.sampling.params\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
