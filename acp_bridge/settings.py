"""The YAML configuration: shipped defaults and agent presets, merged with the user's file.

This module owns the configuration's shape (pydantic models that reject unknown keys),
where it comes from (the ``acp_bridge.presets`` package, then ``--config FILE`` or
``$XDG_CONFIG_HOME/acp-bridge/config.yaml``), how layers merge (mappings key by key, lists
replaced whole), and ``${VAR}`` / ``${VAR:-default}`` expansion. Expansion happens when a
value is used, not when it is loaded, because ``verify`` supplies variables
(``ENDPOINT_URL``, ``VERIFY_HOME``) that only exist while it runs.

Every problem is a :class:`ConfigError` whose message has one line per problem, naming the
file and the key path (``config.yaml: agents.claude.argz: unknown key``).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeAlias

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from acp_bridge.config_file import default_config_file
from acp_bridge.core.system_prompt import DEFAULT_MAX_PROMPT_BYTES
from acp_bridge.state.store import MEMORY, SessionStore
from acp_bridge.wire.framing import DEFAULT_LINE_LIMIT, DEFAULT_STREAM_AFTER

PRESETS_PACKAGE: Final = "acp_bridge.presets"
# Applied in this order; later files override earlier ones.
SHIPPED_FILES: Final = ("defaults.yaml", "presets.yaml")
# A string: yaml.CSafeLoader exists only when PyYAML was built with libyaml.
_Loader: TypeAlias = "type[yaml.SafeLoader] | type[yaml.CSafeLoader]"
# The shipped files are read on every start: libyaml parses them in a tenth of the time
# when PyYAML was built with it (they are valid, and the tests hold both loaders to the
# same result). A user's file keeps the pure-Python loader, whose messages its errors quote.
_SHIPPED_LOADER: Final[_Loader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

Key = str | int
KeyPath = tuple[Key, ...]


class ConfigError(Exception):
    """The configuration cannot be used; the message has one line per problem."""

    def __init__(self, problems: str | Iterable[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


# ---------------------------------------------------------------------------------------
# ${VAR} expansion

_REFERENCE: Final = re.compile(
    r"(?P<escaped>\$\$\{)"
    r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|(?P<malformed>\$\{)"
)


def expand(value: str, variables: Mapping[str, str], where: str) -> str:
    """Replace ``${VAR}`` and ``${VAR:-default}`` in ``value`` from ``variables``.

    As in the shell, the default applies when the variable is unset or empty. ``$${``
    stands for a literal ``${``; a ``$`` not followed by ``{`` is left alone. ``where``
    names the value in errors (``agents.goose.command``).
    """

    def substitute(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "${"
        name = match.group("name")
        if name is None:
            raise ConfigError(f"{where}: {_MALFORMED_HINT} in {value!r}")
        current = variables.get(name)
        default = match.group("default")
        if default is not None and not current:
            return default
        if current is None:
            raise ConfigError(
                f"{where}: ${{{name}}} is not defined (set it, or write ${{{name}:-default}})"
            )
        return current

    return _REFERENCE.sub(substitute, value)


_MALFORMED_HINT: Final = "malformed variable reference (write ${NAME} or ${NAME:-default})"


def _is_malformed(value: str) -> bool:
    return any(match.group("malformed") for match in _REFERENCE.finditer(value))


# ---------------------------------------------------------------------------------------
# Models


def _scalar_text(value: object) -> object:
    # YAML reads `DISABLE_TELEMETRY: 1` and `GOOSE_TELEMETRY_ENABLED: false` as a number
    # and a boolean; in env and args the user means the text they wrote.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


Text = Annotated[str, BeforeValidator(_scalar_text)]


class _Section(BaseModel):
    # Empty lists and mappings are defaults as values, which pydantic copies for each
    # instance: a default_factory of list or dict has pydantic read the factory's signature,
    # which parses their text signatures with tokenize (4 ms of every start).
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Where this section sits in the merged configuration, and which file set each key:
    # errors found at use time (an undefined ${VAR}) name the file and key path.
    _path: KeyPath = PrivateAttr(default=())
    _origins: Mapping[KeyPath, str] = PrivateAttr(default_factory=dict)

    def _at(self, *keys: str | int) -> str:
        """``FILE: key.path`` of one of this section's values, for error messages."""
        path = (*self._path, *keys)
        if not self._origins:
            return _dotted(path)
        return f"{_origin(self._origins, path)}: {_dotted(path)}"

    def _place(self, path: KeyPath, origins: Mapping[KeyPath, str]) -> None:
        self._path = path
        self._origins = origins


class VerifySpec(_Section):
    """How ``acp-bridge verify`` points an agent at the embedded local model endpoint."""

    endpoint: Literal["anthropic", "openai-chat", "openai-responses", "gemini"]
    env: dict[str, Text] = Field(default={})
    args: list[Text] = Field(default=[])
    dirs: list[str] = Field(default=[])
    files: dict[str, Text] = Field(default={})
    """Files to write before the agent starts, path -> text (both expanded): for an agent
    that reads the endpoint's address only from a settings file."""
    model: str | None = None

    def resolved_env(self, variables: Mapping[str, str]) -> dict[str, str]:
        """Variables to set on top of the agent's environment while verifying."""
        return {
            name: expand(value, variables, self._at("env", name))
            for name, value in self.env.items()
        }

    def resolved_args(self, variables: Mapping[str, str]) -> list[str]:
        """Arguments to append to the agent's command line while verifying."""
        return [
            expand(arg, variables, self._at("args", index)) for index, arg in enumerate(self.args)
        ]

    def resolved_dirs(self, variables: Mapping[str, str]) -> list[Path]:
        """Folders to create before the agent starts."""
        return [
            Path(expand(folder, variables, self._at("dirs", index))).expanduser()
            for index, folder in enumerate(self.dirs)
        ]

    def resolved_files(self, variables: Mapping[str, str]) -> dict[Path, str]:
        """Files to write before the agent starts, path -> text."""
        return {
            Path(expand(path, variables, self._at("files"))).expanduser(): expand(
                text, variables, self._at("files", path)
            )
            for path, text in self.files.items()
        }


class AgentPreset(_Section):
    """A named agent: ``acp-bridge --agent NAME``."""

    command: str = Field(min_length=1)
    args: list[Text] = Field(default=[])
    env: dict[str, Text] = Field(default={})
    adapter: str = "auto"
    description: str = ""
    install: str = ""
    """How to install the agent (or which variable points at it): shown when ``command``
    cannot be started."""
    verify: VerifySpec | None = None

    def resolved_command(self, variables: Mapping[str, str]) -> list[str]:
        """The command line: ``command`` followed by ``args``, expanded."""
        return [
            expand(self.command, variables, self._at("command")),
            *(
                expand(arg, variables, self._at("args", index))
                for index, arg in enumerate(self.args)
            ),
        ]

    def resolved_env(self, variables: Mapping[str, str]) -> dict[str, str]:
        """Variables to set on top of the bridge's own environment (never instead of it)."""
        return {
            name: expand(value, variables, self._at("env", name))
            for name, value in self.env.items()
        }


LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class BridgeSettings(_Section):
    """The ``bridge:`` section; command-line options override it."""

    adapter: str = "auto"
    adapter_paths: list[str] = Field(default=[])
    # Options of one adapter each, keyed by adapter name; the adapter validates its own.
    adapter_options: dict[str, dict[str, Any]] = Field(default={})
    state: str = "default"
    on_omitted: Literal["keep", "default"] = "keep"
    allow_override: bool = True
    max_prompt_bytes: PositiveInt = DEFAULT_MAX_PROMPT_BYTES
    line_limit: PositiveInt = DEFAULT_LINE_LIMIT
    # A line this long passes on while it arrives (docs/architecture.md); 0: none does.
    stream_after: NonNegativeInt = DEFAULT_STREAM_AFTER
    shutdown_grace: NonNegativeFloat = 2.0
    log_level: LogLevel = "warning"
    trace: str | None = None
    trace_prompts: bool = False

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_log_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    def state_location(self, variables: Mapping[str, str]) -> Path | Literal[":memory:"]:
        """Where the session store lives: ``default`` is :meth:`SessionStore.default_path`."""
        return resolve_state(self.state, variables, self._at("state"))

    def trace_path(self, variables: Mapping[str, str]) -> Path | None:
        if self.trace is None:
            return None
        return Path(expand(self.trace, variables, self._at("trace"))).expanduser()

    def adapter_folders(self, variables: Mapping[str, str]) -> list[Path]:
        return [
            Path(expand(folder, variables, self._at("adapter_paths", index))).expanduser()
            for index, folder in enumerate(self.adapter_paths)
        ]


def resolve_state(
    value: str, variables: Mapping[str, str], where: str = "state"
) -> Path | Literal[":memory:"]:
    """Turn a ``state`` setting (``default``, ``:memory:`` or a path) into a location."""
    if value == "default":
        return SessionStore.default_path()
    if value == MEMORY:
        return MEMORY
    return Path(expand(value, variables, where)).expanduser()


class Config(_Section):
    """The merged configuration."""

    bridge: BridgeSettings = Field(default_factory=BridgeSettings)
    agents: dict[str, AgentPreset] = Field(default={})

    _sources: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _name_presets(self) -> Config:
        self.place({})
        return self

    def place(self, origins: Mapping[KeyPath, str]) -> None:
        """Tell every section its key path and which file set each key."""
        self._place((), origins)
        self.bridge._place(("bridge",), origins)
        for name, preset in self.agents.items():
            preset._place(("agents", name), origins)
            if preset.verify is not None:
                preset.verify._place(("agents", name, "verify"), origins)

    @property
    def sources(self) -> tuple[str, ...]:
        """The files this configuration was read from, in merge order."""
        return self._sources

    def agent(self, name: str) -> AgentPreset:
        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise ConfigError(f"unknown agent preset {name!r}; known presets: {known}") from None


# ---------------------------------------------------------------------------------------
# Loading


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/acp-bridge/config.yaml``, falling back to ``~/.config``."""
    # One rule for both: the early start (launch.py) looks for this file before it loads
    # anything, since an initialize answered early must not ignore it.
    return Path(default_config_file(environ))


def load_config(
    user_file: Path | None = None, *, environ: Mapping[str, str] | None = None
) -> Config:
    """Shipped defaults and presets, overridden by ``user_file`` (``--config``) or, when
    that is not given, by the default user file if it exists."""
    shipped = [(f"{PRESETS_PACKAGE}/{name}", _read_shipped(name)) for name in SHIPPED_FILES]
    layers = [(source, _parse(source, text, _SHIPPED_LOADER)) for source, text in shipped]
    if user_file is not None:
        if not user_file.is_file():
            raise ConfigError(f"{user_file}: no such configuration file")
        layers.append((str(user_file), _parse(str(user_file), _read_file(user_file))))
    else:
        candidate = default_config_path(environ)
        if candidate.is_file():
            layers.append((str(candidate), _parse(str(candidate), _read_file(candidate))))

    merged: dict[str, Any] = {}
    origins: dict[KeyPath, str] = {}
    for source, data in layers:
        merged = _merge(merged, data)
        for path in _key_paths(data):
            origins[path] = source

    problems = [
        f"{_origin(origins, path)}: {_dotted(path)}: {_MALFORMED_HINT}"
        for path, value in _strings(merged)
        if _is_malformed(value)
    ]
    try:
        config = Config.model_validate(merged)
    except ValidationError as exc:
        problems = [_describe(error, origins) for error in exc.errors()] + problems
    if problems:
        raise ConfigError(problems)
    config._sources = tuple(source for source, _ in layers)
    config.place(origins)
    return config


def _read_shipped(name: str) -> str:
    try:
        return resources.files(PRESETS_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    except ModuleNotFoundError:
        # Running from a source checkout that was never installed: the package's files
        # are the repository's config/ folder.
        source_tree = Path(__file__).resolve().parent.parent / "config" / name
        return source_tree.read_text(encoding="utf-8")


def _read_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the configuration file: {exc}") from exc


def _parse(source: str, text: str, loader: _Loader = yaml.SafeLoader) -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=loader)  # a safe loader either way
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(f"{source}: invalid YAML: {where}{problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}".replace("\n", " ")) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping (bridge:, agents:), "
            f"not a {_yaml_kind(data)}"
        )
    return data


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced whole.

    Builds new dicts rather than updating ``base``: YAML anchors make several presets
    share one mapping, and an override of one must not leak into the others.
    """
    merged = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = _merge(current, value)
        else:
            merged[key] = value
    return merged


def _key_paths(data: Mapping[str, Any], prefix: KeyPath = ()) -> Iterator[KeyPath]:
    for key, value in data.items():
        path = (*prefix, key)
        yield path
        if isinstance(value, Mapping):
            yield from _key_paths(value, path)


def _strings(value: object, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, str]]:
    if isinstance(value, str):
        yield prefix, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*prefix, index))


