"""MPNet, DINOv2, DETR and wav2vec2 from the zoo (small, random-init) through the real commands where their own limits
and output shapes meet trtforge: an axis range past MPNet's position table, and tiled or chunked runs whose outputs
cannot be merged back (an image model's token output, rank-3 class logits and boxes); wav2vec2's frames at a stride of
the samples now merge. Each is one sentence and exit 2, before any window runs, where each used to be a traceback or a silent pass."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import ROOT, assert_user_error, run_cli

from trtforge.core.config import apply_overrides, load_config
from trtforge.core.errors import UserError
from trtforge.export.step import export_model
from trtforge.runtime.outputs import OutputKind, merge_refusal


@pytest.fixture(scope="module", autouse=True)
def _in_repo_root():
    """Zoo configs name `zoo/models.py:NAME` relative to the repository root."""
    before = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(before)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each small zoo model exported once (in-process: one torch import), by name."""
    folder = tmp_path_factory.mktemp("families")
    cache = {}

    def get(name: str, **overrides):
        key = (name, tuple(sorted(overrides.items())))
        if key not in cache:
            cfg = apply_overrides(load_config(ROOT / "zoo" / "configs" / f"{name}.yaml"), overrides)
            cache[key] = export_model(cfg, folder / f"{name}{len(cache)}.onnx").path
        return cache[key]

    return get


# -- an axis range past the model's positions ---------------------------------------------------------


def _mpnet_config(tmp_path, seq_max: int):
    text = (ROOT / "zoo" / "configs" / "mpnet.yaml").read_text().replace("max: 128}", f"max: {seq_max}}}")
    path = tmp_path / "mpnet.yaml"
    path.write_text(text)
    return path


