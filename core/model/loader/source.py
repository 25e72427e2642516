"""Where the weights come from: a local directory or file, a Hugging Face repo id (through
huggingface_hub and its cache, ``--revision`` honoured), or the default-model alias."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")
_HUB_PATTERNS = {
    "safetensors": ["*.safetensors", "*.safetensors.index.json"],
    "pt": ["*.bin", "*.pt", "*.bin.index.json"],
    "gguf": ["*.gguf"],
    "dummy": [],
}
_META_PATTERNS = ["*.json", "*.model", "*.txt", "*.jinja", "tokenizer*"]


class ModelSourceError(ValueError):
    """The model path or load format cannot be used; the message says why and what to do."""


@dataclass
class ModelSource:
    directory: Path  # holds config.json / tokenizer files (or the GGUF file)
    load_format: str  # resolved: safetensors | pt | gguf | dummy
    weight_files: list[Path] = field(default_factory=list)

    @property
    def gguf_file(self) -> Path | None:
        return self.weight_files[0] if self.load_format == "gguf" else None


def _find_format(directory: Path, load_format: str) -> ModelSource:
    found = {
        "safetensors": sorted(directory.glob("*.safetensors")),
        "pt": sorted(p for p in directory.glob("*.bin") if "training_args" not in p.name)
        + sorted(directory.glob("*.pt")),
        "gguf": sorted(directory.glob("*.gguf")),
    }
    if load_format == "dummy":
        if not (directory / "config.json").is_file():
            raise ModelSourceError(f"--load-format dummy needs a config.json in {directory}")
        return ModelSource(directory, "dummy")
    order = ["safetensors", "pt", "gguf"] if load_format == "auto" else [load_format]
    for fmt in order:
        if found[fmt]:
            if fmt == "gguf" and len(found[fmt]) > 1:
                names = ", ".join(p.name for p in found[fmt])
                raise ModelSourceError(f"{directory} holds several GGUF files ({names}); pass "
                                       f"the file itself as --model-path")
            return ModelSource(directory, fmt, found[fmt])
    raise ModelSourceError(f"no {' / '.join(order)} weights found in {directory} "
                           f"(--load-format {load_format})")


def _download(repo_id: str, revision: str | None, load_format: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    fmts = ["safetensors", "pt"] if load_format == "auto" else [load_format]
    patterns = _META_PATTERNS + [p for f in fmts for p in _HUB_PATTERNS[f]]
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except LocalEntryNotFoundError as exc:
        raise ModelSourceError(
            f"--model-path {repo_id}: not in the Hugging Face cache and the hub cannot be "
            f"reached ({exc}); download it on a connected machine or pass a local path") from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelSourceError(f"--model-path {repo_id}: {type(exc).__name__}: {exc}") from exc


def resolve_source(model_path: str | None, load_format: str = "auto",
                   revision: str | None = None) -> ModelSource:
    """Local file/dir, default-model alias or Hugging Face repo id -> ModelSource."""
    if not model_path:  # SGLang's launch_server requires it too
        raise ModelSourceError("no model given: pass --model-path (a model directory, a .gguf "
                               "file, a Hugging Face repo id, or smollm2 for the default model)")
    if load_format not in LOAD_FORMATS:
        raise ModelSourceError(f"--load-format {load_format!r} is not one of {', '.join(LOAD_FORMATS)}")
    from infer.core.model.loader.default_model import resolve_alias

    model_path = resolve_alias(model_path)
    path = Path(model_path).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelSourceError(f"--model-path {path} is a file but not a .gguf; pass the "
                                   f"model directory instead")
        if load_format not in ("auto", "gguf"):
            raise ModelSourceError(f"--model-path {path} is a GGUF file; --load-format "
                                   f"{load_format} cannot read it (use gguf or auto)")
        return ModelSource(path.parent, "gguf", [path])
    if path.is_dir():
        return _find_format(path, load_format)
    parts = model_path.split("/")
    if len(parts) == 2 and all(parts) and not model_path.startswith((".", "~")):
        return _find_format(_download(model_path, revision, load_format), load_format)
    raise ModelSourceError(f"--model-path {model_path!r} is neither an existing file or "
                           f"directory nor a Hugging Face repo id (org/name)")
