"""Harness episodes through p3o's endpoint into training rows (`p3o.envs.harness.HarnessEngine`,
`p3o.train.wiring.harness_side`), on the shipped agent base served by an fp32 HF engine.

For every row built through the endpoint: the trainer's input ids are the served prompt ids + sampled ids +
observation ids, and each sampled token's recorded log-prob is the trainer's; a weight push between two calls of one
episode gives two versions in one row; every fault is counted and trains nothing; a harness that imports only
`openai` trains end to end inside ``p3o train``.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("openai", reason="the serve extra (pip install -e '.[serve]')")
pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")

from p3o.config import load_config
from p3o.envs.harness import FAULTS, HarnessEngine
from p3o.logprobs import token_logprobs
from p3o.models import load_policy
from p3o.rollout import HFEngine
from p3o.serve import EndpointServer
from p3o.tasks.calc import calc_problem
from p3o.train.loop import run

MODEL = "tiny-agent"


@pytest.fixture(scope="module")
def base() -> tuple[Any, Any]:
    return load_policy(MODEL)


@pytest.fixture(scope="module")
def server(base):
    model, tok = base
    srv = EndpointServer(HFEngine(model, tok, precision="fp32"), tok, model_name=MODEL).start()
    yield srv
    srv.stop()


def _engine(server, harness, problems) -> tuple[HarnessEngine, list[list[int]]]:
    tok = server.tokenizer
    prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    by_prompt = {tuple(ids): p for ids, p in zip(prompts, problems)}
    return HarnessEngine(server, harness, by_prompt, timeout_s=60.0, pad_id=int(tok.pad_token_id or 0)), prompts


def _episode(client) -> str:
    return str(client.base_url).rstrip("/").split("/")[-2]


def _two_turns(served: dict[str, list[dict]]):
    """A two-call harness (no tools: the agent base has no tool format) that keeps every raw response by episode."""

    async def harness(client, model, problem):
        messages = [{"role": "user", "content": problem.prompt}]
        for follow_up in ("Check it.", None):
            out = await client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=1.0)
            served.setdefault(_episode(client), []).append(out.model_dump())
            if follow_up is None:
                break
            messages += [{"role": "assistant", "content": out.choices[0].message.content or ""}]
            messages += [{"role": "user", "content": follow_up}]
        return 1.0

    return harness


def _trainer_logprobs(model, r) -> torch.Tensor:
    with torch.no_grad():
        logp, _ = token_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.attn, loss_mask=r.mask)
    return logp


def test_every_row_is_what_the_endpoint_served_and_its_logprobs_are_the_trainers(server, base) -> None:
    served: dict[str, list[dict]] = {}
    problems = [calc_problem(i, "test", kind="small") for i in range(3)]
    engine, prompts = _engine(server, _two_turns(served), problems)
    r = engine.generate(prompts, 2)
    assert len(r) == 6 and r.group_ids.tolist() == [0, 0, 1, 1, 2, 2] and r.rewards.tolist() == [1.0] * 6
    calls = list(served.values())
    assert len(calls) == 6 and all(len(c) == 2 for c in calls)
    by_ids = {}
    for c in calls:  # the trainer's input ids of an episode = its last call's prompt ids + the ids sampled for it
        by_ids[tuple(c[1]["prompt_token_ids"] + c[1]["choices"][0]["token_ids"])] = c
    for i in range(6):
        full = r.prompt_ids[i][r.prompt_mask[i]].tolist() + r.response_ids[i][r.attn[i]].tolist()
        c = by_ids[tuple(full)]  # every row is one episode's served ids, exactly
        first, second = c[0], c[1]
        p = len(first["prompt_token_ids"])
        assert r.prompt_ids[i][r.prompt_mask[i]].tolist() == first["prompt_token_ids"]
        n1, n2 = len(first["choices"][0]["token_ids"]), len(second["choices"][0]["token_ids"])
        mask = r.mask[i][r.attn[i]].tolist()
        obs = len(second["prompt_token_ids"]) - p - n1  # observation / template ids between the turns: mask 0
        assert obs > 0 and mask == [True] * n1 + [False] * obs + [True] * n2
        recorded = first["choices"][0]["p3o"]["logprobs"] + second["choices"][0]["p3o"]["logprobs"]
        assert r.rollout_logp[i][r.mask[i]].tolist() == pytest.approx(recorded, abs=1e-6)
    trainer = _trainer_logprobs(base[0], r)
    diff = (trainer[r.mask] - r.rollout_logp[r.mask]).abs().max()
    assert diff < 1e-4, diff  # fp32 tolerance
    assert r.extras["turns"].tolist() == [2.0] * 6 and r.extras["failed"].sum() == 0


def test_a_weight_push_between_two_calls_gives_two_versions_in_one_row(server, base) -> None:
    model = base[0]
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pushed = {
        k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() and v.dim() == 2 else v for k, v in original.items()
    }

    async def harness(client, m, problem):
        messages = [{"role": "user", "content": problem.prompt}]
        out = await client.chat.completions.create(model=m, messages=messages, max_tokens=6)
        await asyncio.to_thread(server.load_weights, pushed, 1)
        messages += [
            {"role": "assistant", "content": out.choices[0].message.content or ""},
            {"role": "user", "content": "?"},
        ]
        await client.chat.completions.create(model=m, messages=messages, max_tokens=6)
        return 0.0

    engine, prompts = _engine(server, harness, [calc_problem(0, "test", kind="small")])
    try:
        r = engine.generate(prompts, 1)
    finally:
        server.load_weights(original, 0)
    sampled = r.policy_version[0][r.mask[0]].tolist()
    assert sampled[0] == 0 and sampled[-1] == 1 and set(sampled) == {0, 1}
    assert r.extras["versions"].tolist() == [2.0] and r.extras["version_span"].tolist() == [1.0]


async def _ok(client, model, problem):
    await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": problem.prompt}], max_tokens=4
    )
    return {"reward": 1.0, "extra": 2.0}


async def _other_model(client, model, problem):
    await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": problem.prompt}])
    return 1.0


async def _raises(client, model, problem):
    await _ok(client, model, problem)
    raise ValueError("the harness's own bug, after a recorded call")


async def _never_calls(client, model, problem):
    return 1.0


async def _hangs(client, model, problem):
    await _ok(client, model, problem)
    await asyncio.sleep(30)


async def _not_a_reward(client, model, problem):
    await _ok(client, model, problem)
    return "yes"


BEHAVIOUR = {"error": _raises, "timeout": _hangs, "bad_reward": _not_a_reward, "no_calls": _never_calls,
             "wrong_model": _other_model}  # fmt: skip


def test_every_fault_is_counted_and_nothing_of_a_failed_episode_is_trained(server) -> None:
    assert set(BEHAVIOUR) == set(FAULTS)
    problems = [calc_problem(i, "test", kind="small") for i in range(len(FAULTS) + 1)]
    plan = {p.prompt: BEHAVIOUR.get(f, _ok) for p, f in zip(problems, [*FAULTS, "ok"])}

    async def harness(client, model, problem):
        return await plan[problem.prompt](client, model, problem)

    engine, prompts = _engine(server, harness, problems)
    engine.timeout_s = 1.5
    before = server.counters()["wrong_model"]
    r = engine.generate(prompts, 2)
    assert len(r) == 2 * len(problems)
    assert engine.faults == {f: 2 for f in FAULTS} and server.counters()["wrong_model"] == before + 2
    for k, fault in enumerate(FAULTS):
        rows = [2 * k, 2 * k + 1]
        assert r.extras[f"stop_{fault}"][rows].tolist() == [1.0, 1.0], fault
        assert not r.mask[rows].any() and r.rewards[rows].tolist() == [0.0, 0.0]  # nothing to train on, no reward
    ok = [2 * len(FAULTS), 2 * len(FAULTS) + 1]
    assert r.mask[ok].any(dim=1).all() and r.rewards[ok].tolist() == [1.0, 1.0]
    assert r.extras["extra"][ok].tolist() == [2.0, 2.0] and r.extras["failed"].sum() == 2 * len(FAULTS)
    assert not [e for e in server.store.episodes() if e.startswith(engine.run_id)]  # failed episodes' records dropped


OPENAI_ONLY = """
import openai


