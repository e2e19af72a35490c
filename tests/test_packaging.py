"""What a user gets on install: one version everywhere, an import that changes nothing in the
host's process, and the MCP SDK optional, with a missing one naming the extra to install.

The built wheel and sdist themselves are checked by ``.ci/run`` (``.ci/check_dist.py``): building
needs the build backend, which the test environment does not have to hold.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import agentloop

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_version_is_the_same_in_pyproject_the_package_and_the_changelog() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.findall(r"^## \[(\d[^\]]*)\]", changelog, re.MULTILINE)
    assert released, "CHANGELOG.md has no released version"
    assert project["version"] == agentloop.__version__ == released[0]


def test_importing_every_module_changes_nothing_in_the_process() -> None:
    """No thread started, no logging handler or level set, no signal handler or hook replaced, no
    warning: a library's import leaves the host's process as it was."""
    proc = _run(
        """
        import asyncio, logging, pkgutil, importlib, signal, sys, threading
        signals = [signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGWINCH, signal.SIGTSTP]
        def state():
            return (
                sorted(t.name for t in threading.enumerate()),
                list(logging.root.handlers), logging.root.level, logging.lastResort,
                [signal.getsignal(s) for s in signals],
                sys.excepthook, threading.excepthook, sys.unraisablehook,
                type(asyncio.get_event_loop_policy()),
            )
        before = state()
        import agentloop
        names = ["agentloop", *(m.name for m in pkgutil.walk_packages(agentloop.__path__, "agentloop."))]
        for name in names:
            importlib.import_module(name)
        assert state() == before, (before, state())
        handlers = {
            name: logger.handlers for name, logger in logging.root.manager.loggerDict.items()
            if isinstance(logger, logging.Logger) and name.startswith("agentloop")
            and any(not isinstance(h, logging.NullHandler) for h in logger.handlers)
        }
        assert handlers == {}, handlers
        print(len(names))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert int(proc.stdout) > 50  # every module was imported, subpackages included


def test_without_the_mcp_sdk_the_rest_imports_and_agentloop_mcp_names_the_extra() -> None:
    proc = _run(
        """
        import sys
        sys.modules["mcp"] = None  # as if not installed: importing it raises ImportError
        import agentloop, agentloop.models, agentloop.sessions, agentloop.policies, agentloop.testing
        import agentloop.demo.app
        try:
            import agentloop.mcp
        except ImportError as exc:
            print(exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "agentloop.mcp needs the MCP SDK (mcp >= 2.3): pip install 'agentloop[mcp]'"


def test_an_mcp_sdk_too_old_for_the_http_transport_names_the_extra_at_import() -> None:
    """mcp 2.0 to 2.2 import, but their HTTP client takes no ``max_sse_event_size``: every call
    over streamable HTTP failed with a ``TypeError`` from inside the SDK."""
    proc = _run(
        """
        import contextlib
        import mcp.client.streamable_http as sdk
        @contextlib.asynccontextmanager
        async def streamable_http_client(url, *, http_client=None, terminate_on_close=True):
            yield None
        sdk.streamable_http_client = streamable_http_client  # the signature mcp 2.2 has
        try:
            import agentloop.mcp
        except ImportError as exc:
            print(exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "agentloop.mcp needs the MCP SDK (mcp >= 2.3): pip install 'agentloop[mcp]'"
