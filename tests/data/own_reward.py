"""An example of your own reward for `--task.verifier own_reward.py:last_number` (p3o docs tasks).

p3o calls it once per completion, in a worker process with the `task.reward_timeout_s` time limit.
"""

import re


def last_number(completion: str, answer: str) -> float:
    """1.0 iff the last number in the completion equals the reference answer, else 0.0."""
    numbers = re.findall(r"-?\d+", completion)
    return float(bool(numbers) and numbers[-1] == answer.strip())
