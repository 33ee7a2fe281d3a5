"""The calibration cache: TensorRT's text format plus a JSON sidecar saying what the scales depend on.

Text format (what trtexec --calib and ModelOpt read): a header `TRT-<version>-<Algorithm>`, then one
line per tensor `name: <8 hex digits>`, the big-endian bits of the float32 scale, scale = amax / 127.
Algorithm names: entropy -> EntropyCalibration2, minmax -> MinMaxCalibration, percentile ->
LegacyCalibration (TensorRT has no percentile calibrator; its legacy one is the percentile-style one).

A cache is reused only when its sidecar matches the graph hash, the data manifest hash, the method
and its parameters, the cache's bytes are the ones the sidecar recorded (`cache_sha256`) and its
header names the method's algorithm; it is never used silently otherwise. The cache is written
first and its sidecar last, naming the cache's hash: a crash between the two leaves a sidecar that
does not describe the cache, which the hash then tells.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

from trtforge.core.artifacts import content_mismatch, sha256_bytes, write_text_atomic
from trtforge.core.errors import UserError

ALGORITHMS = {"entropy": "EntropyCalibration2", "minmax": "MinMaxCalibration", "percentile": "LegacyCalibration"}
DEFAULT_TRT_VERSION = "8600"


def scale_to_hex(scale: float) -> str:
    return struct.pack(">f", float(scale)).hex()


def hex_to_scale(text: str) -> float:
    return struct.unpack(">f", bytes.fromhex(text))[0]


def format_cache(amax: dict[str, float], method: str, trt_version: str = DEFAULT_TRT_VERSION) -> str:
    lines = [f"TRT-{trt_version}-{ALGORITHMS[method]}"]
    lines += [f"{name}: {scale_to_hex(value / 127.0)}" for name, value in amax.items()]
    return "\n".join(lines) + "\n"


def write_cache(path: Path, amax: dict[str, float], method: str, trt_version: str = DEFAULT_TRT_VERSION) -> str:
    """Write the cache atomically; returns the sha256 of the bytes written, for its sidecar (written after it)."""
    text = format_cache(amax, method, trt_version)
    write_text_atomic(path, text)
    return sha256_bytes(text.encode("utf-8"))


def header_algorithm(header: str) -> str:
    """The algorithm a `TRT-<version>-<Algorithm>` header names."""
    return header.split("-", 2)[2] if header.count("-") >= 2 else header


def cache_mismatch(path: Path, sidecar: dict, method: str) -> str | None:
    """Why the cache at `path` is not the one `sidecar` describes for `method` (None: it is): other bytes than the
    sidecar recorded at write time, or a header naming another algorithm. A corrupt cache is a mismatch too."""
    why = content_mismatch(path, sidecar.get("cache_sha256"))
    if why:
        return f"cache {why}"
    try:
        header, _ = read_cache(path)
    except UserError as exc:
        return str(exc).rstrip(".")
    if header_algorithm(header) != ALGORITHMS[method]:
        return f"cache {path}'s header names {header_algorithm(header)}, not {method}'s {ALGORITHMS[method]}"
    return None


def read_cache(path: Path) -> tuple[str, dict[str, float]]:
    """(header, tensor -> amax) from a TensorRT calibration cache; corrupt files are a UserError."""
    if not path.is_file():
        raise UserError(f"calibration cache {path} does not exist; check the path.")
    try:
        lines = [l.strip() for l in path.read_text(encoding="ascii").splitlines() if l.strip()]
    except (UnicodeDecodeError, OSError):
        raise UserError(f"calibration cache {path} is not a TensorRT text cache; delete it and recalibrate.") from None
    if not lines or not lines[0].startswith("TRT-"):
        raise UserError(f"calibration cache {path} has no 'TRT-<version>-<algorithm>' header; it is corrupt or not a TensorRT cache.")
    amax: dict[str, float] = {}
    for lineno, line in enumerate(lines[1:], 2):
        name, sep, value = line.rpartition(":")
        value = value.strip()
        if not sep or len(value) != 8:
            raise UserError(f"calibration cache {path} line {lineno} is not 'tensor: <8 hex digits>'; the cache is corrupt.")
        try:
            scale = hex_to_scale(value)
        except ValueError:
            raise UserError(f"calibration cache {path} line {lineno} holds '{value}', which is not hex; the cache is corrupt.") from None
        if not math.isfinite(scale) or scale < 0:  # NaN, infinite or negative
            raise UserError(f"calibration cache {path} line {lineno} holds an invalid scale for '{name.strip()}'.")
        amax[name.strip()] = scale * 127.0
    return lines[0], amax
