"""Reference outputs stored on disk, so a CI job compares a target against yesterday's reference without
recomputing it (Polygraphy's --save-outputs / --load-outputs, for trtforge's chunked runs).

The file is an .npz: per chunk row, its inputs' content hash names the row (`row/<hash>/<output>`), and
`meta.json` (as a uint8 array) records the reference ONNX, its graph hash, the output names and when it was
made. Rows are keyed by content, not by position, so a run that batches the same chunks differently (another
engine's batch cap) still finds them; a run whose chunks differ (other inputs, chunk or overlap) is refused
naming the first chunk that has no stored outputs.
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.backends.base import RunnerLifecycle
from trtforge.core.artifacts import NpzStream
from trtforge.core.errors import UserError

FORMAT = "trtforge.reference/1"


def row_key(feeds: dict[str, np.ndarray], row: int) -> str:
    """The content hash of one row of a stacked feed dict (names, dtypes, shapes and bytes)."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        part = np.ascontiguousarray(np.asarray(feeds[name])[row])
        digest.update(f"{name}|{part.dtype.str}|{part.shape}".encode())
        digest.update(part.tobytes())
    return digest.hexdigest()[:32]


def batch_rows(feeds: dict[str, np.ndarray]) -> int:
    return int(np.asarray(next(iter(feeds.values()))).shape[0]) if feeds else 0


class RecordingReference(RunnerLifecycle):
    """Runs the reference and keeps every row it answered, to be written by `save`."""

    def __init__(self, runner: Any, reference_path: Path, graph_hash: str | None):
        self.runner = runner
        self.input_names, self.output_names = list(runner.input_names), list(runner.output_names)
        self.rows: dict[str, dict[str, np.ndarray]] = {}
        self.meta = {
            "format": FORMAT,
            "reference_onnx": str(reference_path),
            "graph_hash": graph_hash,
            "outputs": self.output_names,
            "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.runner.run(feeds)
        for r in range(batch_rows(feeds)):
            self.rows.setdefault(row_key(feeds, r), {name: np.asarray(out[name])[r] for name in self.output_names})
        return out

    def close(self) -> None:
        self.runner.close()

    def save(self, path: Path) -> None:
        stream = NpzStream(path)
        try:
            stream.write("meta.json", np.frombuffer(json.dumps({**self.meta, "rows": len(self.rows)}).encode(), dtype=np.uint8))
            for key, outputs in self.rows.items():
                for name, value in outputs.items():
                    stream.write(f"row/{key}/{name}", value)
        except BaseException:
            stream.abort()
            raise
        stream.close()


class StoredReference(RunnerLifecycle):
    """Answers a batch from a file `RecordingReference.save` wrote; every row must be in it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"--load-reference {self.path} does not exist; write one with run --save-reference first.")
        try:
            self._npz = np.load(self.path, allow_pickle=False)
            self.meta = json.loads(bytes(self._npz["meta.json"]).decode())
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError, json.JSONDecodeError):
            raise UserError(
                f"--load-reference {self.path} is not a stored reference (made by run --save-reference); check the path or save it again."
            ) from None
        if self.meta.get("format") != FORMAT or not isinstance(self.meta.get("outputs"), list):
            raise UserError(
                f"--load-reference {self.path} has format {self.meta.get('format')!r}, not {FORMAT}; save it again with this trtforge."
            )
        self.output_names = list(self.meta["outputs"])
        self.input_names: list[str] = []

    def check_outputs(self, names: list[str]) -> None:
        missing = [n for n in names if n not in self.output_names]
        if missing:
            raise UserError(
                f"--load-reference {self.path} holds outputs {', '.join(self.output_names)}, not '{missing[0]}'; "
                "save the reference again for this model."
            )

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = []
        for r in range(batch_rows(feeds)):
            key = row_key(feeds, r)
            try:
                rows.append({name: self._npz[f"row/{key}/{name}"] for name in self.output_names})
            except KeyError:
                raise UserError(
                    f"--load-reference {self.path} has no reference outputs for a chunk of this run (row {r} of a "
                    "batch): the inputs, --chunk, --overlap or the tokenizer differ from the run that saved it; "
                    "use the same ones or save the reference again."
                ) from None
        return {name: np.stack([row[name] for row in rows]) for name in self.output_names}

    def close(self) -> None:
        self._npz.close()
