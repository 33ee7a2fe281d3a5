"""Bounded hypothesis fuzzing of everything that reads user files: config, ONNX, cache, sidecar.

Whatever the bytes, a reader returns a value or raises UserError: never another exception."""

import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtforge.calibrate.cache import read_cache
from trtforge.core.artifacts import read_sidecar
from trtforge.core.config import ModelConfig, config_from_dict, load_config
from trtforge.core.errors import UserError
from trtforge.core.onnxio import load_onnx

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=False), st.text(max_size=12))
json_like = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12
)


@FUZZ
@given(json_like)
def test_config_from_any_structure(data):
    try:
        assert isinstance(config_from_dict(data, "fuzz.yaml"), ModelConfig)
    except UserError as exc:
        assert "fuzz.yaml" in str(exc) or "command-line" in str(exc)


@FUZZ
@given(st.sampled_from(["name", "model", "inputs", "axes", "export", "build", "run", "calibrate"]), json_like)
def test_config_with_one_mangled_section(tmp_path, key, value):
    base = yaml.safe_load(open("configs/tiny-fcn.yaml").read())
    base[key] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base))
    try:
        load_config(path)
    except UserError:
        pass


@FUZZ
@given(st.binary(max_size=400))
def test_config_from_any_bytes(tmp_path, blob):
    path = tmp_path / "c.yaml"
    path.write_bytes(blob)
    try:
        load_config(path)
    except UserError:
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_onnx_reader(tmp_path, blob):
    path = tmp_path / "m.onnx"
    path.write_bytes(blob)
    try:
        load_onnx(path)
    except UserError:
        pass


@FUZZ
@given(st.text(max_size=300))
def test_cache_reader(tmp_path, text):
    path = tmp_path / "c.cache"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        header, amax = read_cache(path)
        assert header.startswith("TRT-") and all(v >= 0 for v in amax.values())
    except UserError:
        pass


@FUZZ
@given(st.one_of(st.binary(max_size=200), json_like.map(lambda v: json.dumps(v).encode())))
def test_sidecar_reader(tmp_path, blob):
    (tmp_path / "a.onnx.json").write_bytes(blob)
    try:
        assert isinstance(read_sidecar(tmp_path / "a.onnx"), dict)
    except UserError:
        pass
