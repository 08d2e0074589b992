"""`Frame`: one Python frame (file, line, function), the foundation both the compile log and
`sources` describe code places with. A foundation: imports nothing of tpu_nb."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    """One Python frame: where in the user's code (or a library) something happened."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"
