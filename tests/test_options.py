"""p3o.options on a schema of its own: pydantic bounds, the extra-keys field, cli_aliases, bare flags, --help."""

from __future__ import annotations

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
