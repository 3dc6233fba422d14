"""Verifiers: `(completion, answer) -> float`, time-limited and exception-free, plus a batch `score`.

score(completions, answers, "gsm8k")            # -> list[float]
get_verifier("math")("... \\boxed{2}", "2")     # -> 1.0
get_verifier("my_rewards:score")               # your own fn(completion, answer) -> float, time-limited
reward_fn = make_reward_fn("math", timeout_s=1.0)   # rollouts -> (N,) float32 rewards; reward_fn.tally counts
with tally() as t: score(...)                       # t.timeouts, t.restarts: this thread's verifier events
"""

from p3o.errors import VerifierError
from p3o.rewards.extract import final_boxed, hash_answer, last_boxed, parse_int, parse_number
from p3o.rewards.tally import Tally, tally
from p3o.rewards.verifiers import (
    DIFFERENCES,
    VERIFIERS,
    RewardFn,
    exact_int,
    format_reward,
    get_verifier,
    gsm8k,
    make_reward_fn,
    math_equal,
    math_reward,
    safe_for_sympy,
    score,
)

__all__ = [
    "DIFFERENCES",
    "VERIFIERS",
    "RewardFn",
    "Tally",
    "VerifierError",
    "exact_int",
    "final_boxed",
    "format_reward",
    "get_verifier",
    "gsm8k",
    "hash_answer",
    "last_boxed",
    "make_reward_fn",
    "math_equal",
    "math_reward",
    "parse_int",
    "parse_number",
    "safe_for_sympy",
    "score",
    "tally",
]
