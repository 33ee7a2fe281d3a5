"""Pure units of issue 9: output kinds, tile merge at a scale, pooled merge, tokenizer windows, gates."""

import numpy as np
import pytest

from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError
from trtforge.core.layout import model_layout
from trtforge.runtime.chunking import merge_pooled, merge_tiles, plan_tiles, scaled_tiles
from trtforge.runtime.outputs import Probe, parse_override, probe_sizes, resolve
from trtforge.verify.compare import compare_outputs
from trtforge.verify.gates import evaluate_gates, gates_from

TEXT = [
    InputSpec(name="input_ids", dtype="int64", shape=["batch", "seq"]),
    InputSpec(name="attention_mask", dtype="int64", shape=["batch", "seq"]),
]
IMAGE = [InputSpec(name="pixel_values", shape=["batch", 3, "height", "width"])]


def test_layout_finds_the_chunk_axis_by_name_at_any_dim():
    specs = [InputSpec(name="x", shape=["batch", 4, "seq"]), InputSpec(name="scale", shape=["batch", 1])]
    layout = model_layout(specs)
    assert layout.seq_axis == "seq" and layout.dims == {"x": {"seq": 2}, "scale": {}}
    feeds = {"x": np.zeros((1, 4, 10)), "scale": np.ones((1, 1))}
    cut = layout.sliced(feeds, {"seq": (2, 6)})
    assert cut["x"].shape == (1, 4, 4) and cut["scale"].shape == (1, 1)  # the side input is not sliced
    assert model_layout(IMAGE).chunk_axes == ("height", "width")
    assert model_layout([InputSpec(name="p", shape=["batch", 3, 32, 32])]).fixed_hw == (32, 32)


def test_token_and_dense_kinds_are_inferred_from_probes():
    text = model_layout(TEXT)
    probes = [Probe({"batch": 1, "seq": 64}, {"h": (1, 64, 384)}), Probe({"batch": 1, "seq": 128}, {"h": (1, 128, 384)})]
    assert resolve(["h"], {}, text, probes)["h"].kind == "token"
    image = model_layout(IMAGE)
    probes = [
        Probe({"height": 64, "width": 64}, {"seg": (1, 5, 16, 16), "sr": (1, 3, 128, 128)}),
        Probe({"height": 128, "width": 128}, {"seg": (1, 5, 32, 32), "sr": (1, 3, 256, 256)}),
    ]
    kinds = resolve(["seg", "sr"], {}, image, probes)
    assert (kinds["seg"].kind, kinds["seg"].scale, kinds["sr"].scale) == ("dense", 0.25, 2.0)


def test_rank2_is_ambiguous_unless_declared():
    text = model_layout(TEXT)
    probes = [Probe({"seq": 64}, {"pooler_output": (1, 384)}), Probe({"seq": 128}, {"pooler_output": (1, 384)})]
    with pytest.raises(
        UserError,
        match=r"output 'pooler_output' \(shape \[1, 384\]\) may be a pooled vector or class logits.*"
        r"outputs: \[\{name: pooler_output, kind: pooled\|logits\}\]",
    ):
        resolve(["pooler_output"], {}, text, probes)
    assert resolve(["pooler_output"], {"pooler_output": ("pooled", None)}, text, probes)["pooler_output"].kind == "pooled"
    assert resolve(["pooler_output"], {}, text, probes, strict=False)["pooler_output"].kind is None


def test_inconsistent_dense_scale_is_an_error():
    image = model_layout(IMAGE)
    probes = [Probe({"height": 64, "width": 64}, {"o": (1, 5, 16, 16)}), Probe({"height": 128, "width": 128}, {"o": (1, 5, 33, 32)})]
    with pytest.raises(UserError, match="does not scale consistently"):
        resolve(["o"], {}, image, probes)


def test_probe_sizes_and_override_parsing():
    sizes = probe_sizes(model_layout(TEXT), {"batch": AxisRange(min=1, opt=8, max=32), "seq": AxisRange(min=1, opt=128, max=512)})
    assert [s["seq"] for s in sizes] == [64, 128] and all(s["batch"] == 1 for s in sizes)
    assert parse_override("logits=dense:1/4") == ("logits", ("dense", 0.25))
    with pytest.raises(UserError):
        parse_override("logits=softmax")


@pytest.mark.parametrize("scale", [0.25, 2.0])
def test_tile_merge_at_output_scale_reconstructs_the_image(scale):
    """A per-pixel signal at `scale`, cut into scaled tiles and merged, comes back exactly (any merge)."""
    h, w, tile, overlap = 96, 64, 32, 8
    oh, ow = int(h * scale), int(w * scale)
    image = np.random.default_rng(0).normal(size=(2, oh, ow)).astype(np.float32)
    tiles = scaled_tiles(plan_tiles(h, w, tile, overlap), scale)
    outs = [image[:, t.rows.start : t.rows.end, t.cols.start : t.cols.end] for t in tiles]
    for merge in ("center", "linear", "gaussian"):
        np.testing.assert_allclose(merge_tiles(outs, h, w, tile, overlap, merge, scale), image, rtol=1e-5, atol=1e-5)


def test_tiles_that_miss_whole_output_pixels_are_refused():
    with pytest.raises(UserError, match="multiples of 4"):
        scaled_tiles(plan_tiles(100, 100, 30, 6), 0.25)


def test_pooled_merge_is_a_weighted_mean_never_a_softmax():
    a, b = np.array([1.0, -2.0, 3.0]), np.array([3.0, 0.0, -1.0])
    merged = merge_pooled([a, b], [30, 10])
    np.testing.assert_allclose(merged, (30 * a + 10 * b) / 40)
    assert not np.isclose(merged.sum(), 1.0)


