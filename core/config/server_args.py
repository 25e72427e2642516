"""``ServerArgs``: every server flag as pydantic-settings models grouped by section, with provenance.

Sources, strongest first: the command line (or Python keyword arguments), the environment
(``INFER_<DEST>``, e.g. ``INFER_PORT=1234``; lists and dicts as JSON), the YAML file named by
``--config`` / ``INFER_CONFIG`` (keys are flag names, dashes or underscores, aliases allowed), and
the defaults. Each value remembers where it came from: ``args.provenance["port"]`` is one of
``user``, ``env``, ``config``, ``default`` or ``platform default`` (set by the gate).

    args = ServerArgs(model_path="m", page_size=16)      # keyword args count as user-set
    args.is_set("page_size")                              # True
    args.explicit_flags()                                 # [("--model-path", "m"), ("--page-size", 16)]
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Optional

import yaml
from infer.core.config.flags import (
    FLAG_SPECS,
    NO_CONSTANT,
    OPEN_CHOICES,
    SECTIONS,
    ConfigError,
    FlagSpec,
    lookup_name,
    translate_value,
)
from infer.core.config.validate import check_cross_flags
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, create_model
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "INFER_"
USER, ENV, CONFIG, DEFAULT, PLATFORM = "user", "env", "config", "default", "platform default"
EXPLICIT = (USER, ENV, CONFIG)


def _parse_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from exc
    return value


def _split_list(value: Any) -> Any:
    """A list flag given as one string ("1,2 4") becomes its items."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return _parse_json(text)
        return [v for v in re.split(r"[,\s]+", text) if v]
    if isinstance(value, tuple):
        return list(value)
    return value


_SCALAR = {"str": str, "int": int, "float": float, "bool": bool}


def _annotation(spec: FlagSpec) -> Any:
    if spec.type == "json":
        return Annotated[Any, BeforeValidator(_parse_json)]
    if spec.is_list:
        ann: Any = Annotated[list[_SCALAR[spec.item_type]], BeforeValidator(_split_list)]
    else:
        ann = _SCALAR[spec.type]
    return Optional[ann] if spec.default is None else ann


def _field(spec: FlagSpec) -> tuple[Any, Any]:
    extra = {"flag": spec.flag, "aliases": list(spec.aliases), "section": spec.section}
    if spec.choices is not None:
        extra["choices"] = list(spec.choices)
    return _annotation(spec), Field(spec.default, description=spec.help, json_schema_extra=extra)


def _class_name(section: str) -> str:
    words = re.findall(r"[A-Za-z0-9]+", section)
    return "".join(w[:1].upper() + w[1:] for w in words) + "Args"


_SECTION_CONFIG = ConfigDict(protected_namespaces=(), extra="forbid")

SECTION_MODELS: dict[str, type[BaseModel]] = {
    section: create_model(  # type: ignore[call-overload]
        _class_name(section), __config__=_SECTION_CONFIG,
        **{s.dest: _field(s) for s in FLAG_SPECS.values() if s.section == section})
    for section in SECTIONS
}