async def solve(client: openai.AsyncOpenAI, model: str, problem) -> float:
    out = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": problem.prompt}], max_tokens=8
    )
    return float(problem.answer in (out.choices[0].message.content or ""))
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_harness_importing_only_openai_trains_end_to_end(tmp_path: Path, monkeypatch, mode: str) -> None:
    (tmp_path / "only_openai_agent.py").write_text(OPENAI_ONLY)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "r"
    argv = [
        "--model.name", MODEL, "--task.name", "calc-small", "--agent.harness", "only_openai_agent:solve",
        "--steps", "2", "--rollout.prompts_per_step", "2", "--rollout.group_size", "2", "--task.n_eval", "4",
        "--log.eval_every", "2", "--log.progress", "false", "--log.plot", "false", "--log.tensorboard", "false",
        "--ckpt.every", "0", "--loop.mode", mode, "--run_dir", str(run_dir),
    ]  # fmt: skip
    out = run(load_config(argv))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    for key in ("turns", "failed", "version_span", "stop_done", *(f"stop_{f}" for f in FAULTS)):
        assert f"episode/{key}" in last, key
    assert last["episode/failed"] == 0.0 and last["episode/stop_done"] == 4.0 and last["episode/turns"] == 1.0
    assert "eval_accuracy" in last  # stop_done: the step's 4 episodes, a count
    info = out / "endpoint.json"
    assert stat.S_IMODE(os.stat(info).st_mode) == 0o600
    key = json.loads(info.read_text())["api_key"]
    leaked = [p for p in out.rglob("*") if p.is_file() and p != info and key.encode() in p.read_bytes()]
    assert not leaked  # the key is written once, for the harness, and nowhere else
    assert not _harness_processes()  # the run's harness processes (agent.harness_processes 2) ended with it


