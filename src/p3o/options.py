"""Typed options for any config dataclass: dotted command-line overrides, YAML files and presets, ``--help``.

The schema lives in the dataclasses (``p3o.config.TrainConfig``, ``p3o.train.sft.SFTConfig``, the experiment
options); this module only reads text into them. Each field is declared with :func:`config_field` (help text and
pydantic ``Field`` bounds); pydantic coerces and bounds every value; errors are one line naming the key, e.g.
``unknown key 'optim.lrr' (did you mean 'optim.lr'?)`` or ``optim.lr: must be > 0, got 0.0``.

Two opt-ins let a schema shape its command line without this module knowing it:

* a ``dict`` field whose metadata has ``extra=True`` collects its section's undeclared keys, flat
  (``--objective.clip_eps 0.4`` -> ``ObjectiveConfig.hyper["clip_eps"]``); the class's ``_cross_check`` types them,
  and a root method ``_extra_keys()`` lists them for nearest-name hints;
* a root ``ClassVar`` ``cli_aliases`` maps an option to a key (``--resume`` = ``--ckpt.resume``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import importlib
import math
import operator
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import field
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml

from p3o.errors import ConfigError

# pydantic's error type of a broken bound -> (the Field argument, its symbol in the one-line message)
_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}
_BOUND_ARGS = {arg for arg, _ in _BOUNDS.values()}

Row = tuple[str, str] | str
"""A line of ``--help``: (option, help) or a section heading."""


def config_field(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, **bounds: float) -> Any:
    """A dataclass field with its help text and optional numeric bounds in the metadata.

    ``bounds`` are pydantic ``Field`` constraints (``gt``, ``ge``, ``lt``, ``le``): pydantic checks them, with the
    field's type, whenever a value is set or validated. Every config of the project (train, sft, the experiment
    files' sections) declares its fields with it, so :func:`load_config`, :func:`from_dict`, :func:`validate` and
    :func:`config_help` type, bound and document them all the same way.
    """
    assert help, "every config field needs a help text"
    assert set(bounds) <= _BOUND_ARGS, bounds
    metadata = {"help": help, **bounds}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# --------------------------------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """Resolved type hints of a config dataclass (the modules use postponed annotations)."""
    return typing.get_type_hints(cls)


def leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, type) of every leaf field of root ``cls``, in declaration order."""
    out: list[tuple[str, dataclasses.Field, Any]] = []
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        key = f"{prefix}{f.name}"
        out += leaf_fields(tp, key + ".") if dataclasses.is_dataclass(tp) else [(key, f, tp)]
    return out


def nearest(key: str, candidates: list[str]) -> str | None:
    """Closest valid key: same section first (comparing the last component), then the whole dotted name."""
    section, _, last = key.rpartition(".")
    same = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == section}
    near = difflib.get_close_matches(last, list(same), n=1, cutoff=0.6)
    if near:
        return same[near[0]]
    near = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    if near:
        return near[0]
    by_last = {c.rpartition(".")[2]: c for c in candidates}
    near = difflib.get_close_matches(last, list(by_last), n=1, cutoff=0.75)
    return by_last[near[0]] if near else None


def _unknown(key: str, cfg: Any) -> ConfigError:
    """The one-line error for an unknown ``key``, with the nearest declared key. The root's ``_extra_keys()`` (the
    objective's keys, whose registry imports torch) are consulted only when no declared key is near, or the key is
    in an extra section: a typo like ``--step`` or ``--optim.lrr`` is answered without that import."""
    keys = [k for k, f, _ in leaf_fields(type(cfg)) if not f.metadata.get("extra")]
    extra_sections = {k.rpartition(".")[0] for k, f, _ in leaf_fields(type(cfg)) if f.metadata.get("extra")}
    near = None if key.rpartition(".")[0] in extra_sections else nearest(key, keys)
    if near is None:
        near = nearest(key, keys + list(getattr(cfg, "_extra_keys", list)()))
    return ConfigError(f"unknown key '{key}'" + (f" (did you mean '{near}'?)" if near else ""))


# --------------------------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------------------------


