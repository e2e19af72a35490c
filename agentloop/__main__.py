"""``python -m agentloop`` (and the ``agentloop`` console script)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

__all__ = ["main"]


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line's parser, and its ``demo`` command's."""
    import argparse  # here, where a Ctrl-C is a quiet exit (see main)

    parser = argparse.ArgumentParser(prog="agentloop", description="agentloop command line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="an interactive agent you can interrupt and steer (offline by default)",
        description="An interactive coding agent on ScriptedModel: interrupt it with Ctrl-C, steer it by "
        "typing, send a message now with !text. See /help inside.",
    )
    demo.add_argument(
        "--provider",
        choices=["anthropic", "openai", "openai-responses", "openai-compatible"],
        help="run against a real endpoint instead of the scripted model",
    )
    demo.add_argument("--model", help="the model name for --provider")
    demo.add_argument("--base-url", help="the endpoint for --provider (required for openai-compatible)")
    demo.add_argument(
        "--script",
        metavar="FILE|builtin",
        help="play a scenario of host actions (JSON, see agentloop/demo/scenario.py) instead of the keyboard",
    )
    demo.add_argument("--speed", type=float, default=1.0, help="speed factor for the scripted model (default 1)")
    demo.add_argument("--plain", action="store_true", help="no colour, no status line")
    return parser, demo


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the exit status (130 after a Ctrl-C that came
    before the demo handles it: no traceback)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return 130


def _main(argv: Sequence[str] | None) -> int:
    parser, demo = _parsers()
    args, extra = parser.parse_known_args(argv)
    if extra:  # for the demo, under its own usage, which names its options
        (demo if args.command == "demo" else parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command != "demo":  # no command: a usage error (help asked for, --help, goes to stdout)
        parser.print_help(sys.stderr)
        return 2
    if args.provider is None and (args.model or args.base_url):  # else the offline demo runs, ignoring them
        print("agentloop demo: --model and --base-url need --provider (without it the demo is offline)", file=sys.stderr)
        return 2
    if not args.speed > 0:  # NaN too: every pause of the scripted model would never end
        print("agentloop demo: --speed must be positive", file=sys.stderr)
        return 2
    from .demo import Options, run

    opts = Options(
        provider=args.provider,
        model=args.model,
        base_url=args.base_url,
        script=args.script,
        speed=args.speed,
        plain=args.plain,
    )
    return run(opts)


if __name__ == "__main__":
    sys.exit(main())
