"""p3o.errors: one-line errors; json_object names where the bad JSON came from."""

from __future__ import annotations

import pytest

from p3o.errors import ConfigError, DataError, json_object


def test_json_object_parses_an_object():
    assert json_object('{"a": 1, "b": [2]}', "x.jsonl: line 1") == {"a": 1, "b": [2]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{oops", r"^x.jsonl: line 3: invalid JSON \(Expecting property name enclosed in double quotes at char 1\)$"),
        ("", r"^x.jsonl: line 3: invalid JSON \(Expecting value at char 0\)$"),
        ("[1, 2]", r"^x.jsonl: line 3: expected a JSON object, got list$"),
        ("3", r"^x.jsonl: line 3: expected a JSON object, got int$"),
    ],
)
def test_json_object_names_the_place_in_one_line(text, message):
    with pytest.raises(DataError, match=message):
        json_object(text, "x.jsonl: line 3")


def test_json_object_raises_the_callers_error_class():
    with pytest.raises(ConfigError, match=r"^OPT: expected a JSON object, got str$"):
        json_object('"s"', "OPT", ConfigError)
