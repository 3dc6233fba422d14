"""The built-in environments (calc, guess), the calc task, and the registry."""

from __future__ import annotations

import pytest

from p3o.envs.base import Environment, EnvLimits, Step
from p3o.envs.builtin import CalcEnv, GuessEnv, calc_transcript, guess_problems
from p3o.envs.registry import ENV_NAMES, env_problems, make_env
from p3o.envs.render import Renderer
from p3o.envs.tools import CALCULATOR, ToolRunner
from p3o.errors import ConfigError
from p3o.rewards.verifiers import exact_int
from p3o.tasks.arithmetic import split_of
from p3o.tasks.calc import calc_problem, load_calc


@pytest.fixture(scope="module")
def runner():
    r = ToolRunner([CALCULATOR], timeout_s=2.0, workers=1)
    yield r
    r.close()


# ------------------------------------------------------------------------------------------------------------------
# The calc task
# ------------------------------------------------------------------------------------------------------------------


def test_calc_problems_are_deterministic_correct_and_split_disjoint() -> None:
    train, test = load_calc("train", seed=0, n=300), load_calc("test", seed=0, n=60)
    assert [p.prompt for p in load_calc("train", seed=0, n=300)] == [p.prompt for p in train]
    assert calc_problem(7, "train", seed=0) == train[7]  # problem i depends on (seed, split, index) only
    assert load_calc("train", seed=1, n=5) != train[:5]
    assert not {p.meta["key"] for p in train} & {p.meta["key"] for p in test}
    assert all(split_of(p.meta["key"]) == "test" for p in test)
    kinds = {p.meta["kind"] for p in train}
    assert kinds == {"mul", "add"}
    for p in train + test:
        terms = [int(x) for x in p.meta["expression"].replace("*", "+").split("+")]
        if p.meta["kind"] == "mul":
            assert 100 <= terms[0] <= 9999 and 10 <= terms[1] <= 999 and int(p.answer) == terms[0] * terms[1]
        else:
            assert len(terms) == 3 and all(1000 <= t <= 999999 for t in terms) and int(p.answer) == sum(terms)
        assert exact_int(p.solution, p.answer) == 1.0 and p.meta["verifier"] == "exact-int"
    assert {p.meta["kind"] for p in load_calc("test", n=10, kind="mul")} == {"mul"}
    with pytest.raises(ConfigError):
        load_calc("dev")
    with pytest.raises(ConfigError):
        load_calc("train", kind="div")


def test_calc_small_holds_out_at_least_256_distinct_problems() -> None:
    """Issue 51 item 10: the agent testbed's 256 held-out problems are 256 different expressions (55 before)."""
    test = load_calc("test", seed=0, n=256, kind="small")
    train = load_calc("train", seed=0, n=2000, kind="small")
    assert len({p.meta["key"] for p in test}) == 256
    assert len({p.meta["key"] for p in load_calc("test", seed=0, n=10_000, kind="small")}) >= 300
    assert not {p.meta["key"] for p in test} & {p.meta["key"] for p in train}
    assert (
        len({p.meta["key"] for p in train}) + len({p.meta["key"] for p in load_calc("test", n=999, kind="small")})
        == 623
    )
    assert [p.prompt for p in load_calc("test", seed=1, n=256, kind="small")] != [p.prompt for p in test]
    for p in test[:50] + train[:50]:
        a, b = (int(x) for x in p.meta["expression"].split(" * "))
        assert 11 <= a <= 99 and 3 <= b <= 9 and int(p.answer) == a * b and p.meta["kind"] == "small"
        assert exact_int(p.solution, p.answer) == 1.0
    assert calc_problem(300, "test", kind="small") == load_calc("test", n=301, kind="small")[300]


# ------------------------------------------------------------------------------------------------------------------
# calc
# ------------------------------------------------------------------------------------------------------------------


def test_a_calc_episode_calls_the_tool_reads_the_result_and_is_scored(runner: ToolRunner) -> None:
    p = calc_problem(3, "test", kind="mul")
    env = CalcEnv(runner=runner)
    assert isinstance(env, Environment) and env.stop_strings == ("</calc>",) and env.render_mode == "plain"
    [msg] = env.reset(p, seed=0)
    assert msg["role"] == "user" and p.prompt in msg["content"] and "#### <number>" in msg["content"]
    step = env.step(f"<calc>{p.meta['expression']}</calc>")
    assert step.observation == [{"role": "tool", "content": p.answer}] and not step.done and step.reward == 0.0
    assert step.info["tool_calls"] == 1.0 and step.info["tool_errors"] == 0.0
    final = env.step(f"\n#### {p.answer}")
    assert final.done and final.reward == 1.0 and final.observation == []
    env.reset(p, seed=1)
    assert env.step("#### 12").reward == 0.0  # no call: the answer, wrong
    env.close()


def test_calc_counts_bad_calls_and_runs_qwen_style(runner: ToolRunner) -> None:
    env = CalcEnv(runner=runner)
    env.reset(calc_problem(0, "train"), seed=0)
    bad = env.step("<calc>import os</calc>")
    assert bad.observation[0]["content"].startswith("error: ValueError") and bad.info["tool_errors"] == 1.0
    unclosed = env.step("<calc>1 +")
    assert unclosed.info["parse_errors"] == 1.0 and not unclosed.done
    qwen = CalcEnv(style="qwen", runner=runner)
    assert qwen.stop_strings == ("</tool_call>",) and qwen.render_mode == "chat" and qwen.tools[0]["function"]
    p = calc_problem(1, "train")
    qwen.reset(p, seed=0)
    [call, result, final] = calc_transcript(p, use_tool=True, style="qwen")
    step = qwen.step(call["content"])
    assert step.observation == [{"role": "tool", "content": p.answer}] == [result]
    assert qwen.step(final["content"]).reward == 1.0
    with pytest.raises(ConfigError):
        CalcEnv(style="xml")


