"""Reusable CLI pieces: every server flag as Typer options, and ServerArgs built from them.

Any command can take all ``infer serve`` flags (names, aliases, vLLM spellings, grouped in help
panels by section) with the ``with_server_flags`` decorator. The decorated function declares a
keyword-only ``server_args: ServerArgs`` parameter and receives the settings already built from
command line > INFER_ environment > --config file > defaults; a bad setting ends the command with
exit code 2 and one clear message::

    from infer.cli.common import ServerFlagsCommand, with_server_flags
    from infer.core.config import ServerArgs

    @app.command("generate", cls=ServerFlagsCommand)
    @with_server_flags
    def generate(prompt: str, max_new_tokens: int = 16, *, server_args: ServerArgs) -> None:
        ...

``cls=ServerFlagsCommand`` lets list flags take several values after one name, as SGLang's do
(``--cuda-graph-bs 1 2 4``); without it, repeat the flag (``--cuda-graph-bs 1 --cuda-graph-bs 2``).
Your own options must not reuse a server flag's name (the decorator raises if they do).
``fail(message)`` prints ``error: message`` to stderr and exits with code 2.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer
from infer.core.config import FLAG_SPECS, VLLM_ALIASES, ConfigError, FlagSpec, ServerArgs
from infer.core.config.flags import OPEN_CHOICES, VLLM_REJECTED
from typer.core import TyperCommand

VLLM_PANEL = "vLLM-compatible spellings"
_VLLM_PREFIX = "vllm__"
_SCALAR: dict[str, type] = {"str": str, "int": int, "float": float, "json": str}


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` on stderr and exit (code 2: bad usage or unsupported setting)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _help(spec: FlagSpec) -> str:
    text = spec.help.replace("—", "--")
    if spec.choices is not None:
        text += f" [choices: {', '.join(str(c) for c in spec.choices)}"
        text += ", or one a plugin registers]" if spec.dest in OPEN_CHOICES else "]"
    if spec.default not in (None, False, "", [], {}):
        text += f" [default: {spec.default}]"
    if spec.deprecated is not None:
        text = "(deprecated) " + text
    return text.replace("[", r"\[")


def _param(spec: FlagSpec) -> inspect.Parameter:
    if spec.is_bool:
        ann: Any = Annotated[bool, typer.Option(*spec.names, help=_help(spec),
                                                rich_help_panel=spec.section, show_default=False)]
        default: Any = False
    else:
        base: Any = list[str] if spec.is_list else _SCALAR[spec.type]
        ann = Annotated[Optional[base], typer.Option(*spec.names, help=_help(spec),
                                                     rich_help_panel=spec.section,
                                                     show_default=False)]
        default = None
    return inspect.Parameter(spec.dest, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)


def _vllm_params() -> list[inspect.Parameter]:
    out = []
    for alias in VLLM_ALIASES.values():
        name = _VLLM_PREFIX + alias.name[2:].replace("-", "_")
        target = FLAG_SPECS[alias.dest]
        if alias.is_switch:
            ann: Any = Annotated[bool, typer.Option(alias.name, help=alias.help, rich_help_panel=VLLM_PANEL,
                                                    show_default=False)]
            default: Any = False
        else:
            ann = Annotated[Optional[_SCALAR[target.type]],
                            typer.Option(alias.name, help=alias.help, rich_help_panel=VLLM_PANEL)]
            default = None
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann))
    for flag, reason in VLLM_REJECTED.items():
        name = _VLLM_PREFIX + flag[2:].replace("-", "_")
        ann = Annotated[Optional[str], typer.Option(flag, help=f"Not available: {reason}.",
                                                    rich_help_panel=VLLM_PANEL)]
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann))
    return out


def server_flag_parameters() -> list[inspect.Parameter]:
    """One keyword-only Typer parameter per server flag, then the vLLM spellings."""
    return [_param(s) for s in FLAG_SPECS.values()] + _vllm_params()


SERVER_FLAG_NAMES: frozenset[str] = frozenset(
    [n for s in FLAG_SPECS.values() for n in s.names] + list(VLLM_ALIASES) + list(VLLM_REJECTED))
_LIST_FLAGS: frozenset[str] = frozenset(n for s in FLAG_SPECS.values() if s.is_list for n in s.names)


def _given(ctx: Any, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def build_server_args(ctx: Any, values: dict[str, Any],
                      positional: dict[str, tuple[str, Any]] | None = None) -> ServerArgs:
    """ServerArgs from the parsed server-flag ``values`` of a command (only those given on the
    command line count as user-set) and ``positional``: dest -> (argument name, value) for a
    server flag also given as a positional argument (vLLM's ``serve MODEL``; None = not given).
    Raises ConfigError."""
    user: dict[str, Any] = {}
    spellings: dict[str, str] = {}
    for name, value in values.items():
        if not _given(ctx, name):
            continue
        if name.startswith(_VLLM_PREFIX):
            flag = "--" + name[len(_VLLM_PREFIX):].replace("_", "-")
            if flag in VLLM_REJECTED:
                raise ConfigError(f"{flag}: {VLLM_REJECTED[flag]}")
            dest = VLLM_ALIASES[flag].dest
        else:
            flag, dest = None, name
        if dest in user:
            raise ConfigError(f"{spellings[dest]} and {flag or FLAG_SPECS[dest].flag} set the same "
                              "setting; give only one")
        spec = FLAG_SPECS[dest]
        if spec.is_list and value is not None:
            items = [v for item in value for v in (item.split(",") if spec.item_type != "str" else [item])]
            value = [v.strip() for v in items if v.strip()]
        user[flag or dest] = value
        spellings[flag or dest] = flag or _typed_name(ctx, dest)
        if flag:
            spellings[dest] = flag
            user[dest] = user.pop(flag)
    for dest, (name, value) in (positional or {}).items():
        if value is None:
            continue
        if dest in user and user[dest] != value:
            raise ConfigError(f"the positional {name} {value!r} and {spellings[dest]} {user[dest]!r} "
                              f"disagree; give the model once")
        user[dest] = value
        spellings.setdefault(dest, name)
    return ServerArgs.build(user, spellings)


def _typed_name(ctx: Any, dest: str) -> str:
    """The spelling the user typed for ``dest`` (an alias such as --tp-size, or the flag)."""
    argv = getattr(ctx, "_infer_argv", None) or []
    for name in FLAG_SPECS[dest].names:
        if any(a == name or a.startswith(name + "=") for a in argv):
            return name
    return FLAG_SPECS[dest].flag


def build_args_or_exit(ctx: Any, values: dict[str, Any],
                       positional: dict[str, tuple[str, Any]] | None = None) -> ServerArgs:
    """build_server_args, with ConfigError -> exit 2 and deprecation warnings printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            args = build_server_args(ctx, values, positional)
        except ConfigError as exc:
            fail(str(exc))
    for w in caught:
        typer.echo(f"warning: {w.message}", err=True)
    return args


class ServerFlagsCommand(TyperCommand):
    """A Typer command whose list flags take several values after one name (SGLang's nargs)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx._infer_argv = list(args)
        return super().parse_args(ctx, expand_list_flags(args))


def expand_list_flags(args: list[str]) -> list[str]:
    """``--x 1 2 4`` -> ``--x 1 --x 2 --x 4`` for list flags; ``--x`` alone -> ``--x ''``."""
    out: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            out += args[i:]
            break
        if tok in _LIST_FLAGS:
            j = i + 1
            vals = []
            while j < len(args) and not (args[j].startswith("--") or
                                         (args[j].startswith("-") and not args[j][1:2].isdigit()
                                          and args[j] != "-")):
                vals.append(args[j])
                j += 1
            for v in vals or [""]:
                out += [tok, v]
            i = j
            continue
        out.append(tok)
        i += 1
    return out


def with_server_flags(func: Callable[..., Any] | None = None, *,
                      positional: dict[str, str] | None = None) -> Any:
    """Give a Typer command function every server flag; it receives ``server_args=ServerArgs``.

    ``positional`` maps a positional parameter of ``func`` onto the server flag (its dest) it
    also sets, e.g. ``{"model": "model_path"}`` for vLLM's ``serve MODEL``: that parameter is
    consumed here (a user setting, like the flag) and not passed on. See the module docstring.
    """
    if func is None:
        return functools.partial(with_server_flags, positional=positional)
    as_flags = positional or {}
    sig = inspect.signature(func, eval_str=True)
    own = [p for n, p in sig.parameters.items() if n != "server_args"]
    flags = server_flag_parameters()
    clash = {p.name for p in own} & {p.name for p in flags}
    if clash:
        raise TypeError(f"{func.__name__}: parameters {sorted(clash)} clash with server flags")
    ctx_param = inspect.Parameter("_infer_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    flag_names = {p.name for p in flags}

    @functools.wraps(func)
    def wrapper(*a: Any, **kw: Any) -> Any:
        ctx = kw.pop("_infer_ctx")
        values = {k: kw.pop(k) for k in list(kw) if k in flag_names}
        given = {dest: (name.upper(), kw.pop(name, None)) for name, dest in as_flags.items()}
        return func(*a, **kw, server_args=build_args_or_exit(ctx, values, given))

    positional = [p for p in own if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = [p for p in own if p.kind == p.KEYWORD_ONLY]
    params = positional + [ctx_param] + keyword + flags
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    wrapper._infer_server_flags = True  # type: ignore[attr-defined]  # main mounts it with ServerFlagsCommand
    del wrapper.__wrapped__  # type: ignore[attr-defined]  # typer must read the new signature
    return wrapper
