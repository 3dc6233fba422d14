"""Fixtures of the endpoint tests: the shipped agent base served by an fp32 HF engine (one server per module) and a
tokenizer with a Qwen3-layout chat template whose tool markers are single tokens."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")

from serve_fixtures import MARKERS, MODEL, QWEN3_TEMPLATE

from p3o.models import load_policy
from p3o.rollout import HFEngine
from p3o.serve import EndpointServer


@pytest.fixture(scope="module")
def base() -> tuple[Any, Any]:
    return load_policy(MODEL)


@pytest.fixture(scope="module")
def served(base) -> Iterator[EndpointServer]:
    model, tok = base
    server = EndpointServer(HFEngine(model, tok, precision="fp32"), tok, model_name=MODEL).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def qwen_tokenizer(base) -> Any:
    """The agent base's tokenizer with the Qwen3 markers as single tokens and a Qwen3-layout template."""
    tok = copy.deepcopy(base[1])
    tok.add_tokens(MARKERS)
    tok.chat_template = QWEN3_TEMPLATE
    return tok