def _describe(tp: Any) -> str:
    """Human-readable type name used in error messages."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        text = " or ".join(_describe(a) for a in args)
        return text + (" or null" if len(args) < len(typing.get_args(tp)) else "")
    if origin is tuple:
        args = typing.get_args(tp)
        return f"a list of {len(args)} {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    return {int: "an int", float: "a float", bool: "a bool", str: "a string", dict: "a mapping"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


@functools.cache
def _adapter(tp: Any, bounds: tuple[tuple[str, float], ...] = ()) -> pydantic.TypeAdapter:
    """pydantic's validator for type ``tp`` with ``Field`` constraints ``bounds`` (lax mode: '1e-4' -> 1e-4,
    'yes' -> True, [1, 2] -> (1, 2); floats must be finite)."""
    annotated = typing.Annotated[tp, pydantic.Field(**dict(bounds))] if bounds else tp
    return pydantic.TypeAdapter(annotated, config=pydantic.ConfigDict(allow_inf_nan=False))


def _bounds(f: dataclasses.Field) -> tuple[tuple[str, float], ...]:
    """The pydantic constraints a :func:`config_field` declared (hashable, for :func:`_adapter`)."""
    return tuple((k, v) for k, v in f.metadata.items() if k in _BOUND_ARGS)


@dataclasses.dataclass(frozen=True)
class Flag:
    """The value of a bare ``--key`` on the command line: true for a bool field, a missing value otherwise."""

    key: str  # as given, for the error message


_OPS = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le}


def _already(value: Any, union: tuple[Any, ...], bounds: tuple[tuple[str, float], ...]) -> bool:
    """True when ``value`` is exactly of a plain member of ``union`` (None, bool, int, str, a finite float, one of a
    ``Literal``'s values) and within ``bounds``: pydantic's lax mode returns such a value unchanged, so
    :func:`check_value` skips building a validator for it (~5 ms per type: the defaults of a config's ~100 keys made
    an option error of `p3o train` 0.15 s slower; issue 47). Anything else goes to pydantic, errors included."""
    kind = type(value)
    plain = any(
        (m is type(None) and value is None)
        or (m in (bool, int, str) and kind is m)
        or (m is float and kind is float and math.isfinite(value))
        or (typing.get_origin(m) is Literal and any(kind is type(c) and value == c for c in typing.get_args(m)))
        for m in union
    )
    if not plain or (bounds and kind not in (int, float)):
        return False
    return all(_OPS[arg](value, bound) for arg, bound in bounds)


def check_value(key: str, value: Any, tp: Any, raw: str | None = None, bounds: tuple = ()) -> Any:
    """Coerce ``value`` to ``tp`` and check ``bounds`` (pydantic, lax) or raise a one-line ConfigError naming ``key``.

    ``raw`` is the original command-line text: a text-only field (``str``, ``str | None``) keeps it verbatim
    ('007' stays '007'), and errors quote it. Choices (``Literal``) match case-insensitively.
    """
    if isinstance(value, Flag):
        if tp is not bool:
            raise ConfigError(f"--{value.key}: expected a value")
        return True
    if tp is Any:
        return value
    union = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    if (
        raw is not None
        and value is not None
        and str in union
        and (isinstance(value, str) or set(union) <= {str, type(None)})
    ):
        value = raw
    if isinstance(value, str) and typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        value = next((c for c in choices if isinstance(c, str) and c.lower() == value.strip().lower()), value)
    if _already(value, union, bounds):  # what pydantic would return unchanged, without building its validator
        return value
    try:
        value = _adapter(tp).validate_python(value)
        return _adapter(tp, bounds).validate_python(value) if bounds else value
    except pydantic.ValidationError as err:
        error = err.errors()[0]
        if error["type"] in _BOUNDS:
            arg, symbol = _BOUNDS[error["type"]]
            raise ConfigError(f"{key}: must be {symbol} {dict(bounds)[arg]}, got {value}") from None
        if error["type"] == "finite_number":
            raise ConfigError(f"{key}: must be a finite number, got {error['input']}") from None
        got = raw if raw is not None else value
        raise ConfigError(f"{key}: expected {_describe(tp)}, got {got!r}") from None


def _parse_scalar(text: str) -> Any:
    """Parse a command-line value as a YAML scalar/flow value ('1e-4' and 'abc' stay strings)."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


# --------------------------------------------------------------------------------------------------------------------
# Setting keys, validating
# --------------------------------------------------------------------------------------------------------------------


def _set(cfg: Any, key: str, value: Any, *, raw: str | None = None) -> None:
    """Set dotted ``key`` on ``cfg`` in place, type-checking the value (undeclared keys go to an extra field)."""
    parts = key.split(".")
    if any(not p for p in parts):
        raise ConfigError(f"malformed key '{key}'")
    obj: Any = cfg
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
        extra = next((name for name, f in fields.items() if f.metadata.get("extra")), None)
        if extra is not None and (part not in fields or (part == extra and i == len(parts) - 2)):
            if part not in fields and i != len(parts) - 1:
                raise _unknown(key, cfg)
            getattr(obj, extra)[parts[-1]] = value  # typed by the class's _cross_check
            return
        if part not in fields:
            raise _unknown(key, cfg)
        tp = _hints(type(obj))[part]
        if i < len(parts) - 1 and (tp is dict or typing.get_origin(tp) is dict):  # a free mapping (agent.env_kwargs)
            getattr(obj, part)[".".join(parts[i + 1 :])] = value
            return
        if i < len(parts) - 1:
            obj = getattr(obj, part)
        elif dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key}: is a section; set its keys, e.g. '{key}.{dataclasses.fields(tp)[0].name}'")
            for k, v in value.items():
                _set(cfg, f"{key}.{k}", v)
        elif part == extra:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key}: expected a mapping, got {value!r}")
            getattr(obj, part).update(value)
        else:
            setattr(obj, part, check_value(key, value, tp, raw, _bounds(fields[part])))


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested mapping -> [(dotted key, leaf value)]; lists and scalars are leaves, an empty mapping sets nothing."""
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        if not isinstance(k, str):
            raise ConfigError(f"key {prefix}{k!r}: keys must be strings")
        out += _flatten(v, f"{prefix}{k}.") if isinstance(v, Mapping) else [(f"{prefix}{k}", v)]
    return out


def validate(cfg: Any) -> Any:
    """Check types, bounds and cross-field constraints of any config dataclass; raises a one-line ConfigError.

    Every leaf is coerced to its declared type in place (pydantic); then the class's ``_cross_check(self)`` runs,
    if it has one. Returns ``cfg``.
    """
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise ConfigError(f"expected a config dataclass, got {type(cfg).__name__}")
    for key, f, tp in leaf_fields(type(cfg)):
        if f.metadata.get("extra"):
            continue
        obj: Any = cfg
        for part in key.split(".")[:-1]:
            obj = getattr(obj, part)
        setattr(obj, f.name, check_value(key, getattr(obj, f.name), tp, bounds=_bounds(f)))
    check = getattr(cfg, "_cross_check", None)
    if check is not None:
        check()
    return cfg


def apply_overrides(cfg: Any, overrides: Mapping[str, Any], *, check: bool = True) -> Any:
    """A copy of ``cfg`` with dotted ``overrides`` applied, e.g. ``{"loop.mode": "stale", "objective.clip_eps": 0.4}``.

    Values may be Python objects or strings (strings are converted like command-line values); nested
    mappings are flattened (``{"optim": {"lr": 1e-3}}``). ``check`` runs :func:`validate` at the end.
    """
    new = copy.deepcopy(cfg)
    for key, value in _flatten(overrides):
        _set(new, key, value)
    return validate(new) if check else new


def from_dict(d: Mapping[str, Any], cls: type, *, base: Any = None, source: str | None = None) -> Any:
    """A validated ``cls`` from a (nested or dotted) dict laid over ``base`` (default: ``cls()``).

    ``source`` (a file name, or ``file: section``) prefixes error messages.
    """
    cfg = copy.deepcopy(base) if base is not None else cls()
    try:
        for key, value in _flatten(d):
            _set(cfg, key, value)
        return validate(cfg)
    except ConfigError as err:
        if source:
            raise ConfigError(f"{source}: {err}") from None
        raise


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of ``cfg`` (tuples as lists; an extra field's keys flat in its section)."""

    def conv(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):
            out: dict[str, Any] = {}
            for f in dataclasses.fields(obj):
                value = conv(getattr(obj, f.name))
                if f.metadata.get("extra"):
                    out.update(value)
                else:
                    out[f.name] = value
            return out
        if isinstance(obj, tuple | list):
            return [conv(v) for v in obj]
        if isinstance(obj, Mapping):
            return {k: conv(v) for k, v in obj.items()}
        return obj

    return conv(cfg)


