"""The bad-input matrix: every command, fed the inputs users get wrong (option values, config files, model files,
data folders, engines and their sidecars). Each case: exit 2, exactly one `error:` sentence (the last line on stderr)
naming the flag, config key, file or tensor, and no traceback.

The cases run in-process (`trtforge.cli.main` with a patched argv and captured output), on tiny models: a hand-made
ONNX graph and the tiny-fcn image model, so that a few hundred cases take well under a minute.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import ROOT, assert_user_error

from trtforge.cli import app as cli


def invoke(*args: object) -> subprocess.CompletedProcess:
    """`trtforge ARGS` in this process: (exit code, stdout, stderr) as a CompletedProcess for assert_user_error."""
    argv = ["trtforge", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = argv
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.fixture(autouse=True)
def plain_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRTFORGE_LOG_DIR", str(tmp_path / "logs"))


# -- the world every case points into ------------------------------------------------------------------------------


def _vec_onnx(path: Path) -> None:
    """x [batch, 4] -> MatMul -> Relu -> y [batch, 8]: the smallest model with a dynamic axis."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "vec",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _npz(path: Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)


def _image_cases(root: Path) -> dict[str, Path]:
    """Folders (or files) of bad samples for the tiny-fcn model (input 'image' [batch, 3, height, width], height and
    width 16..1024)."""
    good = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    cases: dict[str, Path] = {}

    def folder(name: str) -> Path:
        cases[name] = root / name
        cases[name].mkdir(parents=True)
        return cases[name]

    folder("empty")
    (folder("unrelated") / "notes.md").write_text("no samples here\n")
    mixed = folder("mixed")
    _npz(mixed / "a.npz", image=good)
    (mixed / "b.txt").write_text("a document\n")
    _npz(folder("zero_batch") / "a.npz", image=np.zeros((0, 3, 32, 32), np.float32))
    _npz(folder("zero_width") / "a.npz", image=np.zeros((1, 3, 32, 0), np.float32))
    _npz(folder("wrong_name") / "a.npz", pixels=good)
    _npz(folder("wrong_rank") / "a.npz", image=good[0, 0])
    _npz(folder("wrong_channels") / "a.npz", image=np.zeros((1, 5, 32, 32), np.float32))
    _npz(folder("wrong_dtype") / "a.npz", image=np.zeros((1, 3, 32, 32), np.int64))
    _npz(folder("complex") / "a.npz", image=np.zeros((1, 3, 32, 32), np.complex64))
    _npz(folder("strings") / "a.npz", image=np.array(["a", "b"]))
    nan = good.copy()
    nan[0, 0, 0, 0] = np.nan
    _npz(folder("nan") / "a.npz", image=nan)
    inf = good.copy()
    inf[0, 1, 2, 3] = np.inf
    _npz(folder("inf") / "a.npz", image=inf)
    (folder("bad_npz") / "a.npz").write_bytes(b"PK\x03\x04 not really a zip" * 10)
    (folder("bad_npy") / "image.npy").write_bytes(b"\x93NUMPY garbage")
    np.save(folder("misnamed_npy") / "pixels.npy", good)
    np.save(folder("object_npy") / "image.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (folder("bad_image") / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(200)))
    (folder("empty_image") / "a.png").write_bytes(b"")
    (folder("binary_jsonl") / "a.jsonl").write_bytes(bytes(range(256)) * 4)
    (folder("bad_jsonl") / "a.jsonl").write_text('{"text": "ok"}\nnot json\n')
    (folder("jsonl_no_text") / "a.jsonl").write_text('{"body": "no text field"}\n')
    (folder("empty_text") / "a.txt").write_text("   \n")
    _npz(folder("too_small") / "a.npz", image=np.zeros((1, 3, 8, 32), np.float32))
    _npz(folder("too_large_batch") / "a.npz", image=np.zeros((17, 3, 16, 16), np.float32))
    cases["a_file"] = root / "a_file.npz"
    _npz(cases["a_file"], image=good)
    cases["missing"] = root / "does_not_exist"
    cases["binary_jsonl_file"] = root / "inputs.jsonl"
    cases["binary_jsonl_file"].write_bytes(b'{"input_ids"' + bytes(range(128, 256)))
    cases["pretokenized_binary"] = root / "ids.jsonl"
    cases["pretokenized_binary"].write_bytes(b'{"input_ids": [1, 2]}\n' + bytes(range(128, 256)))
    return cases


@pytest.fixture(scope="module")
def world(tiny_fcn_clean, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("matrix")
    w: dict = {"root": root}
    w["vec"] = root / "vec.onnx"
    _vec_onnx(w["vec"])
    # tiny-fcn, cleaned, with its sidecar (axes from the config), calibrated once for bisect and the Q/DQ cases.
    fcn = root / "fcn.clean.onnx"
    shutil.copy(tiny_fcn_clean, fcn)
    shutil.copy(str(tiny_fcn_clean) + ".json", str(fcn) + ".json")
    w["fcn"] = fcn
    w["images"] = root / "images"
    w["images"].mkdir()
    for src in sorted((ROOT / "calib_data" / "images").glob("*.png"))[:2]:
        shutil.copy(src, w["images"] / src.name)
    proc = invoke(
        "calibrate",
        fcn,
        "--data",
        w["images"],
        "--eval-data",
        w["images"],
        "--min-cosine",
        "0",
        "--min-int8-flops",
        "0",
        "--no-engine-check",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    w["int8"] = root / "fcn.int8.onnx"
    w["data"] = _image_cases(root / "data")
    w["file"] = root / "plain_file"
    w["file"].write_text("a file where a folder belongs\n")
    w["garbage_onnx"] = root / "garbage.onnx"
    w["garbage_onnx"].write_bytes(bytes(range(256)) * 8)
    w["empty_onnx"] = root / "empty.onnx"
    w["empty_onnx"].write_bytes(b"")
    w["text_onnx"] = root / "text.onnx"
    w["text_onnx"].write_text("ir_version: 8\n")
    w["folder_onnx"] = root / "folder.onnx"
    w["folder_onnx"].mkdir()
    w["missing_onnx"] = root / "missing.onnx"
    w["binary_lengths"] = root / "lengths.txt"
    w["binary_lengths"].write_bytes(bytes(range(128, 256)))
    w["negative_lengths"] = root / "neg_lengths.txt"
    w["negative_lengths"].write_text("12\n-4\n")
    w["configs"] = _configs(root / "configs")
    try:
        import tensorrt_rtx  # noqa: F401
    except ImportError:
        w["engine"] = None
    else:
        engine = root / "eng" / "t.engine"
        proc = invoke("build", fcn, "--tiers", "height=64;width=64", "-o", engine)
        assert proc.returncode == 0, proc.stderr[-2000:]
        w["engine"] = engine
    return w


# -- config files: (name, edit of tiny-fcn's config or raw text, what the sentence names) --------------------------


def _set(path: str, value):
    def edit(cfg: dict) -> dict:
        node = cfg
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        return cfg

    return edit


def _drop(key: str):
    def edit(cfg: dict) -> dict:
        cfg.pop(key)
        return cfg

    return edit


BASE_CONFIG = (ROOT / "configs" / "tiny-fcn.yaml").read_text()

CONFIGS = {
    "duplicate_key": (BASE_CONFIG.replace("  opset: 17\n", "  opset: 17\n  opset: 18\n"), ["duplicate key 'opset'", ":17"]),
    "duplicate_top_key": (BASE_CONFIG + "name: other\n", ["duplicate key 'name'"]),
    "duplicate_nested_key": (
        BASE_CONFIG.replace("  method: percentile\n", "  method: percentile\n  method: minmax\n"),
        ["duplicate key 'method'"],
    ),
    "unknown_key": (BASE_CONFIG.replace("  opset: 17", "  opst: 17"), ["export.opst", "did you mean 'opset'"]),
    "unknown_section": (BASE_CONFIG.replace("build:", "buld:"), ["buld"]),
    "check_sizes_one": (_set("export.check_sizes.batch", [1]), ["export.check_sizes.batch", "two different sizes"]),
    "check_sizes_same": (_set("export.check_sizes.height", [33, 33]), ["export.check_sizes.height", "two different sizes"]),
    "check_sizes_outside": (_set("export.check_sizes.batch", [1, 300]), ["export.check_sizes.batch", "1..16"]),
    "check_sizes_zero": (_set("export.check_sizes.width", [0, 40]), ["export.check_sizes.width"]),
    "check_sizes_unknown_axis": (_set("export.check_sizes.depth", [1, 2]), ["depth"]),
    "tiers_unknown_axis": (_set("build.tiers", {"heigth": [256, 1024]}), ["build.tiers", "heigth"]),
    "tiers_empty": (_set("build.tiers", {"height": []}), ["build.tiers.height"]),
    "tiers_zero": (_set("build.tiers", {"height": [0, 256]}), ["build.tiers.height"]),
    "clean_tolerance_zero": (_set("clean.tolerance", 0), ["clean.tolerance", "greater than 0"]),
    "clean_tolerance_one": (_set("clean.tolerance", 1.0), ["clean.tolerance", "less than 1"]),
    "clean_fold_negative": (_set("clean.fold_size_limit_mb", -1), ["clean.fold_size_limit_mb"]),
    "export_tolerance_nan": (_set("export.tolerance", float("nan")), ["export.tolerance"]),
    "export_opset_old": (_set("export.opset", 3), ["export.opset"]),
    "export_opset_future": (_set("export.opset", 99), ["export.opset", "at most"]),
    "export_exporter": (_set("export.exporter", "torchscript"), ["export.exporter", "'legacy' or 'dynamo'"]),
    "percentile_150": (_set("calibrate.percentile", 150), ["calibrate.percentile", "100"]),
    "max_samples_negative": (_set("calibrate.max_samples", -3), ["calibrate.max_samples"]),
    "method_unknown": (_set("calibrate.method", "kl"), ["calibrate.method"]),
    "smooth_two": (_set("calibrate.smooth", 2), ["calibrate.smooth"]),
    "calibrate_min_cosine": (_set("calibrate.min_cosine", 2), ["calibrate.min_cosine"]),
    "num_bins_small": (_set("calibrate.num_bins", 8), ["calibrate.num_bins"]),
    "optimization_level_9": (_set("build.optimization_level", 9), ["build.optimization_level"]),
    "workspace_negative": (_set("build.workspace_mb", -1), ["build.workspace_mb"]),
    "precision_unknown": (_set("build.precision", "fp64"), ["build.precision"]),
    "fuse_gemm_unknown": (_set("build.fuse_gemm", "maybe"), ["build.fuse_gemm"]),
    "fp8_cosine_zero": (_set("build.fp8_min_cosine", 0), ["build.fp8_min_cosine"]),
    "run_chunk_zero": (_set("run.chunk", 0), ["run.chunk"]),
    "run_overlap_negative": (_set("run.overlap", -1), ["run.overlap"]),
    "run_warmup_negative": (_set("run.warmup", -1), ["run.warmup"]),
    "run_max_rel_l2_negative": (_set("run.max_rel_l2", -1), ["run.max_rel_l2"]),
    "run_max_rel_l2_inf": (_set("run.max_rel_l2", float("inf")), ["run.max_rel_l2"]),
    "run_min_cosine_two": (_set("run.min_cosine", 2), ["run.min_cosine"]),
    "run_merge_unknown": (_set("run.merge", "blend"), ["run.merge"]),
    "run_batch_zero": (_set("run.batch_size", 0), ["run.batch_size"]),
    "axis_reversed": (_set("axes.height", {"min": 64, "opt": 32, "max": 16}), ["axes.height", "min <= opt <= max"]),
    "axis_zero": (_set("axes.width", {"min": 0, "opt": 1, "max": 2}), ["axes.width.min"]),
    "undeclared_axis": (_set("inputs", [{"name": "image", "shape": ["batch", 3, "depth", "width"]}]), ["depth"]),
    "input_dtype": (_set("inputs", [{"name": "image", "dtype": "float64", "shape": ["batch", 3, "height", "width"]}]), ["inputs.0.dtype"]),
    "fixed_dim_zero": (_set("inputs", [{"name": "image", "shape": ["batch", 0, "height", "width"]}]), ["inputs.0.shape.1"]),
    "duplicate_output": (_set("outputs", ["logits", "logits"]), ["'logits' more than once"]),
    "value_range_reversed": (
        _set("inputs", [{"name": "image", "shape": ["batch", 3, "height", "width"], "value_range": [1, 0]}]),
        ["inputs.0.value_range"],
    ),
    "output_scale_on_logits": (_set("outputs", [{"name": "logits", "kind": "logits", "scale": 2}]), ["scale"]),
    "missing_name": (_drop("name"), ["'name' is required"]),
    "not_a_mapping": ("- just\n- a list\n", ["must be a YAML mapping"]),
    "empty_file": ("", ["must be a YAML mapping"]),
    "bad_syntax": ("name: [unclosed\n", ["not valid YAML"]),
    "binary": (bytes(range(256)), ["not valid YAML"]),
    "tab_indent": ("name: x\nmodel:\n\tsource: tiny-fcn\n", ["not valid YAML"]),
}


def _configs(folder: Path) -> dict[str, Path]:
    folder.mkdir()
    paths = {}
    for name, (content, _) in CONFIGS.items():
        path = folder / f"{name}.yaml"
        if callable(content):
            path.write_text(yaml.safe_dump(content(yaml.safe_load(BASE_CONFIG)), sort_keys=False))
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        paths[name] = path
    return paths


CONFIG_COMMANDS = {
    "export": lambda w, c: ["export", "-c", c, "-o", w["root"] / "never.onnx"],
    "pipeline": lambda w, c: ["pipeline", c, "--out-dir", w["root"] / "never_out"],
    "calibrate": lambda w, c: ["calibrate", w["fcn"], "-c", c, "--data", w["images"], "-o", w["root"] / "never.int8.onnx"],
    "build": lambda w, c: ["build", w["fcn"], "-c", c, "-o", w["root"] / "never.engine"],
    "run": lambda w, c: ["run", w["fcn"], "-c", c, "--inputs", w["images"]],
}


@pytest.mark.parametrize("command", list(CONFIG_COMMANDS))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_bad_config(world, command, config):
    path = world["configs"][config]
    assert_user_error(invoke(*CONFIG_COMMANDS[command](world, path)), path.name, *CONFIGS[config][1])


# -- option values: checked when parsed, before any file is read -----------------------------------------------------

OPTIONS = {
    "export": (
        ["export", "--model", "tiny-fcn"],
        [
            (["--opset", "3"], "--opset"),
            (["--opset", "99"], "--opset"),
            (["--exporter", "torchscript"], "--exporter"),
            (["--opset", "seventeen"], "--opset"),
        ],
    ),
    "clean": (
        ["clean", "m.onnx"],
        [
            (["--tolerance", "0"], "--tolerance"),
            (["--tolerance", "-1"], "--tolerance"),
            (["--tolerance", "1"], "--tolerance"),
            (["--tolerance", "nan"], "--tolerance"),
            (["--fold-size-limit-mb", "0"], "--fold-size-limit-mb"),
            (["--fold-size-limit-mb", "-5"], "--fold-size-limit-mb"),
        ],
    ),
    "calibrate": (
        ["calibrate", "m.onnx", "--data", "d"],
        [
            (["--method", "kl"], "--method"),
            (["--percentile", "150"], "--percentile"),
            (["--percentile", "0"], "--percentile"),
            (["--percentile", "-5"], "--percentile"),
            (["--smooth", "1.5"], "--smooth"),
            (["--smooth", "-0.1"], "--smooth"),
            (["--max-samples", "-3"], "--max-samples"),
            (["--max-samples", "0"], "--max-samples"),
            (["--max-eval-samples", "0"], "--max-eval-samples"),
            (["--min-cosine", "2"], "--min-cosine"),
            (["--min-cosine", "-3"], "--min-cosine"),
            (["--min-int8-flops", "1.5"], "--min-int8-flops"),
            (["--min-int8-flops", "-0.1"], "--min-int8-flops"),
            (["--min-top1-agreement", "2"], "--min-top1-agreement"),
            (["--min-pixel-agreement", "-1"], "--min-pixel-agreement"),
            (["--ray-actors", "0"], "--ray-actors"),
            (["--ray-actors", "2"], "--ray-actors"),
            (["--from-cache", "missing.cache"], "--from-cache"),
            (["--percentile", "abc"], "--percentile"),
        ],
    ),
    "build": (
        ["build", "m.onnx"],
        [
            (["--precision", "fp64"], "--precision"),
            (["--tier-count", "0"], "--tier-count"),
            (["--tier-count", "100"], "--tier-count"),
            (["--lengths", "missing.txt"], "--lengths"),
            (["--backend", "cuda"], "--backend"),
            (["--workspace-mb", "-1"], "--workspace-mb"),
            (["--workspace-mb", "0"], "--workspace-mb"),
            (["--optimization-level", "9"], "--optimization-level"),
            (["--optimization-level", "-1"], "--optimization-level"),
            (["--hardware-compatibility", "any"], "--hardware-compatibility"),
            (["--fuse-attention", "maybe"], "--fuse-attention"),
            (["--fuse-gelu", "2"], "--fuse-gelu"),
            (["--fuse-skip-layernorm", "sometimes"], "--fuse-skip-layernorm"),
            (["--fuse-gemm", "x"], "--fuse-gemm"),
            (["--qkv-projection", "linear"], "--qkv-projection"),
            (["--gemm-precision", "int4"], "--gemm-precision"),
            (["--fp8-min-cosine", "0"], "--fp8-min-cosine"),
            (["--fp8-min-cosine", "1.5"], "--fp8-min-cosine"),
            (["--fp8-min-top1-agreement", "0"], "--fp8-min-top1-agreement"),
            (["--fp8-chain-ffn", "sometimes"], "--fp8-chain-ffn"),
            (["--workspace-mb", "abc"], "--workspace-mb"),
        ],
    ),
    "bisect": (
        ["bisect", "m.onnx", "--data", "d"],
        [
            (["--max-samples", "0"], "--max-samples"),
            (["--max-gap", "-0.1"], "--max-gap"),
            (["--optimization-level", "7"], "--optimization-level"),
            (["--precision", "fp16"], "--precision"),
            (["--modes", "both"], "--modes"),
        ],
    ),
    "run": (
        ["run", "m.onnx", "--inputs", "d"],
        [
            (["--chunk", "0"], "--chunk"),
            (["--chunk", "-3"], "--chunk"),
            (["--overlap", "-1"], "--overlap"),
            (["--batch-size", "0"], "--batch-size"),
            (["--warmup", "-1"], "--warmup"),
            (["--max-rel-l2", "-1"], "--max-rel-l2"),
            (["--max-rel-l2", "0"], "--max-rel-l2"),
            (["--max-rel-l2", "inf"], "--max-rel-l2"),
            (["--min-cosine", "2"], "--min-cosine"),
            (["--min-cosine", "-1.5"], "--min-cosine"),
            (["--min-cosine", "nan"], "--min-cosine"),
            (["--min-chunk-cosine", "1.5"], "--min-chunk-cosine"),
            (["--min-top1-agreement", "1.2"], "--min-top1-agreement"),
            (["--min-top1-agreement", "-0.1"], "--min-top1-agreement"),
            (["--min-pixel-agreement", "2"], "--min-pixel-agreement"),
            (["--merge", "blend"], "--merge"),
            (["--gpu-wait", "poll"], "--gpu-wait"),
            (["--last-window", "half"], "--last-window"),
            (["--backend", "cuda"], "--backend"),
            (["--provider", "CUDAExecutionProvider"], "--provider CUDAExecutionProvider"),
            (["--provider", "TensorrtExecutionProvider"], "--provider TensorrtExecutionProvider"),
            (["--ray-actors", "0"], "--ray-actors"),
            (["--ray-actors", "2"], "--ray-actors"),
            (["--generate", "-1"], "--generate"),
            (["--slots", "0"], "--slots"),
            (["--plan-ahead", "-1"], "--plan-ahead"),
            (["--plan-workers", "-1"], "--plan-workers"),
            (["--merge-workers", "-2"], "--merge-workers"),
            (["--pinned-reserve-mb", "-1"], "--pinned-reserve-mb"),
            (["--plan-processes", "-1"], "--plan-processes"),
            (["--switch-interval-us", "0"], "--switch-interval-us"),
            (["--chunk", "abc"], "--chunk"),
            (["--warmup", "1.5"], "--warmup"),
            (["--output-kind", "y"], "y"),
            (["--output-kind", "y=blob"], "blob"),
        ],
    ),
    "doctor": (["doctor"], [(["--bogus"], "--bogus"), (["extra"], "extra"), (["--json", "--verbose"], "--verbose")]),
    "inspect": (["inspect"], [(["a.engine", "b.engine"], "b.engine"), (["a.engine", "--verbose"], "--verbose")]),
    "pipeline": (
        ["pipeline", "c.yaml"],
        [
            (["--from", "bogus"], "--from"),
            (["--only", "deploy"], "--only"),
            (["--backend", "cuda"], "--backend"),
        ],
    ),
}

OPTION_CASES = [
    pytest.param(command, extra, says, id=f"{command}:{' '.join(extra)}")
    for command, (_, cases) in OPTIONS.items()
    for extra, says in cases
]


@pytest.mark.parametrize("command, extra, says", OPTION_CASES)
def test_bad_option_value(command, extra, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths (m.onnx, d) name nothing
    base = OPTIONS[command][0]
    line = assert_user_error(invoke(*base, *extra), says)
    if extra[-1] not in ("missing.cache", "missing.txt"):
        assert extra[-1] in line, line  # the sentence repeats the value it refused


def test_the_option_check_and_the_config_key_say_the_same(tmp_path):
    """One constraint, one sentence: the CLI's check of --percentile is the config's check of calibrate.percentile."""
    cfg = yaml.safe_load(BASE_CONFIG)
    cfg["calibrate"]["percentile"] = 150
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    from_config = assert_user_error(invoke("calibrate", "m.onnx", "-c", tmp_path / "c.yaml", "--data", "d"))
    from_flag = assert_user_error(invoke("calibrate", "m.onnx", "--percentile", "150", "--data", "d"))
    assert "must be less than or equal to 100, got 150" in from_config and "must be less than or equal to 100, got 150" in from_flag


# -- folders that are files, files that are folders -------------------------------------------------------------------


def test_out_dir_naming_a_file(world):
    assert_user_error(
        invoke("bisect", world["fcn"], "--data", world["images"], "--no-engine", "--out-dir", world["file"]),
        "--out-dir",
        "plain_file",
        "is a file",
    )
    assert_user_error(
        invoke("bisect", world["fcn"], "--data", world["images"], "--no-engine", "--out-dir", world["file"] / "sub"),
        "plain_file",
        "is a file",
    )
    assert_user_error(invoke("pipeline", world["configs"]["duplicate_key"], "--out-dir", world["file"]), "plain_file")


def test_default_bisect_folder_is_a_file(world, tmp_path):
    onnx_path = tmp_path / "m.clean.onnx"
    shutil.copy(world["fcn"], onnx_path)
    shutil.copy(str(world["fcn"]) + ".json", str(onnx_path) + ".json")
    (tmp_path / "m.bisect").write_text("in the way\n")
    assert_user_error(
        invoke("bisect", onnx_path, "--cache", world["root"] / "fcn.calib.cache", "--data", world["images"], "--no-engine"), "m.bisect"
    )


# -- model files: missing, garbage, empty, text, a folder --------------------------------------------------------------

MODEL_FILES = ["missing_onnx", "garbage_onnx", "empty_onnx", "text_onnx", "folder_onnx"]
MODEL_COMMANDS = {
    "clean": lambda w, m: ["clean", m, "-o", w["root"] / "never.clean.onnx"],
    "calibrate": lambda w, m: ["calibrate", m, "--data", w["images"], "-o", w["root"] / "never.int8.onnx"],
    "build": lambda w, m: ["build", m, "-o", w["root"] / "never.engine"],
    "run": lambda w, m: ["run", m, "--inputs", w["images"]],
    "bisect": lambda w, m: ["bisect", m, "--data", w["images"], "--cache", w["root"] / "fcn.calib.cache", "--no-engine"],
    "inspect": lambda w, m: ["inspect", m],
    "run-reference": lambda w, m: ["run", w["fcn"], "--reference", m, "--inputs", w["images"]],
}


@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
@pytest.mark.parametrize("model", MODEL_FILES)
def test_bad_model_file(world, command, model):
    path = world[model]
    assert_user_error(invoke(*MODEL_COMMANDS[command](world, path)), path.name)


# -- data folders ---------------------------------------------------------------------------------------------------

DATA = {  # case: what the sentence names besides the file or folder
    "empty": [],
    "unrelated": [],
    "mixed": ["mixes"],
    "zero_batch": ["'image'", "empty"],
    "zero_width": ["'image'", "empty"],
    "wrong_name": ["'image'"],
    "wrong_rank": ["'image'", "rank"],
    "wrong_channels": ["'image'", "dim 1"],
    "wrong_dtype": ["'image'", "int64"],
    "complex": ["'image'", "complex64"],
    "strings": ["'image'"],
    "nan": ["'image'", "NaN"],
    "inf": ["'image'", "NaN or Inf"],
    "bad_npz": ["a.npz"],
    "bad_npy": ["image.npy"],
    "misnamed_npy": ["pixels.npy"],
    "object_npy": ["image.npy"],
    "bad_image": ["a.png"],
    "empty_image": ["a.png"],
    "binary_jsonl": [],
    "bad_jsonl": [],
    "jsonl_no_text": [],
    "empty_text": [],
    "a_file": [],
    "missing": [],
}
DATA_COMMANDS = {
    "calibrate": lambda w, d: ["calibrate", w["fcn"], "--data", d, "-o", w["root"] / "never.int8.onnx"],
    "calibrate-eval": lambda w, d: ["calibrate", w["fcn"], "--data", w["images"], "--eval-data", d, "-o", w["root"] / "never.int8.onnx"],
    "run": lambda w, d: ["run", w["fcn"], "--inputs", d],
    "bisect": lambda w, d: ["bisect", w["fcn"], "--data", d, "--no-engine", "--out-dir", w["root"] / "never.bisect"],
}


def _where(case: str, path: Path) -> str:
    """The part of the path the sentence must name: the folder, or the file inside it that is wrong."""
    return path.name


@pytest.mark.parametrize("command", list(DATA_COMMANDS))
@pytest.mark.parametrize("case", list(DATA))
def test_bad_data(world, command, case):
    path = world["data"][case]
    proc = invoke(*DATA_COMMANDS[command](world, path))
    line = assert_user_error(proc, *DATA[case])
    assert path.name in line or any(p.name in line for p in path.glob("*")) or str(path) in line, line


@pytest.mark.parametrize("command", ["calibrate", "calibrate-eval"])
@pytest.mark.parametrize("case, axis", [("too_small", "'height'"), ("too_large_batch", "'batch'")])
def test_calibration_data_outside_the_axis_ranges(world, command, case, axis):
    assert_user_error(invoke(*DATA_COMMANDS[command](world, world["data"][case])), "a.npz", "'image'", axis, "outside")


@pytest.mark.parametrize("inputs", ["binary_jsonl_file", "pretokenized_binary"])
def test_run_on_a_binary_jsonl(world, inputs):
    path = world["data"][inputs]
    assert_user_error(invoke("run", world["fcn"], "--inputs", path), path.name, "not UTF-8")


# -- quantized twice, lengths files, tiers ----------------------------------------------------------------------------


def test_calibrating_a_quantized_model(world):
    assert_user_error(
        invoke("calibrate", world["int8"], "--data", world["images"], "-o", world["root"] / "twice.int8.onnx"),
        "fcn.int8.onnx",
        "already quantized",
        "fcn.clean.onnx",
    )


def test_bisecting_a_quantized_model(world):
    assert_user_error(invoke("bisect", world["int8"], "--data", world["images"], "--no-engine"), "fcn.int8.onnx", "Q/DQ")


@pytest.mark.parametrize("lengths, says", [("binary_lengths", "lengths.txt"), ("negative_lengths", "neg_lengths.txt")])
def test_bad_lengths_file(world, lengths, says):
    assert_user_error(
        invoke("build", world["fcn"], "--tiers", "auto", "--lengths", world[lengths], "-o", world["root"] / "never.engine"), says
    )


@pytest.mark.parametrize(
    "tiers, says",
    [
        ("depth=64", "'depth'"),
        ("height=64,32;width=64", "strictly increasing"),
        ("height=4096;width=64", "1024"),
        ("height=a,b;width=64", "comma-separated"),
        ("auto", "--lengths"),
    ],
)
def test_bad_tiers(world, tiers, says):
    assert_user_error(invoke("build", world["fcn"], "--tiers", tiers, "-o", world["root"] / "never.engine"), says)


def test_config_tiers_on_an_axis_the_model_lacks(world, tmp_path):
    """A config whose axes declare 'depth' but whose model (another ONNX) has no such axis: refused, not dropped."""
    cfg = yaml.safe_load(BASE_CONFIG)
    cfg["axes"]["depth"] = {"min": 1, "opt": 2, "max": 4}
    cfg["build"]["tiers"] = {"depth": [2, 4]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert_user_error(
        invoke("build", world["fcn"], "-c", tmp_path / "c.yaml", "-o", world["root"] / "never.engine"), "build.tiers", "'depth'"
    )


# -- engines and their sidecars -------------------------------------------------------------------------------------


def _without(key):
    def edit(side):
        side.pop(key)
        return side

    return edit


def _with(key, value):
    def edit(side):
        side[key] = value
        return side

    return edit


SIDECARS = {
    "no_profiles": (_without("profiles"), "lacks 'profiles'"),
    "no_backend": (_without("backend"), "lacks 'backend'"),
    "no_precision": (_without("precision"), "lacks 'precision'"),
    "empty_profiles": (_with("profiles", []), "no optimization profiles"),
    "profiles_not_list": (_with("profiles", {"0": 1}), "malformed 'profiles'"),
    "profile_without_shapes": (_with("profiles", [{"index": 0}]), "profile 0"),
    "shape_without_max": (_with("profiles", [{"index": 0, "shapes": {"image": {"min": [1], "opt": [1]}}}]), "'image'"),
    "bytes_as_text": (_with("engine_bytes", "many"), "malformed 'engine_bytes'"),
    "wrong_kind": (_with("kind", "onnx"), "not an engine sidecar"),
    "a_list": (lambda side: [side], "JSON object"),
    "not_json": (None, "not valid JSON"),
}


@pytest.mark.parametrize("command", ["inspect", "run"])
@pytest.mark.parametrize("case", list(SIDECARS))
def test_engine_sidecar(world, tmp_path, command, case):
    if world["engine"] is None:
        pytest.skip("tensorrt_rtx is not installed: no engine to break")
    engine = tmp_path / "e.engine"
    shutil.copy(world["engine"], engine)
    edit, says = SIDECARS[case]
    side_path = tmp_path / "e.engine.json"
    if edit is None:
        side_path.write_bytes(b"{\x00\xff not json")
    else:
        side_path.write_text(json.dumps(edit(json.loads(Path(str(world["engine"]) + ".json").read_text()))))
    args = ["inspect", engine] if command == "inspect" else ["run", engine, "--inputs", world["images"]]
    assert_user_error(invoke(*args), "e.engine", says)


@pytest.mark.parametrize("case", ["missing_sidecar", "truncated", "not_an_engine"])
def test_engine_file(world, tmp_path, case):
    if world["engine"] is None:
        pytest.skip("tensorrt_rtx is not installed: no engine to break")
    engine = tmp_path / "e.engine"
    data = world["engine"].read_bytes()
    engine.write_bytes({"missing_sidecar": data, "truncated": data[:1000], "not_an_engine": b"\x00" * len(data)}[case])
    if case != "missing_sidecar":
        shutil.copy(str(world["engine"]) + ".json", str(engine) + ".json")
    assert_user_error(invoke("inspect", engine), "e.engine")


def test_the_matrix_is_large():
    """The issue asks for >= 250 cases over every command."""
    commands = {"export", "clean", "calibrate", "build", "run", "pipeline", "inspect", "bisect", "doctor"}
    assert commands <= set(OPTIONS) | set(CONFIG_COMMANDS) | set(MODEL_COMMANDS)
    assert set(OPTIONS) == commands, set(OPTIONS) ^ commands
    count = (
        len(CONFIGS) * len(CONFIG_COMMANDS)
        + len(OPTION_CASES)
        + len(MODEL_FILES) * len(MODEL_COMMANDS)
        + len(DATA) * len(DATA_COMMANDS)
        + 4
        + 2
        + 2
        + 2
        + 2
        + 5
        + 1
        + len(SIDECARS) * 2
        + 3
        + 3
    )
    assert count >= 250, count
