"""The scripted coding-assistant session the demo plays on `ScriptedModel`.

`Story` is one callable handed to ``ScriptedModel([story], cycle=True)``: every
model request calls it with the `ModelRequest`, and it answers like a model
would, from what the transcript shows. So the session survives whatever the
user does (an interrupt anywhere, a steer, a send-now): the next step is always
"what a sensible agent would do now", not "the next line of a fixed script".

The fix story (any prompt while the fix is not done):
  list files -> read utils.py -> run the tests (a real subprocess, fails)
  -> think in circles (a doom loop: the detector cuts it, the engine resamples)
  -> the resampled answer edits utils.py -> run the tests (pass)
  -> re-read utils.py again and again (the stationarity policy nudges at the
     4th identical call of this "tight" tool) -> heed the nudge, summarise.
The CI story (a prompt that mentions CI): poll ``ci_status`` with identical
arguments and ignore the nudge, until the policy ends the turn at the 8th.
After the fix, any other message: run the tests again (something to stop,
steer or queue behind), then answer with what is left to try.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._messages import Message, ToolResultBlock, ToolUseBlock
from .._model import ModelRequest
from .._scripted import ScriptedResponse, ScriptedToolCall
from .screen import shorten

__all__ = ["SUMMARY_MARK", "Story"]

SUMMARY_MARK = "All green"
_CHANT = "No wait, maybe the bug is in the test file. "
_FIX_OLD = "return title.strip().lower()"
_FIX_NEW = 'return "-".join(title.strip().lower().split())'
_CI = re.compile(r"\bci\b", re.IGNORECASE)
_QUERY = re.compile(r"<user_query>\n?(.*?)\n?</user_query>", re.DOTALL)


@dataclass
class Facts:
    """What the transcript of one request shows."""

    calls: list[tuple[ToolUseBlock, ToolResultBlock | None]] = field(default_factory=list)
    prompt: Message | None = None  # the latest genuine user message
    new_turn: bool = False  # that prompt came after the last assistant message
    interrupted_before: bool = False  # the turn before that prompt was interrupted
    steers: list[str] = field(default_factory=list)  # interjections since the last answer
    nudged: bool = False  # a policy reminder since the last answer
    resample: bool = False  # this request retries an attempt cut as a loop
    summarised: bool = False
    since_prompt: list[str] = field(default_factory=list)  # tool names called since that prompt

    def ok(self, name: str) -> list[ToolUseBlock]:
        return [u for u, r in self.calls if u.name == name and r is not None and not r.is_error]

    def after(self, use: ToolUseBlock | None, name: str) -> list[ToolUseBlock]:
        """Successful calls of ``name`` made after ``use`` (all of them when None)."""
        seen = use is None
        out: list[ToolUseBlock] = []
        for u, r in self.calls:
            if u is use:
                seen = True
            elif seen and u.name == name and r is not None and not r.is_error:
                out.append(u)
        return out


def read_facts(messages: Sequence[Message]) -> Facts:
    """Derive `Facts` from a request's messages."""
    f = Facts()
    results: dict[str, ToolResultBlock] = {}
    for m in messages:
        for r in m.tool_results:
            results[r.tool_use_id] = r
    last_answer = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    for i, m in enumerate(messages):
        if m.role == "assistant":
            f.calls += [(u, results.get(u.id)) for u in m.tool_uses]
            f.since_prompt += [u.name for u in m.tool_uses]
            f.summarised = f.summarised or SUMMARY_MARK in m.text
            continue
        if m.kind == "interrupt_notice" or (m.kind is None and m.partial):
            f.interrupted_before = True
        if not m.synthetic and m.text and not m.tool_results:
            f.prompt, f.new_turn, f.since_prompt = m, i > last_answer, []
            f.interrupted_before = f.interrupted_before and f.new_turn
        elif i > last_answer and m.kind == "interjection":
            f.steers += [t.strip() for t in _QUERY.findall(m.text)]
        elif i > last_answer and m.kind == "nudge":
            f.nudged = True
        elif m.kind == "doom_reminder":
            f.resample = True
    if last_answer >= 0 and messages[last_answer].partial:
        f.interrupted_before = f.interrupted_before or f.new_turn
    return f