# --------------------------------------------------------------------------------------------------------------------
# Presets, files and the command line
# --------------------------------------------------------------------------------------------------------------------


def _preset_dirs() -> list[Path | Any]:
    """Where presets live: the package's ``p3o/configs/`` (the one copy; a wheel ships it as package data)."""
    try:
        packaged = files("p3o") / "configs"
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - namespace/zip oddities
        return []
    return [packaged] if packaged.is_dir() else []


def list_presets() -> list[str]:
    """Training presets accepted by ``--config NAME``: the files p3o/configs/<name>.yaml (sub-folders are not
    presets), found from any working directory."""
    names: set[str] = set()
    for d in _preset_dirs():
        names |= {p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml") and p.is_file()}
    return sorted(names)


def preset_path(name_or_path: str) -> Path:
    """Resolve ``--config`` to a file: an existing path, else a preset name (p3o/configs/<name>.yaml)."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    if p.suffix in {".yaml", ".yml"} and (p.is_absolute() or ("/" in name_or_path and p.parent.exists())):
        raise ConfigError(f"--config: file not found: {name_or_path}")
    stem = name_or_path[:-5] if name_or_path.endswith(".yaml") else name_or_path
    for d in _preset_dirs():
        cand = d / f"{stem}.yaml" if isinstance(d, Path) else d.joinpath(*f"{stem}.yaml".split("/"))
        if cand.is_file():
            return Path(str(cand))
    presets = list_presets()
    near = difflib.get_close_matches(stem, presets, n=1)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    raise ConfigError(
        f"--config: no file or preset named '{name_or_path}'{hint}; presets: {', '.join(presets) or 'none'}"
    )


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[str, Any]]:
    """Dotted (key, value) pairs of a YAML config file, following an optional top-level ``extends: <preset>``."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} invalid YAML ({getattr(err, 'problem', err)})") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
    if data is None:
        return []
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level, got {type(data).__name__}")
    data = dict(data)
    pairs: list[tuple[str, Any]] = []
    parent = data.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: extends: expected a preset name or path, got {parent!r}")
        ppath = preset_path(parent)
        if ppath.resolve() in seen:
            raise ConfigError(f"{path}: extends: cycle through {ppath}")
        pairs += _read_yaml(ppath, (*seen, path.resolve()))
    return pairs + _flatten(data)


