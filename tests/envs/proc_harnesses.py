"""Harnesses that a harness process imports by spec (``proc_harnesses:<name>``; tests/envs on PYTHONPATH), for
tests/envs/test_harness.py's harness-process tests."""

from __future__ import annotations

import asyncio
import os

from p3o.examples.agent_openai import solve

__all__ = ["dies_on_first", "hangs", "pid", "raises", "solve"]


async def raises(client, model, problem):
    raise RuntimeError("a harness bug")


async def hangs(client, model, problem):
    await asyncio.sleep(60)


async def pid(client, model, problem):
    """Calls the model once; its reward is the process id it ran in (which process ran which episode)."""
    await client.chat.completions.create(model=model, messages=[{"role": "user", "content": problem.prompt}])
    return float(os.getpid())


async def dies_on_first(client, model, problem):
    """Kills its process on the first problem (index 0 of calc-small's test split); solves the others."""
    if problem.meta.get("index") == 0:
        os._exit(3)
    return await solve(client, model, problem)
