"""``python -m agentloop demo``: an interactive terminal agent on the kernel.

Modules: `story` (the scripted model's side), `project` (the pretend project
and its tools), `screen` and `render` (the terminal UI), `keyboard` (input and
the terminal's modes), `editor` (the line being typed), `host` (what a person
does to the engine), `scenario` (the same, scripted), `app` (the wiring).
"""

from .app import DemoError, Options, run

__all__ = ["DemoError", "Options", "run"]
