"""p3o.options on a schema of its own: pydantic bounds, the extra-keys field, cli_aliases, bare flags, --help."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import pytest

from p3o import options
from p3o.errors import ConfigError
from p3o.options import config_field as _f


@dataclass
class Inner:
    """An inner section."""

    rate: float = _f(0.5, "a rate in (0, 1]", gt=0, le=1)
    mode: Literal["a", "b"] = _f("a", "a choice")
    on: bool = _f(False, "a switch")
    kw: dict[str, Any] = field(default_factory=dict, metadata={"help": "free keywords", "extra": True})


@dataclass
class Root:
    """A root config."""

    cli_aliases: ClassVar[dict[str, str]] = {"go": "inner.on"}

    name: str = _f("x", "a name")
    count: int = _f(1, "a count >= 1", ge=1)
    size: int | None = _f(None, "a size >= 2 or null", ge=2)
    pair: tuple[float, float] = _f((0.0, 1.0), "two floats")
    inner: Inner = field(default_factory=Inner, metadata={"help": "inner"})

    def _extra_keys(self) -> list[str]:
        return ["inner.kw_known"]


def _load(*argv: str) -> Root:
    return options.load_config(list(argv), Root)


def test_values_are_coerced_and_bounded_by_pydantic():
    cfg = _load(
        "--count", "3", "--inner.rate=1", "--size", "2", "--name", "007", "--pair", "[1, 2]", "--inner.mode", "B"
    )
    assert (cfg.count, cfg.inner.rate, cfg.size, cfg.name, cfg.pair, cfg.inner.mode) == (
        3,
        1.0,
        2,
        "007",
        (1.0, 2.0),
        "b",
    )
    assert isinstance(cfg.inner.rate, float)
    for argv, message in [
        (["--count", "0"], "count: must be >= 1, got 0"),
        (["--inner.rate", "0"], "inner.rate: must be > 0, got 0.0"),
        (["--inner.rate", "1.5"], "inner.rate: must be <= 1, got 1.5"),
        (["--size", "1"], "size: must be >= 2, got 1"),
        (["--inner.rate", ".inf"], "inner.rate: must be a finite number, got inf"),
        (["--count", "many"], "count: expected an int, got 'many'"),
        (["--inner.mode", "c"], "inner.mode: expected one of a, b, got 'c'"),
        (["--cout", "2"], "unknown key 'cout' (did you mean 'count'?)"),
        (["--inner.kw_knwn.x", "2"], "unknown key 'inner.kw_knwn.x' (did you mean 'inner.kw_known'?)"),
        (["--count"], "--count: expected a value"),
        (["--inner"], "inner: is a section; set its keys, e.g. 'inner.rate'"),
    ]:
        with pytest.raises(ConfigError) as err:
            _load(*argv)
        assert str(err.value) == message, (argv, str(err.value))
    with pytest.raises(ConfigError, match="count: must be >= 1, got 0"):
        options.validate(Root(count=0))


def test_extra_field_aliases_and_bare_flags():
    cfg = _load("--inner.anything", "0.3", "--inner.kw.other=x", "--go")
    assert cfg.inner.kw == {"anything": 0.3, "other": "x"} and cfg.inner.on is True
    assert _load("--go", "no").inner.on is False
    assert options.to_dict(cfg)["inner"] == {"rate": 0.5, "mode": "a", "on": True, "anything": 0.3, "other": "x"}
    assert options.from_dict(options.to_dict(cfg), Root).inner.kw == cfg.inner.kw
    text = options.config_help(Root)
    assert "--inner.<kw> VALUE" in text and "--count INT" in text and "[default: null]" in text


@dataclass
class Command:
    """A command's options: a positional argument, a bool flag, an int."""

    path: str = _f("", "the input (PATH)")
    window: int = _f(20, "a window", ge=1)
    no_plot: bool = _f(False, "a switch")


