"""Audio: token outputs that advance at a stride of the input's samples (wav2vec2: one frame per 320), measured at
export, windows over long recordings merged at the output's frame rate, fixed-length models windowed with padding, and
WAV inputs. The pure algorithms are checked against a simulated strided model (numpy), the commands on the zoo's small
wav2vec2."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import ROOT, assert_user_error, run_cli

from trtforge.core.config import InputSpec, apply_overrides, load_config
from trtforge.core.errors import UserError
from trtforge.runtime.audio import (
    FrameRate,
    check_aligned,
    fixed_frame_rate,
    fixed_window_part,
    frame_windows,
    measure_frame_rate,
    merge_frames,
    output_frame_rates,
    plan_fixed_windows,
    plan_strided_windows,
    read_wav,
    write_wav,
)
from trtforge.runtime.outputs import OutputKind

WAV2VEC2_CONVS = [(10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2)]  # (kernel, stride) of its feature encoder


def conv_frames(length: int, convs=WAV2VEC2_CONVS, pad: int = 0) -> int:
    """Output frames of a stack of 1-D convolutions (each padded by `pad` on both sides)."""
    for kernel, stride in convs:
        length = (length + 2 * pad - kernel) // stride + 1
    return max(length, 0)


def local_model(x: np.ndarray, stride: int = 320, field: int = 400) -> np.ndarray:
    """A strided front-end with no context beyond its receptive field: frame f sees samples [f * stride, f * stride +
    field), as features (mean, energy, first sample); frames(L) = (L - (field - stride)) // stride."""
    n = max(0, (len(x) - field) // stride + 1)
    frames = np.lib.stride_tricks.sliding_window_view(x, field)[::stride][:n]
    return np.stack([frames.mean(1), (frames**2).mean(1), frames[:, 0]], axis=1)


# -- measuring the frame rate ------------------------------------------------------------------------------------


def test_frame_rate_of_wav2vec2s_convolutions_is_measured_exactly():
    calls = []

    def frames_at(n):
        calls.append(n)
        return conv_frames(n)

    rate = measure_frame_rate(frames_at, 4000, 6000)
    assert rate == FrameRate(320, 80)
    assert all(rate.frames(n) == conv_frames(n) for n in range(400, 20000, 7))
    assert len(calls) < 40  # bisection, not a scan


def test_frame_rate_of_padded_convolutions_has_a_negative_offset():
    rate = measure_frame_rate(lambda n: conv_frames(n, [(3, 2), (3, 2)], pad=1), 100, 200)
    assert rate.stride == 4 and rate.offset < 0
    assert all(rate.frames(n) == conv_frames(n, [(3, 2), (3, 2)], pad=1) for n in range(8, 500))


def test_frame_rate_refuses_counts_without_a_constant_stride():
    with pytest.raises(ValueError):
        measure_frame_rate(lambda n: int(n**0.5), 100, 400)
    assert measure_frame_rate(lambda n: n // 320, 4000, 4400) is None  # one boundary only: too narrow to tell


def test_fixed_frame_rate_from_one_length():
    assert fixed_frame_rate(3000, 1500, 2) == FrameRate(2, 0)  # Whisper's encoder: 3000 mel frames -> 1500
    assert fixed_frame_rate(16000, 49, 320).frames(16000) == 49
    with pytest.raises(ValueError):
        fixed_frame_rate(16000, 49, 200)


def test_declared_stride_is_checked_against_the_model():
    spec = InputSpec(name="input_values", shape=["batch", "samples"])

    class Range:
        min, max = 4000, 80000

    def shapes_at(sizes):
        return {"last_hidden_state": (1, conv_frames(sizes["samples"]), 8), "pooled": (1, 8)}

    rates = output_frame_rates(shapes_at, [spec], {"samples": Range}, {"last_hidden_state": 320}, {"batch": 2, "samples": 16000})
    assert rates == {"last_hidden_state": FrameRate(320, 80)}
    with pytest.raises(UserError, match=r"last_hidden_state\.stride is 300, but the exported model gives one frame per 320 samples"):
        output_frame_rates(shapes_at, [spec], {"samples": Range}, {"last_hidden_state": 300}, {"batch": 2, "samples": 16000})
    fixed = InputSpec(name="input_values", shape=["batch", 16000])
    assert output_frame_rates(lambda s: {"y": (1, 49, 8)}, [fixed], {}, {"y": 320}, {"batch": 1}) == {"y": FrameRate(320, 320)}
    with pytest.raises(UserError, match=r"y\.stride is 100"):
        output_frame_rates(lambda s: {"y": (1, 49, 8)}, [fixed], {}, {"y": 100}, {"batch": 1})


# -- windows and merges ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("full_last", [False, True])
def test_strided_windows_start_on_frames_and_reach_the_end(full_last):
    windows = plan_strided_windows(160_123, 32000, 3200, 320, full_last)
    assert all(w.start % 320 == 0 for w in windows)
    assert windows[-1].end == 160_123 and windows[0].start == 0
    if full_last:
        assert 32000 - 320 < windows[-1].length <= 32000


@pytest.mark.parametrize("merge", ["center", "linear"])
@pytest.mark.parametrize("length", [64000, 100_001, 16000 * 60 + 77])
def test_chunked_frames_equal_the_whole_pass_for_a_local_model(length, merge):
    """With an overlap wider than the receptive field, a model without wider context gives the same frames chunked."""
    x = np.random.default_rng(length).normal(size=length)
    whole = local_model(x)
    kind = OutputKind("y", "token", stride=320, frame_offset=80)
    windows = plan_strided_windows(length, 16000, 1280, 320, True)
    merged = merge_frames(kind, windows, [local_model(x[w.start : w.end]) for w in windows], length, merge)
    assert merged.shape == whole.shape
    np.testing.assert_allclose(merged, whole, rtol=1e-12, atol=1e-12)


def test_overlap_halves_are_kept_from_each_window():
    windows = plan_strided_windows(48000, 16000, 3200, 320, False)
    frames, total = frame_windows(windows, FrameRate(320, 80), 48000)
    assert total == FrameRate(320, 80).frames(48000)
    for a, b in zip(frames, frames[1:]):
        overlap = a.end - b.start
        assert a.keep_end == b.keep_start == b.start + overlap // 2


def test_an_overlap_narrower_than_the_receptive_field_is_refused_with_the_overlap_needed():
    windows = plan_strided_windows(48000, 16000, 0, 320, False)
    with pytest.raises(UserError, match="raise --overlap to at least 320"):
        frame_windows(windows, FrameRate(320, 80), 48000)


def test_chunk_and_overlap_must_be_multiples_of_the_stride():
    check_aligned(32000, 3200, 320, "output 'y'")
    with pytest.raises(UserError, match="--overlap 3000 is not a multiple of 320.*use 2880 or 3200"):
        check_aligned(32000, 3000, 320, "output 'y'")
    with pytest.raises(UserError, match="--chunk 100 is not a multiple of 320.*use 320 or 320"):
        check_aligned(100, 0, 320, "output 'y'")


def test_fixed_windows_are_padded_and_merged_at_the_frame_rate():
    """A model that takes exactly 16000 samples: windows of 16000 (the last padded with silence), merged frames equal
    the whole pass of a local model except where the padding reaches into a frame's receptive field."""
    length, size = 41_000, 16000
    x = np.random.default_rng(0).normal(size=length)
    windows = plan_fixed_windows(length, size, 3200)
    assert windows[0].start == 0 and windows[-1].end == length and all(w.length <= size for w in windows)
    assert [w.start for w in windows] == [0, 12800, 25600]
    parts = [local_model(fixed_window_part(x[None, w.start : w.end], 1, size)[0]) for w in windows]
    assert all(p.shape[0] == 49 for p in parts)
    kind = OutputKind("y", "token", stride=320, frame_offset=fixed_frame_rate(size, 49, 320).offset, fixed_window=size)
    merged = merge_frames(kind, windows, parts, length, "center")
    whole = local_model(x)
    assert merged.shape[0] == kind.frames(length) <= whole.shape[0]
    np.testing.assert_allclose(merged, whole[: merged.shape[0]], rtol=1e-12, atol=1e-12)
    short = plan_fixed_windows(5000, size, 3200)
    assert len(short) == 1 and fixed_window_part(np.ones((1, 5000)), 1, size).shape == (1, size)


# -- WAV files -----------------------------------------------------------------------------------------------------


def test_wav_files_read_back(tmp_path):
    samples = np.sin(np.linspace(0, 100, 8000)) * 0.5
    write_wav(tmp_path / "pcm.wav", samples, 16000)
    write_wav(tmp_path / "float.wav", samples, 16000, float32=True)
    np.testing.assert_allclose(read_wav(tmp_path / "pcm.wav", 16000), samples, atol=1 / 32767)
    np.testing.assert_array_equal(read_wav(tmp_path / "float.wav"), samples.astype(np.float32))
    with pytest.raises(UserError, match="sampled at 16000 Hz but the model takes 8000 Hz; resample it"):
        read_wav(tmp_path / "pcm.wav", 8000)
    import wave

    with wave.open(str(tmp_path / "stereo.wav"), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(np.zeros(200, "<i2").tobytes())
    with pytest.raises(UserError, match="has 2 channels; .* mix it down"):
        read_wav(tmp_path / "stereo.wav")
    (tmp_path / "junk.wav").write_bytes(b"not a wav")
    with pytest.raises(UserError, match="is not a readable WAV file"):
        read_wav(tmp_path / "junk.wav")


def test_calib_data_audio_is_small_and_readable():
    files = sorted((ROOT / "calib_data" / "audio").glob("*.wav"))
    assert len(files) >= 3 and sum(f.stat().st_size for f in files) < 1_000_000
    for f in files:
        x = read_wav(f, 16000)
        assert 1.5 * 16000 <= x.size <= 5 * 16000 and 0 < np.abs(x).max() <= 1


# -- the commands, on the zoo's small wav2vec2 ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def in_root():
    before = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(before)


@pytest.fixture(scope="module")
def wav2vec2(tmp_path_factory, in_root):
    """The zoo's small wav2vec2 exported (stride measured), without the PyTorch check (not what these tests prove)."""
    from trtforge.export.step import export_model

    out = tmp_path_factory.mktemp("audio") / "wav2vec2.onnx"
    return export_model(load_config(ROOT / "zoo" / "configs" / "wav2vec2.yaml"), out, check=False).path


def test_export_records_the_measured_stride(wav2vec2):
    outputs = json.loads(wav2vec2.with_name(wav2vec2.name + ".json").read_text())["outputs"]
    assert outputs[0]["stride"] == 320 and outputs[0]["frame_offset"] == 80


def test_export_refuses_a_declared_stride_the_model_does_not_have(tmp_path, in_root):
    from trtforge.export.step import export_model

    config = apply_overrides(load_config(ROOT / "zoo" / "configs" / "wav2vec2.yaml"), {})
    config.outputs[0].stride = 300
    with pytest.raises(UserError, match=r"outputs: last_hidden_state\.stride is 300, but the exported model gives one frame per 320"):
        export_model(config, tmp_path / "w.onnx", check=False)
    assert not (tmp_path / "w.onnx").exists()


def test_a_minute_of_audio_runs_chunked_with_its_chunking_error_measured(wav2vec2, tmp_path):
    """60 s of 16 kHz audio (a WAV file) in windows of 2 s with 0.2 s overlap; the merged output has the whole pass'
    frames, and the chunking error is measured on the longest prefix the model takes whole (5 s)."""
    audio = tmp_path / "audio"
    audio.mkdir()
    t = np.arange(60 * 16000) / 16000
    write_wav(audio / "minute.wav", 0.3 * np.sin(2 * np.pi * (200 + 80 * np.sin(0.6 * t)) * t), 16000)
    report, saved = tmp_path / "r.json", tmp_path / "out.npz"
    proc = run_cli(
        "run", str(wav2vec2), "--inputs", str(audio), "--chunk", "32000", "--overlap", "3200",
        "--report", str(report), "--save-outputs", str(saved),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(report.read_text())
    assert r["inputs"][0]["chunks"] == 34  # 1 + ceil((960000 - 32000) / 28800)
    chunking = r["chunking_error"]
    assert chunking["measured"] and chunking["per_input"][0]["scope"] == "prefix of 80000 positions"
    metrics = chunking["per_output"]["last_hidden_state"]
    assert 0 < metrics["rel_l2"] < 1 and metrics["values"] == FrameRate(320, 80).frames(80000) * 64
    with np.load(saved) as data:
        assert data["minute/last_hidden_state"].shape == (FrameRate(320, 80).frames(60 * 16000), 64)


def test_run_refuses_misaligned_windows_and_other_sample_rates(wav2vec2, tmp_path):
    audio = tmp_path / "audio"
    audio.mkdir()
    write_wav(audio / "slow.wav", np.zeros(40000), 8000)
    assert_user_error(run_cli("run", str(wav2vec2), "--inputs", str(audio)), "sampled at 8000 Hz but the model takes 16000 Hz")
    shutil.rmtree(audio)
    audio.mkdir()
    write_wav(audio / "a.wav", np.zeros(100_000), 16000)
    proc = run_cli("run", str(wav2vec2), "--inputs", str(audio), "--chunk", "32100", "--overlap", "3200")
    assert_user_error(proc, "--chunk 32100 is not a multiple of 320", "output 'last_hidden_state'")
    proc = run_cli("run", str(wav2vec2), "--inputs", str(audio), "--chunk", "32000", "--overlap", "0")
    assert_user_error(proc, "raise --overlap to at least 320")


def test_a_stride_missing_from_an_older_sidecar_is_still_refused(wav2vec2, tmp_path):
    old = tmp_path / "old.onnx"
    shutil.copy(wav2vec2, old)
    sidecar = json.loads(wav2vec2.with_name(wav2vec2.name + ".json").read_text())
    for entry in sidecar["outputs"]:
        entry.pop("stride"), entry.pop("frame_offset")
    old.with_name("old.onnx.json").write_text(json.dumps(sidecar))
    audio = tmp_path / "audio"
    audio.mkdir()
    write_wav(audio / "a.wav", np.zeros(100_000), 16000)
    proc = run_cli("run", str(old), "--inputs", str(audio), "--chunk", "32000", "--overlap", "3200")
    assert_user_error(proc, "has 12 positions for 4000 input positions", "declare it `kind: token`", "re-export")


def test_a_fixed_length_model_runs_in_padded_windows(tmp_path, in_root):
    """wav2vec2 exported at exactly 16000 samples (Whisper-style fixed windows): recordings of 2-3 s run as windows of
    16000 with an overlap, the last padded, merged to the recording's frames; no whole pass exists to measure against."""
    from trtforge.export.step import export_model

    config = apply_overrides(load_config(ROOT / "zoo" / "configs" / "wav2vec2.yaml"), {})
    config.inputs[0].shape = ["batch", 16000]
    config.axes.pop("samples")
    config.export.check_sizes = {}
    onnx = export_model(config, tmp_path / "fixed.onnx", check=False).path
    assert json.loads(onnx.with_name("fixed.onnx.json").read_text())["outputs"][0]["stride"] == 320
    report, saved = tmp_path / "r.json", tmp_path / "out.npz"
    proc = run_cli(
        "run", str(onnx), "--inputs", "calib_data/audio", "--overlap", "3200", "--report", str(report), "--save-outputs", str(saved)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(report.read_text())
    lengths = {i["name"]: (i["length"], i["chunks"]) for i in r["inputs"]}
    assert lengths["chirp"] == (48000, 4)  # windows at 0, 12800, 25600, 38400 (padded)
    assert "no whole pass exists" in r["chunking_error"]["reason"]
    with np.load(saved) as data:
        assert data["chirp/last_hidden_state"].shape == (FrameRate(320, 320).frames(48000), 64)
    proc = run_cli("run", str(onnx), "--inputs", "calib_data/audio", "--chunk", "8000")
    assert_user_error(proc, "takes exactly 16000 positions per window", "--chunk 16000")
    proc = run_cli("run", str(onnx), "--inputs", "calib_data/audio", "--overlap", "3000")
    assert_user_error(proc, "windows of 16000 positions must advance by a multiple of 320", "use --overlap 2880 or 3200")


def test_npy_recordings_of_any_name_feed_a_one_input_model(tmp_path):
    from trtforge.calibrate.data import read_arrays, scan

    np.save(tmp_path / "talk.npy", np.zeros(48000, np.float32))
    np.save(tmp_path / "song.npy", np.ones((1, 32000), np.float32))
    spec = InputSpec(name="input_values", shape=["batch", "samples"])
    samples = read_arrays(scan(tmp_path), [spec])
    assert sorted(s["input_values"].shape for s in samples) == [(1, 32000), (1, 48000)]
    two = [spec, InputSpec(name="attention_mask", dtype="int64", shape=["batch", "samples"])]
    with pytest.raises(UserError, match="is not named after a model input"):
        read_arrays(scan(tmp_path), two)
