"""The test suite's own hygiene checks (conftest) hold up on any machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import child_pids

_RENAME = (
    "import ctypes, sys\n"
    "ctypes.CDLL(None).prctl(15, b'agentloop-\\xc3\\0')\n"  # PR_SET_NAME: a name cut inside a character
    "print('named', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or sys.platform != "linux", reason="Linux /proc")
def test_a_process_whose_name_is_not_utf8_is_still_listed() -> None:
    # A process name ending inside a UTF-8 character (the kernel keeps 15 bytes of it) made the
    # leftover-process check of every test raise UnicodeDecodeError.
    child = subprocess.Popen([sys.executable, "-c", _RENAME], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"named\n"
        assert Path(f"/proc/{child.pid}/stat").read_bytes().count(b"\xc3") == 1
        assert child.pid in child_pids()
    finally:
        child.communicate(b"")
