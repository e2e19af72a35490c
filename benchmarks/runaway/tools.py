"""RUNAWAY.md §(d) tool-call scenarios 22-25, driven through the policy hooks."""

from __future__ import annotations

import itertools
from typing import Any

from agentloop._messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from agentloop.policies import EndTurn, IdenticalToolCallRun, Nudge, Policy, ToolCallCycle, Verdict

_ids = itertools.count()


def _call(name: str, **args: Any) -> ToolUseBlock:
    return ToolUseBlock(id=f"b{next(_ids)}", name=name, input=args)


def _step(pol: Policy, calls: list[ToolUseBlock], result: str = "ok", thought: str = "") -> Verdict | None:
    content: list[Any] = [TextBlock(text=thought)] if thought else []
    msg = Message(role="assistant", content=[*content, *calls])
    pol.on_response(msg)
    return pol.on_results(msg, [ToolResultBlock(tool_use_id=c.id, content=result) for c in calls])


def _first(verdicts: list[Verdict | None], kind: type) -> int | None:
    return next((i + 1 for i, v in enumerate(verdicts) if isinstance(v, kind)), None)


def _polling() -> tuple[bool, str]:
    pol = IdenticalToolCallRun(poller_tools=["bash"])
    changing = [_step(pol, [_call("bash", command="sleep 60 && tail log")], f"step {i}") for i in range(30)]
    pol = IdenticalToolCallRun(poller_tools=["bash"])
    same = [_step(pol, [_call("bash", command="sleep 60 && tail log")], "waiting") for _ in range(12)]
    ok = not any(changing) and _first(same, EndTurn) == 12
    return (
        ok,
        f"changing: no verdict in 30 polls; unchanged: nudge@{_first(same, Nudge)} end@{_first(same, EndTurn)}",
    )


def _batch() -> tuple[bool, str]:
    pol = IdenticalToolCallRun()
    v = [_step(pol, [_call("edit", path=f"f{i}.py")]) for i in range(20)]
    v += [_step(pol, [_call("read_file", path="big.py", offset=100 * i)]) for i in range(20)]
    return not any(v), f"{len(v)} calls, verdicts: {sum(x is not None for x in v)}"


def _ping_pong() -> tuple[bool, str]:
    pol = ToolCallCycle()
    v = [
        _step(pol, [_call("edit", path="x", new="1")] if i % 2 == 0 else [_call("pytest")]) for i in range(10)
    ]
    par = IdenticalToolCallRun()
    p = [_step(par, [_call("mvn", goal="test") for _ in range(6)]) for _ in range(2)]
    ok = _first(v, Nudge) == 6 and isinstance(p[0], type(None)) and isinstance(p[1], EndTurn)
    return (
        ok,
        f"A/B nudge@{_first(v, Nudge)} end@{_first(v, EndTurn)}; 6+6 parallel identical -> {type(p[1]).__name__}",
    )


def _boundaries() -> tuple[bool, str]:
    pol = IdenticalToolCallRun()
    for _ in range(7):
        pol.begin_attempt()
        pol.begin_attempt()  # a transport retry never reaches on_response
        _step(pol, [_call("git_status")], thought=f"maybe {_}")
    retried_ok = pol.count == 7
    pol.begin_turn(real_user=True)
    restarted = pol.count == 0
    keep = IdenticalToolCallRun()
    k = [_step(keep, [_call("bash", command="true")]) for _ in range(4)]
    ok = retried_ok and restarted and isinstance(k[3], EndTurn) and k[3].reason == "stationarity_ended"
    return ok, "retry not double-counted; varied thought counted; user 'continue' resets; `true`x4 ends"


def tool_scenarios() -> list[tuple[str, bool, str]]:
    return [
        ("22 polling: changing result is progress, unchanged stops", *_polling()),
        ("23 batch work and pagination are not loops", *_batch()),
        ("24 A/B ping-pong caught; parallel identical calls counted", *_ping_pong()),
        ("25 resume/retry boundaries, keep-alive, distinct terminal", *_boundaries()),
    ]
