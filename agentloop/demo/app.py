"""Wiring: the model (scripted or a real provider), the engine, the terminal, the session.

`run(options)` is what ``python -m agentloop demo`` calls; it returns the exit
status: 0 when the final transcript is valid, 1 when it is not (or a scenario
got stuck, or the output could not be written: a full disk), 2 for a usage
error (a missing provider or API key), 130 when Ctrl-C cut a scenario short (or
came before the demo handles it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from typing import TextIO

from .._engine import QueryEngine
from .._model import Model
from .._scripted import ScriptedModel
from .editor import LineEditor
from .host import Host
from .keyboard import Blocking, LineReader, TerminalMode, parse
from .project import Project, make_permission, make_tools
from .render import Renderer
from .scenario import Player, Scenario, ScenarioError, load
from .screen import Screen
from .story import Story

__all__ = ["DemoError", "Options", "build_model", "run"]

FIRST_PROMPT = "Fix the failing test in utils.py"
SYSTEM = (
    "You are a coding assistant working on a tiny Python project through the tools you are given. "
    "Be brief. Use run_tests to check your work."
)
# provider -> (class name in agentloop.models, API key variable, default model)
PROVIDERS: dict[str, tuple[str, str, str]] = {
    "anthropic": ("AnthropicModel", "ANTHROPIC_API_KEY", "claude-sonnet-4-5"),
    "openai": ("OpenAIChatModel", "OPENAI_API_KEY", "gpt-4.1-mini"),
    "openai-responses": ("OpenAIResponsesModel", "OPENAI_API_KEY", "gpt-4.1-mini"),
    "openai-compatible": ("OpenAIChatModel", "", "default"),
}


class DemoError(Exception):
    """A usage error, reported as one line with exit status 2."""


@dataclass(frozen=True, slots=True)
class Options:
    provider: str | None = None
    model: str | None = None
    base_url: str | None = None
    script: str | None = None
    speed: float = 1.0
    plain: bool = False


def build_model(opts: Options) -> Model:
    """The scripted model, or a provider's model imported lazily. Raises DemoError."""
    if opts.provider is None:
        story = Story(delay=0.03 / opts.speed)
        return ScriptedModel([story], cycle=True, record=False)
    if opts.provider not in PROVIDERS:
        raise DemoError(f"unknown provider {opts.provider!r}: choose one of {', '.join(PROVIDERS)}")
    cls_name, key_var, default_model = PROVIDERS[opts.provider]
    try:
        from .. import models

        cls = getattr(models, cls_name)
    except (ImportError, AttributeError) as exc:
        raise DemoError(f"provider {opts.provider!r} is not available in this install ({exc})") from None
    if opts.provider == "openai-compatible" and not opts.base_url:
        raise DemoError("--provider openai-compatible needs --base-url (e.g. http://127.0.0.1:8000/v1)")
    if key_var and not os.environ.get(key_var) and not opts.base_url:
        raise DemoError(f"{key_var} is not set: export it, or run the offline demo without --provider")
    model: Model = cls(opts.model or default_model, base_url=opts.base_url)
    return model


def build_engine(model: Model, speed: float) -> QueryEngine:
    project = Project(test_pause=0.5 / speed)
    return QueryEngine(
        model,
        tools=make_tools(project, poll_pause=0.15 / speed),
        system=SYSTEM,
        permission=make_permission(0.4 / speed),
        max_turns=40,
    )


def run(opts: Options, out: TextIO | None = None) -> int:
    """Run the demo; returns the exit status (see the module docstring)."""
    stream = out or sys.stdout
    try:
        _check_no_running_loop()
        model = build_model(opts)
        scenario = load(opts.script) if opts.script else None
        if scenario is None:
            _check_stdin()
    except (DemoError, ScenarioError) as exc:
        print(f"agentloop demo: {exc}", file=sys.stderr)
        return 2
    # A terminal (or pipe) left non-blocking by another program: blocking for the session. Standard
    # input is left as it is when a scenario plays: nothing reads it (and the flag is the open
    # file's, which other programs share).
    streams = (stream, sys.stderr) if scenario is not None else (sys.stdin, stream, sys.stderr)
    modes = Blocking([fd for fd in map(_fileno, streams) if fd is not None])
    try:  # a Ctrl-C while the flags are cleared gives back those cleared already
        modes.apply()
        screen = Screen.for_stream(stream, plain=opts.plain or scenario is not None, modes=modes)
        return _play(model, screen, opts, scenario)
    finally:
        modes.restore()


def _play(model: Model, screen: Screen, opts: Options, scenario: Scenario | None) -> int:
    session = _session(model, screen, opts, scenario)
    try:
        status = asyncio.run(session)
    except KeyboardInterrupt:  # Ctrl-C before the handler was installed, or after it was removed
        session.close()  # if it came before the session started: no "never awaited" warning
        return 130
    finally:
        screen.stop()
    if screen.failed is not None:
        with contextlib.suppress(OSError):
            print(f"agentloop demo: cannot write the output: {screen.failed}", file=sys.stderr)
        return 1
    return status


def _fileno(stream: object) -> int | None:
    """The descriptor of ``stream``, if it has one."""
    fileno = getattr(stream, "fileno", None)
    try:
        fd = fileno() if fileno is not None else None
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return None
    return fd if isinstance(fd, int) else None


