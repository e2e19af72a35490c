"""A stdio MCP server's process and our ends of its pipes, owned here rather than by an asyncio
transport (`agentloop._process` reads them the same way): starting the server awaits nothing, so
a host closing its loop under the start leaves no pipe half connected, and `ServerChild.close`
lets go of all of it at once, without the loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from .._process import Sink as _ChildSink
from .._process import _Child

_HIGH = 64 << 10  # bytes queued for the server's stdin past which a request waits (`pause_writing`)
_LOW = 16 << 10  # bytes queued below which it goes on


class Sink(_ChildSink, Protocol):
    """What is told of the server's pipes, its exit and stdin's flow control (`Pipes`)."""
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


def spawn(
    loop: asyncio.AbstractEventLoop, command: str, args: Sequence[str], env: Mapping[str, str], cwd: str | None
) -> ServerChild:
    """Start ``command`` in a session of its own (a new process group), on three pipes."""
    popen = subprocess.Popen(
        [command, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    return ServerChild(loop, popen)


class ServerChild(_Child):
    """The server process: its stdout and stderr read into a `Sink`, its stdin written with flow
    control. Like `_Child`, it holds the sink only in the loop's callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes]) -> None:
        super().__init__(loop, popen)
        self.queued = bytearray()  # bytes for stdin not yet taken by the pipe
        self.stdin_closing = False
        self.writing_paused = False

    def begin(self, sink: Sink) -> None:
        """Read stdout and stderr into ``sink``, and tell it of the exit."""
        os.set_blocking(self.files[0].fileno(), False)
        self.start(None, sink)

    @property
    def stdin_open(self) -> bool:
        return 0 in self.files and not self.stdin_closing

    def write(self, data: bytes, sink: Sink) -> None:
        """Write ``data`` to stdin, after what is queued; ``sink`` is paused past `_HIGH` bytes."""
        self.queued += data
        self._flush(sink)

    def close_stdin(self, sink: Sink) -> None:
        """Close stdin once what is queued is written: the server reads to the end, then exits."""
        self.stdin_closing = True
        self._flush(sink)

    def _flush(self, sink: Sink) -> None:
        file = self.files.get(0)
        if file is None:
            return
        try:
            written = os.write(file.fileno(), self.queued) if self.queued else 0
        except BlockingIOError:
            written = 0
        except OSError:  # the server closed its stdin, or exited
            self._lose_stdin(sink)
            return
        del self.queued[:written]
        if self.queued:
            self.loop.add_writer(file.fileno(), self._flush, sink)
        else:
            self.loop.remove_writer(file.fileno())
        if self.writing_paused != (len(self.queued) > (_LOW if self.writing_paused else _HIGH)):
            self.writing_paused = not self.writing_paused
            (sink.pause_writing if self.writing_paused else sink.resume_writing)()
        if not self.queued and self.stdin_closing:
            self._lose_stdin(sink)

    def _lose_stdin(self, sink: Sink) -> None:
        self.queued.clear()
        self._drop(0)
        sink.pipe_connection_lost(0)

    def pause_reading(self, paused: bool, sink: Sink) -> None:
        """Stop (or go on) reading stdout: the session is behind (or has caught up)."""
        file = self.files.get(1)
        if file is None:
            return
        if paused:
            self.loop.remove_reader(file.fileno())
        else:
            self.loop.add_reader(file.fileno(), self._read, 1, sink)
