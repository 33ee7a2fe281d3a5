"""Property tests over every reader of user files: whatever the bytes, a reader returns a valid result or raises
UserError, never another exception.

Readers: calibration/run samples (.npz, .npy, .txt, .jsonl, pre-tokenized .jsonl, images), YAML configs, calibration
caches, sidecars (any artifact's, an engine's, an ONNX's input specs), lengths files, tokenizer folders. Each gets
raw bytes and, where random bytes would rarely get past the first check, structured inputs (real .npz containers
of random arrays, real images of random sizes and modes, JSON lines of random values, mutated valid files).

A few hundred examples per reader in CI; TRTFORGE_NIGHTLY=1 runs 10,000 each.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from trtforge.core.config import InputSpec
from trtforge.core.errors import UserError

NIGHTLY = os.environ.get("TRTFORGE_NIGHTLY", "") not in ("", "0")
EXAMPLES = 10_000 if NIGHTLY else 200
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not NIGHTLY,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

IMAGE_SPEC = [InputSpec(name="image", dtype="float32", shape=["batch", 3, "height", "width"])]
VEC_SPECS = [InputSpec(name="x", dtype="float32", shape=["batch", 4]), InputSpec(name="ids", dtype="int64", shape=["batch", "seq"])]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12))
json_like = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=16
)


def _fresh(folder: Path) -> Path:
    """An empty folder for one example (hypothesis reuses the test's tmp_path across examples)."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@st.composite
def _mutations(draw, valid: bytes) -> bytes:
    """A valid file cut short, with bytes overwritten, or with bytes inserted: a corrupt copy of a real one."""
    blob = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["cut", "flip", "insert"]))
        if kind == "cut":
            del blob[draw(st.integers(0, len(blob))) :]
        elif blob and kind == "flip":
            blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
        else:
            i = draw(st.integers(0, len(blob)))
            blob[i:i] = draw(st.binary(max_size=8))
    return bytes(blob)


def _load(folder: Path, specs, tokenizer=None, axes=None):
    from trtforge.calibrate import data as data_mod

    return data_mod.load_samples(folder, specs, tokenizer, 64, None, axes)


def _valid_samples(samples, specs) -> None:
    """A returned sample set is what the steps rely on: one array per input, right rank and dtype, finite floats."""
    assert samples
    for sample in samples:
        for spec in specs:
            array = sample[spec.name]
            assert array.ndim == len(spec.shape) and array.dtype == np.dtype(spec.dtype) and array.size > 0
            if array.dtype.kind == "f":
                assert np.isfinite(array).all()


# -- arrays ---------------------------------------------------------------------------------------------------------

npz_arrays = st.dictionaries(
    st.sampled_from(["image", "x", "ids", "other"]),
    hnp.arrays(
        st.sampled_from([np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_, np.complex64]),
        hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=4),
    ),
    max_size=3,
)


@PROPERTY
@given(npz_arrays, st.sampled_from([IMAGE_SPEC, VEC_SPECS]))
def test_npz_of_any_arrays(tmp_path, arrays, specs):
    folder = _fresh(tmp_path / "d")
    np.savez(folder / "a.npz", **arrays)
    try:
        _valid_samples(_load(folder, specs)[1], specs)
    except UserError:
        pass


def _npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@PROPERTY
@given(st.one_of(st.binary(max_size=600), _mutations(_npz_bytes(image=np.ones((1, 3, 4, 4), np.float32)))))
def test_npz_of_any_bytes(tmp_path, blob):
    folder = _fresh(tmp_path / "d")
    (folder / "a.npz").write_bytes(blob)
    try:
        _valid_samples(_load(folder, IMAGE_SPEC)[1], IMAGE_SPEC)
    except UserError:
        pass