class _Resolved:
    """The merged raw values of every source, with where each came from."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.provenance: dict[str, str] = {}
        self.spelling: dict[str, str] = {}  # dest -> the flag name as the user wrote it

    def put(self, raw_name: str, value: Any, source: str) -> None:
        spec, constant = lookup_name(raw_name)
        if constant is not NO_CONSTANT:  # a value-less alias such as --enforce-eager
            if value is None:
                return
            if not isinstance(value, bool):
                raise ConfigError(f"{_cli(raw_name)} is a switch: it takes no value (got {value!r})")
            value = constant if value else (not constant)
        value = translate_value(spec, value)
        self.values[spec.dest] = value
        self.provenance[spec.dest] = source
        self.spelling[spec.dest] = _cli(raw_name)


def _cli(name: str) -> str:
    return name if name.startswith("--") else "--" + name.replace("_", "-")


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The YAML settings file (``--config``): a mapping of flag name -> value."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values")
    return data


def _read_env(environ: Mapping[str, str] | None) -> dict[str, Any]:
    if environ is not None:
        return {k[len(ENV_PREFIX):].lower(): v for k, v in environ.items()
                if k.upper().startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() in FLAG_SPECS}
    try:
        return EnvSettingsSource(ServerArgs, env_prefix=ENV_PREFIX, case_sensitive=False)()
    except Exception as exc:  # pydantic-settings reports which variable failed to decode
        raise ConfigError(f"environment: {exc}") from None


def resolve_sources(user: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                    spellings: Mapping[str, str] | None = None) -> _Resolved:
    """Merge defaults < config file < environment < user, keeping each value's provenance.

    ``user`` keys may be dest names, flag names or aliases; a None value means "not given".
    """
    user = {k: v for k, v in user.items() if v is not None}
    env = _read_env(environ)
    out = _Resolved()
    config_path = user.get("config") or env.get("config")
    if config_path:
        for key, value in read_config_file(config_path).items():
            try:
                spec, _ = lookup_name(str(key))
                if spec.dest == "config":
                    raise ConfigError("a config file cannot name another one")
                out.put(str(key), value, CONFIG)
            except ConfigError as exc:
                raise ConfigError(f"--config {config_path}: {exc}") from None
    for key, value in env.items():
        out.put(key, value, ENV)
        out.spelling[key] = f"{ENV_PREFIX}{key.upper()}"
    for key, value in user.items():
        out.put(key, value, USER)
        if spellings and key in spellings:
            out.spelling[FLAG_SPECS[lookup_name(key)[0].dest].dest] = spellings[key]
    return out


def _validation_message(exc: ValidationError, spelling: Mapping[str, str]) -> str:
    lines = []
    for err in exc.errors():
        dest = str(err["loc"][0]) if err["loc"] else ""
        spec = FLAG_SPECS.get(dest)
        name = spelling.get(dest) or (spec.flag if spec else dest)
        lines.append(f"{name}: invalid value {err.get('input')!r}: {err['msg']}")
    return "; ".join(lines)


class _ServerArgsBase(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", protected_namespaces=(),
                                      case_sensitive=False, validate_default=False)

    _provenance: dict[str, str] = PrivateAttr(default_factory=dict)
    _spelling: dict[str, str] = PrivateAttr(default_factory=dict)
    _adjustments: list[tuple[str, Any, str]] = PrivateAttr(default_factory=list)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Sources are merged (with provenance) by resolve_sources before validation.
        return (init_settings,)

    def __init__(self, **kwargs: Any) -> None:
        resolved = kwargs.pop("_resolved", None)
        if resolved is None:
            resolved = resolve_sources(kwargs)
        try:
            super().__init__(**resolved.values)
        except ValidationError as exc:
            raise ConfigError(_validation_message(exc, resolved.spelling)) from None
        self._provenance = {d: resolved.provenance.get(d, DEFAULT) for d in FLAG_SPECS}
        self._spelling = dict(resolved.spelling)
        self._apply_deprecated()
        self._check_choices()
        check_cross_flags(self)

    @classmethod
    def build(cls, user: Mapping[str, Any], spellings: Mapping[str, str] | None = None,
              environ: Mapping[str, str] | None = None) -> ServerArgs:
        """Build from parsed command-line values (``user``: dest/flag name -> value, None = not
        given); ``spellings`` maps a key to the flag as typed, for messages."""
        return cls(_resolved=resolve_sources(user, environ, spellings))  # type: ignore[return-value]

    # -- provenance -----------------------------------------------------------------------------
    @property
    def provenance(self) -> Mapping[str, str]:
        return MappingProxyType(self._provenance)

    def is_set(self, dest: str) -> bool:
        """Whether the setting came from the user, the environment or the config file."""
        if dest not in FLAG_SPECS:
            raise KeyError(dest)
        return self._provenance[dest] in EXPLICIT

    def spelling(self, dest: str) -> str:
        """How the setting was named where it was set (e.g. ``--max-model-len``, ``INFER_PORT``)."""
        return self._spelling.get(dest, FLAG_SPECS[dest].flag)

    def explicit_flags(self) -> list[tuple[str, Any]]:
        """(flag name as on the command line, value) for every user/config/env-set setting.

        A deprecated flag that maps onto a new one is reported as the new one.
        """
        out = []
        for dest, spec in FLAG_SPECS.items():
            if not self.is_set(dest):
                continue
            if spec.deprecated and spec.deprecated.get("set"):
                continue
            out.append((spec.flag, getattr(self, dest)))
        return out

    def set_platform_default(self, dest: str, value: Any, reason: str = "") -> None:
        """Apply a platform's default to a setting the user left unset (the gate calls this)."""
        if self.is_set(dest):
            raise ConfigError(f"{FLAG_SPECS[dest].flag} was set explicitly; a platform default "
                              f"may not change it")
        object.__setattr__(self, dest, value)
        self._provenance[dest] = PLATFORM
        self._adjustments.append((dest, value, reason))

    @property
    def adjustments(self) -> list[tuple[str, Any, str]]:
        return list(self._adjustments)

    def section(self, name: str) -> BaseModel:
        """The settings of one flag section as its own model (e.g. ``section("HTTP server")``)."""
        model = SECTION_MODELS[name]
        return model.model_validate({d: getattr(self, d) for d in model.model_fields})

    # -- checks -----------------------------------------------------------------------------------
    def _apply_deprecated(self) -> None:
        for dest, spec in FLAG_SPECS.items():
            if not spec.deprecated or not self.is_set(dest):
                continue
            value = getattr(self, dest)
            if value is None or value is False:
                continue
            targets = spec.deprecated.get("set", {})
            if not targets:
                warnings.warn(f"{spec.flag} is deprecated: {spec.help}", FutureWarning, stacklevel=3)
                continue
            for target, new in targets.items():
                if isinstance(new, str) and new.startswith("@"):
                    new = value if new == "@value" else getattr(self, new[1:])
                tspec = FLAG_SPECS[target]
                if self.is_set(target) and getattr(self, target) != new:
                    raise ConfigError(
                        f"{spec.flag} (deprecated) means {tspec.flag} {new}, which contradicts "
                        f"{self.spelling(target)} {getattr(self, target)}; drop {spec.flag}")
                object.__setattr__(self, target, new)
                self._provenance[target] = self._provenance[dest]
                self._spelling[target] = self.spelling(dest)
                warnings.warn(f"{spec.flag} is deprecated; using {tspec.flag} {new} instead",
                              FutureWarning, stacklevel=3)

    def _check_choices(self) -> None:
        for dest, spec in FLAG_SPECS.items():
            if spec.choices is None or dest in OPEN_CHOICES:
                continue
            value = getattr(self, dest)
            if value is None:
                continue
            items = value if isinstance(value, list) else [value]
            for item in items:
                if item not in spec.choices:
                    choices = ", ".join(str(c) for c in spec.choices)
                    raise ConfigError(f"{self.spelling(dest)}: invalid choice {item!r} "
                                      f"(choose from {choices})")


class ServerArgs(_ServerArgsBase, *SECTION_MODELS.values()):  # type: ignore[misc]
    """Every server flag (field names are SGLang's dest names), grouped by section.

    Construct with keyword args (user-set): ``ServerArgs(model_path="m", page_size=16)``, or from
    the command line through ``ServerArgs.build``. Raises ``ConfigError`` on a bad value or a
    contradiction between flags; the message names the flag.
    """
