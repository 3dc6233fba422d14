"""`model.name` as a Hugging Face Hub id: passed to transformers; offline, one line that says what to do."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from p3o.cli import main as p3o_main
from p3o.errors import ConfigError
from p3o.models import is_hub_id, load_policy
from p3o.models.hub import hub_error


def test_hub_id_offline_is_attempted_and_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants
    import transformers

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("offline: no connection may be attempted")

    monkeypatch.setattr(socket, "create_connection", no_network)
    asked: list[str] = []
    real = transformers.AutoTokenizer.from_pretrained

    def spy(name: str, *args: object, **kwargs: object) -> object:
        asked.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    with pytest.raises(ConfigError) as info:
        load_policy("p3o-test-org/no-such-model-0.6B")
    msg = str(info.value)
    assert asked == ["p3o-test-org/no-such-model-0.6B"]  # the Hub path went to transformers
    assert "\n" not in msg and msg.startswith("model.name: 'p3o-test-org/no-such-model-0.6B'")
    assert "HF_HUB_OFFLINE=1" in msg
    assert "hf download p3o-test-org/no-such-model-0.6B --local-dir DIR" in msg
    assert "huggingface-cli download p3o-test-org/no-such-model-0.6B --local-dir DIR" in msg


def test_no_network_fails_fast_without_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def unreachable(*args: object, **kwargs: object) -> None:
        raise OSError("Name or service not known")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    with pytest.raises(ConfigError, match=r"the Hub cannot be reached \(no network\): download it"):
        load_policy("p3o-test-org/no-such-model")


def test_cli_exit_2_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert p3o_main(["eval", "--model", "p3o-test-org/no-such-model", "--n-samples", "1", "--k", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--local-dir DIR" in err, err


def test_names_and_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_hub_id("Qwen/Qwen3-0.6B") and is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert not is_hub_id("tiny") and not is_hub_id("runs/x/final") and not is_hub_id("./a/b")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert not is_hub_id("org/model")  # an existing local path wins
    with pytest.raises(ConfigError, match=r"nor a Hugging Face Hub id like 'Qwen/Qwen3-0\.6B'"):
        load_policy("qwen3")
    missing = OSError("foo/bar is not a local folder and is not a valid model identifier listed on the Hub")
    assert "neither a local directory nor a model on the Hugging Face Hub" in hub_error("foo/bar", missing)
