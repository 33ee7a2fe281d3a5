"""Loading and saving ONNX files with clear errors and atomic writes, external data included.

Models over 2 GB cannot be one protobuf; they are saved with their weights in `NAME.data` beside the
ONNX. Both files are written under temp names and renamed, data first, so a reader never sees an ONNX
pointing at a half-written data file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx

from trtforge.core.artifacts import ensure_writable_dir, publish
from trtforge.core.errors import UserError

PROTOBUF_LIMIT = 2 * 1024**3 - 1


def load_onnx(path: str | os.PathLike, load_external_data: bool = True) -> onnx.ModelProto:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"ONNX file {path} does not exist; check the path or run the previous step first.")
    try:
        model = onnx.load(str(path), load_external_data=load_external_data)
    except Exception as exc:  # protobuf DecodeError, missing external data, ...
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path} is not a readable ONNX model ({first}); re-export it.") from None
    if not model.graph.node:
        raise UserError(f"{path} holds no graph nodes (empty or truncated file); re-export it.")
    return model


def model_bytes(model: onnx.ModelProto) -> int:
    return model.ByteSize()


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool | None = None) -> Path:
    """Write `model` to `path` atomically; weights go to `path.data` when asked or when over 2 GB."""
    path = Path(path)
    ensure_writable_dir(path)
    use_external = external_data if external_data is not None else model_bytes(model) > PROTOBUF_LIMIT
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    data_name = path.name + ".data"
    try:
        tmp_model = tmpdir / path.name
        if use_external:
            onnx.save_model(
                model, str(tmp_model), save_as_external_data=True, all_tensors_to_one_file=True, location=data_name, size_threshold=0
            )
            publish(tmpdir / data_name, path.parent / data_name)
            # save_model moved the weights out of `model`; read them back so the caller's model stays whole.
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        else:
            onnx.save_model(model, str(tmp_model))
            (path.parent / data_name).unlink(missing_ok=True)
        publish(tmp_model, path)
    except OSError as exc:
        raise UserError(f"could not write {path}: {exc.strerror or exc}; free space or choose another path.") from None
    finally:
        for leftover in tmpdir.glob("*"):
            leftover.unlink(missing_ok=True)
        tmpdir.rmdir()
    return path