def test_comparator_picks_metrics_by_kind():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, 10))
    flipped = logits.copy()
    flipped[:, 0] = logits.max(axis=1) + 1  # every argmax moves to class 0 while the cosine stays high
    m = compare_outputs({"l": "logits"}, {"l": logits}, {"l": flipped})["l"]
    assert m["top1_agreement"] < 0.3 and "pixel_agreement" not in m
    seg = rng.normal(size=(1, 5, 8, 8))
    m = compare_outputs({"s": "dense"}, {"s": seg}, {"s": seg})["s"]
    assert m["pixel_agreement"] == 1.0 and m["rel_l2"] == 0.0
    tok = rng.normal(size=(2, 7, 4))
    m = compare_outputs({"t": "token"}, {"t": tok}, {"t": tok * 2})["t"]
    assert m["min_item_cosine"] == pytest.approx(1.0) and m["items"] == 2 and "top1_agreement" not in m


def _report(measured=True, per_output=None, reason="target is its own reference"):
    section = {"measured": True, "per_output": per_output or {}} if measured else {"measured": False, "reason": reason}
    return {
        "outputs": {"h": {"kind": "token"}},
        "precision_error": section,
        "chunking_error": {"measured": False, "reason": "no input was chunked"},
    }


def test_gates_set_but_unevaluable_fail_defaults_do_not():
    defaults = evaluate_gates(_report(measured=False), gates_from({}))
    assert defaults["passed"] and {c["status"] for c in defaults["checked"]} == {"not evaluated"}
    explicit = evaluate_gates(_report(measured=False), gates_from({"max_rel_l2": 1e-2}))
    assert (
        not explicit["passed"]
        and "max_rel_l2 0.01 could not be evaluated: precision error not measured: target is its own reference" in explicit["failures"][0]
    )
    chunk = evaluate_gates(_report(per_output={"h": {"rel_l2": 0.0, "cosine": 1.0}}), gates_from({"min_chunk_cosine": 0.9}))
    assert chunk["failures"] == ["min_chunk_cosine 0.9 could not be evaluated: chunking error not measured: no input was chunked"]


def test_a_gate_naming_a_metric_no_output_has_fails():
    result = evaluate_gates(_report(per_output={"h": {"rel_l2": 0.0, "cosine": 1.0}}), gates_from({"min_top1_agreement": 0.9}))
    assert result["failures"] == ["min_top1_agreement 0.9 could not be evaluated: no output has top1_agreement (outputs: h (token))"]
    ok = evaluate_gates(
        _report(per_output={"h": {"rel_l2": 0.0, "cosine": 1.0, "top1_agreement": 0.5}}), gates_from({"min_top1_agreement": 0.9})
    )
    assert "precision top-1 agreement of 'h' 0.5 < 0.9" in ok["failures"][0]


def test_int8_targets_are_gated_by_cosine_not_the_fp16_rel_l2_default():
    """H200: BERT-base's INT8 engine (cosine 0.9997, rel-L2 0.025) failed `run`'s fp16-level rel-L2 default."""
    from trtforge.runtime.report import target_precision
    from trtforge.verify.gates import gate_notes

    healthy_int8 = _report(per_output={"h": {"rel_l2": 0.025, "cosine": 0.9997}})
    assert not evaluate_gates(healthy_int8, gates_from({}, "fp16"))["passed"]  # fp16 defaults
    for precision in ("int8", "best"):
        result = evaluate_gates(healthy_int8, gates_from({}, precision))
        assert result["passed"] and [c["gate"] for c in result["checked"]] == ["min_cosine"]
        assert "max_rel_l2 has no default for an INT8 or FP8-GEMM target" in gate_notes({}, precision)[0]
    broken_int8 = _report(per_output={"h": {"rel_l2": 0.7, "cosine": 0.74}})  # issue 10's engine
    assert not evaluate_gates(broken_int8, gates_from({}, "best"))["passed"]
    explicit = evaluate_gates(healthy_int8, gates_from({"max_rel_l2": 0.01}, "best"))
    assert not explicit["passed"] and gate_notes({"max_rel_l2": 0.01}, "best") == []
    assert gate_notes({}, "fp16") == []
    assert target_precision({"precision": "best"}, None) == "best"
    assert target_precision(None, {"step": "calibrate"}) == "int8" and target_precision(None, {"step": "clean"}) == "fp32"
    assert target_precision(None, {"step": "precision", "precision": "best"}) == "best"  # the ONNX build writes
    assert target_precision(None, {"step": "precision", "precision": "fp16"}) == "fp16"


def test_fp8_gemm_engines_are_gated_by_cosine_like_int8():
    """H100 w37c: BERT-base's FP8-GEMM engine (build gate cosine 0.9984) measured rel-L2 0.070 / cosine 0.9976 on real
    text and failed `run`'s fp16-level rel-L2 default; it is an fp16 build whose sidecar says its GEMMs are fp8."""
    from trtforge.runtime.report import target_precision
    from trtforge.verify.gates import gate_notes

    side = {"precision": "fp16", "gemm_precision": {"precision": "fp8"}}
    assert target_precision(side, None) == "fp8" and target_precision({"precision": "fp16"}, None) == "fp16"
    fp8_engine = _report(per_output={"h": {"rel_l2": 0.070, "cosine": 0.9976}})
    assert not evaluate_gates(fp8_engine, gates_from({}, "fp16"))["passed"]
    result = evaluate_gates(fp8_engine, gates_from({}, target_precision(side, None)))
    assert result["passed"] and [c["gate"] for c in result["checked"]] == ["min_cosine"]
    assert "FP8-GEMM" in gate_notes({}, "fp8")[0]
    assert not evaluate_gates(_report(per_output={"h": {"rel_l2": 0.3, "cosine": 0.95}}), gates_from({}, "fp8"))["passed"]
