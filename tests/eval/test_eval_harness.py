"""`p3o eval` on a harness run (``agent.harness``): full harness episodes through p3o's endpoint on the run's
held-out problems, with its limits, drawn as the in-loop evaluation draws them (`p3o.eval.harness`).

The in-loop figure is the run's own metrics.jsonl row. With ``agent.harness_concurrency 1`` every engine call is one
request, so the draws are a function of the weights and the seed and the two evaluations of one checkpoint agree to
the episode: the same pass@1, the same mean score, the same tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("openai", reason="the serve extra (pip install -e '.[serve]')")
pytest.importorskip("fastapi", reason="the serve extra (pip install -e '.[serve]')")

from p3o.cli import main as p3o_main
from p3o.config import load_config, save_config
from p3o.envs.harness import FAULTS
from p3o.errors import ConfigError
from p3o.eval.cli import sample_counts
from p3o.train.loop import run

N_EVAL = 12


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step `agent-openai` run (the shipped openai-SDK harness on tiny-chat, calc-small), evaluated in the loop
    once, at its end, on N_EVAL held-out problems; its final/ is the checkpoint `p3o eval` loads."""
    run_dir = tmp_path_factory.mktemp("harness") / "run"
    argv = [
        "--config", "agent-openai", "--steps", "2", "--rollout.prompts_per_step", "2", "--rollout.group_size", "2",
        "--task.n_eval", str(N_EVAL), "--agent.harness_concurrency", "1", "--log.eval_every", "0",
        "--ckpt.every", "0", "--log.progress", "false", "--log.plot", "false", "--log.tensorboard", "false",
        "--run_dir", str(run_dir),
    ]  # fmt: skip
    return run(load_config(argv))


def test_eval_of_a_harness_run_is_its_in_loop_evaluation(harness_run: Path, tmp_path: Path, capsys) -> None:
    rows = map(json.loads, (harness_run / "metrics.jsonl").read_text().splitlines())
    in_loop = [r for r in rows if "eval_score" in r]
    assert len(in_loop) == 1 and in_loop[0]["eval_problems"] == N_EVAL  # one evaluation: the final policy's
    endpoint = (harness_run / "endpoint.json").read_text()
    out = tmp_path / "eval.json"
    assert p3o_main(["eval", "--model", str(harness_run), "--out", str(out), "--quiet"]) == 0
    r = json.loads(out.read_text())
    assert (r["n_problems"], r["n_samples"], list(r["pass_at_k"])) == (N_EVAL, 1, ["1"])  # the in-loop defaults
    assert r["pass_at_k"]["1"] == pytest.approx(in_loop[0]["eval_accuracy"], abs=1e-6)  # float32 there
    assert r["extra"]["in_loop"] == pytest.approx({k: in_loop[0][k] for k in ("eval_accuracy", "eval_score")})
    assert r["extra"]["harness"] == "p3o.examples.agent_openai:solve" and r["extra"]["seed"] == 0
    assert set(r["extra"]["faults"]) == set(FAULTS)
    stats = r["extra"]["episode"]
    assert stats["stop_done"] + stats["failed"] == pytest.approx(1.0)  # every episode ended one way or the other
    assert "calculator_calls" in stats and stats["turns"] >= 1.0  # the harness's own metric, the endpoint's rows
    assert r["extra"]["endpoint"]["episodes"] == N_EVAL and r["extra"]["endpoint"]["requests"] >= N_EVAL
    assert r["mean_response_len"] > 0
    # the evaluation's endpoint is its own: the run's endpoint file and key are untouched, no key printed in full
    assert (harness_run / "endpoint.json").read_text() == endpoint
    key = json.loads(endpoint)["api_key"]
    assert key not in capsys.readouterr().err and key not in out.read_text()
    # the match is the draws', not a coincidence of counts: another seed samples other episodes
    other = tmp_path / "seed5.json"
    assert p3o_main(["eval", "--model", str(harness_run), "--seed", "5", "--out", str(other), "--quiet"]) == 0
    draws = json.loads(other.read_text())
    assert (draws["correct"], draws["mean_response_len"]) != (r["correct"], r["mean_response_len"])


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_such_module_for_eval:solve", "agent.harness: cannot import 'no_such_module_for_eval'"),
        ("p3o.examples.agent_openai:no_such_function", "agent.harness: 'p3o.examples.agent_openai' has no function"),
    ],
)
def test_a_bad_harness_spec_is_one_line(spec: str, match: str, tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "final" / "config.json").write_text("{}")  # never read: the harness is refused before the model loads
    save_config(load_config(["--config", "agent-openai", "--agent.harness", spec]), run_dir / "config.yaml")
    assert p3o_main(["eval", "--model", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err


def _options(**given: object) -> SimpleNamespace:
    return SimpleNamespace(**{"n_samples": None, "k": None, "batch_prompts": None, "seed": None, **given})


def test_the_sample_counts_of_a_harness_run_are_its_in_loop_evaluations() -> None:
    assert sample_counts(_options(), harness_seed=7) == (1, [1], 64, 7)  # 1 episode per problem, batches of 64
    assert sample_counts(_options()) == (8, [1, 2, 4, 8], 16, 0)  # any other evaluation, as before
    assert sample_counts(_options(n_samples=4, seed=3), harness_seed=7) == (4, [1, 2, 4], 64, 3)
    with pytest.raises(ConfigError, match=r"--k: \[2\] exceed --n-samples 1"):
        sample_counts(_options(k="1,2"), harness_seed=7)
