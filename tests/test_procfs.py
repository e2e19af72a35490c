"""Reading /proc while other processes come and go: a process name is bytes, not text."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agentloop.mcp._stop import _group_alive
from tests.conftest import child_pids
from tests.helpers import child_pids_alive, pid_alive

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's /proc")

# A process name is cut to 15 bytes: here in the middle of an "é", which is not UTF-8 then.
_NAMER = (
    "import ctypes, sys; ctypes.CDLL(None).prctl(15, b'agentloop-test\\xc3\\xa9', 0, 0, 0); "
    "print('named', flush=True); sys.stdin.read()"
)


@pytest.fixture
def oddly_named() -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose name (``/proc/PID/stat``'s second field) is not valid UTF-8, as any
    program on the machine may have (a name cut in the middle of a character)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _NAMER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"named\n"
        with open(f"/proc/{proc.pid}/comm", "rb") as f:
            assert f.read() == b"agentloop-test\xc3\n"
        yield proc
    finally:
        proc.kill()
        proc.communicate()


def test_the_tests_process_checks_read_a_name_that_is_not_utf8(oddly_named: subprocess.Popen[bytes]) -> None:
    """The check that no test leaves a process behind read every /proc/PID/stat as UTF-8 text:
    a process anywhere on the machine with such a name (another program's, running meanwhile)
    made the next test fail in its setup with UnicodeDecodeError."""
    assert oddly_named.pid in child_pids()
    assert oddly_named.pid in child_pids_alive() and pid_alive(oddly_named.pid)


def test_a_stdio_servers_group_check_reads_a_name_that_is_not_utf8(oddly_named: subprocess.Popen[bytes]) -> None:
    """Stopping an MCP stdio server checks whether its process group is still alive by reading
    every /proc/PID/stat: a process with such a name anywhere on the machine made the shutdown
    raise UnicodeDecodeError."""
    assert _group_alive(os.getpgid(oddly_named.pid))
