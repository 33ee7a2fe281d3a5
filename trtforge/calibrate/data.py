"""Calibration and evaluation samples from a folder.

- `.npy` / `.npz`: arrays named after the model inputs (`.npy` files as INPUT_NAME.npy in a sample
  sub-folder, or `.npz` holding every input; for a model of one float [batch, samples] input (audio), any
  `.npy` file is one recording).
  A leading batch axis is optional.
- `.txt` (one document per file) / `.jsonl` (`{"text": ...}` per line): tokenized with the model's own
  tokenizer (trtforge.tokenize: its own special tokens, no transformers needed), each sample keeping
  its own length (calibrating over many lengths, not one shape).
- audio (`.wav`, mono, 16-bit PCM or 32-bit float): the samples of a model's one audio input, [1, T]; a file at
  another rate than the input's `sample_rate` is refused (never resampled).
- images (`.png`, `.jpg`, `.jpeg`, `.bmp`): read with Pillow, scaled to [0, 1], NCHW; resized bilinearly
  to the model's height and width where those are fixed (ViT 32x32), else kept at their own size.

Samples may differ in shape. The manifest hash covers every file's name and bytes, so a cache knows
which data it was computed from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError

TEXT_SUFFIXES = (".txt", ".jsonl")
ARRAY_SUFFIXES = (".npy", ".npz")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
AUDIO_SUFFIXES = (".wav",)


@dataclass
class Dataset:
    folder: Path
    files: list[Path]
    kind: str  # "text" | "arrays" | "images" | "audio"
    manifest_hash: str


def scan(folder: str | Path) -> Dataset:
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"data folder {folder} does not exist; pass a folder of .npy/.npz, .txt/.jsonl, image or .wav files.")
    files = sorted(
        p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES + ARRAY_SUFFIXES + IMAGE_SUFFIXES + AUDIO_SUFFIXES
    )
    if not files:
        raise UserError(f"data folder {folder} holds no .npy/.npz, .txt/.jsonl, image or .wav files; add samples to it.")
    kinds = {_file_kind(p) for p in files}
    if len(kinds) > 1:
        raise UserError(f"data folder {folder} mixes {' and '.join(sorted(kinds))}; keep one kind of sample per folder.")
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return Dataset(folder, files, kinds.pop(), digest.hexdigest())


def _file_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return "text"
    if suffix in ARRAY_SUFFIXES:
        return "arrays"
    return "audio" if suffix in AUDIO_SUFFIXES else "images"


def read_audio(dataset: Dataset, specs: list[InputSpec]) -> list[dict[str, np.ndarray]]:
    """Each mono WAV file as the samples of the model's one input, shaped [1, T] (runtime/audio.read_wav), checked
    against the input's declared sample rate."""
    from trtforge.runtime.audio import read_wav

    if len(specs) != 1 or len(specs[0].shape) != 2 or not specs[0].dtype.startswith("float"):
        shown = ", ".join(f"{s.name} {list(s.shape)}" for s in specs)
        raise UserError(f"audio files feed one float [batch, samples] input, but the model takes {shown}; give .npz samples instead.")
    spec = specs[0]
    return [{spec.name: read_wav(path, spec.sample_rate)[None].astype(spec.dtype)} for path in dataset.files]


