"""What the loader settles before any weight is read: the model's config (custom code only with
--trust-remote-code), the context length it runs with (--context-length), and the tokenizer
(--tokenizer-path, or the checkpoint's own).

``check_load_settings`` runs the same checks from ``infer serve`` before the engine process starts,
so a bad value is one message and exit code 2. Every error is a ``ModelSourceError`` naming the
flag, the value and what to do instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infer.core.model.arch import config_context_length
from infer.core.model.loader.source import ModelSource, ModelSourceError, resolve_source


def gguf_built(gguf: Path, part: str, build: Callable[[], Any], reload: Callable[[str], Any]) -> Any:
    """transformers' config or tokenizer built from a GGUF file, kept between starts. ``build``
    parses the whole file (gguf's reader: about 4 s for the default model's config and 3.4 s for
    its tokenizer, and a served model reads them in several processes); its result is saved
    (``save_pretrained``) under ``$INFER_CACHE_DIR/gguf-meta/<key>/<part>`` and later loads take
    it from there (``reload``, a folder). The key is the file's resolved path, size and mtime and
    the transformers version, so a changed file or library builds it again; a folder that fails
    to load is built again too. Written to a temporary folder and renamed, so a concurrent or
    interrupted start never reads a partial one."""
    from infer.core.model.loader.default_model import cache_dir

    try:
        import transformers

        st = gguf.stat()
        ident = f"{gguf.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}"
        target = cache_dir() / "gguf-meta" / hashlib.sha256(ident.encode()).hexdigest()[:24] / part
    except OSError:
        return build()
    if target.is_dir():
        try:
            return reload(str(target))
        except Exception:  # noqa: BLE001 - any folder that does not load (the tokenizers library
            shutil.rmtree(target, ignore_errors=True)  # raises plain Exception) is built again
    built = build()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{part}-", dir=target.parent))
        try:
            built.save_pretrained(str(tmp))
            os.replace(tmp, target)  # fails if another start renamed its own first: keep that one
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # a read-only or full cache: the next start builds it again
    return built


def read_config(source: ModelSource, trust_remote_code: bool) -> Any:
    """The transformers config of ``source`` (from GGUF metadata for a GGUF file). A config class
    shipped as code in the checkpoint (``auto_map``) runs only with ``trust_remote_code``."""
    from transformers import AutoConfig

    try:
        if source.load_format == "gguf":
            gguf = source.gguf_file
            return gguf_built(gguf, "config", lambda: AutoConfig.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, trust_remote_code=trust_remote_code),
                AutoConfig.from_pretrained)
        return AutoConfig.from_pretrained(str(source.directory), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        if not trust_remote_code and "trust_remote_code" in str(exc):
            raise ModelSourceError(
                f"{source.directory}: the model's config is custom code shipped with the checkpoint "
                f"(auto_map in config.json); pass --trust-remote-code to run it if you trust its "
                f"source") from None
        raise ModelSourceError(f"cannot read the model config in {source.directory}: "
                               f"{type(exc).__name__}: {exc}") from exc


def context_length_for(config: Any, requested: int | None) -> int:
    """The longest sequence (prompt + output) to run: ``requested`` (--context-length), at most the
    model's own maximum, else that maximum; within a sliding window, where full attention is exact."""
    derived = config_context_length(config)
    if requested is not None:
        if requested < 2:
            raise ModelSourceError(f"--context-length {requested}: must be at least 2 (a prompt "
                                   f"token and a generated one)")
        if requested > derived:
            raise ModelSourceError(
                f"--context-length {requested} exceeds the model's maximum context of {derived} "
                f"tokens (its config's max_position_embeddings and rope scaling): positions past it "
                f"were never trained; use at most {derived}")
    length = requested or derived
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and length > window:
        if requested:
            raise ModelSourceError(f"--context-length {requested} exceeds the model's sliding window "
                                   f"({window}); sliding-window attention is not implemented")
        length = window
    return length


