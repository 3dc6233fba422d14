"""Pre-flight really is before the flight (issue 32): every refusal of `p3o train` and `p3o eval` below is one line,
exit 2, and happens before any model loads: no weights file is opened (an audit hook watches every open()) and
neither the model loader nor the trainer side is called."""

from __future__ import annotations

import importlib.util
import sys

import pytest

import p3o.models.hub as hub
import p3o.train.wiring as wiring
from p3o.cli import main as p3o_main

_OPENED: list[str] = []
_WATCH = {"on": False}
_WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def _audit(event: str, args: tuple) -> None:
    if _WATCH["on"] and event == "open" and args and isinstance(args[0], str | bytes):
        name = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if name.endswith(_WEIGHTS):
            _OPENED.append(name)


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one only records while a test switches it on


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if a model loads (the loader or the trainer side is called) or a weights file is opened."""
    loaded: list[str] = []

    def refuse(*args, **kwargs):
        loaded.append(str(args[:1]))
        raise AssertionError(f"a model was loaded: {args[:1]}")

    monkeypatch.setattr(hub, "load_policy", refuse)
    monkeypatch.setattr(hub, "load_pretrained", refuse)
    monkeypatch.setattr(wiring, "build_trainer_side", refuse)
    _OPENED.clear()
    _WATCH["on"] = True
    yield loaded
    _WATCH["on"] = False
    assert not loaded and not _OPENED, (loaded, _OPENED)


RAY = importlib.util.find_spec("ray") is not None
VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model.name", "tinyy"], "model.name: 'tinyy' is not a built-in model (tiny, tiny-1m"),
        (["--model.name", "tiny-rando"], "unknown tiny size or testbed in 'tiny-rando'"),
        (["--model.name", "/nonexistent/model"], "model.name: /nonexistent/model: no such directory"),
        (["--model.name", "Nobody/no-such-model-xyz"], "is not in the HF cache and HF_HUB_OFFLINE=1 is set"),
        (["--task.name", "/nonexistent/data.jsonl"], "/nonexistent/data.jsonl"),
        (["--task.verifier", "no_such_module_xyz:score"], "no_such_module_xyz"),
        (["--ray.address", "auto"], "ray.address: a Ray setting; it needs rollout.workers > 0"),
        pytest.param(
            ["--rollout.workers", "1", "--ray.address", "127.0.0.1:9"],
            "ray.address: cannot reach a Ray cluster at 127.0.0.1:9",
            marks=pytest.mark.skipif(not RAY, reason="needs the ray extra"),
        ),
        pytest.param(
            ["--rollout.engine", "vllm"],
            "vllm",
            marks=pytest.mark.skipif(VLLM, reason="the refusal is for an environment without vLLM"),
        ),
    ],
)
def test_train_refusals_come_before_any_model_loads(args, needle, tmp_path, capsys, monkeypatch, no_model):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = p3o_main(["train", "--run_dir", str(tmp_path / "run"), "--log.progress", "false", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert needle in err[0], err


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ("tinyy", "--model: 'tinyy' is not a built-in model"),
        ("/nonexistent/run", "--model: /nonexistent/run: no such directory"),
    ],
)
def test_eval_refuses_a_bad_model_name_before_loading(model, needle, capsys, no_model):
    code = p3o_main(["eval", "--model", model])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err


def test_a_missing_path_under_an_existing_folder_is_not_sent_to_the_hub(tmp_path, monkeypatch, capsys, no_model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert p3o_main(["train", "--model.name", "runs/nope", "--run_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "model.name: runs/nope: no such directory" in err and "hf download" not in err