def _split_argv(argv: Sequence[str] | None, cls: type) -> tuple[list[str], list[tuple[str, str | None]]]:
    """(``--config`` values, [(key, raw value or None for a bare flag)]) of a command line, aliases resolved."""
    aliases: Mapping[str, str] = getattr(cls, "cli_aliases", {})
    args, configs, overrides = list(argv or []), [], []
    while args:
        tok = args.pop(0)
        if not tok.startswith("--") or tok == "--":
            raise ConfigError(f"unexpected argument '{tok}' (options look like --key value or --key=value)")
        name, eq, val = tok[2:].partition("=")
        if not eq:  # the next token is the value unless it is another option
            val = None if not args or (args[0].startswith("--") and len(args[0]) > 2) else args.pop(0)
        name = name.replace("-", "_")
        if name == "config":
            if not val:
                raise ConfigError("--config: expected a file path or preset name")
            configs.append(val)
        else:
            overrides.append((aliases.get(name, name), val))
    return configs, overrides


def given_keys(argv: Sequence[str] | None, cls: type, *, skip_files: Sequence[Path] = ()) -> list[str]:
    """The dotted keys a command line sets, in order without repeats: every key of each ``--config`` file (and the
    presets it extends) except the files in ``skip_files``, then each override (a mapping value gives its leaves).

    ``given_keys(["--config", "quick", "--optim.lr", "1e-3"], TrainConfig)`` -> quick's keys, then ``optim.lr``.
    """
    configs, overrides = _split_argv(argv, cls)
    skip = {Path(f).resolve() for f in skip_files}
    keys: list[str] = []
    for c in configs:
        path = preset_path(c)
        if path.resolve() not in skip:
            keys += [k for k, _ in _read_yaml(path)]
    for key, val in overrides:
        value = None if val is None else _parse_scalar(val)
        keys += [k for k, _ in _flatten(value, key + ".")] if isinstance(value, Mapping) and value else [key]
    return list(dict.fromkeys(keys))


