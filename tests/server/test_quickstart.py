"""The README quickstart: serve the default model, then its curl and `openai` examples, verbatim."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


@pytest.mark.slow
def test_readme_quickstart(tmp_path):
    from server_proc import ServerProc

    serve = next(b for b in _blocks("bash") if "infer serve" in b)
    flags = serve.split("infer serve", 1)[1].split()
    assert flags == ["--model-path", "smollm2"]
    curl = next(b for b in _blocks("bash") if b.startswith("curl"))
    client = next(b for b in _blocks("python") if "OpenAI(" in b)
    srv = ServerProc(Path("smollm2"), tmp_path)  # infer serve --model-path smollm2 on a free port
    try:
        srv.wait_ready()
        port = str(srv.port)
        out = subprocess.run(["bash", "-c", curl.replace("30000", port)], capture_output=True, text=True,
                             timeout=300)
        reply = json.loads(out.stdout)
        assert reply["choices"][0]["message"]["content"].strip(), reply
        out = subprocess.run([sys.executable, "-c", client.replace("30000", port)], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.strip(), out.stderr
    finally:
        srv.stop()
