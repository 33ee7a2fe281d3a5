"""Detections as pure numpy: box formats, IoU, greedy matching and its metrics (verify/boxes.py), slices, shifting and
merging of sliced boxes (runtime/slicing.py), and the comparator and gates that read them (verify/compare.py, gates.py)."""

from __future__ import annotations

import numpy as np
import pytest

from trtforge.runtime.slicing import merge_boxes, shift, slice_spans, slice_tiles
from trtforge.verify.boxes import BoxSpec, agreement, detections, iou_matrix, match, to_xyxy
from trtforge.verify.compare import Comparator, worst
from trtforge.verify.gates import evaluate_gates, gates_from

DETR = BoxSpec("cxcywh_norm", "logits", "softmax", no_object=True, score_threshold=0.5)


def row(x1, y1, x2, y2, score=0.9, cls=0):
    return [x1, y1, x2, y2, score, cls]


# -- formats and IoU -------------------------------------------------------------------------------------------------


def test_formats_become_the_same_pixel_box():
    """One box, 20..60 x 10..30 in a 100 wide, 50 high image, written in each format."""
    want = [20, 10, 60, 30]
    assert np.allclose(to_xyxy(np.array([0.4, 0.4, 0.4, 0.4]), "cxcywh_norm", 50, 100), want)
    assert np.allclose(to_xyxy(np.array([0.2, 0.2, 0.6, 0.6]), "xyxy_norm", 50, 100), want)
    assert np.allclose(to_xyxy(np.array([20, 10, 60, 30]), "xyxy_px", 50, 100), want)
    assert np.allclose(to_xyxy(np.array([20, 10, 40, 20]), "xywh_px", 50, 100), want)


def test_iou():
    a = np.array([row(0, 0, 10, 10)])
    b = np.array([row(0, 0, 10, 10), row(5, 0, 15, 10), row(20, 20, 30, 30), row(3, 3, 3, 8)])
    assert np.allclose(iou_matrix(a, b), [[1.0, 50 / 150, 0.0, 0.0]])  # half overlap: 50 / (100 + 100 - 50); zero area: 0


def test_detections_softmax_drops_the_no_object_class_and_marks_low_scores():
    logits = np.array([[[4.0, 0.0, 0.0], [0.0, 0.0, 9.0]]])  # query 0: class 0; query 1: 'no object' wins
    boxes = np.array([[[0.5, 0.5, 0.2, 0.2], [0.5, 0.5, 0.2, 0.2]]])
    found = detections(boxes, logits, DETR, 10, 10)
    assert found.shape == (1, 2, 6)
    assert np.allclose(found[0, 0, :4], [4, 4, 6, 6]) and found[0, 0, 4] > 0.9 and found[0, 0, 5] == 0
    assert found[0, 1, 5] == -1  # class 0's share of query 1 is tiny: under the threshold


def test_detections_from_one_score_per_query():
    spec = BoxSpec("xyxy_px", "scores", "sigmoid", score_threshold=0.5)
    found = detections(np.array([[[0, 0, 1, 1], [0, 0, 2, 2]]]), np.array([[3.0, -3.0]]), spec)
    assert list(found[0, :, 5]) == [0, -1] and found[0, 0, 4] == pytest.approx(1 / (1 + np.exp(-3)))


# -- matching --------------------------------------------------------------------------------------------------------


def test_match_pairs_same_class_boxes_best_iou_first():
    ref = np.array([row(0, 0, 10, 10, 0.9), row(50, 50, 60, 60, 0.8), row(100, 100, 110, 110, 0.7, cls=1)])
    cand = np.array([row(1, 0, 11, 10, 0.85), row(50, 50, 60, 60, 0.8), row(100, 100, 110, 110, 0.7, cls=2)])
    pairs = match(ref, cand)
    assert [(r, c) for r, c, _ in pairs] == [(0, 0), (1, 1)]  # the third is another class: no pair
    stats = agreement(ref, cand).to_json()
    assert stats["box_recall"] == pytest.approx(2 / 3) and stats["box_precision"] == pytest.approx(2 / 3)
    assert stats["matched_iou"] == pytest.approx((90 / 110 + 1) / 2)
    assert stats["score_error"] == pytest.approx(0.05 / 2)


def test_match_takes_each_candidate_once_and_needs_iou_half():
    ref = np.array([row(0, 0, 10, 10, 0.9), row(0, 0, 10, 10, 0.8)])
    cand = np.array([row(0, 0, 10, 10, 0.9)])
    assert [(r, c) for r, c, _ in match(ref, cand)] == [(0, 0)]
    far = np.array([row(6, 0, 16, 10)])  # IoU 40/160 = 0.25
    assert match(ref[:1], far) == []


def test_empty_sets_agree_and_one_sided_ones_do_not():
    none = np.zeros((0, 6))
    assert agreement(none, none).to_json()["box_recall"] == 1.0
    one = np.array([row(0, 0, 1, 1)])
    assert agreement(one, none).to_json()["box_recall"] == 0.0
    assert agreement(none, one).to_json()["box_precision"] == 0.0


# -- slices, shifting, merging ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("length,size,overlap", [(1024, 256, 64), (300, 128, 32), (129, 128, 0), (100, 128, 16), (1000, 7, 3)])
def test_slices_cover_the_axis_at_one_size(length, size, overlap):
    spans = slice_spans(length, size, overlap)
    covered = np.zeros(length, dtype=bool)
    for start, end in spans:
        covered[start:end] = True
        assert end - start == min(size, length) and 0 <= start and end <= length
    assert covered.all() and spans[-1][1] == length
    assert all(b[0] - a[1] <= -overlap for a, b in zip(spans, spans[1:]))  # neighbours share at least the overlap