def _quote(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return "\u201c" + shorten(text, limit) + "\u201d"


class Story:
    """The model's side of the demo (see the module docstring).

    ``delay`` is the pause before each streamed event and ``chunk`` the delta
    size: small enough that a person can interrupt mid-sentence.
    """

    def __init__(self, *, delay: float = 0.03, chunk: int = 6) -> None:
        self.delay = delay
        self.chunk = chunk

    def __call__(self, request: ModelRequest) -> ScriptedResponse:
        f = read_facts(request.messages)
        step = self._ci(f) if f.prompt is not None and _CI.search(f.prompt.text) else self._fix(f)
        ack = self._ack(f)
        # A step that only calls a tool says the ack alone; the looping attempt (thinking only)
        # does not: it is cut, and the resampled answer says it.
        if ack and (step.text or step.tool_calls):
            step = ScriptedResponse(
                thinking=step.thinking, text=f"{ack} {step.text}".strip(), tool_calls=step.tool_calls,
                chunk=step.chunk, delay=step.delay,
            )
        return step

    def _say(self, thinking: str, text: str, *calls: ScriptedToolCall) -> ScriptedResponse:
        return ScriptedResponse(thinking=thinking, text=text, tool_calls=calls, chunk=self.chunk, delay=self.delay)

    def _ack(self, f: Facts) -> str:
        if f.steers:
            return f"Noted your message {_quote(' / '.join(f.steers))}: I'll take it into account."
        if f.prompt is None or not f.new_turn:
            return ""
        if str(f.prompt.meta.get("receipt", "")).startswith("send"):
            return f"Switching to your message {_quote(f.prompt.text)} right away."
        if f.interrupted_before:
            return f"OK, you stopped me. Picking up again with {_quote(f.prompt.text)} in mind."
        return ""

    def _fix(self, f: Facts) -> ScriptedResponse:
        call = ScriptedToolCall
        if f.summarised:
            return self._after_fix(f)
        if not f.ok("list_files"):
            return self._say(
                "The user wants a failing test fixed. First, what does the project look like?",
                "Let me look at the project first.",
                call("list_files", {"path": "."}),
            )
        if not f.ok("read_file"):
            return self._say("There is a utils.py and a test file. Read the code.", "", call("read_file", {"path": "utils.py"}))
        if not f.ok("run_tests"):
            return self._say(
                "slugify only lowercases. Let me see which test fails.",
                "Running the tests to see the failure.",
                call("run_tests"),
            )
        edits = [u for u in f.ok("edit_file") if u.input.get("path") == "utils.py"]
        if not edits:
            return self._edit(f)
        passes = f.after(edits[-1], "run_tests")
        if not passes:
            return self._say("Edited. Now check the tests again.", "Re-running the tests.", call("run_tests"))
        rereads = f.after(passes[-1], "read_file")
        if not f.nudged and len(rereads) < 6:
            return self._say(
                "Tests pass. Let me make sure the file really contains the fix.",
                "Double-checking the file." if not rereads else "Checking once more.",
                call("read_file", {"path": "utils.py"}),
            )
        return self._say(
            "The reminder is right: I have read this file enough, it contains the fix.",
            f"You're right, I was re-reading the same file. {SUMMARY_MARK}: slugify now joins the "
            "words with hyphens, and both tests pass. Ask me to wait for CI to see the stationarity "
            "policy stop a polling loop.",
        )

    def _after_fix(self, f: Facts) -> ScriptedResponse:
        """Any later message: the tests run again (a tool that takes a while, something to stop,
        steer or queue behind), then a short answer that says what is left to try."""
        if "run_tests" not in f.since_prompt:
            return self._say(
                "The fix is done. Check that the tests still pass before answering.",
                "Running the tests again to be sure.",
                ScriptedToolCall("run_tests"),
            )
        said = f"The fix is in and the tests still pass. You said {_quote(f.prompt.text if f.prompt else '')}."
        if not f.ok("ci_status"):
            return self._say("Answer briefly.", f"{said} Ask me to wait for CI to see the stationarity policy stop a polling loop.")
        return self._say(
            "Answer briefly.",
            f"{said} Send me another message and, while the tests run, try typing to steer me, !text "
            "to replace the turn, or /mode queue and a message to queue it for after the turn.",
        )

    def _edit(self, f: Facts) -> ScriptedResponse:
        if not f.resample:
            # A runaway chant in small thinking deltas: the client detector finds
            # the period and the default policy cuts the stream.
            return ScriptedResponse(
                thinking="test_slugify_spaces fails. Let me think about why. " + _CHANT * 24,
                chunk=4, delay=self.delay / 3,
            )
        return self._say(
            "I was going round in circles. The test wants 'hello-world': join the words with hyphens.",
            "I got stuck re-reading the same thought; the loop detector cut me off. Fixing slugify now.",
            ScriptedToolCall("edit_file", {"path": "utils.py", "old": _FIX_OLD, "new": _FIX_NEW}),
        )

    def _ci(self, f: Facts) -> ScriptedResponse:
        polls = f.since_prompt.count("ci_status")
        if polls >= 12:
            return self._say("Enough polling.", "CI is still running; I'll stop polling here.")
        text = "Checking CI." if polls == 0 else "Still running. Checking again."
        if f.nudged:
            text = "I know I keep asking, but CI must finish first. Checking again."
        return self._say("Wait for the pipeline.", text, ScriptedToolCall("ci_status", {"pipeline": "main"}))

