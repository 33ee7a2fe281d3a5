"""Files on disk: atomic writes, content hashes and the JSON sidecar beside every artifact.

Every artifact `X` gets `X.json` describing where it came from, so that a later step (or a person)
can tell whether it is still valid. Writes go to a temp file in the same folder and are renamed into
place, so an interrupted step never leaves a half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from trtforge.core.errors import UserError

_published: list[Path] = []


def publish(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Rename a finished temp file onto its final name and remember it: an interrupted command then says
    exactly which complete files it had already written (`published()`)."""
    os.replace(tmp, final)
    _published.append(Path(final))


def published() -> list[Path]:
    """Files this process has written that are still there (a staging folder's are gone), in order, no repeats."""
    return [p for p in dict.fromkeys(_published) if p.exists()]


def sidecar_path(artifact: str | os.PathLike) -> Path:
    return Path(str(artifact) + ".json")


def ensure_writable_dir(path: Path) -> None:
    """Create the parent folder of `path`, or say which folder cannot be written."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output folder {parent}: {exc.strerror}; choose a writable path.") from None
    if not os.access(parent, os.W_OK):
        raise UserError(f"output folder {parent} is not writable; choose another output path.")


def _temp_beside(final: Path) -> Path:
    """An empty temp file in `final`'s folder (created if need be), named after it: renamed onto it when complete."""
    ensure_writable_dir(final)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    return Path(tmp)


def _cannot_write(final: Path, exc: OSError) -> UserError:
    return UserError(f"could not write {final}: {exc.strerror or exc}; free space or choose another path.")


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `final`; rename it onto `final` only if the block succeeds."""
    final = Path(final)
    tmp_path = _temp_beside(final)
    try:
        yield tmp_path
        publish(tmp_path, final)
    except OSError as exc:
        tmp_path.unlink(missing_ok=True)
        raise _cannot_write(final, exc) from None
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """Serialise the final writes of concurrent steps aimed at the same output (an artifact and its
    sidecar must come from the same run): an exclusive flock on a `.lock` file beside it, removed again by its holder
    (a lock taken on a file its holder has just removed is taken again on the new one). waiting(line) is told when
    another process holds it, before this one waits for it."""
    import fcntl

    path = Path(path)
    ensure_writable_dir(path)
    lock_path = path.with_name(f".{path.name}.lock")
    told = False
    while True:
        fh = open(lock_path, "a")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None and not told:
                waiting(f"waiting for another trtforge process writing {path} to finish")
                told = True
            fcntl.flock(fh, fcntl.LOCK_EX)
        if _inode(lock_path) == (os.fstat(fh.fileno()).st_dev, os.fstat(fh.fileno()).st_ino):
            break
        fh.close()  # its holder removed it while this process waited: lock the file now there
    try:
        yield
    finally:
        lock_path.unlink(missing_ok=True)  # while held: a waiter then finds its file gone and locks a new one
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


@contextlib.contextmanager
def output_locks(paths: Iterable[str | os.PathLike], waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """output_lock on every path, taken in one order (by resolved path), so two steps sharing some outputs never
    hold one lock each while waiting for the other's."""
    with contextlib.ExitStack() as stack:
        for path in sorted(dict.fromkeys(Path(p).resolve() for p in paths), key=str):
            stack.enter_context(output_lock(path, waiting))
        yield


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, payload: Any) -> None:
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=False, default=json_default) + "\n")


def json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def write_sidecar(artifact: str | os.PathLike, payload: dict[str, Any]) -> Path:
    path = sidecar_path(artifact)
    write_json_atomic(path, payload)
    return path


def read_sidecar(artifact: str | os.PathLike, required: bool = True) -> dict[str, Any] | None:
    """Read `artifact.json`; a missing file is None (or an error if required), a corrupt one an error."""
    path = sidecar_path(artifact)
    if not path.exists():
        if required:
            raise UserError(f"sidecar {path} is missing; re-create {artifact} with trtforge.")
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad UTF-8 or JSON
        reason = "nested too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())[:200]
        raise UserError(f"sidecar {path} is not valid JSON ({reason}); delete it and re-create {artifact}.") from None
    if not isinstance(data, dict):
        raise UserError(f"sidecar {path} does not hold a JSON object; delete it and re-create {artifact}.")
    return data


def declared_output_kinds(onnx_path: str | os.PathLike) -> dict[str, str | None]:
    """{output: kind} as the ONNX's sidecar (the export's) declares them; empty where it has none."""
    side = read_sidecar(onnx_path, required=False) or {}
    return {o["name"]: o.get("kind") for o in side.get("outputs") or [] if isinstance(o, dict) and "name" in o}