def _harness_processes() -> list[int]:
    """The pids of this process's children that are harness processes (``python -m p3o.envs.harness_client``)."""
    mine = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if ppid == os.getpid() and b"p3o.envs.harness_client" in cmd:
            mine.append(int(proc.name))
    return mine


def test_a_rewritten_history_splits_the_row_and_the_producer_keeps_its_rows_in_the_problems_group(server) -> None:
    """A harness that rewrites its history (its second call does not extend the first) gets two rows for one
    episode; the producer numbers every row by its problem (HarnessEngine.relative_group_ids), so the batch keeps
    all rows, each in its problem's group, with the episode's reward (fails before: P·G group ids for P·G + k rows)."""
    from types import SimpleNamespace

    from p3o.config import AdvantageConfig, LoopConfig, RolloutConfig
    from p3o.train.sources import Producer, PromptStream

    async def rewrites(client, model, problem):
        await client.chat.completions.create(model=model, messages=[{"role": "user", "content": problem.prompt}],
                                             max_tokens=4)  # fmt: skip
        again = [{"role": "user", "content": "Once more: " + problem.prompt}]  # a rewritten history: a new row
        await client.chat.completions.create(model=model, messages=again, max_tokens=4)
        return 1.0 if problem.answer.endswith(("0", "2", "4", "6", "8")) else 0.0

    problems = [calc_problem(i, "test", kind="small") for i in range(2)]
    engine, prompts = _engine(server, rewrites, problems)
    comps = SimpleNamespace(prompts=prompts, answers=[p.answer for p in problems], pad_id=engine.pad_token_id,
                            reward_fn=lambda r: r.rewards.clone())  # fmt: skip
    ro = RolloutConfig(prompts_per_step=2, group_size=2)
    produce = Producer(ro, LoopConfig(mode="sync"), AdvantageConfig(), 0, comps, PromptStream(2, 2, seed=0))
    batch, info = produce(0, engine)
    assert len(batch) == 8  # 2 problems × 2 episodes × 2 rows
    assert batch.extras["split"].tolist().count(1.0) == 4 and info["episode/split"] == 0.5
    groups = batch.group_ids.tolist()
    assert sorted(groups.count(g) for g in set(groups)) == [4, 4]  # each problem's 4 rows in one group
    for g in set(groups):
        rows = [i for i, x in enumerate(groups) if x == g]
        assert len({batch.answers[i] for i in rows}) == 1 and len({float(batch.rewards[i]) for i in rows}) == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_harness_trains_through_a_ray_rollout_worker(tmp_path: Path, monkeypatch, mode: str) -> None:
    """rollout.workers 1: the harness's episodes and the endpoint in this process, every engine call in a Ray
    rollout worker (p3o.serve.remote.RemoteEngine); the rows' recorded log-probs are the trainer's."""
    ray = pytest.importorskip("ray", reason="the ray extra")
    from p3o.cluster import RaySource

    (tmp_path / "only_openai_agent.py").write_text(OPENAI_ONLY)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = [
        "--model.name", MODEL, "--task.name", "calc-small", "--agent.harness", "only_openai_agent:solve",
        "--steps", "2", "--rollout.prompts_per_step", "2", "--rollout.group_size", "2", "--task.n_eval", "4",
        "--log.eval_every", "2", "--log.progress", "false", "--log.plot", "false", "--log.tensorboard", "false",
        "--ckpt.every", "0", "--loop.mode", mode, "--run_dir", str(tmp_path / "r"), "--rollout.workers", "1",
        "--ray.num_cpus", "2",
    ]  # fmt: skip
    was_up = ray.is_initialized()  # a suite's earlier test may have left its cluster up
    out = run(load_config(argv), remote_source=RaySource)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"]] == [1, 2]
    for r in rows[1:]:
        assert r["episode/failed"] == 0.0 and r["episode/stop_done"] == 4.0
        assert r["offpolicy/dlogp_max"] < 1e-4  # a worker's recorded log-probs are the trainer's (fp32)
    assert "eval_accuracy" in rows[-1]
    (worker,) = json.loads((out / "rollout_workers.json").read_text())["workers"]
    assert worker["engine"] == "hf" and ray.is_initialized() == was_up  # Ray left as the run found it