def test_calc_uses_a_shared_runner_and_replaces_a_closed_one() -> None:
    limits = EnvLimits(tool_timeout_s=1.5, max_tool_output_chars=50)
    a, b = CalcEnv(limits=limits, workers=1), CalcEnv(limits=limits, workers=1)
    assert a.runner is b.runner and a.runner.timeout_s == 1.5 and a.runner.max_output_chars == 50
    first = a.runner
    first.close()
    a.reset(calc_problem(0, "train"), seed=0)
    assert a.step("<calc>2 + 2</calc>").observation == [{"role": "tool", "content": "4"}]
    assert a.runner is not first
    a.runner.close()


def test_the_warm_start_transcript_is_a_rewarded_episode(runner: ToolRunner, chatml_tok) -> None:
    """Replaying a transcript's assistant turns through the environment gives its tool messages and reward 1, and
    `Renderer.transcript` builds the ids an episode would."""
    for use_tool in (True, False):
        p = calc_problem(5, "train")
        env = CalcEnv(runner=runner)
        prompt = env.reset(p, seed=0)
        transcript = calc_transcript(p, use_tool=use_tool)
        steps = [env.step(m["content"]) for m in transcript if m["role"] == "assistant"]
        assert steps[-1].done and steps[-1].reward == 1.0
        assert [o for s in steps for o in s.observation] == [m for m in transcript if m["role"] == "tool"]
        r = Renderer(chatml_tok, mode=env.render_mode)
        prompt_ids, ids, mask = r.transcript([*prompt, *transcript], stop_strings=env.stop_strings)
        assert prompt_ids == r.prompt_ids(prompt) and ids[-1] == r.eos_id and mask[-1]
        assert (not all(mask)) == use_tool
    assert calc_transcript(p, use_tool=False) == [{"role": "assistant", "content": p.solution}]


# ------------------------------------------------------------------------------------------------------------------
# guess
# ------------------------------------------------------------------------------------------------------------------


def test_guess_gives_higher_lower_feedback_until_a_hit() -> None:
    [p] = guess_problems("train", seed=0, n=1)
    env = GuessEnv()
    [msg] = env.reset(p, seed=0)
    assert "from 1 to 100" in msg["content"]
    low, high, turns = 1, 100, 0
    while True:
        guess = (low + high) // 2
        step = env.step(f"I guess #### {guess}")
        turns += 1
        if step.done:
            break
        [fb] = step.observation
        assert fb["role"] == "user" and fb["content"] in ("higher", "lower")
        low, high = (guess + 1, high) if fb["content"] == "higher" else (low, guess - 1)
    assert step.reward == 1.0 and guess == int(p.answer) and turns <= 7 and step.info["guesses"] == turns
    env.reset(p, seed=0)
    none = env.step("fifty")
    assert none.info["parse_errors"] == 1.0 and not none.done
    capped = GuessEnv(max_guesses=1)
    capped.reset(p, seed=0)
    wrong = 1 if int(p.answer) != 1 else 2
    assert capped.step(f"#### {wrong}") == Step(done=True, info={"guesses": 1.0})


def test_guess_problems_split_by_secret() -> None:
    train, test = guess_problems("train", n=200), guess_problems("test", n=50)
    assert not {p.answer for p in train} & {p.answer for p in test}
    assert guess_problems("train", n=5) == train[:5]
    with pytest.raises(ConfigError):
        guess_problems("train", low=5, high=5)


# ------------------------------------------------------------------------------------------------------------------
# The registry
# ------------------------------------------------------------------------------------------------------------------


def test_make_env_builds_builtins_and_user_classes() -> None:
    assert ENV_NAMES == ("calc", "calc-small", "guess")
    limits = EnvLimits(tool_timeout_s=0.5)
    calc = make_env("calc", limits=limits, style="qwen")
    assert isinstance(calc, CalcEnv) and calc.limits is limits and calc.style == "qwen"
    assert isinstance(make_env("guess", limits=limits, max_guesses=3), GuessEnv)  # limits only where taken
    user = make_env("env_fixtures:Counter", limits=limits, target=2)
    user.reset(None, seed=0)
    assert user.step("1").observation and user.step("2").reward == 1.0
    assert make_env("env_fixtures:TakesLimits", limits=limits).limits is limits
    assert len(env_problems("calc", "test", n=3)) == 3 and env_problems("env_fixtures:Counter") is None
    assert env_problems("guess", n=2)[0].meta["source"] == "guess"


@pytest.mark.parametrize(
    ("name", "options", "words"),
    [
        ("maze", {}, "unknown; known: calc, calc-small, guess"),
        ("no_such_pkg_xyz:Env", {}, "cannot import no_such_pkg_xyz"),
        ("env_fixtures:Missing", {}, "has no attribute 'Missing'"),
        ("env_fixtures:NOT_A_TOOL", {}, "not a class"),
        ("env_fixtures:NoStep", {}, "no step method"),
        ("env_fixtures:BadStops", {}, "stop_strings must be a tuple"),
        ("env_fixtures:Raises", {}, "RuntimeError: cannot make it"),
        ("env_fixtures:Counter", {"size": 3}, "unexpected keyword argument 'size'"),
        ("calc", {"style": "xml"}, "unknown style 'xml'"),
    ],
)
def test_make_env_refuses_in_one_line(name: str, options: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        make_env(name, **options)
    assert "\n" not in str(err.value) and name in str(err.value)