def linked_paths(artifact: Path, recorded: str) -> list[Path]:
    """Where a path that artifact's sidecar records (`parent`, `source_onnx`) may be: as recorded when absolute; a relative
    one was recorded as typed, against a working folder now unknown, so against this one, against the artifact's own
    folder (the link's and its target's), and as that folder's file of the same name (steps write beside their input)."""
    path = Path(recorded)
    if path.is_absolute():
        return [path]
    folders = dict.fromkeys([Path(artifact).absolute().parent, Path(artifact).resolve().parent])
    return list(dict.fromkeys([path.absolute(), *(f / path for f in folders), *(f / path.name for f in folders)]))


def linked_path(artifact: Path, recorded: str) -> Path:
    """The file a sidecar's recorded path names: the first of linked_paths that has a sidecar, else as recorded."""
    return next((p for p in linked_paths(artifact, recorded) if sidecar_path(p).exists()), Path(recorded))


def sidecar_chain(path: str | os.PathLike, first: dict[str, Any] | None = None, strict: bool = False) -> list[tuple[Path, dict[str, Any]]]:
    """(file, its sidecar) for this ONNX or engine and every file it was made from, nearest first, as far as readable
    sidecars lead (`parent`, else `source_onnx`; a relative one found by linked_path; a file seen before, however
    spelled, ends it). `first`: the start's sidecar where the caller holds it already. strict: a sidecar up the chain
    that is not valid JSON is the UserError read_sidecar gives (where a wrong answer would follow from stopping), else
    it ends the chain."""
    chain: list[tuple[Path, dict[str, Any]]] = []
    current: Path | None = Path(path)
    side, seen = first, set()
    while current is not None and os.path.realpath(current) not in seen:
        seen.add(os.path.realpath(current))
        if side is None:
            try:
                side = read_sidecar(current, required=False)
            except UserError:
                if strict:
                    raise
                side = None
        if not side:
            break
        chain.append((current, side))
        recorded = side.get("parent") or side.get("source_onnx")
        current, side = (linked_path(current, str(recorded)) if recorded else None), None
    return chain


def lineage(onnx_path: str | os.PathLike) -> dict[Path, str]:
    """The ONNX and every file it was made from, as far as the sidecars lead, resolved: {path: what it is} (a recorded
    parent counts even where it has no sidecar of its own). The files a step must never overwrite."""
    start = Path(onnx_path)
    found: dict[Path, str] = {start.resolve(): "the ONNX being built"}
    queue, seen = [start], set()
    while queue:
        path = queue.pop()
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        side = None
        for where in (path, path.resolve()):  # a symlink's own sidecar, else its target's
            try:
                side = read_sidecar(where, required=False)
            except UserError:
                side = None
            if side:
                break
        recorded = (side or {}).get("parent") or (side or {}).get("source_onnx")
        if not recorded:
            continue
        for parent in linked_paths(path, str(recorded)):
            found.setdefault(parent.resolve(), f"the file {path.name} was made from")
            queue.append(parent)
    return found


PathLike = str | os.PathLike


def _file_key(path: Path) -> str:
    """One spelling for every way of naming a file: symlinks, `..`, `./x` and `x` resolved."""
    return os.path.realpath(path)


