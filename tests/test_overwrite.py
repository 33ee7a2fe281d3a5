"""No output ever overwrites an input: artifacts.refuse_overwrite, and every command that writes files calling it.

Each command case names the path the old code overwrote (exit 0, data lost); it now exits 2 with one sentence naming
both paths and leaves the input's bytes as they were."""

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import assert_user_error, run_cli

# -- the check itself ---------------------------------------------------------------------------------------------


def _artifact(path, parent=None):
    path.write_bytes(b"model " + path.name.encode())
    path.with_name(path.name + ".json").write_text(json.dumps({"parent": str(parent)} if parent else {"step": "export"}))
    return path


def _refused(*args, **kwargs):
    from trtforge.core.artifacts import refuse_overwrite
    from trtforge.core.errors import UserError

    with pytest.raises(UserError) as info:
        refuse_overwrite(*args, **kwargs)
    return str(info.value)


def test_output_is_the_input_however_spelled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _artifact(tmp_path / "m.onnx")
    (tmp_path / "link.onnx").symlink_to(tmp_path / "m.onnx")
    for output in ("m.onnx", "./m.onnx", str(tmp_path / "m.onnx"), "sub/../m.onnx", "link.onnx"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        message = _refused("clean", ["m.onnx"], [output])
        assert f"write {Path(output)} over its input m.onnx" in message
    # through the symlinked input too
    assert "its input link.onnx" in _refused("clean", ["link.onnx"], ["m.onnx"])


def test_output_or_its_sidecar_over_an_input_sidecar_or_lineage(tmp_path):
    from trtforge.core.artifacts import refuse_overwrite

    raw = _artifact(tmp_path / "m.onnx")
    clean = _artifact(tmp_path / "m.clean.onnx", parent=raw)
    int8 = _artifact(tmp_path / "m.int8.onnx", parent=clean)
    assert "the sidecar of its input" in _refused("build", [int8], [tmp_path / "m.int8.onnx.json"])
    assert "which its input" in _refused("build", [int8], [raw])  # two parents up
    assert "m.onnx.json, the sidecar of" in _refused("build", [int8], [], [tmp_path / "m.onnx.json"])
    # an output whose own sidecar is an input: X -> X.json
    (tmp_path / "notes.json").write_text("{}")
    assert "(the sidecar of" in _refused("export", [tmp_path / "notes.json"], [tmp_path / "notes"])
    assert "twice" not in _refused("run", [raw], [], [tmp_path / "r.json", raw])
    assert "as one file" in _refused("run", [raw], [], [tmp_path / "r.npz", tmp_path / "r.npz"])
    # a file of an input folder is an input; a new file beside them is not, nor are files unrelated to the inputs
    data = tmp_path / "data"
    data.mkdir()
    (data / "s0.npz").write_bytes(b"x")
    assert "a file of its input folder" in _refused("run", [raw, data], [], [data / "s0.npz"])
    refuse_overwrite("run", [raw, data], [tmp_path / "m.fp16.engine"], [data / "new.npz", tmp_path / "r.json"])
    (data / "m.int8.onnx").write_bytes(b"an earlier output kept beside the data")  # not data: replaced as usual
    refuse_overwrite("calibrate", [clean, data], [data / "m.int8.onnx", data / "m.calib.cache"])
    refuse_overwrite("calibrate", [clean, None], [tmp_path / "other.int8.onnx", tmp_path / "other.calib.cache"])


# -- every command, on tiny-fcn -----------------------------------------------------------------------------------


@pytest.fixture()
def work(tiny_fcn_clean, tmp_path):
    """A copy of the exported and cleaned tiny-fcn (t.onnx, t.clean.onnx, sidecars), calibration data and one input."""
    for name in ("tiny-fcn.onnx", "tiny-fcn.clean.onnx"):
        shutil.copy(tiny_fcn_clean.with_name(name), tmp_path / name.replace("tiny-fcn", "t"))
        side = json.loads(tiny_fcn_clean.with_name(name + ".json").read_text())
        if "parent" in side:
            side["parent"] = str(tmp_path / "t.onnx")
        (tmp_path / (name.replace("tiny-fcn", "t") + ".json")).write_text(json.dumps(side))
    shutil.copytree("calib_data/tiny_fcn", tmp_path / "data")
    (tmp_path / "in").mkdir()
    shutil.copy(tmp_path / "data" / "sample_0.npz", tmp_path / "in" / "a.npz")
    return tmp_path


def _unchanged(paths):
    """{path: bytes} now, to compare after a refused command."""
    return {p: p.read_bytes() for p in paths}


@pytest.mark.parametrize("case", ["clean", "calibrate", "from_cache", "run_report", "run_save_outputs", "bisect_report", "build_sidecar"])
def test_the_issue_paths_are_refused(work, case):
    onnx, clean = work / "t.onnx", work / "t.clean.onnx"
    data = ["--data", str(work / "data")]
    if case in ("from_cache", "bisect_report"):
        proc = run_cli("calibrate", str(clean), *data, "-o", str(work / "c.int8.onnx"), "--min-cosine", "0.5")
        assert proc.returncode == 0, proc.stderr
        shutil.copy(work / "c.calib.cache", work / "c.cache")
    protected = [onnx, clean, onnx.with_name("t.onnx.json"), clean.with_name("t.clean.onnx.json")]
    protected += [work / "c.cache"] if case == "from_cache" else []
    before = _unchanged(protected)
    args, fragments = {
        "clean": (["clean", str(onnx), "-o", str(onnx)], ["clean would write", "its input"]),
        "calibrate": (["calibrate", str(clean), *data, "-o", str(clean)], ["calibrate would write", "its input"]),
        "from_cache": (
            ["calibrate", str(clean), *data, "--from-cache", str(work / "c.cache"), "-o", str(work / "c.cache")],
            ["c.cache", "its input"],
        ),
        "run_report": (["run", str(onnx), "--inputs", str(work / "in"), "--report", str(onnx)], ["run would write", "its input"]),
        "run_save_outputs": (["run", str(onnx), "--inputs", str(work / "in"), "--save-outputs", str(onnx)], ["its input"]),
        "bisect_report": (
            ["bisect", str(clean), *data, "--cache", str(work / "c.calib.cache"), "--no-engine", "--report", str(clean)],
            ["bisect would write", "its input"],
        ),
        "build_sidecar": (["build", str(onnx), "-o", str(onnx) + ".json"], ["build would write", "the sidecar of its input"]),
    }[case]
    assert_user_error(run_cli(*args), *fragments)
    assert _unchanged(protected) == before


def test_relative_and_symlinked_spellings_through_the_cli(work):
    """`./x` against `x`, and a symlink to the input: the same file, refused."""
    os.symlink(work / "t.onnx", work / "alias.onnx")
    assert_user_error(run_cli("clean", "./t.onnx", "-o", str(work / "t.onnx"), cwd=work), f"write {work / 't.onnx'} over its input t.onnx")
    assert_user_error(run_cli("clean", "t.onnx", "-o", "alias.onnx", cwd=work), "alias.onnx", "its input t.onnx")
    # the parent of the input, by the sidecar's lineage
    assert_user_error(
        run_cli("calibrate", "t.clean.onnx", "--data", "data", "-o", "t.onnx", cwd=work), "which its input t.clean.onnx was made from"
    )
