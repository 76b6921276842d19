"""A command run on a pseudo-terminal of a chosen width, and the screen it leaves.

``run_on_terminal(argv, columns)`` gives the command a pty as stdin, stdout and stderr (as an
interactive shell does; ``TIOCSWINSZ`` sets its size) and returns everything it wrote.
``Screen(columns).feed(data)`` plays those bytes as a VT100-style terminal does (carriage
return, line feed, backspace, cursor up and down, erase in line, and the wrap at the last
column: a character written there leaves the cursor pending until the next one, which goes to
the next line), keeping every line that scrolled by, so a test reads what a user sees.

Also a command-line tool: ``python tests/pty_helpers.py COLUMNS -- modelpatch ARGS...`` prints
the screen a command leaves (the transcripts in the CHANGELOG's terminal entry came from it).
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass

_CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])")


@dataclass
class Run:
    returncode: int
    raw: bytes
    columns: int

    @property
    def lines(self) -> list[str]:
        """The screen's rows."""
        return Screen(self.columns).feed(self.raw).lines()

    @property
    def logical_lines(self) -> list[str]:
        """The screen's lines, each with the rows the terminal wrapped it onto joined."""
        return Screen(self.columns).feed(self.raw).lines(joined=True)


def run_on_terminal(argv: list[str], columns: int, *, env: dict | None = None,
                    cwd: str | None = None, timeout: float = 180) -> Run:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = dict(os.environ if env is None else env, TERM="xterm", COLUMNS=str(columns))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                            start_new_session=True)
    os.close(slave)
    chunks, end = [], time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:                   # every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=max(1.0, end - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return Run(proc.returncode, b"".join(chunks), columns)


class Screen:
    """The lines a terminal ``columns`` wide shows after ``feed``; nothing scrolls away."""

    def __init__(self, columns: int):
        self.columns = columns
        self.rows: list[list[str]] = [[]]
        self.row = self.col = 0
        self.pending_wrap = False
        self.wrapped: set[int] = set()      # rows that continue the one above (a wrap)

    def feed(self, data: bytes) -> "Screen":
        text = data.decode("utf-8", errors="replace")
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                m = _CSI.match(text, i)
                if m is None:
                    i += 2                     # ESC and one character: ignored
                    continue
                self._csi(m.group(1), m.group(2))
                i = m.end()
                continue
            self._char(ch)
            i += 1
        return self

    def lines(self, joined: bool = False) -> list[str]:
        rows = ["".join(r) for r in self.rows]
        if not joined:
            return [r.rstrip() for r in rows]
        out: list[str] = []
        for i, row in enumerate(rows):
            if i in self.wrapped and out:
                out[-1] += row
            else:
                out.append(row)
        return [line.rstrip() for line in out]

    def _line(self) -> list[str]:
        while len(self.rows) <= self.row:
            self.rows.append([])
        line = self.rows[self.row]
        while len(line) < self.columns:
            line.append(" ")
        return line

    def _char(self, ch: str) -> None:
        if ch == "\r":
            self.col, self.pending_wrap = 0, False
        elif ch == "\n":
            self.row, self.pending_wrap = self.row + 1, False
            self.wrapped.discard(self.row)
            self._line()
        elif ch == "\b":
            self.col, self.pending_wrap = max(0, self.col - 1), False
        elif ch == "\t":
            self.col = min(self.columns - 1, (self.col // 8 + 1) * 8)
        elif ch == "\a" or ord(ch) < 32:
            pass
        else:
            if self.pending_wrap:
                self.row, self.col, self.pending_wrap = self.row + 1, 0, False
                self.wrapped.add(self.row)
            self._line()[self.col] = ch
            if self.col == self.columns - 1:
                self.pending_wrap = True
            else:
                self.col += 1

    def _csi(self, params: str, final: str) -> None:
        numbers = [int(p) for p in params.split(";") if p.isdigit()]
        n = numbers[0] if numbers else None
        self.pending_wrap = False
        if final == "A":
            self.row = max(0, self.row - (n or 1))
        elif final == "B":
            self.row += n or 1
            self._line()
        elif final == "C":
            self.col = min(self.columns - 1, self.col + (n or 1))
        elif final == "D":
            self.col = max(0, self.col - (n or 1))
        elif final == "G":
            self.col = min(self.columns - 1, max(0, (n or 1) - 1))
        elif final == "K":
            line = self._line()
            if not n:
                line[self.col:] = [" "] * (self.columns - self.col)
            elif n == 1:
                line[:self.col + 1] = [" "] * (self.col + 1)
            else:
                line[:] = [" "] * self.columns


def main(args: list[str]) -> int:
    columns, argv = int(args[0]), args[2:]
    run = run_on_terminal(argv, columns)
    for line in run.lines:
        print(line)
    print(f"[exit {run.returncode}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