@pytest.mark.parametrize(
    "argv",
    [
        ["RUN", "--window", "3", "--no-plot"],
        ["--window", "3", "RUN", "--no_plot"],
        ["--no-plot", "RUN", "--window=3"],  # a bare flag takes the next argument only when it reads as a bool
        ["--no-plot", "true", "--window", "3", "RUN"],
        ["--path", "RUN", "--window", "3", "--no-plot"],
    ],
)
def test_parse_command_positional_anywhere(argv):
    assert options.parse_command(argv, Command, positional=["path"]) == Command(path="RUN", window=3, no_plot=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["RUN", "--windw", "3"], "unknown key 'windw' (did you mean 'window'?)"),
        (["RUN", "--wind", "3"], "unknown key 'wind' (did you mean 'window'?)"),  # no abbreviations
        (["RUN", "--window", "0"], "window: must be >= 1, got 0"),
        (["RUN", "--window", "x"], "window: expected an int, got 'x'"),
        (
            ["RUN", "OTHER"],
            "unexpected argument 'OTHER' (the command takes 1 argument; options look like --key value)",
        ),
        (["--window"], "--window: expected a value"),
    ],
)
def test_parse_command_errors_are_one_line(argv, message):
    with pytest.raises(ConfigError) as err:
        options.parse_command(argv, Command, positional=["path"])
    assert str(err.value) == message


def test_command_help_lists_the_arguments_and_every_option():
    text = options.command_help(Command, "usage: cmd PATH [--window W]", "what it does", [("PATH", "= --path")])
    lines = text.splitlines()
    assert lines[:3] == ["usage: cmd PATH [--window W]", "", "what it does"]
    assert "options (--key value or --key=value; values are YAML scalars):" in lines
    for row in ("PATH", "--path STR", "--window INT", "--no_plot BOOL", "--config PATH"):
        assert any(line.strip().startswith(row) for line in lines), row
    assert "[default: 20]" in text
    assert options.wants_help(["RUN", "-h"]) and not options.wants_help(["RUN"])


def test_parse_or_help_prints_the_help_or_parses(capsys):
    """With -h/--help anywhere it prints command_help and returns None; else it is parse_command."""
    usage, about, rows = "usage: cmd PATH [--window W]", "what it does", [("PATH", "= --path")]
    help_argv = ["RUN", "--window", "x", "--help"]
    assert options.parse_or_help(help_argv, Command, usage, about, arguments=rows, positional=["path"]) is None
    assert capsys.readouterr().out == options.command_help(Command, usage, about, rows) + "\n"
    argv = ["RUN", "--window", "3", "--no_plot"]
    got = options.parse_or_help(argv, Command, usage, about, arguments=rows, positional=["path"])
    assert got == options.parse_command(argv, Command, positional=["path"])
    assert got == Command(path="RUN", window=3, no_plot=True)
    assert capsys.readouterr().out == ""
    with pytest.raises(ConfigError, match="unknown key 'windoww'"):
        options.parse_or_help(["--windoww", "3"], Command, usage, about)


def test_run_command_imports_the_run_function_only_for_valid_options(tmp_path, monkeypatch, capsys):
    """--help exits 0 and a bad option raises, both before the "module:function" target is imported; valid options
    are passed to it and its status is the command's, with argv None read from sys.argv."""
    (tmp_path / "heavy_target.py").write_text("CALLS = []\n\n\ndef run(args):\n    CALLS.append(args)\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "heavy_target", raising=False)
    usage, about, target = "usage: cmd [--window W]", "what it does", "heavy_target:run"
    assert options.run_command(["--help"], Command, usage, about, target) == 0
    assert capsys.readouterr().out == options.command_help(Command, usage, about) + "\n"
    with pytest.raises(ConfigError, match="window: must be >= 1, got 0"):
        options.run_command(["--window", "0"], Command, usage, about, target)
    assert "heavy_target" not in sys.modules
    assert options.run_command(["--window", "3"], Command, usage, about, target) == 3
    monkeypatch.setattr(sys, "argv", ["cmd", "--no_plot"])
    assert options.run_command(None, Command, usage, about, target) == 3
    calls = sys.modules["heavy_target"].CALLS
    assert calls == [Command(window=3), Command(no_plot=True)]