def read_utf8(path: Path) -> str:
    """A text file that must be UTF-8 (.jsonl): its text, or one sentence naming the file and the first bad byte."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}; check the file.") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as UTF-8 JSON lines."
        ) from None


def read_texts(dataset: Dataset) -> list[str]:
    texts = []
    for path in dataset.files:
        if path.suffix.lower() == ".txt":
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            if text:
                texts.append(text)
            continue
        for lineno, line in enumerate(read_utf8(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f'{path}:{lineno} is not valid JSON; each line must be {{"text": ...}}.') from None
            if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                raise UserError(f"{path}:{lineno} has no string 'text' field; each line must be {{\"text\": ...}}.")
            texts.append(item["text"])
    if not texts:
        raise UserError(f"data folder {dataset.folder} holds no text; add non-empty .txt or .jsonl samples.")
    return texts


def tokenize(texts: list[str], tokenizer: Any, specs: list[InputSpec], max_length: int) -> list[dict[str, np.ndarray]]:
    """One sample per text, [1, len] each, with the model's own special tokens, truncated at
    `max_length`; named after the model inputs. `tokenizer` is a trtforge.tokenize.TextTokenizer."""
    return [_named(tokenizer.encode(text, max_length), specs) for text in texts]


def _named(enc: Any, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    out = {}
    for spec in specs:
        if spec.name not in enc:
            raise UserError(f"the tokenizer gives {', '.join(enc.keys())} but the model needs '{spec.name}'; rename the input.")
        out[spec.name] = np.asarray(enc[spec.name]).astype(spec.dtype)
    return out


def read_arrays(dataset: Dataset, specs: list[InputSpec]) -> list[dict[str, np.ndarray]]:
    samples: list[dict[str, np.ndarray]] = []
    names = [s.name for s in specs]
    by_dir: dict[Path, dict[str, np.ndarray]] = {}
    for path in dataset.files:
        if path.suffix.lower() == ".npz":
            try:
                with np.load(path) as data:
                    arrays = {k: data[k] for k in data.files}
            except Exception:
                raise UserError(f"{path} is not a readable .npz file; re-save it with numpy.savez.") from None
            samples.append(_check_sample(arrays, specs, path))
        else:
            try:
                array = np.load(path)
            except Exception:
                raise UserError(f"{path} is not a readable .npy file; re-save it with numpy.save.") from None
            if path.stem not in names and _one_audio_input(specs):  # a recording per file, of any name
                samples.append(_check_sample({names[0]: array}, specs, path))
                continue
            if path.stem not in names:
                raise UserError(f"{path.name} is not named after a model input ({', '.join(names)}); rename it INPUT.npy.")
            by_dir.setdefault(path.parent, {})[path.stem] = array
    for folder, arrays in sorted(by_dir.items()):
        samples.append(_check_sample(arrays, specs, folder))
    return samples


def _one_audio_input(specs: list[InputSpec]) -> bool:
    """A model of one float [batch, samples] input (raw audio)."""
    return len(specs) == 1 and len(specs[0].shape) == 2 and specs[0].dtype.startswith("float") and isinstance(specs[0].shape[1], str)


def _check_sample(arrays: dict[str, np.ndarray], specs: list[InputSpec], where: Path) -> dict[str, np.ndarray]:
    out = {}
    for spec in specs:
        if spec.name not in arrays:
            raise UserError(
                f"{where} has no array '{spec.name}' (it has {', '.join(arrays) or 'none'}); name arrays after the model inputs."
            )
        array = arrays[spec.name]
        if array.ndim == len(spec.shape) - 1:
            array = array[None]
        if array.size == 0:
            empty = ", ".join(str(d) for d, n in enumerate(array.shape) if n == 0) or "0"
            raise UserError(
                f"{where}: array '{spec.name}' is empty (shape {list(array.shape)}, size 0 in dim {empty}); "
                "give at least one sample with data in it."
            )
        if array.ndim != len(spec.shape):
            raise UserError(f"{where}: array '{spec.name}' has rank {array.ndim}, the model input has rank {len(spec.shape)}.")
        for d, (dim, size) in enumerate(zip(spec.shape, array.shape)):
            if isinstance(dim, int) and dim != size:
                raise UserError(f"{where}: array '{spec.name}' has size {size} in dim {d}, the model needs {dim}.")
        kind = np.dtype(spec.dtype).kind
        if array.dtype.kind != kind and not (kind in "iu" and array.dtype.kind in "iu"):
            raise UserError(f"{where}: array '{spec.name}' has dtype {array.dtype}, the model input is {spec.dtype}.")
        out[spec.name] = array.astype(spec.dtype)
    return out


def read_images(dataset: Dataset, specs: list[InputSpec]) -> list[dict[str, np.ndarray]]:
    """RGB in [0, 1], NCHW. A model with a fixed input height and width (ViT: 32x32) gets every image
    resized to it, bilinearly; a model with dynamic height/width gets the image at its own size."""
    try:
        from PIL import Image
    except ImportError:
        raise UserError(
            "reading images needs Pillow; `pip install 'trtforge[images]'` (or `pip install pillow`), or save the images as .npy."
        ) from None
    if len(specs) != 1:
        raise UserError(f"image data feeds one input, but the model has {len(specs)}; give .npz samples instead.")
    spec = specs[0]
    if len(spec.shape) != 4:
        raise UserError(f"image data feeds an [N, 3, H, W] input, but '{spec.name}' has shape {spec.shape}; give .npz samples instead.")
    fixed = (spec.shape[2], spec.shape[3]) if isinstance(spec.shape[2], int) and isinstance(spec.shape[3], int) else None
    samples = []
    for path in dataset.files:
        try:
            image = Image.open(path).convert("RGB")
            if fixed and image.size != (fixed[1], fixed[0]):
                image = image.resize((fixed[1], fixed[0]), Image.BILINEAR)
            array = np.asarray(image, dtype=np.float32) / 255.0
        except Exception:
            raise UserError(f"{path} is not a readable image; remove or replace it.") from None
        samples.append({spec.name: array.transpose(2, 0, 1)[None].astype(spec.dtype)})
    return samples


def check_axis_ranges(
    samples: list[dict[str, np.ndarray]], specs: list[InputSpec], axes: dict[str, Any], files: list[Path], folder: Path
) -> None:
    """Each sample's dynamic sizes inside its axis' [min, max]: statistics gathered on shapes the model is never
    built for describe other activations (and ONNX Runtime may reject them)."""
    for i, sample in enumerate(samples):
        where = files[i] if len(files) == len(samples) else f"sample {i} of {folder}"
        for spec in specs:
            array = sample.get(spec.name)
            if array is None:
                continue
            for dim, size in zip(spec.shape, array.shape):
                rng = axes.get(dim) if isinstance(dim, str) else None
                if rng is not None and not rng.min <= size <= rng.max:
                    raise UserError(
                        f"{where}: input '{spec.name}' has size {size} on axis '{dim}', outside the model's "
                        f"range {rng.min}..{rng.max}; resize the sample or widen axes.{dim} when exporting."
                    )


def load_samples(
    folder: str | Path,
    specs: list[InputSpec],
    tokenizer_factory: Callable[[], Any] | None,
    max_length: int,
    max_samples: int | None = None,
    axes: dict[str, Any] | None = None,
) -> tuple[Dataset, list[dict[str, np.ndarray]]]:
    """The samples of a folder, named after the model inputs. With `axes`, array and image samples must lie inside
    the axis ranges (text is truncated to `max_length` when tokenized)."""
    dataset = scan(folder)
    if dataset.kind == "text":
        if tokenizer_factory is None:
            raise UserError(f"{dataset.folder} holds text, but this model has no tokenizer; give .npy/.npz samples.")
        samples = tokenize(read_texts(dataset), tokenizer_factory(), specs, max_length)
    elif dataset.kind == "arrays":
        samples = read_arrays(dataset, specs)
    elif dataset.kind == "audio":
        samples = read_audio(dataset, specs)
    else:
        samples = read_images(dataset, specs)
    for i, sample in enumerate(samples):
        for name, array in sample.items():
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise UserError(f"sample {i} of {dataset.folder}: input '{name}' holds NaN or Inf; clean the data.")
    if axes and dataset.kind != "text":
        check_axis_ranges(samples, specs, axes, dataset.files, dataset.folder)
    return dataset, samples[:max_samples] if max_samples else samples


def batches(
    samples: list[dict[str, np.ndarray]], batch_size: int, pad_values: dict[str, int] | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Group samples of equal shape into batches; different lengths are bucketed, never padded.

    Padding would put pad-token activations into the statistics; bucketing by shape keeps every
    activation a real one.
    """
    buckets: dict[tuple, list[dict[str, np.ndarray]]] = {}
    for sample in samples:
        key = tuple((k, v.shape) for k, v in sorted(sample.items()))
        buckets.setdefault(key, []).append(sample)
        if len(buckets[key]) == batch_size:
            yield _stack(buckets.pop(key))
    for group in buckets.values():
        yield _stack(group)


def _stack(group: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([s[k] for s in group], axis=0) for k in group[0]}


def max_sample_length(specs: list[InputSpec], axes: dict[str, AxisRange]) -> int:
    lengths = [axes[d].max for s in specs for d in s.shape[1:] if isinstance(d, str) and d in axes]
    return max(lengths) if lengths else 512


def tokenizer_factory(onnx_path: Path) -> Callable[[], Any] | None:
    """The model's tokenizer (trtforge.tokenize.TextTokenizer), found through the sidecar chain of
    `onnx_path` (the directory export saved, relative to its ONNX), or the built-in MiniLM's; None when
    there is none."""
    from trtforge.runtime.tokenize import TextTokenizer, find_tokenizer_dir

    directory = find_tokenizer_dir(onnx_path)
    return (lambda: TextTokenizer(directory)) if directory else None


def limited_batches(samples: list[dict[str, np.ndarray]], limit: int | None) -> list[dict[str, np.ndarray]]:
    chosen = samples[:limit] if limit else samples
    return list(batches(chosen, 16))
