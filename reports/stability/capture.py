"""What kernels print during a report, passed on with a cap.

A kernel printing 100 kB a call made a 22.7 MB log of a report with two failing kernels, the
verdicts buried in it. Everything a kernel call writes (to file descriptors 1 and 2, so C code and
device printf too, and to sys.stdout/sys.stderr even where they are not those descriptors) goes to
a scratch file; the first HEAD bytes of a run's kernel output go on to stderr as they come, the
last TAIL bytes at the end, with one line between saying how much was cut.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from typing import Iterator

HEAD = 4096
TAIL = 4096


class KernelOutput:
    def __init__(self, head: int = HEAD, tail: int = TAIL) -> None:
        self.head, self.head_left, self.tail_size = head, head, tail
        self.tail = b""
        self.past_head = 0  # bytes after the head, the kept tail included

    @contextmanager
    def capture(self) -> Iterator[None]:
        """Around one kernel call: what it prints is held back, then passed on within the cap."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        with tempfile.TemporaryFile() as scratch:
            saved = [os.dup(1), os.dup(2)]
            text = io.TextIOWrapper(os.fdopen(os.dup(scratch.fileno()), "wb"), write_through=True,
                                    errors="backslashreplace")
            try:
                os.dup2(scratch.fileno(), 1)
                os.dup2(scratch.fileno(), 2)
                with redirect_stdout(text), redirect_stderr(text):
                    yield
            finally:
                text.close()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
                self._take(scratch)

    def _take(self, f) -> None:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return
        f.seek(0)
        head = f.read(min(self.head_left, size))
        self.head_left -= len(head)
        self._emit(head)
        rest = size - len(head)
        if rest:
            f.seek(size - min(rest, self.tail_size))
            self.tail = (self.tail + f.read())[-self.tail_size:]
            self.past_head += rest

    def close(self) -> None:
        """At the end of the run: the tail, after a line saying what was cut."""
        cut = self.past_head - len(self.tail)
        if cut > 0:
            shown = self.head - self.head_left
            self._emit(f"\n[... {_size(cut)} of kernel output cut: {_size(self.past_head + shown)} printed in all, "
                       f"the first {_size(shown)} and the last {_size(len(self.tail))} shown ...]\n".encode())
        self._emit(self.tail)
        self.tail, self.past_head = b"", 0

    @staticmethod
    def _emit(data: bytes) -> None:
        if data:
            sys.stderr.write(data.decode(errors="backslashreplace"))
            sys.stderr.flush()


def _size(n: int) -> str:
    return f"{n} bytes" if n < 10_000 else f"{n / 1e3:.0f} kB" if n < 10_000_000 else f"{n / 1e6:.1f} MB"


__all__ = ["KernelOutput", "HEAD", "TAIL"]