def load_config(argv: list[str] | None, cls: type, *, base: Any = None) -> Any:
    """Parse ``--config PATH_OR_PRESET`` and dotted overrides into a validated ``cls`` laid over ``base``.

    Accepted forms: ``--config quick``, ``--config=path.yaml``, ``--optim.lr 3e-4``, ``--optim.lr=3e-4``, a bare
    boolean flag ``--loop.dynamic_sampling`` (= true), ``cls.cli_aliases`` (``--resume`` = ``--ckpt.resume``);
    ``-`` and ``_`` are the same in a key (``--batch-size`` = ``--batch_size``). Order: ``base`` (default
    ``cls()``), every ``--config`` file in order, then the overrides left to right. ``--help`` is not handled here.
    """
    configs, overrides = _split_argv(argv, cls)
    cfg = copy.deepcopy(base) if base is not None else cls()
    for c in configs:
        path = preset_path(c)
        try:
            for key, value in _read_yaml(path):
                _set(cfg, key, value)
        except ConfigError as err:
            msg = str(err)
            raise ConfigError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None
    for key, val in overrides:  # a bare --key: true for a bool (an extra key's once typed), else an error
        _set(cfg, key, Flag(key) if val is None else _parse_scalar(val), raw=val)
    return validate(cfg)


def _is_bool_text(text: str) -> bool:
    """True when ``text`` reads as a boolean value (``true``, ``no``, ``1``, ...), i.e. a bare flag may take it."""
    try:
        _adapter(bool).validate_python(_parse_scalar(text))
    except pydantic.ValidationError:
        return False
    return True


def parse_command(argv: Sequence[str] | None, cls: type, *, positional: Sequence[str] = ()) -> Any:
    """A command's options (``p3o doctor``, ``eval``, ``mismatch``, ``plot``, ...) as a validated ``cls``.

    The same mechanism as ``p3o train`` (:func:`load_config`): typed, bounded options, ``--key value`` or
    ``--key=value``, ``-``/``_`` alike, no abbreviations, one-line ConfigErrors with the nearest option. Arguments
    that are not options fill the fields named in ``positional``, in order, wherever they stand: ``p3o doctor RUN
    --window 3`` = ``p3o doctor --window 3 RUN`` = ``p3o doctor --path RUN --window 3``. A bare boolean flag
    (``--no_plot``) takes the next argument as its value only when it reads as a boolean (``--no_plot false``).
    """
    bools = {key for key, _, tp in leaf_fields(cls) if tp is bool}
    aliases: Mapping[str, str] = getattr(cls, "cli_aliases", {})
    args, options, values = list(argv or []), [], []
    while args:
        tok = args.pop(0)
        if tok.startswith("--") and len(tok) > 2:
            options.append(tok)
            name, eq, _ = tok[2:].partition("=")
            key = name.replace("-", "_")
            takes = not eq and args and not (args[0].startswith("--") and len(args[0]) > 2)
            if takes and (aliases.get(key, key) not in bools or _is_bool_text(args[0])):
                options.append(args.pop(0))
        else:
            values.append(tok)
    if len(values) > len(positional):
        extra = values[len(positional)]
        takes = (
            f"takes {len(positional)} argument{'s' if len(positional) != 1 else ''}" if positional else "takes none"
        )
        raise ConfigError(f"unexpected argument '{extra}' (the command {takes}; options look like --key value)")
    given = [f"--{name}={value}" for name, value in zip(positional, values)]
    return load_config([*given, *options], cls)


def command_help(cls: type, usage: str, about: str, arguments: Sequence[tuple[str, str]] = ()) -> str:
    """``--help`` of a command parsed by :func:`parse_command`: usage, one line about it, its positional
    ``arguments`` as (name, help) rows, then every option as :func:`config_help` lists ``p3o train``'s."""
    general = [*arguments, ("--config PATH", "YAML file of these options (applied before the command-line options)")]
    return f"{usage}\n\n{about}\n\n{config_help(cls, general)}"


