"""The line being typed, edited by the demo itself (the terminal echoes nothing).

With a terminal's own line editing (canonical mode) every key is echoed where
the cursor is, and the cursor is wherever the agent's output has got to: typing
while the model streams put the text in the middle of the answer. On a
terminal with a status line the demo reads keys one by one instead, and
`LineEditor` keeps the line, which the screen draws on a row of its own.

`LineEditor.feed(text)` applies what the terminal sent and returns the lines
that Enter completed; ``eof`` is set by Ctrl-D on an empty line. Keys: printable
text, Backspace, Delete, Left, Right, Home, End (and Ctrl-A, -E, -B, -F), Up
and Down (the lines sent before), Ctrl-U, Ctrl-K, Ctrl-W (delete to the start,
to the end, a word back). A bracketed paste keeps its line breaks (a CR LF is
one): several pasted lines are one message, sent by Enter. Any other key or control
character is ignored.
"""

from __future__ import annotations

import re

__all__ = ["LineEditor"]

PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"

# An escape sequence: CSI (ESC [ params final), SS3 (ESC O x), or ESC and one character (Alt+key).
_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|O.|[^\[O])", re.DOTALL)
# The start of one that the end of a read cut: the rest comes with the next read.
_CUT = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|O)?\Z")
# A sequence's meaning, by its final character (CSI and SS3 alike) or its number (CSI n ~).
_FINAL = {"A": "up", "B": "down", "C": "right", "D": "left", "H": "home", "F": "end"}
_TILDE = {"1": "home", "7": "home", "4": "end", "8": "end", "3": "delete"}
# Text: anything but a control character (C0, DEL, C1) or a line or paragraph separator; a tab is
# typed as a space. A run of it is inserted at once: a pasted file is one insertion, not one each.
_TEXT = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]+")
# In a paste the line breaks are text too.
_PASTED = re.compile(r"[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]+")
_AS_TYPED = str.maketrans({"\t": " ", "\r": "\n"})
_CONTROL = {
    "\x01": "home", "\x05": "end", "\x02": "left", "\x06": "right", "\x10": "up", "\x0e": "down",
    "\x7f": "backspace", "\x08": "backspace", "\x15": "kill_start", "\x0b": "kill_end", "\x17": "kill_word",
}


class LineEditor:
    """One line of input and a history of the lines sent (see the module docstring)."""

    def __init__(self, history: int = 100) -> None:
        self.text = ""
        self.cursor = 0  # an index into ``text``: 0 <= cursor <= len(text)
        self.eof = False  # Ctrl-D on an empty line: no more input is taken
        self._pending = ""  # an escape sequence that the end of a read cut (or the Escape key)
        self._pasting = False
        self._cr = False  # the paste so far ends with a CR: an LF next is part of the same line break
        self._history: list[str] = []
        self._limit = history
        self._recall = 0  # the history entry shown (len(history): the line being typed)
        self._draft = ""  # the line being typed, kept while the history is shown

    def clear(self) -> None:
        self.text, self.cursor = "", 0
        self._recall = len(self._history)

    def feed(self, data: str) -> list[str]:
        """Apply ``data`` as typed; returns the lines it completed (without their line breaks)."""
        if self._pending == "\x1b" and data[:1] not in ("[", "O"):
            self._pending = ""  # the ESC that ended the last read was the Escape key: ignored
        data, self._pending = self._pending + data, ""
        lines: list[str] = []
        i, n = 0, len(data)
        while i < n and not self.eof:
            run = (_PASTED if self._pasting else _TEXT).match(data, i)
            if run is not None:
                text = self._pasted(run.group()) if self._pasting else run.group()
                self._insert(text.translate(_AS_TYPED))
                i = run.end()
                continue
            self._cr = False
            ch = data[i]
            if ch == "\x1b":
                m = _SEQUENCE.match(data, i)
                if m is not None:
                    self._sequence(m.group())
                    i = m.end()
                    continue
                if _CUT.match(data, i):  # the read ended inside a sequence: wait for the rest
                    self._pending = data[i:]
                    break
                i += 1  # an ESC that starts no sequence
                continue
            if ch in "\r\n":  # not in a paste: a run of text holds those
                lines.append(self._submit())
            elif ch == "\x04" and not self._pasting:
                if self.text:
                    self._key("delete")
                else:
                    self.eof = True
            elif ch in _CONTROL and not self._pasting:
                self._key(_CONTROL[ch])
            i += 1  # any other control character is not text
        return lines

    def _pasted(self, text: str) -> str:
        """Pasted ``text`` with a CR LF (Windows line ends) as one line break, also when a read
        ended between the two."""
        if self._cr and text.startswith("\n"):
            text = text[1:]
        self._cr = text.endswith("\r")
        return text.replace("\r\n", "\n")

    def _sequence(self, seq: str) -> None:
        if seq == PASTE_START:
            self._pasting = True
        elif seq == PASTE_END:
            self._pasting = False
        elif self._pasting:
            return  # an escape sequence inside pasted text is not text
        elif seq.endswith("~"):
            key = _TILDE.get(seq[2:-1].split(";")[0])
            if key:
                self._key(key)
        elif seq[1:2] in ("[", "O") and seq[-1] in _FINAL:
            self._key(_FINAL[seq[-1]])

    def _insert(self, text: str) -> None:
        self.text = self.text[: self.cursor] + text + self.text[self.cursor :]
        self.cursor += len(text)

    def _submit(self) -> str:
        line = self.text
        if line.strip() and (not self._history or self._history[-1] != line):
            self._history = [*self._history, line][-self._limit :]
        self._draft = ""
        self.clear()
        return line

    def _key(self, key: str) -> None:
        text, cur = self.text, self.cursor
        if key == "left":
            self.cursor = max(0, cur - 1)
        elif key == "right":
            self.cursor = min(len(text), cur + 1)
        elif key == "home":
            self.cursor = 0
        elif key == "end":
            self.cursor = len(text)
        elif key == "backspace" and cur:
            self.text, self.cursor = text[: cur - 1] + text[cur:], cur - 1
        elif key == "delete":
            self.text = text[:cur] + text[cur + 1 :]
        elif key == "kill_start":
            self.text, self.cursor = text[cur:], 0
        elif key == "kill_end":
            self.text = text[:cur]
        elif key == "kill_word":
            start = len(text[:cur].rstrip())
            start = max(text.rfind(" ", 0, start), text.rfind("\n", 0, start)) + 1
            self.text, self.cursor = text[:start] + text[cur:], start
        elif key in ("up", "down"):
            self._browse(-1 if key == "up" else 1)

    def _browse(self, step: int) -> None:
        target = self._recall + step
        if not 0 <= target <= len(self._history):
            return
        if self._recall == len(self._history):
            self._draft = self.text
        self._recall = target
        self.text = self._history[target] if target < len(self._history) else self._draft
        self.cursor = len(self.text)