def _inode(path: Path) -> tuple[int, int] | None:
    """(device, inode) of an existing file: the same file under another name (a hard link, a bind mount)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _protected(inputs: Iterable[PathLike | None]) -> tuple[dict[str, str], dict[tuple[int, int], str], dict[str, Path]]:
    """What a step must not write over, each with how a refusal names it: every input, its sidecar (the symlink's
    and its target's), an ONNX's external data (NAME.data), and every file up its `parent` lineage with theirs; and
    the input folders ({resolved: as given}), whose files are inputs too."""
    by_path: dict[str, str] = {}
    folders: dict[str, Path] = {}

    def add(path: Path, what: str) -> None:
        by_path.setdefault(_file_key(path), what)

    for given in inputs:
        if given is None or str(given) == "":
            continue
        given = Path(given)
        add(given, f"its input {given}")
        if given.is_dir():
            folders[_file_key(given)] = given
        for side in dict.fromkeys([sidecar_path(given), sidecar_path(given.resolve())]):
            add(side, f"{side}, the sidecar of its input {given}")
        data = Path(str(given) + ".data")
        if data.exists():
            add(data, f"{data}, the external weights of its input {given}")
        if given.is_file():
            for path, _ in lineage(given).items():
                add(path, f"{path}, which its input {given} was made from")
                add(sidecar_path(path), f"{sidecar_path(path)}, the sidecar of {path} (which its input {given} was made from)")
    by_inode = {ino: what for key, what in by_path.items() if (ino := _inode(Path(key))) is not None}
    return by_path, by_inode, folders


# Files trtforge itself writes: found in an input folder (a data folder that also holds the models), they are not data.
OWN_SUFFIXES = (".onnx", ".data", ".engine", ".plan", ".cache", ".json", ".lock")


def _in_folder(key: str, folders: dict[str, Path]) -> str | None:
    """How a refusal names the input folder holding the existing file `key`, if one does and it may be read as data."""
    if key.endswith(OWN_SUFFIXES):
        return None
    for folder_key, folder in folders.items():
        if key.startswith(folder_key.rstrip(os.sep) + os.sep) and os.path.exists(key):
            return f"a file of its input folder {folder}"
    return None


def refuse_overwrite(
    step: str, inputs: Iterable[PathLike | None], artifacts: Iterable[PathLike | None] = (), files: Iterable[PathLike | None] = ()
) -> None:
    """The one check every step that writes runs before any work: no file it writes may be one of its inputs, an input's
    sidecar, or a file up an input's `parent` lineage (however spelled: symlinks, relative paths), and no two outputs may
    be one file. artifacts: outputs written with their sidecar X.json (an .onnx also with X.data); files: outputs written
    alone (a report, an .npz). A UserError names both paths."""
    by_path, by_inode, folders = _protected(inputs)
    written: dict[str, str] = {}
    for out, with_sidecar in [(a, True) for a in artifacts] + [(f, False) for f in files]:
        if out is None or str(out) == "":
            continue
        out = Path(out)
        extra = [(sidecar_path(out), f"{sidecar_path(out)} (the sidecar of {out})")] if with_sidecar else []
        if with_sidecar and out.suffix == ".onnx":
            extra.append((Path(str(out) + ".data"), f"{out}.data (the external weights of {out})"))
        for path, label in [(out, str(out)), *extra]:
            key = _file_key(path)
            what = by_path.get(key) or by_inode.get(_inode(path) or (-1, -1)) or _in_folder(key, folders)
            if what is not None:
                raise UserError(f"{step} would write {label} over {what}; choose another output path.")
            if key in written:
                raise UserError(f"{step} would write {label} and {written[key]} as one file; give each output its own path.")
            written[key] = label


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_sha256(path: str | os.PathLike) -> str:
    """sha256 of an artifact's bytes, as its sidecar records them at write time; an ONNX whose weights sit in NAME.data
    (onnxio.save_onnx) hashes both files, so edited weights count as an edit."""
    path = Path(path)
    data = Path(str(path) + ".data")
    if path.suffix == ".onnx" and data.is_file():
        return sha256_bytes((sha256_file(path) + sha256_file(data)).encode())
    return sha256_file(path)


def content_mismatch(path: str | os.PathLike, recorded: str | None) -> str | None:
    """Why `path` is not the file its sidecar recorded (None: it is): missing, no hash recorded, or other bytes."""
    path = Path(path)
    if not path.is_file():
        return f"{path} is missing"
    if not recorded:
        return f"{path}'s sidecar records no content hash (written by an older trtforge or by hand)"
    if content_sha256(path) != recorded:
        return f"{path} does not hold the bytes its sidecar recorded (edited, truncated or replaced after it was written)"
    return None


def onnx_graph_hash(model: Any) -> str:
    """Hash of an ONNX graph's structure and weights, independent of file layout and doc strings.

    External data is hashed by content (the model must have its data loaded), so the same graph saved
    inline or with external data hashes the same.
    """
    import onnx
    from onnx import numpy_helper

    digest = hashlib.sha256()
    graph = model.graph
    for opset in model.opset_import:
        digest.update(f"opset:{opset.domain}:{opset.version};".encode())
    for value in list(graph.input) + list(graph.output):
        digest.update(value.SerializeToString(deterministic=True))
    for init in graph.initializer:
        digest.update(f"init:{init.name}:{init.data_type}:{list(init.dims)};".encode())
        digest.update(numpy_helper.to_array(init).tobytes())
    for node in graph.node:
        stripped = onnx.NodeProto()
        stripped.CopyFrom(node)
        stripped.doc_string = ""
        digest.update(stripped.SerializeToString(deterministic=True))
    return digest.hexdigest()


class NpzStream:
    """An .npz written one array at a time, in np.savez's format (a stored zip of .npy files, zip64), under a temp
    name beside `final` that `close()` renames onto it; `abort()` removes it. np.savez needs every array at once."""

    def __init__(self, final: str | os.PathLike):
        import zipfile

        self.final = Path(final)
        self.tmp = _temp_beside(self.final)
        self.keys: set[str] = set()
        self._zip = zipfile.ZipFile(self.tmp, "w", zipfile.ZIP_STORED, allowZip64=True)

    def write(self, key: str, array: Any) -> None:
        import numpy as np

        if key in self.keys:
            raise ValueError(f"{self.final.name} already holds '{key}'")
        self.keys.add(key)
        try:
            with self._zip.open(key + ".npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asanyarray(array), allow_pickle=False)
        except OSError as exc:
            raise _cannot_write(self.final, exc) from None

    def close(self) -> None:
        try:
            self._zip.close()
            publish(self.tmp, self.final)
        except OSError as exc:
            self.tmp.unlink(missing_ok=True)
            raise _cannot_write(self.final, exc) from None

    def abort(self) -> None:
        try:
            self._zip.close()
        except (OSError, ValueError):
            pass
        self.tmp.unlink(missing_ok=True)
