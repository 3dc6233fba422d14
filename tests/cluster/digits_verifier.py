"""A verifier for the Ray tests (named by file path, so rollout workers load it from the config alone): the share of
digits in the completion, which varies within a group even for a random model, so advantages and updates are not 0."""


def digit_share(completion: str, answer: str) -> float:
    """(number of digit characters) / max(1, len(completion)), in [0, 1]; `answer` unused."""
    return sum(ch.isdigit() for ch in completion) / max(1, len(completion))
