"""`trtforge run` on the ORT backend: MiniLM long documents, tiny-fcn tiles, and its bad input."""

import json
import os
import resource
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, assert_user_error, require, run_cli


def test_minilm_long_documents_report(minilm_clean, tmp_path):
    report_path = tmp_path / "run.json"
    proc = run_cli(
        "run",
        str(minilm_clean),
        "--inputs",
        "calib_data/minilm_long",
        "--chunk",
        "256",
        "--overlap",
        "32",
        "--reference",
        str(minilm_clean),
        "--report",
        str(report_path),
        "--warmup",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["schema"] == "trtforge.run/2"
    # export declares MiniLM's output kind in its sidecar; run reads it from there.
    assert report["outputs"] == {"last_hidden_state": {"kind": "token", "scale": None, "source": "declared"}}
    assert len(report["inputs"]) == 6 and all(i["length"] > 4000 and i["chunks"] >= 16 for i in report["inputs"])
    # every last window at full length: all chunks of one shape, so batches are only ever cut by the batch size
    assert report["chunking"]["last_window"] == "full"
    assert report["batches"] == -(-sum(i["chunks"] for i in report["inputs"]) // report["chunking"]["batch_size"])
    # Same model on both sides: not a measured 0 that passes, but "not measured" (issue 9).
    assert report["precision_error"] == {"measured": False, "reason": "target is its own reference; pass --reference or run an engine"}
    chunking = report["chunking_error"]
    assert chunking["per_input"][0]["scope"] == "prefix of 510 tokens"
    assert 0.5 < chunking["per_output"]["last_hidden_state"]["min_item_cosine"] < 1.0  # mean-pooled cosine per document
    for key in ("p50_ms", "p90_ms", "p99_ms"):
        assert report["latency"]["all"]["wall"][key] > 0
    assert report["throughput"]["tokens_per_s"] > 0 and report["memory"]["peak_rss_mb"] > 0
    assert report["throughput"]["unit"] == "tokens"
    assert report["gates"]["passed"]
    assert report["runtime"]["merge_workers"] == min(2, os.cpu_count() or 2)  # the default (fastest on the H200)
    assert "latency per batch" in proc.stdout and "chunking" in proc.stdout
    host = report["runtime"]["host"]  # where the loop's wall time went, stage by stage
    assert {"plan", "wait_plan", "merge"} <= set(host["stages"]) and host["loop_wall_s"] > 0
    assert host["stages"]["plan"]["count"] == 6 and "host seconds" in proc.stdout
    timeline = report["runtime"]["timeline"]  # each batch's wall ms in order: where the loop stalled
    assert timeline["batches"] == timeline["shown"] == report["batches"] == report["latency"]["all"]["wall"]["count"]
    assert min(timeline["wall_ms"]) > 0 and len(timeline["gpu_ms"]) == report["batches"]


def test_fp16_onnx_passes_the_default_gates(minilm_clean, tmp_path):
    """The fp16 ONNX that `build --precision fp16` writes, run on ORT against the fp32 source."""
    require("tensorrt_rtx")
    proc = run_cli("build", str(minilm_clean), "--precision", "fp16", "--tiers", "256,512", "-o", str(tmp_path / "m.fp16.engine"))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("run", str(tmp_path / "m.fp16.onnx"), "--inputs", "calib_data/minilm_long", "--reference", str(minilm_clean), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    worst = report["precision_error"]["worst"]
    assert 0 < worst["rel_l2"] <= 1e-2 and worst["cosine"] >= 0.99


def test_int8_onnx_is_gated_by_cosine_by_default(minilm_int8, minilm_clean, tmp_path):
    """calibrate's Q/DQ ONNX against its fp32 source: the default gates of an INT8 target are the cosine
    alone (its rel-L2 is INT8 rounding, several percent on healthy models), and the output says so."""
    int8, _ = minilm_int8
    report_path = tmp_path / "r.json"
    args = (
        "run",
        str(int8),
        "--inputs",
        "calib_data/minilm_long",
        "--chunk",
        "256",
        "--overlap",
        "32",
        "--reference",
        str(minilm_clean),
        "--warmup",
        "0",
    )
    proc = run_cli(*args, "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    gates = json.loads(report_path.read_text())["gates"]
    assert [c["gate"] for c in gates["checked"] if c["source"] == "default for int8 targets"] == ["min_cosine"]
    assert gates["checked"][0]["value"] >= 0.99 and "max_rel_l2 has no default for an INT8 or FP8-GEMM target" in proc.stdout
    strict = run_cli(*args, "--max-rel-l2", "1e-4")
    assert strict.returncode == 1, strict.stdout[-2000:]
    # a speed run: no ONNX Runtime pass after the loop; a gate that needs it fails saying so
    fast = run_cli(*args, "--no-precision-check", "--json")
    assert fast.returncode == 0, fast.stderr
    assert json.loads(fast.stdout)["precision_error"] == {"measured": False, "reason": "--no-precision-check"}
    gated = run_cli(*args, "--no-precision-check", "--min-cosine", "0.99")
    assert_user_error(gated, "min_cosine 0.99 could not be evaluated: precision error not measured: --no-precision-check", code=1)
    # and no chunked-vs-whole pass either: measured by default, reported not measured when off, a set gate fails
    assert json.loads(fast.stdout)["chunking_error"]["measured"] is True
    assert json.loads(fast.stdout)["runtime"]["overlap_merges"] is False  # ONNX Runtime's outputs are its own: nothing to overlap
    no_chunking = run_cli(*args, "--no-precision-check", "--no-chunking-check", "--report", str(tmp_path / "fast.json"))
    # the built-in config's chunk gate (0.85) is set, so it fails saying why
    assert_user_error(no_chunking, "min_chunk_cosine 0.85 could not be evaluated: chunking error not measured: --no-chunking-check", code=1)
    assert json.loads((tmp_path / "fast.json").read_text())["chunking_error"]["reason"] == "--no-chunking-check"


def test_chunk_equal_to_model_max_cannot_measure_chunking(minilm_clean, tmp_path):
    """Issue 9: with chunk = the model's max, the 'whole' pass was one chunk and the error always 0.
    Now it is not measurable, and the built-in config's chunk gate (0.85) fails saying so."""
    proc = run_cli(
        "run",
        str(minilm_clean),
        "--inputs",
        "calib_data/minilm_long",
        "--chunk",
        "512",
        "--overlap",
        "0",
        "--warmup",
        "0",
        "--report",
        str(tmp_path / "r.json"),
    )
    assert_user_error(
        proc,
        "min_chunk_cosine 0.85 could not be evaluated: chunking error not measured: not measurable: chunk (512)",
        "the longest input the model takes whole (512)",
        code=1,
    )
    assert json.loads((tmp_path / "r.json").read_text())["chunking_error"]["measured"] is False


def test_chunking_gate_fails_with_exit_1(minilm_clean):
    proc = run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--min-chunk-cosine", "0.999", "--warmup", "0")
    assert_user_error(proc, "chunking item cosine of 'last_hidden_state'", "(min_chunk_cosine)", code=1)


def test_tiny_fcn_tiles_match_whole_image(tiny_fcn_clean, tmp_path):
    data = tmp_path / "images"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(300, 200), (180, 260)]):
        np.savez(data / f"img{i}.npz", image=rng.random((1, 3, h, w), dtype=np.float32))
    proc = run_cli("run", str(tiny_fcn_clean), "--inputs", str(data), "--chunk", "128", "--overlap", "16", "--json", "--warmup", "0")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["outputs"]["logits"] == {"kind": "dense", "scale": 1.0, "source": "inferred"}
    assert report["chunking_error"]["worst"]["rel_l2"] < 1e-5  # overlap 16 >= receptive field 9: centre merge is exact
    assert report["inputs"][0]["chunks"] == 6  # 3 rows x 2 columns of 128-pixel tiles, stride 112
    proc = run_cli(
        "run",
        str(tiny_fcn_clean),
        "--inputs",
        str(data),
        "--chunk",
        "128",
        "--overlap",
        "32",
        "--merge",
        "gaussian",
        "--json",
        "--warmup",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["chunking_error"]["worst"]["rel_l2"] < 2e-2  # blends weigh some edge pixels too: close, not exact


def test_bad_run_inputs(minilm_clean, tiny_fcn_clean, tmp_path):
    assert_user_error(
        run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--no-chunking"),
        "tokens but the model takes at most 512",
        "--chunk",
    )
    assert_user_error(
        run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--chunk", "128", "--overlap", "128"),
        "overlap (128) must be >= 0 and smaller than the chunk size (128)",
    )
    assert_user_error(
        run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--chunk", "1024"),
        "--chunk 1024 is larger than the model's axis 'seq' (512)",
    )
    assert_user_error(
        run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--last-window", "sideways"),
        "--last-window must be 'full' or 'short', got 'sideways'",
    )
    assert_user_error(
        run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--ray", "auto", "--tokenize-processes", "2"),
        "--plan-processes applies to one process's loop",
    )
    for flag, value in (("--plan-workers", "0"), ("--merge-workers", "2")):
        assert_user_error(
            run_cli("run", str(minilm_clean), "--inputs", "calib_data/minilm_long", "--ray", "auto", flag, value),
            f"{flag} applies to one process's loop; with --ray the driver plans every input",
        )
    data = tmp_path / "nan"
    data.mkdir()
    bad = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    bad[0, 0, 3, 3] = np.nan
    np.savez(data / "x.npz", image=bad)
    assert_user_error(run_cli("run", str(tiny_fcn_clean), "--inputs", str(data)), "NaN")
    # I/O names that differ between the target and the reference ONNX.
    assert_user_error(
        run_cli("run", str(tiny_fcn_clean), "--inputs", "calib_data/minilm_long", "--reference", str(minilm_clean)),
        "pass the ONNX the engine was built from",
    )


def test_logits_are_merged_as_token_weighted_softmax(tmp_path):
    from conftest import FIXTURES

    onnx_path = tmp_path / "cls.onnx"
    assert run_cli("export", "--config", str(FIXTURES / "classifier.yaml"), "-o", str(onnx_path)).returncode == 0
    data = tmp_path / "seqs"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i, n in enumerate((150, 64, 90)):
        np.savez(data / f"s{i}.npz", tokens=rng.integers(0, 50, (1, n)))
    args = ("run", str(onnx_path), "--inputs", str(data), "--chunk", "32", "--overlap", "0", "--json", "--warmup", "0")
    # A rank-2 output is a pooled vector or logits: only a declaration can tell (issue 9).
    assert_user_error(
        run_cli(*args),
        "output 'logits' (shape [1, 3]) may be a pooled vector or class logits",
        "outputs: [{name: logits, kind: pooled|logits}]",
        "--output-kind logits=KIND",
    )
    proc = run_cli(*args, "--output-kind", "logits=logits")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    # The model takes 64 positions: s1 runs whole; the others use their 64-position prefix for the chunking error.
    assert [i["scope"] for i in report["chunking_error"]["per_input"]] == ["prefix of 64 positions", "whole", "prefix of 64 positions"]
    # Mean of embeddings is linear, so a token-weighted merge of 32-token chunks is close to the whole pass.
    assert report["chunking_error"]["per_output"]["logits"]["cosine"] > 0.95
    assert report["chunking_error"]["per_output"]["logits"]["top1_agreement"] == 1.0


def test_pooled_output_is_merged_as_a_weighted_mean_not_softmaxed(tmp_path):
    """Issue 9: every rank-2 output was softmaxed, so a pooled embedding came back summing to 1."""
    from conftest import FIXTURES

    onnx_path = tmp_path / "cls.onnx"
    assert run_cli("export", "--config", str(FIXTURES / "classifier.yaml"), "-o", str(onnx_path)).returncode == 0
    data = tmp_path / "seqs"
    data.mkdir()
    np.savez(data / "s0.npz", tokens=np.random.default_rng(1).integers(0, 50, (1, 150)))
    saved = tmp_path / "out.npz"
    proc = run_cli(
        "run",
        str(onnx_path),
        "--inputs",
        str(data),
        "--chunk",
        "32",
        "--overlap",
        "0",
        "--warmup",
        "0",
        "--json",
        "--output-kind",
        "logits=pooled",
        "--save-outputs",
        str(saved),
    )
    assert proc.returncode == 0, proc.stderr
    with np.load(saved) as merged:
        vector = merged["s0/logits"]
    assert vector.shape == (3,) and not np.isclose(vector.sum(), 1.0)  # a mean of raw vectors, not probabilities


def test_image_chunk_gate_is_evaluated(tiny_fcn_clean, tmp_path):
    """Issue 9: tiny-fcn with --chunk 32 --overlap 0 has chunking rel-L2 ~0.1, yet the gate 'passed'."""
    data = tmp_path / "images"
    data.mkdir()
    np.savez(data / "img.npz", image=np.random.default_rng(0).random((1, 3, 300, 200), dtype=np.float32))
    proc = run_cli(
        "run",
        str(tiny_fcn_clean),
        "--inputs",
        str(data),
        "--chunk",
        "32",
        "--overlap",
        "0",
        "--min-chunk-cosine",
        "0.99999",
        "--warmup",
        "0",
    )
    assert_user_error(proc, "chunking item cosine of 'logits'", "< 0.99999 (min_chunk_cosine)", code=1)


def test_explicit_precision_gate_on_its_own_reference_fails(tiny_fcn_clean, tmp_path):
    data = tmp_path / "images"
    data.mkdir()
    np.savez(data / "img.npz", image=np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32))
    proc = run_cli("run", str(tiny_fcn_clean), "--inputs", str(data), "--max-rel-l2", "1e-3", "--warmup", "0")
    assert_user_error(proc, "max_rel_l2 0.001 could not be evaluated: precision error not measured: target is its own reference", code=1)
    # A task gate no output can be judged by: tiny-fcn's only output is dense, it has no top-1 agreement.
    proc = run_cli(
        "run",
        str(tiny_fcn_clean),
        "--inputs",
        str(data),
        "--reference",
        str(tiny_fcn_clean.with_name("tiny-fcn.onnx")),
        "--min-top1-agreement",
        "0.9",
        "--warmup",
        "0",
    )
    assert_user_error(proc, "min_top1_agreement 0.9 could not be evaluated: no output has top1_agreement (outputs: logits (dense))", code=1)


@pytest.mark.parametrize("merge", ["center", "linear"])
def test_parallel_merge_from_the_targets_own_outputs_equals_the_copying_loop(minilm_clean, tmp_path, merge):
    """Without the precision check, run merges each batch straight out of the target's outputs (TensorRT: its
    pinned slots) on several threads, into outputs the planning threads allocated ahead (shapes from the
    warm-up); the merged outputs equal the single-threaded loop's: bit for bit for the disjoint 'center' copies,
    to float32 rounding for the overlapping 'linear' blend (locked, summed in the order windows arrive: where a
    full-length last window overlaps two others, three terms meet and their order shows in the last bit). With
    --plan-processes, worker processes tokenize and plan the texts: same outputs again."""
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    saved = {}
    for name, check, workers, warmup, processes in (("serial", True, 1, 0, 0), ("parallel", False, 3, 1, 0), ("processes", False, 2, 1, 2)):
        saved[name] = tmp_path / f"{name}.npz"
        report = run(
            minilm_clean,
            RunOptions(
                inputs=Path("calib_data/minilm_long"),
                chunk=48,
                overlap=16,
                batch_size=5,
                merge=merge,
                warmup=warmup,
                precision_check=check,
                merge_workers=workers,
                plan_processes=processes,
                save_outputs=saved[name],
            ),
        )
        stages = report["runtime"]["host"]["stages"]
        assert report["runtime"]["merge_workers"] == workers and (stages.get("prepare_outputs", {}).get("count", 0) > 0) == (warmup > 0)
        assert report["runtime"]["plan_processes"] == processes
        assert stages.get("wait_plans", {}).get("count", 0) == (len(report["inputs"]) if processes else 0)
        assert stages.get("plan", {}).get("count", 0) == (0 if processes else len(report["inputs"]))
        assert stages.get("plan_in_workers", {}).get("count", 0) == (len(report["inputs"]) if processes else 0)
        assert 0 < report["runtime"]["host"]["loop_cpu_s"]
        faults = report["runtime"]["host"]["loop_minor_faults"]  # counted over the loop, not the process's life
        assert isinstance(faults, int) and 0 <= faults < resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    serial = np.load(saved["serial"])
    assert len(serial.files) >= 4
    for other in ("parallel", "processes"):
        loaded = np.load(saved[other])
        assert sorted(serial.files) == sorted(loaded.files)
        for key in serial.files:
            if merge == "center":
                np.testing.assert_array_equal(serial[key], loaded[key], err_msg=f"{other}: {key}")
            else:
                np.testing.assert_allclose(serial[key], loaded[key], rtol=1e-6, atol=1e-6, err_msg=f"{other}: {key}")


def test_saved_outputs_are_written_as_inputs_finish_and_their_memory_serves_later_ones(minilm_clean, tmp_path, monkeypatch):
    """run hands each input's merged outputs to the --save-outputs writer as it finishes and reuses their memory
    for later inputs once written (outpool.py, outwriter.py). With a lead of one batch and one planning thread,
    later inputs reuse earlier ones' memory, also while the writer is stuck on input 10 for 0.5 s (its memory must
    stay untouched until written); the file must equal the unbounded run's, where planning runs ahead of every
    merge (little or no reuse). Releasing an input's memory before it is written fails it (checked)."""
    import json as json_mod
    import time

    from trtforge.core.artifacts import NpzStream
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    rng = np.random.default_rng(0)
    docs = tmp_path / "docs.jsonl"  # 24 inputs of 160 distinct random tokens: 5 windows of 48 each, equal sizes
    docs.write_text(
        "".join(json_mod.dumps({"name": f"doc{k:02d}", "input_ids": rng.integers(2000, 20000, 160).tolist()}) + "\n" for k in range(24))
    )
    common = dict(inputs=docs, chunk=48, overlap=16, batch_size=4, warmup=1, precision_check=False, chunking_check=False)
    run(minilm_clean, RunOptions(**common, plan_ahead=0, save_outputs=tmp_path / "unbounded.npz"))
    write = NpzStream.write

    def stuck_on_input_10(self, key, array):
        time.sleep(0.5 if key.startswith("doc10/") else 0)
        write(self, key, array)

    monkeypatch.setattr(NpzStream, "write", stuck_on_input_10)
    bounded = run(minilm_clean, RunOptions(**common, plan_ahead=1, plan_workers=1, save_outputs=tmp_path / "bounded.npz"))
    pool = bounded["runtime"]["output_pool"]
    assert pool["reused"] > 0 and pool["fresh"] < 24, pool
    saved = bounded["runtime"]["saved_outputs"]
    assert saved["path"] == str(tmp_path / "bounded.npz") and saved["write_s"] >= 0.5
    want, got = np.load(tmp_path / "unbounded.npz"), np.load(tmp_path / "bounded.npz")
    assert sorted(want.files) == sorted(got.files) == [f"doc{k:02d}/last_hidden_state" for k in range(24)]
    for key in want.files:
        np.testing.assert_array_equal(want[key], got[key], err_msg=key)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_plan_processes_from_ids_equal_the_planning_threads(minilm_clean, tmp_path):
    """Pre-tokenized inputs planned in worker processes (--plan-processes): the same merged outputs, bit for bit, as
    the planning threads give, for inputs of one window and of many; an empty input is refused as without them."""
    import json as json_mod

    from trtforge.core.errors import UserError
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    rng = np.random.default_rng(1)
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "".join(
            json_mod.dumps({"name": f"doc{k}", "input_ids": rng.integers(2000, 20000, n).tolist()}) + "\n"
            for k, n in enumerate((20, 160, 333, 47, 96, 1000))
        )
    )
    common = dict(inputs=docs, chunk=48, overlap=16, batch_size=7, warmup=1, precision_check=False, chunking_check=False)
    reports = {}
    for processes in (0, 2):
        reports[processes] = run(minilm_clean, RunOptions(**common, plan_processes=processes, save_outputs=tmp_path / f"p{processes}.npz"))
    assert reports[2]["runtime"]["plan_processes"] == 2
    cpus = os.cpu_count() or 2  # threads that only wait for the processes: as many as where they tokenize
    assert (reports[0]["runtime"]["plan_workers"], reports[2]["runtime"]["plan_workers"]) == (min(2, cpus), min(8, cpus))
    assert reports[2]["runtime"]["host"]["stages"]["wait_plans"]["count"] == 6
    assert reports[0]["inputs"] == reports[2]["inputs"] and reports[2]["inputs"][0]["chunks"] == 1
    want, got = np.load(tmp_path / "p0.npz"), np.load(tmp_path / "p2.npz")
    assert sorted(want.files) == sorted(got.files) == [f"doc{k}/last_hidden_state" for k in range(6)]
    for key in want.files:
        np.testing.assert_array_equal(want[key], got[key], err_msg=key)
    docs.write_text('{"name": "a", "input_ids": [2000, 2001]}\n{"name": "nothing", "input_ids": []}\n')
    with pytest.raises(UserError, match="input 'nothing' is empty"):
        run(minilm_clean, RunOptions(**{**common, "save_outputs": None}, plan_processes=2))


@pytest.mark.parametrize("precision_check", [False, True])
def test_a_merged_batchs_windows_are_let_go_without_the_precision_check(minilm_clean, tmp_path, monkeypatch, precision_check):
    """Without the precision check nothing reads a batch's chunks once it is merged, so run lets go of them: when the
    last input finishes, the window blocks of inputs finished long before are freed (kept, every input's planned
    arrays were fresh memory the planning threads page-faulted in). With the check, every batch is kept for the
    ONNX Runtime comparison after the loop."""
    import gc
    import json as json_mod
    import weakref

    from trtforge.runtime import step as run_module

    rng = np.random.default_rng(2)
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "".join(json_mod.dumps({"name": f"doc{k}", "input_ids": rng.integers(2000, 20000, 200).tolist()}) + "\n" for k in range(12))
    )
    blocks: dict[int, list] = {}
    plan_document = run_module.plan_document

    def watched(d, *args, **kwargs):
        chunks = plan_document(d, *args, **kwargs)
        blocks[d] = [weakref.ref(b) for b in chunks.blocks]
        return chunks

    alive_at_end = []
    finish = run_module.Merger._finish

    def counted(self, d):
        finish(self, d)
        if self.finished == len(self.docs):
            gc.collect()
            alive_at_end.append(sum(r() is not None for k in range(len(self.docs) - 4) for r in blocks[k]))

    monkeypatch.setattr(run_module, "plan_document", watched)
    monkeypatch.setattr(run_module.Merger, "_finish", counted)
    report = run_module.run(
        minilm_clean,
        run_module.RunOptions(
            inputs=docs, chunk=48, overlap=16, batch_size=4, warmup=1, precision_check=precision_check, chunking_check=False
        ),
    )
    assert report["batches"] > 12 and len(alive_at_end) == 1
    assert (alive_at_end[0] > 0) == precision_check, alive_at_end


