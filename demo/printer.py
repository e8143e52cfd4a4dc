"""The demo's output: tables through rich when it is importable and the output is a stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from tenplex.compiler.emit import table


class Printer:
    """Tables through rich when it is importable and the output is a stream; plain text otherwise."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        try:
            from rich.console import Console
        except ImportError:
            self.console = None
            return
        self.console = Console(file=stream, highlight=False)
        if not self.console.is_terminal:
            self.console = Console(file=stream, highlight=False, width=110)

    def line(self, text: str = "", style: str | None = None) -> None:
        if self.console is None:
            print(text, file=self.stream)
        else:
            self.console.print(text, style=style, markup=False, soft_wrap=True)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[object]], align: str) -> None:
        if self.console is None:
            print(table(headers, rows, align=align), file=self.stream)
            return
        from rich import box
        from rich.table import Table

        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
        for h, a in zip(headers, align):
            t.add_column(h, justify="right" if a == "r" else "left", no_wrap=True)
        for row in rows:
            t.add_row(*map(str, row))
        self.console.print(t)

    def status(self, text: str):
        """A transient spinner on terminals; nothing elsewhere."""
        import contextlib

        if self.console is None or not self.console.is_terminal:
            return contextlib.nullcontext()
        return self.console.status(text)
