"""`run` on detectors: boxes outputs compared by matching, images larger than the model's input cut into slices whose
boxes are shifted back to image pixels and merged, measured against a whole pass; and the errors around them.

The spot detector is a hand-made ONNX whose one query boxes the brightest pixel of its input (16 px square, normalised
cx, cy, w, h), scored by how bright it is: its right answer on any slice is known, so a sliced run must give exactly
the whole pass's box. The zoo's small DETR runs sliced too, its box metrics measured and reported."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from conftest import ROOT, assert_user_error, run_cli
from onnx import TensorProto, helper

from trtforge.core.config import config_from_dict
from trtforge.core.errors import UserError
from trtforge.verify.boxes import BoxSpec

SPOT = (90, 100)  # row, col of the bright pixel in the 200 x 300 image
BOXES = {"format": "cxcywh_norm", "scores": "logits", "activation": "softmax", "no_object": True, "score_threshold": 0.5}


def spot_detector(folder, boxes=BOXES, name="spot.onnx", extra_dense=False, side=16.0):
    """[B, 3, H, W] -> pred_boxes [B, 1, 4]: a `side` px square around the brightest pixel, logits [B, 1, 2] =
    (10 * max - 5, 0) (the second class is 'no object'): a bright pixel scores 0.993, an empty slice 0.007."""
    c = helper.make_tensor
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["gray"], axes=[1], keepdims=0),
        helper.make_node("Shape", ["gray"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["h"]),
        helper.make_node("Gather", ["shape", "two"], ["w"]),
        helper.make_node("Reshape", ["gray", "flat_shape"], ["flat"]),
        helper.make_node("ArgMax", ["flat"], ["idx"], axis=1, keepdims=1),
        helper.make_node("ReduceMax", ["flat"], ["peak"], axes=[1], keepdims=1),
        helper.make_node("Div", ["idx", "w"], ["row"]),
        helper.make_node("Mod", ["idx", "w"], ["col"]),
        *[helper.make_node("Cast", [a], [a + "_f"], to=TensorProto.FLOAT) for a in ("row", "col", "h", "w")],
        helper.make_node("Add", ["col_f", "half"], ["col_c"]),
        helper.make_node("Add", ["row_f", "half"], ["row_c"]),
        helper.make_node("Div", ["col_c", "w_f"], ["cx"]),
        helper.make_node("Div", ["row_c", "h_f"], ["cy"]),
        helper.make_node("Div", ["side", "w_f"], ["bw0"]),
        helper.make_node("Div", ["side", "h_f"], ["bh0"]),
        helper.make_node("Shape", ["cx"], ["col_shape"]),
        helper.make_node("Expand", ["bw0", "col_shape"], ["bw"]),
        helper.make_node("Expand", ["bh0", "col_shape"], ["bh"]),
        helper.make_node("Concat", ["cx", "cy", "bw", "bh"], ["box"], axis=1),
        helper.make_node("Unsqueeze", ["box", "ax1"], ["pred_boxes"]),
        helper.make_node("Mul", ["peak", "ten"], ["p10"]),
        helper.make_node("Sub", ["p10", "five"], ["object"]),
        helper.make_node("Mul", ["peak", "zero"], ["none"]),
        helper.make_node("Concat", ["object", "none"], ["cls"], axis=1),
        helper.make_node("Unsqueeze", ["cls", "ax1"], ["logits"]),
    ]
    outputs = [
        helper.make_tensor_value_info("pred_boxes", TensorProto.FLOAT, ["batch", 1, 4]),
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1, 2]),
    ]
    if extra_dense:
        nodes.append(helper.make_node("Identity", ["x"], ["image"]))
        outputs.append(helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, "height", "width"]))
    inits = [
        c("one", TensorProto.INT64, [], [1]),
        c("two", TensorProto.INT64, [], [2]),
        c("flat_shape", TensorProto.INT64, [2], [0, -1]),
        c("half", TensorProto.FLOAT, [], [0.5]),
        c("side", TensorProto.FLOAT, [], [side]),
        c("ax1", TensorProto.INT64, [1], [1]),
        c("ten", TensorProto.FLOAT, [], [10.0]),
        c("five", TensorProto.FLOAT, [], [5.0]),
        c("zero", TensorProto.FLOAT, [], [0.0]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    graph = helper.make_graph(nodes, "spot", [x], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = folder / name
    onnx.save(model, path)
    declared = [{"name": "logits", "kind": None}, {"name": "pred_boxes", "kind": "boxes", "boxes": boxes}]
    if extra_dense:
        declared.append({"name": "image", "kind": "dense", "scale": 1.0})
    side = {
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 3, "height", "width"]}],
        "axes": {
            "batch": {"min": 1, "opt": 2, "max": 8},
            "height": {"min": 16, "opt": 64, "max": 128},
            "width": {"min": 16, "opt": 64, "max": 128},
        },
        "outputs": declared,
    }
    (folder / f"{name}.json").write_text(json.dumps(side))
    return path


@pytest.fixture()
def spot_image(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    image = np.zeros((1, 3, 200, 300), dtype=np.float32)
    image[0, :, SPOT[0], SPOT[1]] = 1.0
    np.savez(folder / "spot.npz", x=image)
    return folder


def _report(tmp_path, proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "report.json").read_text())


@pytest.mark.parametrize("merge", ["nms", "greedy"])
def test_sliced_spot_detector_finds_the_whole_pass_box(tmp_path, spot_image, merge):
    """200 x 300 through a model that takes at most 128: slices of 64 overlapping by 16 (0.25); two slices see the spot
    and their boxes, shifted back, merge into the one box the whole pass (the top-left 128 x 128 crop) finds."""
    model = spot_detector(tmp_path)
    reference = spot_detector(tmp_path, name="reference.onnx")
    proc = run_cli(
        "run", str(model), "--reference", str(reference), "--inputs", str(spot_image), "--chunk", "64", "--slice-overlap", "0.25",
        "--box-merge", merge, "--report", str(tmp_path / "report.json"), "--save-outputs", str(tmp_path / "out.npz"),
    )  # fmt: skip
    report = _report(tmp_path, proc)
    assert report["chunking"]["overlap"] == 16 and report["inputs"][0]["chunks"] == 4 * 6  # rows 0, 48, 96, 136; cols 0, 48, ... 192, 236
    assert report["batches"] == 3  # every slice 64 x 64 (the last ones end at the edges): one shape, batches of 8
    sliced = report["chunking_error"]
    assert sliced["per_input"][0]["scope"] == "top-left 128x128 crop"
    m = sliced["per_output"]["pred_boxes"]
    assert (m["reference_boxes"], m["candidate_boxes"], m["matched"]) == (1, 1, 1)
    assert m["box_recall"] == 1.0 and m["box_precision"] == 1.0 and m["matched_iou"] == pytest.approx(1.0)
    assert m["score_error"] == pytest.approx(0.0, abs=1e-6) and m["per_image"][0]["matched"] == 1
    assert "logits" not in sliced["per_output"]  # judged within the detections
    precision = report["precision_error"]["per_output"]
    # precision is judged slice by slice, on the very slices the target ran: the two that see the spot have a box each
    assert precision["pred_boxes"]["box_recall"] == 1.0 and precision["pred_boxes"]["reference_boxes"] == 2
    gates = {g["gate"]: g for g in report["gates"]["checked"]}
    assert gates["min_box_recall"]["status"] == "passed" and gates["min_box_recall"]["source"] == "default for boxes outputs"
    with np.load(tmp_path / "out.npz") as saved:
        found = saved["spot/pred_boxes"]
    cy, cx = SPOT[0] + 0.5, SPOT[1] + 0.5
    assert found.shape == (1, 6) and np.allclose(found[0, :4], [cx - 8, cy - 8, cx + 8, cy + 8], atol=1e-3)
    assert found[0, 5] == 0 and found[0, 4] > 0.99
    assert "boxes (matched at IoU >= 0.5, same class)" in proc.stdout


def test_boxes_off_the_reference_fail_the_default_gates(tmp_path, spot_image):
    """The target's square is 16 px, the reference's 32 px around the same pixel (IoU 0.25): no reference box is
    found, and the default precision gate (recall 0.9) fails the run with exit 1."""
    reference = spot_detector(tmp_path, name="reference.onnx", side=32.0)
    proc = run_cli("run", str(spot_detector(tmp_path)), "--reference", str(reference), "--inputs", str(spot_image), "--chunk", "64")
    assert_user_error(proc, "precision box recall of 'pred_boxes' 0 < 0.9 (min_box_recall)", code=1)


def test_whole_pass_without_a_box_is_an_error(tmp_path, spot_image):
    """The spot outside the whole pass's top-left 128 x 128 crop: that pass finds no box, so the sliced run cannot be
    judged against it (an error naming the output and the threshold, not a pass)."""
    image = np.zeros((1, 3, 200, 300), dtype=np.float32)
    image[0, :, 150, 250] = 1.0
    np.savez(spot_image / "spot.npz", x=image)
    proc = run_cli("run", str(spot_detector(tmp_path)), "--inputs", str(spot_image), "--chunk", "64", "--slice-overlap", "0.25")
    assert_user_error(
        proc, "'pred_boxes'", "is empty (no box above its score threshold in any image)", "lower the boxes output's score_threshold"
    )


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--slice-overlap", "1"], ["--slice-overlap must be less than 1", "run.slice_overlap"]),
        (["--box-merge", "wbf"], ["--box-merge must be 'nms' or 'greedy'", "run.box_merge"]),
        (["--iou", "0"], ["--iou must be greater than 0", "run.iou"]),
        (["--min-box-recall", "2"], ["--min-box-recall must be less than or equal to 1"]),
        (["--min-chunk-matched-iou", "1.01"], ["--min-chunk-matched-iou must be less than or equal to 1", "run.min_chunk_matched_iou"]),
    ],
)
def test_option_errors(tmp_path, spot_image, args, fragments):
    proc = run_cli("run", str(spot_detector(tmp_path)), "--inputs", str(spot_image), "--chunk", "64", *args)
    assert_user_error(proc, *fragments)


def test_scores_output_missing_from_the_model(tmp_path, spot_image):
    model = spot_detector(tmp_path, boxes={**BOXES, "scores": "class_logits"})
    proc = run_cli("run", str(model), "--inputs", str(spot_image), "--chunk", "64")
    assert_user_error(proc, "boxes output 'pred_boxes' takes its scores from 'class_logits'", "outputs: pred_boxes, logits")


def test_dense_beside_boxes_is_refused_when_sliced(tmp_path, spot_image):
    model = spot_detector(tmp_path, extra_dense=True)
    proc = run_cli("run", str(model), "--inputs", str(spot_image), "--chunk", "64")
    assert_user_error(proc, "output 'image' is dense", "run whole images (without --chunk)")


# -- the config ------------------------------------------------------------------------------------------------------


def _config(outputs):
    return {
        "name": "det",
        "model": {"source": "m.py:f"},
        "inputs": [{"name": "x", "shape": ["batch", 3, "height", "width"]}],
        "axes": {a: {"min": 1, "opt": 2, "max": 4} for a in ("batch", "height", "width")},
        "outputs": outputs,
    }


def test_config_declares_boxes():
    cfg = config_from_dict(_config(["logits", {"name": "pred_boxes", "kind": "boxes", "format": "xyxy_px", "scores": "logits"}]))
    keys = cfg.outputs[1].box_keys()
    assert keys == {"format": "xyxy_px", "scores": "logits", "activation": "softmax", "no_object": False, "score_threshold": 0.5}
    assert BoxSpec.from_json(keys).to_json() == keys  # what the export sidecar carries, as run reads it


@pytest.mark.parametrize(
    "boxes_entry,logits_entry,fragment",
    [
        ({"kind": "boxes", "scores": "logits"}, "logits", "output 'pred_boxes' is kind boxes and needs 'format'"),
        ({"kind": "boxes", "format": "cxcywh_norm"}, "logits", "needs 'scores'"),
        ({"kind": "boxes", "format": "cxcywh", "scores": "logits"}, "logits", "config key 'outputs.1.format' must be"),
        ({"kind": "boxes", "format": "xyxy_px", "scores": "scores"}, "logits", "outputs.1.scores names 'scores', which is not another"),
        ({"kind": "boxes", "format": "xyxy_px", "scores": "pred_boxes"}, "logits", "which is not another declared output"),
        (
            {"kind": "boxes", "format": "xyxy_px", "scores": "logits"},
            {"name": "logits", "kind": "logits"},
            "outputs.0.kind: output 'logits' holds",
        ),
        ({"kind": "boxes", "format": "xyxy_px", "scores": "logits", "score_threshold": 1.5}, "logits", "outputs.1.score_threshold"),
        ({"kind": "pooled", "format": "xyxy_px"}, "logits", "'format' applies to boxes outputs only, not 'pooled'"),
    ],
)
def test_config_errors_name_the_key(boxes_entry, logits_entry, fragment):
    with pytest.raises(UserError) as err:
        config_from_dict(_config([logits_entry, {"name": "pred_boxes", **boxes_entry}]), "det.yaml")
    message = str(err.value)
    assert message.startswith("det.yaml: config") and fragment in message and message.count(". ") == 0, message


# -- the zoo's DETR --------------------------------------------------------------------------------------------------


def _export_zoo(name, folder, check=False):
    from trtforge.core.config import load_config
    from trtforge.export.step import export_model

    before = os.getcwd()
    os.chdir(ROOT)  # the config names zoo/models.py relative to the repository root
    try:
        return export_model(load_config(ROOT / "zoo" / "configs" / f"{name}.yaml"), folder / f"{name}.onnx", check=check).path
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def detr(tmp_path_factory):
    return _export_zoo("detr", tmp_path_factory.mktemp("detr"))  # test_export_zoo checks its export


def test_detr_runs_sliced_with_its_box_metrics(detr, tmp_path):
    """1024 x 1024 scenes through the small DETR (it takes at most 256): slices of 128 overlapping by 32, boxes merged;
    the box metrics of the sliced run against the whole pass on the top-left 256 x 256 crop are measured and reported
    per image (a random-init DETR puts every query at about the same place of what it sees, so slices and whole
    disagree: the numbers are what they are, and no slicing gate is set by default)."""
    proc = run_cli(
        "run", str(detr), "--inputs", "calib_data/images_large", "--chunk", "128", "--slice-overlap", "0.25",
        "--report", str(tmp_path / "report.json"),
    )  # fmt: skip
    report = _report(tmp_path, proc)
    assert report["outputs"]["pred_boxes"]["kind"] == "boxes" and report["outputs"]["logits"]["kind"] == "box_scores"
    sliced = report["chunking_error"]
    assert sliced["measured"] and [i["scope"] for i in sliced["per_input"]] == ["top-left 256x256 crop"] * 2
    m = sliced["per_output"]["pred_boxes"]
    assert m["reference_boxes"] >= 2 and m["candidate_boxes"] >= 2 and len(m["per_image"]) == 2
    for key in ("box_recall", "box_precision", "matched_iou"):
        assert 0.0 <= m[key] <= 1.0
    assert not [g for g in report["gates"]["checked"] if g["gate"].startswith("min_chunk")]


def test_conditional_detr_scores_by_sigmoid(tmp_path):
    """The zoo's second detector: sigmoid class scores, no 'no object' class, run whole on small images against a copy
    of itself as the reference: every box found, at the same place (the default box gates pass). Exported without
    the export check, which takes ~40 s of CPU at its axis maxima (`trtforge export --config
    zoo/configs/conditional-detr.yaml` runs it)."""
    import shutil

    model = _export_zoo("conditional-detr", tmp_path)
    reference = tmp_path / "reference.onnx"
    shutil.copy(model, reference)
    shutil.copy(f"{model}.json", f"{reference}.json")
    proc = run_cli(
        "run", str(model), "--reference", str(reference), "--inputs", "calib_data/images_eval", "--report", str(tmp_path / "report.json")
    )
    report = _report(tmp_path, proc)
    assert report["outputs"]["pred_boxes"]["boxes"]["activation"] == "sigmoid"
    m = report["precision_error"]["per_output"]["pred_boxes"]
    assert m["reference_boxes"] > 0 and m["box_recall"] == 1.0 and m["matched_iou"] == pytest.approx(1.0)
    assert {g["gate"]: g["status"] for g in report["gates"]["checked"]}["min_box_recall"] == "passed"


@pytest.fixture()
def small_spot_image(tmp_path):
    folder = tmp_path / "small"
    folder.mkdir()
    image = np.zeros((1, 3, 64, 96), dtype=np.float32)
    image[0, :, 30, 40] = 1.0
    np.savez(folder / "spot.npz", x=image)
    return folder


def test_compare_matches_boxes_as_run_does(tmp_path, small_spot_image):
    """`compare` reads the boxes declaration from the sidecar: a copy of the detector finds every reference box at the
    same place (box metrics, the box gates by default); a 16 px box against a 32 px one around the same pixel (IoU
    0.25, and every number but the box size equal) is no match, which fails the default recall gate with exit 1."""
    model = spot_detector(tmp_path)
    same = spot_detector(tmp_path, name="same.onnx")
    report = tmp_path / "report.json"
    proc = run_cli("compare", str(model), str(same), "--inputs", str(small_spot_image), "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads(report.read_text())["per_output"]["pred_boxes"]
    assert (m["reference_boxes"], m["matched"], m["box_recall"]) == (1, 1, 1.0) and m["matched_iou"] == pytest.approx(1.0)
    wider = spot_detector(tmp_path, name="wider.onnx", side=32.0)
    proc = run_cli("compare", str(model), str(wider), "--inputs", str(small_spot_image), "--report", str(report))
    assert_user_error(proc, "box recall of 'pred_boxes' 0 < 0.9 (min_box_recall)", code=1)


def test_a_detector_without_chunk_is_sliced_at_its_input_size(tmp_path, spot_image):
    """200 x 300 through a detector that takes at most 128, no --chunk: sliced as SAHI slices, at 128 with the default
    overlap 0.2 of it (26 px), and the spot's one box found in image pixels. No pass larger than a slice exists here, so
    the chunking error says it cannot be measured rather than comparing a slice with itself."""
    model = spot_detector(tmp_path)
    proc = run_cli(
        "run",
        str(model),
        "--inputs",
        str(spot_image),
        "--report",
        str(tmp_path / "report.json"),
        "--save-outputs",
        str(tmp_path / "out.npz"),
    )
    report = _report(tmp_path, proc)
    assert report["chunking"]["chunk"] == 128 and report["chunking"]["overlap"] == 26
    assert report["inputs"][0]["chunks"] == 2 * 3  # rows 0, 72; cols 0, 102, 172
    assert report["chunking_error"]["reason"].startswith("not measurable: chunk (128) is not smaller")
    with np.load(tmp_path / "out.npz") as saved:
        found = saved["spot/pred_boxes"]
    cy, cx = SPOT[0] + 0.5, SPOT[1] + 0.5
    assert found.shape == (1, 6) and np.allclose(found[0, :4], [cx - 8, cy - 8, cx + 8, cy + 8], atol=1e-3)
