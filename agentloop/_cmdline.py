"""The credentials a command line carries, redacted for showing it (`shown_args`).

A command line is shown to the model (a `ProcessResult`'s ``args``) and in logs and labels (an
MCP server's ``stdio:<command>``). What is redacted: the value of a credential-named option
(``--token X``, ``--password=X``), variable (``TOKEN=X``, ``PGPASSWORD=X``) or header
(``Authorization: Bearer X``, and after ``-H``/``--header`` without the space), a credential
variable given as an option's value (``--env=API_KEY=X``), the password of
``--user``/``--proxy-user user:password`` (and of curl's ``-u``/``-U``), mysql's ``-pPASSWORD``,
sshpass's and mongosh's ``-p X`` and redis-cli's ``-a X`` (or joined: ``-pX``), a URL's user
info (``postgres://user:password@host/db``) and credential query parameters, and the same inside
a shell script given as one argument (``sh -c "PGPASSWORD=X psql ..."``).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable

__all__ = ["hidden_values", "is_credential_name", "shown_args"]

#: Words in an option, variable or header name that mark its value as a credential
#: (``--token``, ``--password=``, ``GITHUB_TOKEN=``, ``Authorization:``, ``--api-key``...).
_CREDENTIAL_WORDS = ("token", "secret", "pass", "auth", "key", "cookie", "credential")
_REDACTED = "[REDACTED]"
#: Options whose value is ``user:password`` (curl, wget).
_USER_OPTIONS = frozenset({"--user", "--proxy-user"})
#: curl's short forms of them; another program's ``-u`` is something else (``git push -u``).
_CURL_USER_OPTIONS = ("-u", "-U")
#: The programs whose ``-pPASSWORD`` is a password (for another, ``-p`` is a port, a path...).
_MYSQL = frozenset({"mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlshow", "mysqlcheck", "mysqlslap",
                    "mariadb", "mariadb-dump", "mariadb-admin"})  # fmt: skip
#: Programs whose short option takes a password, as the next argument or joined to it
#: (``sshpass -p X``, ``sshpass -pX``, ``redis-cli -a X``); for another program, ``-p`` is a port...
_PASSWORD_OPTIONS = {"sshpass": "-p", "redis-cli": "-a", "mongo": "-p", "mongosh": "-p"}
#: The programs named on a command line that say whose options follow: those above, and those a
#: password program runs (``sshpass -p X ssh -p 2222 host``: the second ``-p`` is ssh's port).
_PROGRAMS = frozenset({"curl", *_MYSQL, *_PASSWORD_OPTIONS, "ssh", "scp", "sftp", "rsync"})


def is_credential_name(name: str) -> bool:
    """Whether an option, variable or header called ``name`` carries a credential."""
    lowered = name.lower()
    return any(word in lowered for word in _CREDENTIAL_WORDS)


def shown_args(args: tuple[str, ...]) -> list[str]:
    """``args`` with the credentials a command line carries replaced by ``[REDACTED]`` (see the
    module's docstring). The rest is shown as it is, so the model still sees what ran."""
    shown: list[str] = []
    hide: Callable[[str], str] | None = None
    program = ""
    for arg in args:
        if hide is not None:
            shown.append(hide(arg))
            hide = None
            continue
        name = os.path.basename(arg)
        if name in _PROGRAMS:
            program = name
        hide = _hides_next(arg, program)
        shown.append(arg if hide is not None else _shown_arg(arg, program))
    return shown


def _hides_next(arg: str, program: str) -> Callable[[str], str] | None:
    """How the argument after ``arg`` is shown, when ``arg`` is an option that takes it as a
    credential (``--token X``, ``--user bob:X``, ``-H 'Authorization: X'``); None otherwise."""
    if not arg.startswith("-") or "=" in arg or _joined(arg, program) is not None:
        return None
    if arg in _USER_OPTIONS or (program == "curl" and arg in _CURL_USER_OPTIONS):
        return _user_password
    if arg == "--header" or (program == "curl" and arg == "-H"):
        return _header
    if is_credential_name(arg.lstrip("-")) or arg == _PASSWORD_OPTIONS.get(program):
        return _redacted
    return None


def _redacted(_value: str) -> str:
    return _REDACTED


def _user_password(value: str) -> str:
    """``user:password`` with the password redacted; ``value`` itself without one."""
    user, colon, password = value.partition(":")
    return f"{user}:{_REDACTED}" if colon and password else value


def _header(value: str) -> str:
    """A header (``Name: value``, or ``Name:value`` as curl takes it too) with its value
    redacted when its name is a credential's."""
    name, colon, rest = value.partition(":")
    if colon and rest.strip() and " " not in name and is_credential_name(name):
        return f"{name}:{' ' if rest.startswith(' ') else ''}{_REDACTED}"
    return value


def _shown_arg(arg: str, program: str) -> str:
    """One argument with the credential it holds, if any, redacted."""
    option, eq, value = arg.partition("=")
    if eq and option in _USER_OPTIONS:
        return f"{option}={_user_password(value)}"
    if eq and option == "--header":
        return f"{option}={_header(value)}"
    joined = _joined(arg, program)
    if joined is not None:
        return joined
    header, colon, rest = arg.partition(":")
    if colon and rest.startswith(" ") and " " not in header and is_credential_name(header):
        return f"{header}: {_REDACTED}"
    if eq and value and "://" not in option and " " not in option and is_credential_name(option):
        return f"{option}={_REDACTED}"  # ``TOKEN=X``, all of what follows: it may hold spaces
    name, eq2, rest = value.partition("=")
    if eq and option.startswith("-") and eq2 and rest and " " not in name and is_credential_name(name):
        return f"{option}={name}={_REDACTED}"  # a variable given as an option's value: ``--env=TOKEN=X``
    if any(c.isspace() for c in arg):
        return _shown_script(arg)
    if "://" in arg:
        return _shown_url(arg)
    return arg


def _joined(arg: str, program: str) -> str | None:
    """``arg`` shown, when it is a password joined to its option (mysql's ``-pPASSWORD``, curl's
    ``-uuser:password``); None otherwise."""
    if program in _MYSQL and len(arg) > 2 and arg.startswith("-p"):
        return f"-p{_REDACTED}"
    flag = _PASSWORD_OPTIONS.get(program)
    if flag is not None and len(arg) > 2 and arg.startswith(flag):
        return f"{flag}{_REDACTED}"
    if program == "curl" and len(arg) > 2 and arg.startswith(_CURL_USER_OPTIONS):
        return arg[:2] + _user_password(arg[2:])
    return None


def _shown_script(script: str) -> str:
    """A shell script given as one argument (``sh -c "..."``), or any text with spaces, with
    the credentials of its words redacted where they stand; when one cannot be found as
    written (an escaped quote in it), the words are shown requoted instead."""
    words = _words(script)
    if len(words) < 2:
        return script  # one word with spaces around it: nothing to split
    found = [v for word, shown in zip(words, shown_args(tuple(words)), strict=True)
             if shown != word for v in hidden_values(word, shown)]  # fmt: skip
    if not found:
        return script
    if not all(value in script for value in found):
        return shlex.join(shown_args(tuple(words)))
    for value in sorted(found, key=len, reverse=True):
        script = script.replace(value, _REDACTED)
    return script


def hidden_values(arg: str, shown: str) -> list[str]:
    """What `shown_args` hid of ``arg``, given how it shows it (``shown``): the text each
    ``[REDACTED]`` stands for; for a script shown requoted, what it hid of each word; the
    whole of ``arg`` when that cannot be told."""
    literal = map(re.escape, shown.split(_REDACTED))
    match = re.fullmatch("(.*)".join(literal), arg, re.DOTALL)
    found = list(match.groups()) if match is not None else []
    words = _words(arg)
    if len(words) > 1 and shown == shlex.join(shown_args(tuple(words))):
        # Requoted: the text the quotes matched as written is the password quoted (``'a'"'"'b'``
        # for ``a'b``, when ``[REDACTED]`` came out quoted where the password stood); the words
        # say what it is.
        found += [v for word, part in zip(words, shown_args(tuple(words)), strict=True)
                  if part != word for v in hidden_values(word, part)]  # fmt: skip
    return found or [arg]


def _words(script: str) -> list[str]:
    """The words of a shell script, as the shell splits them (at whitespace, for one with an
    unbalanced quote)."""
    try:
        return shlex.split(script)
    except ValueError:
        return script.split()


def _shown_url(url: str) -> str:
    """``url`` with its user info and the values of its credential query parameters redacted."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = f"{_REDACTED}@{authority.rpartition('@')[2]}"
    path, question, query = tail.partition("?")
    if question:
        pairs = [pair.partition("=") for pair in query.split("&")]
        query = "&".join(
            f"{k}={_REDACTED}" if eq and v and is_credential_name(k) else k + eq + v for k, eq, v in pairs
        )
    return f"{scheme}{sep}{authority}{path}{question}{query}"
