"""``infer serve --device ascend`` and ``infer doctor`` as a user runs them.

* Without an NPU (and without the emulation) serving on Ascend exits 2 with the probe's reason.
* With a torch_npu importable but no CANN toolkit, ``infer doctor`` says to install CANN.
* With the emulation switched on for the server's processes (its folder on PYTHONPATH and
  INFER_TEST_NPU_EMULATION=A3, read only by the tests' sitecustomize.py), the default model is
  served on emulated A3 chips (attention, layer ops, linear layers and ACL-graph decode all
  through the plugin; one rank, and three tensor-parallel ranks) and answers the official openai
  client.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import EMULATION, HARDWARE

INFER = shutil.which("infer") or "infer"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("INFER_DEVICE", "PYTHONPATH")}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.mark.skipif(HARDWARE, reason="this machine has an NPU")
def test_serve_on_ascend_without_an_npu_exits_2(tmp_path):
    out = subprocess.run([INFER, "serve", "--device", "ascend", "--model-path", "smollm2"],
                         capture_output=True, text=True, timeout=300, env=_env(), cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    msg = out.stderr + out.stdout
    assert "--device ascend" in msg and ("torch_npu" in msg or "davinci" in msg or "CANN" in msg)
    assert "Traceback" not in msg


@pytest.mark.skipif(HARDWARE, reason="this machine has CANN")
def test_doctor_says_cann_is_missing(tmp_path):
    # the emulation's folder makes `torch_npu` importable-looking (find_spec) without CANN;
    # INFER_TEST_NPU_EMULATION is unset, so nothing is emulated: the probe sees no toolkit
    env = _env(PYTHONPATH=str(EMULATION), ASCEND_TOOLKIT_HOME=str(tmp_path / "none"))
    out = subprocess.run([INFER, "doctor", "--json"], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.dumps(json.loads(out.stdout))
    if Path("/usr/local/Ascend/ascend-toolkit/latest").exists():
        pytest.skip("a CANN toolkit is installed at the default path")
    assert "torch_npu is installed but the CANN toolkit is not" in report
    assert "Ascend-cann-toolkit" in report and "set_env.sh" in report


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("tp", ["1", "3"])
def test_serve_default_model_on_emulated_a3_answers_openai_client(tmp_path, tp):
    """tp 3: three ranks (SmolLM2's 9 heads / 3 KV heads split), the core's executor forming
    the "hccl" group, all-reduces inside the captured decode graphs."""
    from infer.core.model.loader.default_model import cached_path

    if not HARDWARE and not cached_path().exists():
        pytest.skip("the default model is not in the cache (infer serve --model-path smollm2 on "
                    "the CPU fetches it once)")
    port = _port()
    env = _env() if HARDWARE else _env(PYTHONPATH=str(EMULATION), INFER_TEST_NPU_EMULATION="A3")
    log = tmp_path / "server.log"
    cmd = [INFER, "serve", "--device", "ascend", "--model-path", "smollm2", "--dtype", "float16",
           "--max-total-tokens", "2048", "--cuda-graph-max-bs", "2", "--tp-size", tp,
           "--host", "127.0.0.1",
           "--port", str(port)]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 600
        while "infer server is ready at" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        text = log.read_text()
        assert "captured ACL graphs for decode batch sizes [1, 2]" in text
        assert "--page-size 1 -> 128" in text  # the platform default, logged
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        reply = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16, temperature=0)
        answer = reply.choices[0].message.content
        assert "Paris" in answer, answer
        assert reply.usage.completion_tokens > 0
        stream = client.completions.create(model="smollm2", prompt="One, two, three,",
                                           max_tokens=8, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in stream).strip()
    finally:
        proc.send_signal(2)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
