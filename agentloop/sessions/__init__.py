"""Session stores: persist a transcript as it is committed, and resume it after a crash.

`JsonlSession` keeps one append-only JSON Lines file per session. Each line is a
whole record, written by one ``os.write`` call of the full line:

    {"type":"message","message":{...}}         one committed `Message`
    {"type":"event","event":{"type":...}}      an event of interest (turn_ended, ...)
    {"type":"checkpoint","messages":[...]}     the repaired transcript a resume started from

Crash safety, the invariant: a line is committed once its final ``\\n`` is in
the file. A crash (even SIGKILL, even between two halves of a short write) can
only leave a torn *last* line without its newline; `JsonlSession.load` skips it
with a warning, and everything before it is intact. Reopening a file for
appending cuts such a torn tail off first, so a new line is never glued to it.
(A last line that is a whole record, its newline alone missing, is no tear:
JSON Lines lets a file end so. It is loaded, and ended with a newline on reopening.)

Durability is the ``fsync`` policy: ``"always"`` fsyncs after every append
(survives power loss, costs one disk flush per message); ``"batch"`` (the
default) fsyncs on `flush`, on `close` and, with ``fsync_every=N``, every N
appends (survives a process crash, since the data is in the OS page cache, but
a power loss may lose the last unsynced appends); ``"never"`` leaves it to the OS.

One writer at a time: from the moment the file is opened for appending until it is
closed, the session holds a lock on it (``flock`` on POSIX; on Windows, ``msvcrt.locking``
of one byte far past the end, where no reader looks), and a second writer (another
process, or another session object of this one) gets `SessionLockedError` instead of
interleaving its records with the first's. The operating system drops the lock with the
process that held it, so a crash leaves none behind. The child of a ``fork`` (without exec)
lets go of the descriptors it inherited at once: it neither writes through the parent's lock
nor keeps it after the parent closes the file. Reading (`load`) takes no lock and
is never refused.

Writes are synchronous on purpose: appending one line to a local file is a
single syscall that lands in the page cache in microseconds, cheaper than
handing it to a thread, and it keeps the order of records equal to the order of
commits without a queue that a crash could lose. Only ``fsync="always"`` waits
for the disk on each append; choose ``"batch"`` when that latency matters.

The package: `JsonlSession` and the `SessionStore` protocol (`_store`), the records written
and read (`_format`), durable appends (`_files`), the writer's lock (`_locking`), reading a
file back (`_load`).
"""

from .._errors import SessionLockedError
from ._format import event_to_json as event_to_json  # importable from here, though not in __all__
from ._load import LoadedSession
from ._store import FsyncPolicy, JsonlSession, SessionStore

__all__ = ["FsyncPolicy", "JsonlSession", "LoadedSession", "SessionLockedError", "SessionStore"]
