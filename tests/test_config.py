from pathlib import Path

import pytest
import yaml

from trtforge.core.config import apply_overrides, config_from_dict, load_config
from trtforge.core.errors import UserError
from trtforge.models import builtin_config_path

ROOT = Path(__file__).resolve().parent.parent


def _minilm_dict():
    return yaml.safe_load(builtin_config_path("minilm").read_text())


def test_builtin_configs_load():
    for name in ("minilm", "tiny-fcn"):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        assert cfg.name == name
        assert cfg.inputs


def test_misspelled_top_level_key_names_file_key_and_suggestion(tmp_path):
    data = _minilm_dict()
    data["exprot"] = data.pop("export")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and "'exprot'" in msg and "did you mean 'export'" in msg


def test_misspelled_nested_key_suggests_sibling():
    data = _minilm_dict()
    data["export"]["opsett"] = 18
    with pytest.raises(UserError, match=r"unknown config key 'export.opsett'; did you mean 'opset'\?"):
        config_from_dict(data, "x.yaml")


def test_misspelled_key_inside_list_item():
    data = _minilm_dict()
    data["inputs"][0]["dtpye"] = "int64"
    with pytest.raises(UserError, match=r"'inputs.0.dtpye'; did you mean 'dtype'"):
        config_from_dict(data, "x.yaml")


def test_axis_range_must_be_ordered():
    data = _minilm_dict()
    data["axes"]["seq"] = {"min": 64, "opt": 8, "max": 512}
    with pytest.raises(UserError, match=r"axes.seq.*min <= opt <= max"):
        config_from_dict(data, "x.yaml")


def test_undeclared_axis_is_an_error():
    data = _minilm_dict()
    data["inputs"][0]["shape"] = ["batch", "tokens"]
    with pytest.raises(UserError, match="axis 'tokens'"):
        config_from_dict(data, "x.yaml")


def test_missing_required_key():
    data = _minilm_dict()
    del data["inputs"]
    with pytest.raises(UserError, match="'inputs' is required"):
        config_from_dict(data, "x.yaml")


def test_invalid_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_flags_override_config_and_none_means_unset():
    cfg = config_from_dict(_minilm_dict())
    new = apply_overrides(cfg, {"export.opset": 18, "export.exporter": None})
    assert new.export.opset == 18 and new.export.exporter == cfg.export.exporter
    with pytest.raises(UserError, match="export.exporter"):
        apply_overrides(cfg, {"export.exporter": "onnxmagic"})


def test_check_sizes_default_to_two_distinct_sizes():
    cfg = config_from_dict(_minilm_dict())
    assert cfg.check_sizes_for("seq") == [7, 131]
    data = _minilm_dict()
    data["export"]["check_sizes"] = {}
    cfg = config_from_dict(data)
    for axis in cfg.axes:
        sizes = cfg.check_sizes_for(axis)
        rng = cfg.axes[axis]
        assert len(sizes) == 2 and all(rng.min <= s <= rng.max for s in sizes)
