"""`verifiers` environments as p3o harnesses (``agent.harness: verifiers:<module>``)."""

from __future__ import annotations

from p3o.envs.harness import Harness
from p3o.errors import ConfigError

__all__ = ["load_verifiers"]


def load_verifiers(module: str) -> Harness:
    """The harness that runs the `verifiers` environment ``module`` against p3o's endpoint."""
    raise ConfigError(
        f"agent.harness: 'verifiers:{module}': verifiers environments are not run yet (p3o docs harness, 'verifiers "
        "environments'); wrap your agent as package.module:function"
    )