def _tokenizer_location(tokenizer_path: str) -> tuple[str, str | None]:
    """--tokenizer-path -> (directory or hub repo id, GGUF file name or None). Accepts what
    --model-path accepts: a folder, a .gguf file (its embedded tokenizer), the default-model
    alias, or a Hugging Face repo id (from the local cache)."""
    from infer.core.model.loader.default_model import resolve_alias

    path = Path(resolve_alias(tokenizer_path)).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelSourceError(f"--tokenizer-path {tokenizer_path}: a file must be a .gguf "
                                   f"(its embedded tokenizer); otherwise pass the tokenizer's folder")
        return str(path.parent), path.name
    if path.is_dir():
        if not any(path.glob("tokenizer*")) and len(ggufs := sorted(path.glob("*.gguf"))) == 1:
            return str(path), ggufs[0].name
        return str(path), None
    parts = tokenizer_path.split("/")
    if len(parts) == 2 and all(parts) and not tokenizer_path.startswith((".", "~")):
        return tokenizer_path, None
    raise ModelSourceError(f"--tokenizer-path {tokenizer_path!r} is neither an existing file or "
                           f"folder nor a Hugging Face repo id (org/name)")


def load_tokenizer(source: ModelSource, tokenizer_path: str | None, trust_remote_code: bool,
                   revision: str | None, vocab_size: int) -> Any:
    """The tokenizer: from ``tokenizer_path`` when given, else the checkpoint's own (a GGUF
    file's embedded one). One whose ids reach past the model's ``vocab_size`` is refused."""
    from transformers import AutoTokenizer

    if tokenizer_path:
        where, gguf_file = _tokenizer_location(tokenizer_path)
        flag = f"--tokenizer-path {tokenizer_path}"
        kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {"revision": revision}
    else:
        gguf = source.gguf_file if source.load_format == "gguf" else None
        where, kwargs = str(gguf.parent if gguf else source.directory), {}
        if gguf is not None:
            kwargs["gguf_file"] = gguf.name
        flag = f"the tokenizer in {where}"
    try:
        def build() -> Any:
            return AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code, **kwargs)

        if "gguf_file" in kwargs:
            tokenizer = gguf_built(Path(where) / kwargs["gguf_file"], "tokenizer", build,
                                   AutoTokenizer.from_pretrained)
        else:
            tokenizer = build()
    except (OSError, ValueError, KeyError) as exc:
        hint = ("pass --trust-remote-code to run the tokenizer code it ships" if not trust_remote_code
                and "trust_remote_code" in str(exc) else
                "pass --tokenizer-path (a folder, .gguf file or repo id) or --skip-tokenizer-init")
        why = " ".join(str(exc).split())
        raise ModelSourceError(f"{flag}: no usable tokenizer ({type(exc).__name__}: {why}); "
                               f"{hint}") from exc
    if len(tokenizer) > vocab_size:
        raise ModelSourceError(
            f"{flag}: the tokenizer has {len(tokenizer)} tokens but the model's vocabulary has "
            f"{vocab_size}: its higher ids have no embedding; use the model's own tokenizer")
    return tokenizer


def check_load_settings(model_path: str, *, load_format: str = "auto", revision: str | None = None,
                        tokenizer_path: str | None = None, context_length: int | None = None,
                        trust_remote_code: bool = False, skip_tokenizer_init: bool = False,
                        tp_size: int = 1, ep_size: int = 1) -> None:
    """The loader's setting checks without its weights: the source resolves, its config reads,
    the context length fits, the tensor/expert-parallel split divides the model, the tokenizer
    loads. Raises ModelSourceError, or ConfigError for a split that does not divide."""
    from infer.core.model.layers.shard import check_model_split

    source = resolve_source(model_path, load_format, revision)
    config = read_config(source, trust_remote_code)
    context_length_for(config, context_length)
    check_model_split(config, tp_size, ep_size)
    if tokenizer_path and not skip_tokenizer_init:
        load_tokenizer(source, tokenizer_path, trust_remote_code, revision, config.vocab_size)