def test_saving_outputs_of_inputs_that_share_a_name_is_refused(minilm_clean, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"name": "a", "input_ids": [2000, 2001, 2002]}\n{"name": "a", "input_ids": [2003, 2004]}\n')
    out = tmp_path / "o.npz"
    assert_user_error(
        run_cli("run", str(minilm_clean), "--inputs", str(docs), "--save-outputs", str(out)),
        "inputs 0 and 1 are both named 'a'",
        "give the inputs distinct names",
    )
    assert not out.exists()


def test_a_failed_save_stops_the_run_and_leaves_no_file(minilm_clean, tmp_path, monkeypatch):
    """A write that fails mid-run (disk full) ends the run with its one sentence; no temp file and no writing
    thread are left behind."""
    import threading

    from trtforge.core.artifacts import NpzStream
    from trtforge.core.errors import UserError
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    def full_disk(self, key, array):
        raise UserError(f"could not write {self.final}: No space left on device; free space or choose another path.")

    monkeypatch.setattr(NpzStream, "write", full_disk)
    with pytest.raises(UserError, match="No space left on device"):
        run(
            minilm_clean,
            RunOptions(
                inputs=Path("calib_data/minilm_long"),
                chunk=128,
                overlap=16,
                batch_size=8,
                warmup=1,
                precision_check=False,
                chunking_check=False,
                save_outputs=tmp_path / "o.npz",
            ),
        )
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name == "trtforge-save"]