def _origin(origins: Mapping[KeyPath, str], path: KeyPath) -> str:
    """The file that last set ``path`` or its closest enclosing key."""
    for length in range(len(path), 0, -1):
        source = origins.get(path[:length])
        if source is not None:
            return source
    return "configuration"


def _dotted(path: KeyPath) -> str:
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text or "(top level)"


def _describe(error: Mapping[str, Any], origins: Mapping[KeyPath, str]) -> str:
    path: KeyPath = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        message = "unknown key"
        import difflib  # only for a configuration error

        close = difflib.get_close_matches(str(path[-1]), _keys_at(path[:-1]), n=1)
        if close:
            message += f" (did you mean {close[0]}?)"
    elif kind == "missing":
        message = "required key is missing"
    else:
        message = str(error["msg"])
        value = error.get("input")
        if value is None or isinstance(value, str | int | float | bool):
            message += f" (got {value!r})"
    return f"{_origin(origins, path)}: {_dotted(path)}: {message}"


def _keys_at(path: KeyPath) -> list[str]:
    """The keys the configuration's models accept at ``path`` (a mapping of names, such as
    ``agents``, takes any key: none listed)."""
    annotation: Any = Config
    rest = list(path)
    while True:
        annotation = _without_none(annotation)
        if typing.get_origin(annotation) is dict:
            if not rest:
                return []
            rest.pop(0)
            annotation = typing.get_args(annotation)[1]
            continue
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        if not rest:
            return list(annotation.model_fields)
        field = annotation.model_fields.get(str(rest.pop(0)))
        if field is None:
            return []
        annotation = field.annotation


def _without_none(annotation: Any) -> Any:
    """``X`` of ``X | None``; anything else as it is."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _yaml_kind(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    return type(value).__name__
