"""A calculator agent written with the `openai` SDK alone; p3o trains it unchanged (``p3o docs harness``).

Run by ``agent.harness: p3o.examples.agent_openai:solve`` (the agent-openai preset).
"""

import json
import re

EXPRESSION = {"expression": {"type": "string", "description": "e.g. 47 * 6"}}
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
          "parameters": {"type": "object", "properties": EXPRESSION, "required": ["expression"]}}}]  # fmt: skip
OPS = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}


def calculator(expression: str) -> str:
    """`<int> <op> <int>` (op + - *) -> the integer as text; parsed, never evaluated as code."""
    m = re.fullmatch(r"\s*(-?\d{1,9})\s*([-+*])\s*(-?\d{1,9})\s*", expression)
    return str(OPS[m[2]](int(m[1]), int(m[3]))) if m else "error: expected <int> <op> <int>"


async def solve(client, model: str, problem, max_turns: int = 3) -> dict:
    """One episode: the model may call the calculator; reward 1 when its last `#### <value>` is the answer."""
    messages, calls = [{"role": "user", "content": problem.prompt}], 0
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=64)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls or []:
            calls += 1
            try:
                expression = str(json.loads(call.function.arguments).get("expression", ""))
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(expression)})
        if not msg.tool_calls:
            break
    found = re.search(r"####\s*(-?\d+)", msg.content or "")
    return {"reward": float(bool(found) and found[1] == problem.answer), "calculator_calls": float(calls)}
