"""Audio: outputs whose frames advance at a stride of the input's samples, windows over long recordings that map to
whole output frames, fixed-length windows (padded) for models that take exactly N samples, and WAV reading. Pure
numpy and the standard library, no runtime.

A strided front-end (wav2vec2's convolutions: kernels 10,3,3,3,3,2,2, strides 5,2,2,2,2,2,2) gives
frames(L) = floor((L - offset) / stride) output frames for L input samples: a stack of convolutions composes to one
such floor (320 samples per frame and offset 80 for wav2vec2; a negative offset where convolutions pad). A window that
starts at a multiple of the stride then yields the whole pass' frames start / stride, start / stride + 1, ..., except
near its edges, where the receptive field runs past the window: the overlap absorbs that.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from trtforge.core.errors import UserError
from trtforge.runtime.chunking import Window, check_overlap, plan_windows, windows_from_spans


@dataclass(frozen=True)
class FrameRate:
    """frames(L) = floor((L - offset) / stride): output frames for L input samples."""

    stride: int
    offset: int = 0

    def frames(self, samples: int) -> int:
        return max(0, (samples - self.offset) // self.stride)


def measure_frame_rate(frames_at: Callable[[int], int], low: int, high: int) -> FrameRate | None:
    """The frame rate of an output from its frame counts at input lengths in [low, high] (frames_at runs the model):
    two frame boundaries found by bisection give the stride, the first one the offset, and it is checked at both ends
    and between. None where the range is too narrow to see two boundaries. ValueError where the counts follow no
    constant stride. Pure given frames_at."""
    if high - low < 2:
        return None
    f_low, f_high = frames_at(low), frames_at(high)
    if f_high - f_low < 3:
        return None

    def next_boundary(start: int, frames: int) -> int:
        """The smallest length > start with more frames than `frames` (frames_at(start) == frames)."""
        lo, hi = start, high  # frames_at(lo) <= frames < frames_at(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if frames_at(mid) > frames:
                hi = mid
            else:
                lo = mid
        return hi

    first = next_boundary(low, f_low)
    f_first = frames_at(first)
    second = next_boundary(first, f_first)
    if frames_at(second) != f_first + 1 or second > high:
        raise ValueError(f"frames grow by more than one per sample near {second} samples")
    rate = FrameRate(second - first, first - f_first * (second - first))
    for length in (low, high, (low + high) // 2, first - 1, second + 1):
        if low <= length <= high and frames_at(length) != rate.frames(length):
            raise ValueError(
                f"{frames_at(length)} frames at {length} samples, where {rate.stride} samples per frame from {rate.offset} "
                f"give {rate.frames(length)}"
            )
    return rate


def fixed_frame_rate(length: int, frames: int, stride: int) -> FrameRate:
    """The frame rate of a model that takes exactly `length` samples and gives `frames` frames, at a declared stride:
    the offset is the one that fits that single length (length - frames * stride). ValueError where the stride
    cannot give that many frames from that many samples."""
    offset = length - frames * stride
    if frames < 1 or not -stride < offset < 2 * stride:
        raise ValueError(f"{frames} frames from {length} samples is not one frame per {stride} samples")
    return FrameRate(stride, offset)


def check_aligned(chunk: int, overlap: int, stride: int, what: str) -> None:
    """Windows over a strided output's input start at multiples of its stride: --chunk and --overlap must be such.
    `what`: the outputs, as the sentence names them ("output 'x'")."""
    for value, flag in ((chunk, "--chunk"), (overlap, "--overlap")):
        if value % stride:
            lower, upper = value // stride * stride, (value // stride + 1) * stride
            raise UserError(
                f"{flag} {value} is not a multiple of {stride}, the input samples per frame of {what}; use "
                f"{lower if lower else upper} or {upper}."
            )


def plan_strided_windows(length: int, chunk: int, overlap: int, stride: int, full_last: bool = False) -> list[Window]:
    """Windows of `chunk` samples advancing by chunk - overlap (multiples of `stride`), every one starting at a multiple
    of `stride` so that its frames are whole frames of the whole pass. full_last: the last window ends at `length` and
    starts at the first multiple of the stride at or after length - chunk (shorter than a chunk by less than a stride)."""
    windows = plan_windows(length, chunk, overlap, False)
    if full_last and len(windows) > 1 and windows[-1].length < chunk:
        start = -(-(length - chunk) // stride) * stride
        spans = [(w.start, w.end) for w in windows[:-1]] + [(start, length)]
        return windows_from_spans(spans)
    return windows


def plan_fixed_windows(length: int, size: int, overlap: int) -> list[Window]:
    """Windows for a model that takes exactly `size` samples: starts advance by size - overlap, and each window's
    content is [start, end) with end <= length (the last is padded to `size` where it is shorter); an input shorter
    than `size` is one padded window. Keep ranges ('center') split each overlap half/half."""
    check_overlap(size, overlap)
    if length < 1:
        return []
    step = size - overlap
    count = 1 + max(0, -(-(length - size) // step))
    return windows_from_spans([(i * step, min(i * step + size, length)) for i in range(count)])


def frame_windows(windows: list[Window], rate: FrameRate, length: int, window_size: int | None = None) -> tuple[list[Window], int]:
    """Sample windows mapped to output frames: window [s, e) gives frames [s / stride, s / stride + frames(e - s)) of
    the whole pass' frames(length) (frames(window_size) for fixed windows, whose padded frames past the input's end are
    dropped). Keep ranges split each overlap's frames half/half. UserError where consecutive windows leave frames
    uncovered (the overlap is narrower than the front-end's receptive field); ValueError where a window does not start
    at a multiple of the stride (plans here never make one)."""
    total = rate.frames(length)
    spans = []
    for w in windows:
        if w.start % rate.stride:
            raise ValueError(f"a window starts at sample {w.start}, not a multiple of the stride {rate.stride}")
        first = w.start // rate.stride
        count = rate.frames(window_size if window_size is not None else w.length)
        spans.append((min(first, total), min(first + count, total)))
    at = 0
    for i, (start, end) in enumerate(spans):
        if start > at:
            size = window_size if window_size is not None else windows[i - 1].length
            need = size - rate.frames(size) * rate.stride
            raise UserError(
                f"windows of {window_size or windows[0].length} samples leave output frames {at}..{start - 1} uncovered: the overlap is "
                f"narrower than the model's receptive field; raise --overlap to at least {-(-need // rate.stride) * rate.stride}."
            )
        at = max(at, end)
    if at < total:
        raise ValueError(f"windows cover frames up to {at}, the input has {total}")
    return windows_from_spans(spans), total


def fixed_window_part(feed: np.ndarray, dim: int, size: int) -> np.ndarray:
    """A window's input cut to at most `size` along `dim`, zero-padded up to `size` (silence)."""
    have = feed.shape[dim]
    if have == size:
        return feed
    pad = [(0, 0)] * feed.ndim
    pad[dim] = (0, size - have)
    return np.pad(feed, pad)


# -- WAV files ---------------------------------------------------------------------------------------


def read_wav(path: Path, rate: int | None = None) -> np.ndarray:
    """A mono WAV file's samples as float32 in [-1, 1]: 16-bit PCM (the stdlib `wave` module) or 32-bit IEEE float.
    `rate`: the model's declared sample rate; a file at another rate is a UserError (trtforge does not resample)."""
    path = Path(path)
    try:
        data = path.read_bytes()
        channels, file_rate, bits, fmt, payload = _wav_chunks(data)
    except (OSError, ValueError, struct.error) as exc:
        raise UserError(f"{path} is not a readable WAV file ({exc}); save it as 16-bit PCM or 32-bit float WAV.") from None
    if channels != 1:
        raise UserError(f"{path} has {channels} channels; trtforge reads mono audio, so mix it down to one channel.")
    if rate is not None and file_rate != rate:
        raise UserError(
            f"{path} is sampled at {file_rate} Hz but the model takes {rate} Hz; resample it to {rate} Hz (trtforge does not resample)."
        )
    if fmt == 1 and bits == 16:
        return (np.frombuffer(payload, dtype="<i2").astype(np.float32) / 32768.0).copy()
    if fmt == 3 and bits == 32:
        return np.frombuffer(payload, dtype="<f4").astype(np.float32).copy()
    raise UserError(f"{path} holds {bits}-bit {'float' if fmt == 3 else 'PCM'} samples; save it as 16-bit PCM or 32-bit float WAV.")


def wav_rate(path: Path) -> int:
    """A WAV file's sample rate (its header only)."""
    return _wav_chunks(Path(path).read_bytes())[1]


def _wav_chunks(data: bytes) -> tuple[int, int, int, int, bytes]:
    """(channels, rate, bits, format, sample bytes) from a RIFF/WAVE file: format 1 PCM, 3 float (WAVE_FORMAT_EXTENSIBLE
    gives its subformat). The stdlib `wave` module reads PCM only, so the header is parsed here for both."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("no RIFF/WAVE header")
    at, fmt_chunk, payload = 12, None, None
    while at + 8 <= len(data):
        tag, size = data[at : at + 4], struct.unpack("<I", data[at + 4 : at + 8])[0]
        body = data[at + 8 : at + 8 + size]
        if tag == b"fmt ":
            fmt_chunk = body
        elif tag == b"data":
            payload = body
        at += 8 + size + (size & 1)
    if fmt_chunk is None or payload is None:
        raise ValueError("no 'fmt ' or 'data' chunk")
    fmt, channels, rate, _, block, bits = struct.unpack("<HHIIHH", fmt_chunk[:16])
    if fmt == 0xFFFE and len(fmt_chunk) >= 26:
        fmt = struct.unpack("<H", fmt_chunk[24:26])[0]
    usable = len(payload) // block * block if block else 0
    return channels, rate, bits, fmt, payload[:usable]


def write_wav(path: Path, samples: np.ndarray, rate: int, float32: bool = False) -> None:
    """Mono samples in [-1, 1] as a 16-bit PCM WAV (the stdlib `wave` module), or as 32-bit float."""
    samples = np.asarray(samples, dtype=np.float32)
    if not float32:
        import wave

        with wave.open(str(path), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(rate)
            out.writeframes(np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2").tobytes())  # read_wav's scale
        return
    payload = samples.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    Path(path).write_bytes(
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(payload))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(payload))
        + payload
    )


def output_frame_rates(
    shapes_at: Callable[[dict[str, int]], dict[str, tuple[int, ...]]],
    inputs: list,
    axes: dict,
    token_outputs: dict[str, int | None],
    base: dict[str, int],
) -> dict[str, FrameRate]:
    """Each token output's frame rate where it advances at a stride of the input (frames != samples), measured with
    `shapes_at` (the model's output shapes at given axis sizes) along the one dynamic non-batch axis of `inputs`; for a
    model whose inputs are all fixed, from the declared stride at its one length. `token_outputs`: output -> the stride
    its config declares (or None); `base`: every axis' size for the other axes. A declared stride that disagrees with
    the model is a UserError naming the config key. Pure given shapes_at."""
    batch = inputs[0].shape[0] if inputs and isinstance(inputs[0].shape[0], str) else None
    seqs = {d for spec in inputs for d in spec.shape[1:] if isinstance(d, str) and d != batch}
    base = {**base, **({batch: 1} if batch else {})}
    rates: dict[str, FrameRate] = {}
    if len(seqs) == 1:
        seq = seqs.pop()
        low, top = axes[seq].min, axes[seq].max
        cache: dict[int, dict[str, tuple[int, ...]]] = {}

        def at(n: int) -> dict[str, tuple[int, ...]]:
            if n not in cache:
                cache[n] = shapes_at({**base, seq: n})
            return cache[n]

        for name, declared in token_outputs.items():
            frames = at(low)[name][1]
            if frames == low:
                if declared not in (None, 1):
                    raise _disagree(name, declared, "one frame per sample (its frames follow the input's length)")
                continue
            span = int(8 * low / max(frames, 1)) + 8
            try:
                rate = measure_frame_rate(lambda n: at(n)[name][1], low, min(top, low + span))
            except ValueError as exc:
                raise UserError(
                    f"output '{name}' does not advance at a constant stride of axis '{seq}' ({exc}); declare another kind for "
                    "it under 'outputs' in the config."
                ) from None
            if rate is None:
                raise UserError(
                    f"output '{name}' has {frames} frames for {low} samples, but axes.{seq} is too narrow to measure its "
                    f"stride; widen axes.{seq} (min {low}, max {top}) by a few strides."
                )
            if declared is not None and declared != rate.stride:
                raise _disagree(name, declared, f"one frame per {rate.stride} samples")
            rates[name] = rate
        return rates
    if seqs:
        return rates
    declared_any = {n: s for n, s in token_outputs.items() if s is not None}
    if not declared_any:
        return rates
    audio = next((s for s in inputs if s.dtype.startswith("float")), inputs[0])
    length = int(audio.shape[-1])
    shapes = shapes_at(base)
    for name, stride in declared_any.items():
        try:
            rates[name] = fixed_frame_rate(length, shapes[name][1], stride)
        except ValueError:
            raise _disagree(name, stride, f"{shapes[name][1]} frames from its {length} samples") from None
    return rates


def _disagree(name: str, declared: int, measured: str) -> UserError:
    return UserError(
        f"outputs: {name}.stride is {declared}, but the exported model gives {measured}; fix or remove 'stride' for "
        f"output '{name}' in the config."
    )


# -- run: layouts and merges for strided outputs ------------------------------------------------------------

FIXED_AXIS = "time"  # the name run gives the window axis of a model that takes a fixed number of positions


def audio_layout(layout, specs: list, strides: dict[str, int]):
    """The layout with windows aligned to the token outputs' strides (`strides`: output -> samples per frame): a
    sequence model's windows start at multiples of their least common multiple; a model whose inputs are all fixed
    takes windows of exactly its length along its float input's last dim (every input of that length there is cut
    alike), the last one padded. The layout unchanged where no output has a stride."""
    import math
    from dataclasses import replace

    if not strides or layout.kind != "sequence":
        return layout
    step = math.lcm(*strides.values())
    if layout.chunk_axes:
        return replace(layout, sample_stride=step)
    if layout.ambiguous:
        return layout
    audio = next((s for s in specs if s.dtype.startswith("float")), None)
    if audio is None or not isinstance(audio.shape[-1], int) or len(audio.shape) < 2:
        return layout
    size = int(audio.shape[-1])
    dims = {s.name: {FIXED_AXIS: len(s.shape) - 1} for s in specs if len(s.shape) >= 2 and s.shape[-1] == size}
    return replace(layout, chunk_axes=(FIXED_AXIS,), dims=dims, sample_stride=step, fixed_length=size)


def reading_specs(specs: list, layout) -> list:
    """Input specs for reading inputs of any length along a fixed-length model's window axis."""
    if not layout.fixed_length:
        return specs
    return [s.model_copy(update={"shape": [*s.shape[:-1], FIXED_AXIS]}) if FIXED_AXIS in layout.dims.get(s.name, {}) else s for s in specs]


def merge_frames(kind, windows: list[Window], parts: list[np.ndarray], length: int, merge: str) -> np.ndarray:
    """A strided token output of one input from its windows' parts (frames along axis 0): the windows mapped to frames
    (frame_windows), each part cut to its window's frames (a padded window's frames past the input's end dropped)."""
    from trtforge.runtime.chunking import StreamingMerge

    rate = FrameRate(kind.stride, kind.frame_offset)
    frames, total = frame_windows(windows, rate, length, kind.fixed_window)
    if len(parts) == 1:
        return parts[0][:total]
    merger = StreamingMerge(frames, total, merge)
    for i, (w, part) in enumerate(zip(frames, parts)):
        merger.add(i, part[: w.length])
    return merger.result()


def output_strides(chain: list, overrides: dict) -> dict[str, int]:
    """The strides export measured for token outputs, from a sidecar chain (the nearest sidecar wins), less outputs
    --output-kind redeclares as another kind."""
    from trtforge.runtime.outputs import declared_frame_rates

    rates: dict[str, tuple[int, int]] = {}
    for _, side in reversed(chain):
        rates.update(declared_frame_rates(side.get("outputs")))
    return {n: stride for n, (stride, _) in rates.items() if overrides.get(n, ("token", None))[0] == "token"}


def run_layout(layout, specs: list, chain: list, overrides: dict, chunk: int | None, overlap: int, model: str):
    """`run`'s layout where token outputs advance at a stride (audio_layout), with --chunk and --overlap checked
    against it: multiples of the stride, and for a fixed-length model --chunk its length or nothing."""
    strides = output_strides(chain, overrides)
    layout = audio_layout(layout, specs, strides)
    if not layout.sample_stride:
        return layout
    what = "output " + ", ".join(f"'{n}'" for n in strides)
    if layout.fixed_length:
        if chunk is not None and chunk != layout.fixed_length:
            raise UserError(
                f"--chunk {chunk}: {model} takes exactly {layout.fixed_length} positions per window; pass --chunk "
                f"{layout.fixed_length} (or leave --chunk out)."
            )
        size, stride = layout.fixed_length, layout.sample_stride
        if (size - overlap) % stride:
            upper = overlap + (size - overlap) % stride
            fits = " or ".join(str(v) for v in (upper - stride, upper) if 0 <= v < size)
            raise UserError(
                f"--overlap {overlap}: windows of {size} positions must advance by a multiple of {stride}, the input "
                f"positions per frame of {what}; use --overlap {fits}."
            )
    elif chunk is not None:
        check_aligned(chunk, overlap, layout.sample_stride, what)
    return layout


def run_kinds(kinds: dict, layout, chunk: int | None, overlap: int) -> dict:
    """The output kinds with a fixed-length model's window recorded on its strided outputs; windows that would leave
    frames of a strided output uncovered are refused here, before anything runs."""
    from dataclasses import replace

    if layout.fixed_length:
        kinds = {n: replace(k, fixed_window=layout.fixed_length) if k.stride else k for n, k in kinds.items()}
    size = layout.fixed_length or chunk
    for kind in kinds.values():
        if kind.stride and size:
            rate = FrameRate(kind.stride, kind.frame_offset)
            frame_windows(plan_fixed_windows(3 * size, size, overlap), rate, 3 * size, kind.fixed_window)
    return kinds
