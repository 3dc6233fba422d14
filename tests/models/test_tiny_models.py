"""Built-in models: tokenizer, Qwen3 sizes, the warm start (trains, saves, loads, caches), load_policy names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from p3o.errors import ConfigError
from p3o.models import SIZES, load_policy, qwen3_config
from p3o.models.bases import file_sha256
from p3o.models.tiny import base_key
from p3o.models.tokenizer import EOS, train_tokenizer
from p3o.models.warmstart import SFTConfig, ensure_base
from p3o.tasks import Problem, format_prompt

QUICK = SFTConfig(size="1m", steps=4, batch_size=4, warmup_steps=2, eval_n=2, max_new_tokens=4)


@pytest.fixture(scope="module")
def small_tok():
    texts = [
        f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n#### {a + b}<|im_end|>" for a in range(9) for b in range(9)
    ]
    return train_tokenizer(texts, vocab_size=300)


def test_tokenizer_roundtrip_specials_and_chat(small_tok) -> None:
    tok = small_tok
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2) and tok.eos_token == EOS
    text = "Zoë has 12 ½ apples 🙂\n#### 12"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level: anything round-trips
    assert tok.convert_ids_to_tokens(tok("1234", add_special_tokens=False)["input_ids"]) == ["1", "2", "3", "4"]
    prompt = format_prompt(Problem("What is 3 + 4?", "7"), tok)
    assert prompt.startswith("<|im_start|>user\nWhat is 3 + 4?") and prompt.endswith("<|im_start|>assistant\n")
    assert format_prompt(Problem("Q?", "1", meta={"answer_format": "boxed"}), None).endswith("\\boxed{}.\n")
    assert format_prompt(Problem("Q?", "1"), None, template="plain") == "Q?\n"
    with pytest.raises(ConfigError, match="unknown template"):
        format_prompt(Problem("Q?", "1"), tok, template="fancy")


@pytest.mark.parametrize(("size", "low", "high"), [("1m", 0.5e6, 1.5e6), ("5m", 3e6, 7e6), ("30m", 20e6, 40e6)])
def test_sizes(size: str, low: float, high: float) -> None:
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        n = sum(p.numel() for p in Qwen3ForCausalLM(qwen3_config(size, 512)).parameters())
    assert low < n < high and set(SIZES) == {"1m", "5m", "30m"}
    with pytest.raises(ValueError, match="known: 1m, 5m, 30m"):
        qwen3_config("7b", 512)


def test_warm_start_trains_saves_loads_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    path = ensure_base("1m", tmp_path, sft=QUICK)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    info = json.loads((path / "sft.json").read_text())
    assert info["stats"]["steps"] == 4 and "pass_at_1" not in info["stats"]  # p3o sft's report, not the base's
    assert info["stats"]["final_loss"] < 7.0  # ln(469) ≈ 6.15 at init; it trained and stayed finite
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]  # the temp dir was renamed away

    import p3o.models.warmstart as sft

    def no_training(*args, **kwargs):
        raise AssertionError("cache miss: the base was trained again")

    monkeypatch.setattr(sft, "warm_start", no_training)
    assert ensure_base("1m", tmp_path, sft=QUICK) == path  # cache hit
    model, tok = load_policy(str(path))
    assert type(model).__name__ == "Qwen3ForCausalLM" and tok.chat_template and not model.training
    # "tiny-5m" (not shipped) resolves to the default-recipe key in the cache: a base planted there is used as is
    default_dir = tmp_path / "models" / base_key("5m", "arithmetic", 2, 0)
    default_dir.symlink_to(path, target_is_directory=True)
    model2, _ = load_policy("tiny-5m", cache_dir=tmp_path)
    ref = dict(model.named_parameters())
    assert all(torch.equal(p, ref[k]) for k, p in model2.named_parameters())
    ids = tok(format_prompt(Problem("What is 3 + 4?", "7"), tok), return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids["input_ids"].shape[1]


def test_cli_sft_and_tiny_random(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from p3o.cli import main

    torch.set_num_threads(1)
    monkeypatch.setenv("P3O_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "base"
    argv = ["sft", "--size", "1m", "--steps", "2", "--batch-size", "2", "--eval-n", "2", "--max-new-tokens", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["path"] == str(out) and (out / "config.json").is_file() and 0.0 <= stats["pass_at_1"] <= 1.0
    assert stats["sha256"] == file_sha256(out / "model.safetensors") and stats["shipped"] is None  # another recipe
    model, tok = load_policy("tiny-random")  # random init, the shipped base's tokenizer: nothing cached
    assert model.config.vocab_size == len(tok) and not (tmp_path / "cache" / "tokenizers").exists()
    assert not hasattr(model.config, "p3o_base")  # not the shipped base's weights
    assert main(["sft", "--size", "7b"]) == 2
    assert "size: expected one of 1m, 5m, 30m, got '7b'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="gpt-17"):
        load_policy("gpt-17")


@pytest.mark.parametrize("name", ["tiny", "tiny-agent", "tiny-random"])
def test_tokenizer_alone_reads_no_weights(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`load_policy(..., with_model=False)` (a rollout worker's tokenizer) gives load_policy's tokenizer and builds or
    reads no model."""
    import p3o.models.hub as hub
    from p3o.train.wiring import load_tokenizer

    _, want = load_policy(name)

    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer alone must not load a model")

    monkeypatch.setattr(hub.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(hub, "Qwen3ForCausalLM", refuse)
    model, tok = load_policy(name, with_model=False)
    assert model is None
    assert tok.get_vocab() == want.get_vocab() and tok.pad_token_id == want.pad_token_id
    cfg = type("Cfg", (), {"model": type("M", (), {"name": name, "cache_dir": None})()})()
    assert load_tokenizer(cfg).get_vocab() == want.get_vocab()