def test_slice_tiles_row_by_row():
    tiles = slice_tiles(300, 200, 128, 32)
    assert len(tiles) == len(slice_spans(300, 128, 32)) * len(slice_spans(200, 128, 32))
    assert (tiles[0].rows.start, tiles[0].cols.start, tiles[-1].rows.end, tiles[-1].cols.end) == (0, 0, 300, 200)


def test_shift_moves_boxes_to_image_pixels():
    moved = shift(np.array([row(1, 2, 3, 4, 0.5, 7)]), top=100, left=10)
    assert moved.tolist() == [[11, 102, 13, 104, 0.5, 7]]


def test_nms_keeps_the_best_box_per_class():
    rows = np.array(
        [row(0, 0, 10, 10, 0.6), row(1, 0, 11, 10, 0.9), row(0, 0, 10, 10, 0.7, cls=1), row(40, 40, 50, 50, 0.5), row(0, 0, 9, 9, 0.1, -1)]
    )
    kept = merge_boxes(rows, "nms", 0.5)
    assert kept[:, 4].tolist() == [0.9, 0.7, 0.5]  # 0.6 overlaps 0.9 (IoU 0.82); class 1 is left alone; class -1 dropped
    assert kept[0, :4].tolist() == [1, 0, 11, 10]


def test_greedy_merge_grows_the_kept_box_to_the_union():
    """An object cut by a slice edge: its halves overlap enough and merge into the whole."""
    rows = np.array([row(0, 0, 10, 10, 0.9), row(2, 0, 12, 10, 0.8)])
    merged = merge_boxes(rows, "greedy", 0.5)
    assert merged.tolist() == [[0, 0, 12, 10, 0.9, 0]]
    assert merge_boxes(rows, "nms", 0.5).tolist() == [row(0, 0, 10, 10, 0.9)]
    assert merge_boxes(rows, "nms", 0.9).shape == (2, 6)  # below the IoU asked: both stay


def test_sliced_boxes_of_one_object_merge_to_it():
    """A box at 90..110 x 90..110 of a 200 x 200 image seen by four 128 slices (overlap 56): each sees it whole,
    in its own pixels; shifted back and merged, one box at the right place remains."""
    parts = []
    for tile in slice_tiles(200, 200, 128, 56):
        r0, c0 = tile.rows.start, tile.cols.start
        parts.append(shift(np.array([row(90 - c0, 90 - r0, 110 - c0, 110 - r0)]), r0, c0))
    assert len(parts) == 4
    assert merge_boxes(np.concatenate(parts)).tolist() == [row(90, 90, 110, 110)]


# -- the comparator and the gates ------------------------------------------------------------------------------------


def test_comparator_matches_raw_outputs_and_gates_read_it():
    logits = np.array([[[5.0, 0.0, 0.0], [0.0, 5.0, 0.0]]])
    boxes = np.array([[[0.2, 0.2, 0.1, 0.1], [0.7, 0.7, 0.2, 0.2]]])
    moved = boxes + np.array([0.0, 0.0, 0.0, 0.0]) + np.array([[[0.0, 0.0, 0.0, 0.0], [0.06, 0.0, 0.0, 0.0]]])
    comparator = Comparator({"pred_boxes": "boxes", "logits": "box_scores"}, boxes={"pred_boxes": DETR})
    comparator.add({"pred_boxes": boxes, "logits": logits}, {"pred_boxes": moved, "logits": logits})
    result = comparator.result()
    m = result["pred_boxes"]
    assert (m["reference_boxes"], m["candidate_boxes"], m["matched"]) == (2, 2, 2)
    assert m["matched_iou"] == pytest.approx((1 + 14 / 26) / 2)  # the second box moved by 0.3 of its width
    assert m["box_recall"] == 1.0 and m["reference_problem"] is None and len(m["per_image"]) == 1
    assert result["logits"]["rel_l2"] == 0.0
    assert worst(result)["matched_iou"] == pytest.approx(m["matched_iou"])
    report = {"precision_error": {"measured": True, "per_output": result}, "chunking_error": {"measured": False}}
    verdict = evaluate_gates(report, gates_from({}, "fp32", boxes=True))
    assert not verdict["passed"] and any("precision matched IoU of 'pred_boxes'" in f for f in verdict["failures"])
    assert evaluate_gates(report, gates_from({"min_matched_iou": 0.7}, "fp32", boxes=True))["passed"]
    assert not [g for g in gates_from({}, "fp32") if g.key.startswith("min_box")]  # no box defaults without boxes


def test_comparator_refuses_a_reference_without_boxes():
    comparator = Comparator({"b": "boxes", "s": "box_scores"}, boxes={"b": BoxSpec("xyxy_px", "s", "none", score_threshold=0.5)})
    comparator.add({"b": np.ones((1, 2, 4)), "s": np.full((1, 2), 0.1)}, {"b": np.ones((1, 2, 4)), "s": np.full((1, 2), 0.9)})
    assert "no box above its score threshold" in comparator.result()["b"]["reference_problem"]


def test_comparator_counts_nan_boxes_of_the_candidate():
    comparator = Comparator({"b": "boxes", "s": "box_scores"}, boxes={"b": BoxSpec("xyxy_px", "s", "none")})
    bad = np.array([[[0, 0, np.nan, 1.0]]])
    comparator.add({"b": np.array([[[0, 0, 1, 1.0]]]), "s": np.array([[0.9]])}, {"b": bad, "s": np.array([[0.9]])})
    m = comparator.result()["b"]
    assert m["candidate_nonfinite"] == 1 and m["box_recall"] != m["box_recall"]  # NaN: no number for a broken target