def test_an_empty_input_is_refused(minilm_clean, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"name": "full", "input_ids": [2000, 2001, 2002]}\n{"name": "hollow", "input_ids": []}\n')
    assert_user_error(
        run_cli(
            "run", str(minilm_clean), "--inputs", str(docs), "--chunk", "48", "--overlap", "8", "--save-outputs", str(tmp_path / "o.npz")
        ),
        "input 'hollow' is empty (no tokens or positions)",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


def test_the_run_loop_flags_reach_the_run_options(minilm_clean, tmp_path, monkeypatch):
    """--no-pad-batches and --gpu-wait go from the command line into RunOptions (and a bad --gpu-wait is one sentence)."""
    from typer.testing import CliRunner

    import trtforge.runtime.step as run_mod
    from trtforge.cli.app import app

    seen = []

    class Stop(Exception):
        pass

    def fake_run(target, options, progress=None):
        seen.append(options)
        raise Stop

    monkeypatch.setattr(run_mod, "run", fake_run)
    args = ["run", str(minilm_clean), "--inputs", "calib_data/minilm_long"]
    CliRunner().invoke(app, args + ["--no-pad-batches", "--gpu-wait", "block"])
    CliRunner().invoke(app, args)
    assert [(o.pad_batches, o.gpu_wait) for o in seen] == [(False, "block"), (True, "spin")]
    assert_user_error(run_cli(*args, "--gpu-wait", "sleep"), "--gpu-wait")


@pytest.mark.parametrize("pause", [True, False])
def test_the_garbage_collector_is_off_while_the_loop_runs_and_back_after(minilm_clean, tmp_path, monkeypatch, pause):
    """A full collection stops every thread of the loop for tens of ms: off while the loop plans, runs and merges
    (after one collection before the clock), on again after it, also when the loop fails; --no-gc-pause leaves it on."""
    import gc

    import trtforge.runtime.step as run_mod
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    seen, plan_document = [], run_mod.plan_document

    def recording(d, *args):
        seen.append(gc.isenabled())
        return plan_document(d, *args)

    monkeypatch.setattr(run_mod, "plan_document", recording)
    common = dict(
        inputs=Path("calib_data/minilm_long"),
        chunk=256,
        overlap=32,
        batch_size=8,
        warmup=0,
        precision_check=False,
        chunking_check=False,
        gc_pause=pause,
    )
    assert gc.isenabled()
    report = run(minilm_clean, RunOptions(**common))
    assert seen and set(seen) == {not pause} and gc.isenabled()
    assert report["runtime"]["gc"]["paused_in_loop"] is pause
    assert (report["runtime"]["gc"]["collect_before_loop_s"] is not None) is pause

    def failing(d, *args):
        raise RuntimeError("planning failed")

    monkeypatch.setattr(run_mod, "plan_document", failing)
    with pytest.raises(RuntimeError, match="planning failed"):
        run(minilm_clean, RunOptions(**common))
    assert gc.isenabled()


def test_the_garbage_collector_stays_off_where_the_caller_had_it_off_and_merge_workers_0_is_refused_before_loading(minilm_clean):
    """run turns the collector back on only if it was on; --merge-workers 0 on a target whose merges do not overlap (here
    ONNX Runtime) is refused before anything is loaded, and negative worker counts are refused outright."""
    import gc

    from trtforge.core.errors import UserError
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    common = dict(
        inputs=Path("calib_data/minilm_long"), chunk=256, overlap=32, batch_size=8, warmup=0, precision_check=False, chunking_check=False
    )
    gc.disable()
    try:
        run(minilm_clean, RunOptions(**common))
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(UserError, match="--merge-workers 0 .* needs an engine run without the precision check"):
        run(minilm_clean, RunOptions(**common, merge_workers=0))
    assert gc.isenabled()
    for key in ("merge_workers", "plan_workers"):
        with pytest.raises(UserError, match=f"--{key.replace('_', '-')} -1 is negative"):
            RunOptions(**common, **{key: -1})


def test_a_relative_reference_in_an_older_sidecar_is_found_from_another_folder(minilm_clean, tmp_path, monkeypatch):
    """`run` compares against the reference ONNX a sidecar records; older sidecars recorded it as typed, relative to
    the folder the step ran in: it is found beside the sidecar from any working folder."""
    import shutil

    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.prepare import prepare

    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("m.clean.onnx", "m.target.onnx"):
        shutil.copy(minilm_clean, folder / name)
        shutil.copy(minilm_clean.with_name(minilm_clean.name + ".json"), folder / f"{name}.json")
    side = json.loads((folder / "m.target.onnx.json").read_text())
    (folder / "m.target.onnx.json").write_text(json.dumps({**side, "reference_onnx": "models/m.clean.onnx"}))
    monkeypatch.chdir(folder)  # from here "models/m.clean.onnx" does not exist
    p = prepare(Path("m.target.onnx"), RunOptions(inputs=ROOT / "calib_data/minilm_long", chunk=256, overlap=32), plan=False)
    assert p.reference_path.resolve() == (folder / "m.clean.onnx").resolve()