def _check_no_running_loop() -> None:
    """The demo runs an event loop of its own. Raises DemoError in a thread whose loop runs
    already (a notebook cell), before anything is made that would be left unawaited."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise DemoError(
        "an event loop is already running in this thread (a notebook?), and the demo runs its own: "
        "run `python -m agentloop demo` in a terminal, or `!python -m agentloop demo --script builtin` in a cell"
    )


def _check_stdin() -> None:
    """The keyboard demo reads standard input's descriptor. Raises DemoError without one."""
    try:
        if sys.stdin is None:
            raise OSError("closed")
        os.fstat(sys.stdin.fileno())
    except (OSError, ValueError) as exc:  # io.UnsupportedOperation is both
        raise DemoError(
            f"standard input is not readable ({exc}): run it in a terminal, or play a scenario with --script builtin"
        ) from None


def _terminal() -> int | None:
    """Standard input's descriptor, if it is a terminal."""
    try:
        fd = sys.stdin.fileno()
        return fd if os.isatty(fd) else None
    except (AttributeError, OSError, ValueError):  # no stdin at all, or closed
        return None


async def _session(model: Model, screen: Screen, opts: Options, scenario: Scenario | None) -> int:
    loop = asyncio.get_running_loop()
    renderer = Renderer(screen, asks=frozenset({"edit_file"}), scripted=opts.provider is None)
    fd = _terminal()
    # On a terminal with a status line the demo edits the line being typed on a row of its own:
    # echoed by the terminal, it landed in the middle of the streamed output.
    mode = None if fd is None else TerminalMode(fd, "quiet" if scenario else "edit" if screen.tty else "lines")
    if mode is not None and not mode.apply():
        mode = None  # the terminal refused: it is left as it is
    reader: LineReader | None = None
    try:  # from here on the terminal is given back however the session ends
        editor = LineEditor() if mode is not None and mode.mode == "edit" else None
        host = Host(
            build_engine(model, opts.speed), renderer, hints=scenario is None, editor=editor,
            echo=editor is not None or fd is None,
        )
        screen.on_closed = host.quit  # nobody reads the output any more (a pipe into head, say)
        _install_signals(loop, host, screen, mode)
        screen.start(keyboard=editor is not None)
        if scenario is not None:
            player = Player(host, scenario)
            with contextlib.suppress(NotImplementedError, RuntimeError):  # Ctrl-C ends the scenario
                loop.add_signal_handler(signal.SIGINT, player.interrupt)
            player.begin()
            try:
                async with asyncio.timeout(scenario.timeout):
                    await _first(player.finished, host.exit)  # the end, or the user quit
            except TimeoutError:
                renderer.note(f"[script] timed out after {scenario.timeout:g}s", "red")
                player.stuck = True
            stuck = player.stuck
            interrupted = player.interrupted
        else:
            renderer.note(f"agentloop demo: {_what(opts)}", "bold")
            renderer.help()
            eof = host.quit if fd is not None else host.end_of_input  # Ctrl-D, or the end of a pipe
            reader = LineReader(
                loop, sys.stdin.fileno(), lambda line: host.handle(parse(line)), eof,
                encoding=getattr(sys.stdin, "encoding", None) or "utf-8",
                editor=editor, on_edit=None if editor is None else lambda: screen.typed(editor.text, editor.cursor),
                partial=fd is None,
            )
            host.start(FIRST_PROMPT)  # something happens at once, until the user types
            await _first(host.exit, host.shown)
            reader.start()  # what was typed meanwhile waits in the terminal (or the pipe)
            await host.exit.wait()
            stuck = interrupted = False
        await host.close()
    finally:
        if reader is not None:
            reader.stop()
            if reader.unsent:  # echoed by the terminal, no line break after it: the summary goes below
                screen.at_line_start = False
        _remove_signals(loop)
        screen.stop()
        if mode is not None:
            mode.restore()
        close = getattr(model, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
    valid = host.summary()
    return 1 if not valid or stuck else 130 if interrupted else 0


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


def _what(opts: Options) -> str:
    if opts.provider is None:
        return "a scripted coding agent (ScriptedModel, offline, no API key)"
    return f"{opts.provider} ({opts.model or PROVIDERS[opts.provider][2]})"


def _install_signals(
    loop: asyncio.AbstractEventLoop, host: Host, screen: Screen, mode: TerminalMode | None
) -> None:
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, host.sigint)
        loop.add_signal_handler(signal.SIGTERM, host.quit)
        loop.add_signal_handler(signal.SIGHUP, host.quit)  # the terminal closed: end as on SIGTERM
        loop.add_signal_handler(signal.SIGQUIT, _sigquit, host, screen, mode)
        loop.add_signal_handler(signal.SIGWINCH, screen.resized)
        loop.add_signal_handler(signal.SIGTSTP, _suspend, screen, mode)


def _sigquit(host: Host, screen: Screen, mode: TerminalMode | None) -> None:
    """Ctrl-\\: quit as on SIGTERM (the turn stopped, its processes ended, the terminal given
    back); its default action would leave the terminal unechoed and its rows set. Pressed again
    while the demo quits (a quit that hangs), it ends the demo at once by that default action,
    once the terminal has its rows and its modes back."""
    if not host.exit.is_set():
        host.quit()
        return
    screen.stop()
    if mode is not None:
        mode.restore()
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGQUIT)


def _suspend(screen: Screen, mode: TerminalMode | None) -> None:
    """Ctrl-Z: give the terminal back (its rows and its settings), stop (as the default action
    of SIGTSTP would), and take the terminal again when continued."""
    screen.suspend()
    if mode is not None:
        mode.restore()
    os.kill(os.getpid(), signal.SIGSTOP)  # returns once continued (fg, bg, SIGCONT)
    if mode is not None:
        mode.apply()
    screen.resume()


def _remove_signals(loop: asyncio.AbstractEventLoop) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH, signal.SIGTSTP):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(sig)