def test_export_names_where_mpnets_positions_run_out(tmp_path):
    """The small MPNet's table has 130 rows (positions start after the pad id 1): 128 tokens fit, 129 do not. The
    export check used to try seq 7 and 67 only and pass."""
    cfg = load_config(_mpnet_config(tmp_path, 200))
    with pytest.raises(
        UserError,
        match=r"^PyTorch fails at seq=200 \(the max of axis 'seq', with batch=2\): IndexError.*"
        r"positions run out at seq 129; lower axes.seq.max to 128 and re-export\.$",
    ):
        export_model(cfg, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_export_checks_every_axis_at_its_max(exported):
    import json

    side = json.loads((exported("mpnet").parent / f"{exported('mpnet').name}.json").read_text())
    assert {(c["axis"], c["size"]) for c in side["check"]} >= {("seq", 128), ("batch", 16)}


def test_clean_names_the_gather_past_the_table(tmp_path):
    """An ONNX exported without the check claims seq up to 200: clean runs seq 200 and names the Gather, the size,
    and the largest seq that works (found by bisection). It used to compare at seq 2 and 67 only and pass."""
    onnx_path = export_model(load_config(_mpnet_config(tmp_path, 200)), tmp_path / "m.onnx", check=False).path
    proc = run_cli("clean", str(onnx_path))
    assert_user_error(
        proc,
        "ONNX Runtime on m.onnx fails at seq=200 (the max of axis 'seq'",
        "in Gather node '/embeddings/position_embeddings/Gather'",
        "positions run out at seq 129; lower axes.seq.max to 128",
    )
    assert not (tmp_path / "m.clean.onnx").exists()


# -- tiled and chunked runs whose outputs cannot be merged ------------------------------------------------


def test_tiled_dinov2_refuses_its_token_output(exported):
    """1024x1024 images tiled at 224: DINOv2's last_hidden_state is [1, 1 + patches, H], which no tile merge can put
    back (it used to crash: TypeError: 'Tile' object is not iterable)."""
    proc = run_cli("run", str(exported("dinov2")), "--inputs", "calib_data/images_large", "--chunk", "224", "--overlap", "28")
    assert_user_error(proc, "output 'last_hidden_state' is a token output of an image model", "run whole images (without --chunk)")


def test_dinov2_runs_whole_images(exported):
    """Its token output needs no merge on whole images: the refusal is about tiling, not the kind."""
    proc = run_cli("run", str(exported("dinov2")), "--inputs", "calib_data/images_eval", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "kinds,named",
    [
        (["logits=logits", "pred_boxes=pooled"], "output 'logits' (shape [1, 10, 6]) is declared logits"),
        (["logits=dense:1", "pred_boxes=pooled"], "output 'logits' (shape [1, 10, 6]) is declared dense"),
    ],
)
def test_tiled_detr_refuses_rank3_logits_and_boxes(exported, kinds, named):
    """DETR's per-query class logits [B, Q, C+1] and boxes [B, Q, 4] declared logits / pooled / dense: averaging them
    over tiles is meaningless (it used to crash in merge_logits: operands could not be broadcast together; declared
    dense, in merge_tiles)."""
    onnx_path = exported("detr")
    proc = run_cli(
        "run",
        str(onnx_path),
        "--inputs",
        "calib_data/images_large",
        "--chunk",
        "256",
        "--overlap",
        "32",
        *[a for k in kinds for a in ("--output-kind", k)],
    )
    assert_user_error(proc, named, "without --chunk")


def test_chunked_wav2vec2_merges_frames_at_its_stride(exported, tmp_path):
    """60 s of 16 kHz audio in windows of 80000 samples: each window gives 249 frames, which merge at the stride export
    measured (320 samples per frame; it used to crash: ValueError: output 'last_hidden_state' has 249 positions per
    row ...). tests/test_audio.py covers the chunking error and the refusals."""
    audio = tmp_path / "audio"
    audio.mkdir()
    rng = np.random.default_rng(0)
    np.savez(audio / "talk.npz", input_values=rng.uniform(-1, 1, (1, 60 * 16000)).astype(np.float32))
    proc = run_cli(
        "run", str(exported("wav2vec2")), "--inputs", str(audio), "--chunk", "80000", "--overlap", "16000", "--no-chunking-check"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_chunked_text_model_still_runs(exported):
    """The probe refuses only what cannot merge: MPNet's token and pooled outputs over long texts, chunked."""
    proc = run_cli("run", str(exported("mpnet")), "--inputs", "calib_data/minilm_long", "--chunk", "64", "--overlap", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- the decision itself --------------------------------------------------------------------------------


def test_merge_refusal_by_kind_and_shape():
    token, pooled, logits, dense = (OutputKind("y", k) for k in ("token", "pooled", "logits", "dense"))
    assert merge_refusal(token, True, (1, 17, 64), None, None).startswith("output 'y' is a token output of an image")
    assert merge_refusal(token, False, (1, 64, 8), 64, "seq") is None
    assert "has 12 positions for 4000" in merge_refusal(token, False, (1, 12, 8), 4000, "samples")
    assert merge_refusal(pooled, False, (1, 8), 64, "seq") is None
    assert merge_refusal(logits, True, (1, 10), None, None) is None
    assert "rank 3" in merge_refusal(logits, True, (1, 10, 6), None, None)
    assert "rank 3" in merge_refusal(pooled, False, (1, 10, 4), 64, "seq")
    assert merge_refusal(dense, True, (1, 5, 16, 16), None, None) is None
    assert "rank 3" in merge_refusal(dense, True, (1, 10, 4), None, None)


def test_largest_working_size_by_bisection():
    from trtforge.export.axislimits import axis_limit_error, largest_working

    tried = []

    def works(n):
        tried.append(n)
        return n <= 128

    assert largest_working(works, 67, 200) == 128 and len(tried) <= 9
    assert all(largest_working(lambda n, top=top: n <= top, 1, 64) == top for top in range(1, 64))
    assert largest_working(lambda n: False, 1, 200) is None and largest_working(works, 5, 5) is None
    ort = (
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running Gather node. "
        "Name:'/embeddings/Gather' Status Message: indices element out of data bounds, idx=512 must be within the "
        "inclusive range [-512,511]"
    )
    message = str(axis_limit_error("ONNX Runtime on m.onnx", "seq", 512, ort, 510, {"batch": 2, "seq": 512}))
    assert message == (
        "ONNX Runtime on m.onnx fails at seq=512 (the max of axis 'seq', with batch=2) in Gather node "
        "'/embeddings/Gather': indices element out of data bounds, idx=512, so the model's positions run "
        "out at seq 511; lower axes.seq.max to 510 and re-export."
    )
    other = str(axis_limit_error("PyTorch", "height", 256, RuntimeError("shape mismatch"), 224, {"height": 256}))
    assert other.startswith(
        "PyTorch fails at height=256 (the max of axis 'height'): RuntimeError: shape mismatch, and "
        "the largest height that works is 224; lower axes.height.max"
    )
