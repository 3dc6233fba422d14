"""Your own verifier `module:function`: called like the built-ins, time-limited, raising or hanging scores 0."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from p3o.errors import ConfigError
from p3o.rewards import VerifierError, get_verifier, score
from p3o.rewards.custom import CustomVerifier

SOURCE = '''
import time


def exact(completion, answer):
    """1.0 iff the last line of the completion is the answer."""
    lines = completion.strip().splitlines()
    return float(bool(lines) and lines[-1] == answer)


def moody(completion, answer):
    if completion == "hang":
        time.sleep(60)
    if completion == "boom":
        raise ValueError("cannot parse " + completion)
    if completion == "none":
        return None
    print("debug output must not break the protocol")
    return 1.0 if answer in completion else 0.0


NOT_CALLABLE = 3


def one_arg(completion):
    return 1.0
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A user module on sys.path (a unique name per test: the parent imports it once)."""
    name = "my_rewards_" + "".join(c if c.isalnum() else "_" for c in request.node.name)
    (tmp_path / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_module_function_scores_like_a_builtin(user_module: str) -> None:
    v = get_verifier(f"{user_module}:exact")
    assert isinstance(v, CustomVerifier)
    assert score(["work\n7", "work\n8", ""], ["7", "7", "7"], v, timeout_s=5.0) == [1.0, 0.0, 0.0]
    assert v.calls == 3 and v.errors == 0 and v.timeouts == 0
    with_format = get_verifier(f"{user_module}:exact+format")
    assert with_format("x\n#### 7\n7", "7", timeout_s=5.0) == pytest.approx(1.1)
    v.close()


def test_file_path_spec(tmp_path: Path) -> None:
    f = tmp_path / "reward_file.py"
    f.write_text(SOURCE)
    v = get_verifier(f"{f}:exact")
    assert v("a\n5", "5", timeout_s=5.0) == 1.0


def test_raising_verifier_scores_zero_and_warns_once(user_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    v = get_verifier(f"{user_module}:moody")
    assert v("42", "42", timeout_s=5.0) == 1.0  # starts the worker (start-up is not charged to the call)
    got = score(["boom", "42", "boom", "none"], ["42"] * 4, v, timeout_s=5.0)
    assert got == [0.0, 1.0, 0.0, 0.0]
    assert v.errors == 3
    err = capsys.readouterr().err
    assert err.count("warning") == 1, err
    assert "ValueError: cannot parse boom" in err and "scores 0" in err
    assert "debug output" not in err  # the function's stdout went to the worker's stderr (discarded)


def test_hanging_verifier_is_killed_by_the_time_limit(user_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    v = get_verifier(f"{user_module}:moody")
    assert v("42", "42", timeout_s=5.0) == 1.0  # worker up
    t0 = time.perf_counter()
    got = score(["hang", "hang"], ["42", "42"], v, timeout_s=0.5)
    elapsed = time.perf_counter() - t0
    assert got == [0.0, 0.0] and v.timeouts == 2
    # each call returned at its limit (a hang never returns; the killed worker's spare takes over). The bound is
    # loose on purpose: it proves the limit fired, not how fast a loaded 2-core machine restarts a worker
    assert elapsed < 20.0, elapsed
    assert v("it is 42", "42", timeout_s=10.0) == 1.0  # and the verifier keeps working afterwards
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "did not return within 0.5s (task.reward_timeout_s)" in err


@pytest.mark.parametrize(
    ("suffix", "match"),
    [
        (":nope", "has no attribute 'nope'"),
        (":NOT_CALLABLE", "is not callable"),
        (":one_arg", r"must accept \(completion: str, answer: str\)"),
        ("", "expected 'package.module:function'"),
    ],
)
def test_bad_specs_are_one_line_config_errors(user_module: str, suffix: str, match: str) -> None:
    spec = f"{user_module}{suffix}" if suffix else "no_colon:"
    with pytest.raises(ConfigError, match=match) as info:
        get_verifier(spec)
    assert "\n" not in str(info.value)


def test_unknown_module_and_builtin_names() -> None:
    with pytest.raises(VerifierError, match="cannot import surely_missing_mod_p3o") as info:
        get_verifier("surely_missing_mod_p3o:fn")
    assert isinstance(info.value, ValueError) and isinstance(info.value, ConfigError)
    with pytest.raises(ValueError, match=r"or your own 'package.module:function'"):
        get_verifier("nope")