def _npy_bytes(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


@PROPERTY
@given(
    st.one_of(st.binary(max_size=400), _mutations(_npy_bytes(np.ones((2, 4), np.float32)))), st.sampled_from(["x.npy", "ids.npy", "y.npy"])
)
def test_npy_of_any_bytes(tmp_path, blob, name):
    folder = _fresh(tmp_path / "d")
    (folder / "s0").mkdir()
    if name != "ids.npy":
        (folder / "s0" / "ids.npy").write_bytes(_npy_bytes(np.ones((1, 3), np.int64)))
    (folder / "s0" / name).write_bytes(blob)
    try:
        _valid_samples(_load(folder, VEC_SPECS)[1], VEC_SPECS)
    except UserError:
        pass


# -- text and JSON lines ----------------------------------------------------------------------------------------------


class _Tokenizer:
    """Stands in for the model's tokenizer: a token per character, specials 101/102."""

    def encode(self, text: str, max_length: int) -> dict[str, np.ndarray]:
        ids = [101] + [ord(c) % 1000 for c in text][: max_length - 2] + [102]
        return {"ids": np.asarray([ids], np.int64)}


TEXT_SPECS = [InputSpec(name="ids", dtype="int64", shape=["batch", "seq"])]
jsonl_lines = st.lists(
    st.one_of(json_like.map(json.dumps), st.text(max_size=30), st.fixed_dictionaries({"text": st.text(max_size=30)}).map(json.dumps)),
    max_size=6,
)


@PROPERTY
@given(
    st.one_of(st.binary(max_size=400), jsonl_lines.map(lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass"))),
    st.sampled_from(["a.jsonl", "a.txt"]),
)
def test_text_and_jsonl_of_any_bytes(tmp_path, blob, name):
    folder = _fresh(tmp_path / "d")
    (folder / name).write_bytes(blob)
    try:
        _, samples = _load(folder, TEXT_SPECS, tokenizer=_Tokenizer)
        assert samples and all(s["ids"].shape[0] == 1 for s in samples)
    except UserError:
        pass


@PROPERTY
@given(
    st.one_of(
        st.binary(max_size=400),
        st.lists(
            st.one_of(
                json_like, st.fixed_dictionaries({"input_ids": st.lists(st.integers(-5, 2**40), max_size=5)}, optional={"name": json_like})
            ),
            min_size=1,
            max_size=5,
        ).map(lambda items: "\n".join(map(json.dumps, items)).encode()),
    )
)
def test_pretokenized_jsonl_of_any_bytes(tmp_path, blob):
    """run's pre-tokenized inputs ({"input_ids": [...]} per line) and its first-line sniffing."""
    from trtforge.core.layout import Layout  # noqa: F401 - run's module imports it
    from trtforge.runtime.documents import _pretokenized, load_documents

    path = tmp_path / "ids.jsonl"
    path.write_bytes(blob)

    class Tok:
        def document(self, text):
            return np.arange(len(text), dtype=np.int64)

    try:
        docs = _pretokenized(path, Tok())
        assert all(d.ids.dtype == np.int64 and d.ids.ndim == 1 for d in docs)
    except UserError:
        pass
    try:
        load_documents(path, TEXT_SPECS, None, Tok(), tokenize=False)
    except UserError:
        pass


# -- images ---------------------------------------------------------------------------------------------------------


def _image_bytes(mode: str, size: tuple[int, int], fmt: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format=fmt)
    return buf.getvalue()


image_files = st.builds(
    _image_bytes,
    st.sampled_from(["RGB", "L", "RGBA", "P", "1"]),
    st.tuples(st.integers(1, 40), st.integers(1, 40)),
    st.sampled_from(["PNG", "BMP"]),
)


@PROPERTY
@given(
    st.one_of(
        st.binary(max_size=400), image_files, _mutations(_image_bytes("RGB", (8, 8), "PNG")), _mutations(_image_bytes("RGB", (8, 8), "BMP"))
    ),
    st.sampled_from(["a.png", "a.jpg", "a.bmp"]),
)
def test_images_of_any_bytes(tmp_path, blob, name):
    from trtforge.core.config import AxisRange

    folder = _fresh(tmp_path / "d")
    (folder / name).write_bytes(blob)
    axes = {"batch": AxisRange(min=1, opt=1, max=4), "height": AxisRange(min=2, opt=8, max=32), "width": AxisRange(min=2, opt=8, max=32)}
    try:
        _valid_samples(_load(folder, IMAGE_SPEC, axes=axes)[1], IMAGE_SPEC)
    except UserError:
        pass


# -- YAML configs ---------------------------------------------------------------------------------------------------

BASE_CONFIG = (Path(__file__).resolve().parents[1] / "configs" / "tiny-fcn.yaml").read_bytes()


@PROPERTY
@given(
    st.one_of(
        st.binary(max_size=400),
        _mutations(BASE_CONFIG),
        st.lists(st.sampled_from(BASE_CONFIG.splitlines(keepends=True)), max_size=40).map(b"".join),
    )
)
def test_yaml_config_of_any_bytes(tmp_path, blob):
    from trtforge.core.config import ModelConfig, load_config

    path = tmp_path / "c.yaml"
    path.write_bytes(blob)
    try:
        assert isinstance(load_config(path), ModelConfig)
    except UserError as exc:
        assert "c.yaml" in str(exc)


# -- calibration caches ---------------------------------------------------------------------------------------------

VALID_CACHE = b"TRT-8600-EntropyCalibration2\nx: 3c010204\nlayer/out: 3d4ccccd\n"
cache_lines = st.lists(
    st.one_of(
        st.text(max_size=20),
        st.builds(lambda n, h: f"{n}: {h}", st.text(max_size=8), st.text("0123456789abcdefABCDEF", min_size=6, max_size=10)),
    ),
    max_size=6,
).map(lambda ls: ("TRT-8600-MinMaxCalibration\n" + "\n".join(ls)).encode("utf-8", "surrogatepass"))


@PROPERTY
@given(st.one_of(st.binary(max_size=300), _mutations(VALID_CACHE), cache_lines))
def test_calibration_cache_of_any_bytes(tmp_path, blob):
    from trtforge.calibrate.cache import read_cache

    path = tmp_path / "c.cache"
    path.write_bytes(blob)
    try:
        header, amax = read_cache(path)
        assert header.startswith("TRT-") and all(np.isfinite(v) and v >= 0 for v in amax.values())
    except UserError:
        pass


# -- sidecars -------------------------------------------------------------------------------------------------------

sidecar_bytes = st.one_of(
    st.binary(max_size=300), json_like.map(lambda v: json.dumps(v).encode()), st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)
)


@PROPERTY
@given(sidecar_bytes)
def test_any_sidecar(tmp_path, blob):
    from trtforge.core.artifacts import read_sidecar

    (tmp_path / "a.onnx.json").write_bytes(blob)
    try:
        assert isinstance(read_sidecar(tmp_path / "a.onnx"), dict)
    except UserError:
        pass


ENGINE_SIDECAR = {
    "kind": "engine",
    "backend": "tensorrt_rtx",
    "tensorrt_version": "1.0",
    "precision": "fp16",
    "engine_bytes": 4,
    "build_seconds": 1.0,
    "profiles": [{"index": 0, "shapes": {"image": {"min": [1, 3, 16, 16], "opt": [1, 3, 64, 64], "max": [1, 3, 64, 64]}}}],
}


@st.composite
def _engine_sidecars(draw) -> bytes:
    """The engine sidecar build writes, one key (at any depth) replaced by any JSON value or dropped."""
    side = json.loads(json.dumps(ENGINE_SIDECAR))
    shape = side["profiles"][0]["shapes"]["image"]
    parent, key = draw(
        st.sampled_from(
            [(side, k) for k in side]
            + [
                (side["profiles"], 0),
                (side["profiles"][0], "index"),
                (side["profiles"][0], "shapes"),
                (side["profiles"][0]["shapes"], "image"),
            ]
            + [(shape, k) for k in shape]
            + [(shape["max"], 2)]
        )
    )
    if draw(st.booleans()) or isinstance(parent, list):
        parent[key] = draw(json_like)
    else:
        parent.pop(key)
    return json.dumps(side).encode()


@PROPERTY
@given(st.one_of(sidecar_bytes, _engine_sidecars()))
def test_any_engine_sidecar(tmp_path, blob):
    """inspect/run read the engine's sidecar first: every key they rely on is checked before use."""
    from trtforge.build.engine_record import read_engine_sidecar

    (tmp_path / "e.engine").write_bytes(b"\x00" * 4)
    (tmp_path / "e.engine.json").write_bytes(blob)
    try:
        side = read_engine_sidecar(tmp_path / "e.engine", verify=True)
        assert side["profiles"] and all("min" in s for p in side["profiles"] for s in p["shapes"].values())
    except UserError:
        pass


@PROPERTY
@given(st.one_of(sidecar_bytes, st.fixed_dictionaries({"inputs": json_like, "axes": json_like}).map(lambda d: json.dumps(d).encode())))
def test_any_onnx_sidecar_input_specs(tmp_path, blob):
    """The input specs and axes every step reads from an ONNX's sidecar (graph.io_specs)."""
    import onnx
    from onnx import TensorProto, helper

    from trtforge.graph.index import io_specs

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph)
    (tmp_path / "m.onnx.json").write_bytes(blob)
    try:
        specs, axes, _ = io_specs(tmp_path / "m.onnx", model)
        assert all(isinstance(s, InputSpec) for s in specs)
    except UserError:
        pass
    del onnx


# -- lengths files and tokenizer folders ----------------------------------------------------------------------------


@PROPERTY
@given(
    st.one_of(
        st.binary(max_size=200),
        json_like.map(lambda v: json.dumps(v).encode()),
        st.lists(st.integers(-5, 10**6), max_size=8).map(lambda v: "\n".join(map(str, v)).encode()),
    )
)
def test_lengths_file_of_any_bytes(tmp_path, blob):
    from trtforge.build.step import read_lengths

    path = tmp_path / "lengths.txt"
    path.write_bytes(blob)
    try:
        lengths = read_lengths(path)
        assert all(isinstance(n, int) and n >= 1 for n in lengths)
    except UserError:
        pass


TOKENIZER_JSON = json.dumps(
    {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"},
    }
).encode()


@settings(PROPERTY, max_examples=max(EXAMPLES // 4, 50))
@given(
    st.one_of(st.binary(max_size=300), _mutations(TOKENIZER_JSON), json_like.map(lambda v: json.dumps(v).encode())),
    st.one_of(st.none(), st.binary(max_size=100), json_like.map(lambda v: json.dumps(v).encode())),
)
def test_tokenizer_folder_of_any_bytes(tmp_path, tokenizer_json, tokenizer_config):
    pytest.importorskip("tokenizers")
    from trtforge.runtime.tokenize import TextTokenizer

    folder = _fresh(tmp_path / "tok")
    (folder / "tokenizer.json").write_bytes(tokenizer_json)
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_bytes(tokenizer_config)
    try:
        tok = TextTokenizer(folder)
        tok.pad_id  # noqa: B018 - reads the config
    except UserError:
        pass
