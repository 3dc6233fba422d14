"""A `verifiers` environment written as verifiers' own scaffold shows (``vf-init -T``), no p3o import: a taskset of
2-digit x 1-digit products with ONE Python tool, a ``calculator`` served as an MCP tool server (``vf.Toolset``).

p3o trains a model on it unchanged (``p3o docs harness``, 'verifiers environments'):

    p3o train --config agent-verifiers        # = --agent.harness verifiers:p3o.examples.verifiers_calc

Its taskset id is this module; verifiers finds the `vf.Taskset` subclass it exports in ``__all__``. The tool server is
taskset-scoped (``Taskset.toolsets``: one server for the whole run, the tool is stateless); verifiers starts it as
``python -m p3o.examples.verifiers_calc`` in a local subprocess. The tool's docstring is its description (verifiers'
rule); its ``Args:`` section describes the argument (p3o's seat reads it, as ``transformers.get_json_schema`` does).
"""

import random
import re

import verifiers.v1 as vf

__all__ = ["CalcTaskset"]

OPS = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = None  # the tool is advertised bare, as `calculator`

    @vf.tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: e.g. 47 * 6
        """
        m = re.fullmatch(r"\s*(-?\d{1,9})\s*([-+*])\s*(-?\d{1,9})\s*", expression)
        return str(OPS[m[2]](int(m[1]), int(m[3]))) if m else "error: expected <int> <op> <int>"


class CalcData(vf.TaskData):
    """One row: the prompt and its answer."""

    answer: str


class CalcTask(vf.Task[CalcData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1 when the final reply's last `#### <value>` is the answer."""
        found = re.findall(r"####\s*(-?\d+)", trace.last_reply)
        return float(bool(found) and found[-1] == self.data.answer)


class CalcConfig(vf.TasksetConfig):
    seed: int = 0
    """The rows' order (every product a*b, a in 10..99, b in 2..9, shuffled by this seed)."""
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self) -> list[CalcTask]:
        pairs = [(a, b) for a in range(10, 100) for b in range(2, 10)]
        random.Random(self.config.seed).shuffle(pairs)
        return [
            CalcTask(CalcData(prompt=f"What is {a} * {b}?", answer=str(a * b)), self.config.task) for a, b in pairs
        ]

    @classmethod
    def toolsets(cls, config: CalcConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]


if __name__ == "__main__":
    CalcToolset.run()
