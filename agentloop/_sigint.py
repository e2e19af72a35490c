"""``python -m agentloop``: a Ctrl-C while the package is still importing ends the program quietly.

Python turns Ctrl-C into KeyboardInterrupt from its first line on, so one pressed
in the half second ``python -m agentloop demo`` spends importing the package
(before the demo handles Ctrl-C itself) printed a traceback through the import
machinery. While ``python -m`` imports the package, Ctrl-C has its default
action instead: the process ends at once, silently, as any program does on a
Ctrl-C. Python's handler is back as soon as the import of the package ends, whether it
succeeded or failed (a dependency missing, in a program that can do without agentloop), and an
import as a library (``sys.argv[0]`` is ``"-m"`` only while ``python -m`` looks
for its module) changes nothing. Where Ctrl-C is already ignored or handled
differently (a job started in the background, an embedding host), it is left so.
"""

from __future__ import annotations

import signal
import sys

__all__ = ["done_importing", "quiet_while_importing"]

_quiet: list[bool] = []  # holds True while the default action is ours to undo


def quiet_while_importing() -> None:
    """Under ``python -m``, Ctrl-C ends the process while the package imports (run as this
    module is imported: the package imports it first)."""
    if sys.argv[:1] != ["-m"] or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # not the main thread: nothing to do from here
        return
    _quiet.append(True)


def done_importing() -> None:
    """Called last by the package, however its import ended (from a ``finally``): Python's
    handler again (KeyboardInterrupt from here on)."""
    if _quiet and signal.getsignal(signal.SIGINT) is signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _quiet.clear()


quiet_while_importing()
