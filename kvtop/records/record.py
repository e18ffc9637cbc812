"""The values a reader hands out: :class:`Record` (the envelope around one payload) and :class:`SourceId` (who
produced it). The format, its checks and its readers are the package's (kvtop/records/__init__.py); these classes
have a module of their own so that the spec (checks.py) and its accelerators (fast.py) can build them without
importing the package that imports them.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SourceId:
    """Who produced a record: a host, a rank on it, and a run name."""

    host: str = ""
    rank: int = 0
    run: str = ""

    def key(self) -> str:
        """A short stable name, used in MQTT topics and dashboard rows (``host/rank/run``)."""
        # Kept on the instance (not a field: equality, hashing and repr stay the three fields'): the session asks
        # for it once a record, and decode hands out one SourceId per source (_SOURCE_CACHE).
        key = self.__dict__.get("_key")
        if key is None:
            key = f"{self.host or '-'}/{self.rank}/{self.run or '-'}"
            object.__setattr__(self, "_key", key)
        return key

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "rank": self.rank, "run": self.run}

    @classmethod
    def local(cls, run: str = "", rank: int = 0) -> SourceId:
        return cls(host=socket.gethostname(), rank=rank, run=run or f"run-{os.getpid()}")


@dataclass(frozen=True)
class Record:
    kind: str
    data: dict[str, Any]
    source: SourceId = field(default_factory=SourceId)
    time: float = 0.0
    v: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"v": self.v, "kind": self.kind, "source": self.source.to_json(), "time": self.time,
                "data": self.data}