def wants_help(argv: Sequence[str] | None) -> bool:
    """``-h`` or ``--help`` anywhere on the command line."""
    return any(a in {"-h", "--help"} for a in argv or [])


def parse_or_help(
    argv: Sequence[str] | None,
    cls: type,
    usage: str,
    about: str,
    *,
    arguments: Sequence[tuple[str, str]] = (),
    positional: Sequence[str] = (),
) -> Any | None:
    """A command's options, or its ``--help``: with ``-h``/``--help`` anywhere on ``argv``, print
    :func:`command_help` (``usage``, ``about``, the positional ``arguments`` rows, the options of ``cls``) and return
    None (the command exits 0); else ``argv`` parsed by :func:`parse_command` into a validated ``cls``."""
    if wants_help(argv):
        print(command_help(cls, usage, about, arguments))
        return None
    return parse_command(argv, cls, positional=positional)


def run_command(argv: Sequence[str] | None, cls: type, usage: str, about: str, run: str) -> int:
    """The whole ``main`` of a command whose work loads heavy libraries: ``argv`` (None: ``sys.argv[1:]``) parsed by
    :func:`parse_or_help` into ``cls`` (``--help``: exit 0; bad options raise ConfigError before anything heavy
    loads), then ``run`` (``"module:function"``, imported only now) called with the options; its exit status."""
    args = parse_or_help(sys.argv[1:] if argv is None else list(argv), cls, usage, about)
    if args is None:
        return 0
    module, _, function = run.partition(":")
    return int(getattr(importlib.import_module(module), function)(args))


# --------------------------------------------------------------------------------------------------------------------
# --help
# --------------------------------------------------------------------------------------------------------------------


def metavar(tp: Any) -> str:
    """Short type name for --help: INT, FLOAT, BOOL, STR, {a,b}, INT|null, [FLOAT,FLOAT]."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "{" + ",".join(str(c).lower() if isinstance(c, bool) else str(c) for c in typing.get_args(tp)) + "}"
    if origin in (typing.Union, types.UnionType):
        return "|".join("null" if a is type(None) else metavar(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "[" + ",".join(metavar(a) for a in typing.get_args(tp)) + "]"
    return {int: "INT", float: "FLOAT", bool: "BOOL", str: "STR"}.get(tp, "VALUE")


def shown(value: Any) -> str:
    """A default as --help shows it (YAML spelling: true, null, [0.9, 0.999], "")."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if value == "":
        return '""'
    if isinstance(value, tuple):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return str(value)


def config_help(cls: type, general: Sequence[Row] | None = None, tail: Sequence[Row] = ()) -> str:
    """Every option of root ``cls`` grouped by section, with its type, default and help.

    ``general`` are the rows before the sections (default: the ``--config PATH`` row); ``tail`` rows close the
    listing (``p3o train`` lists the objectives there).
    """
    default = cls()
    rows: list[Row] = ["general:"]
    rows += list(general or []) or [
        ("--config PATH", "YAML file of these keys (applied before the command-line options)")
    ]
    section = None
    for key, f, tp in leaf_fields(cls):
        head = key.split(".")[0] if "." in key else None
        if head != section:
            section = head
            if head is not None:
                rows.append(f"{head}: {(_hints(cls)[head].__doc__ or '').strip().splitlines()[0].replace('``', '')}")
        if f.metadata.get("extra"):
            rows.append((f"--{key.rpartition('.')[0]}.<{f.name}> VALUE", f.metadata["help"]))
            continue
        obj: Any = default
        for part in key.split("."):
            obj = getattr(obj, part)
        rows.append((f"--{key} {metavar(tp)}", f"{f.metadata['help']} [default: {shown(obj)}]"))
    rows += list(tail)
    width = min(48, max(len(r[0]) for r in rows if isinstance(r, tuple)) + 2)
    lines = ["options (--key value or --key=value; values are YAML scalars):"]
    for r in rows:
        if isinstance(r, str):
            lines += ["", r]
        else:
            opt, text = r
            lines.append(f"  {opt:<{width}}{text}" if len(opt) < width else f"  {opt}\n  {'':<{width}}{text}")
    return "\n".join(lines)
