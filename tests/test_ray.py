"""Issue 13: `run` and `calibrate` on Ray, CPU side (2 ONNX Runtime actors on one local cluster).

- `run --ray auto` with 2 actors on the shipped long documents: merged outputs and errors equal the
  single-process run (the precision sums differ at most in the last bits: they are added in another order);
- `calibrate --ray auto` with 2 actors writes the byte-identical cache;
- an actor killed mid-run (it exits after its 2nd batch): its units are retried on another actor, every
  document is merged exactly once, and the report equals the single-process one again.
"""

import json

import numpy as np
import pytest
from conftest import ROOT, require, run_cli

RUN_ARGS = (
    "--inputs",
    "calib_data/minilm_long",
    "--chunk",
    "256",
    "--overlap",
    "32",
    "--warmup",
    "1",
    "--min-cosine",
    "0",
    "--max-rel-l2",
    "1",
)
CALIB_ARGS = (
    "--data",
    "calib_data/minilm",
    "--max-samples",
    "48",
    "--max-eval-samples",
    "16",
    "--no-fallback",
    "--min-cosine",
    "0",
    "--json",
)
EXACT = ("min_row_cosine", "max_abs", "min_item_cosine", "items", "values", "candidate_nonfinite", "reference_problem")  # order-free


@pytest.fixture(scope="module")
def ray_cluster():
    """One local cluster of 2 CPUs for the module; CLI subprocesses join it through RAY_ADDRESS."""
    ray = require("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def calibrated(minilm_clean, ray_cluster, tmp_path_factory):
    """The same small calibration (SmoothQuant on, as the built-in config) in one process and on 2 actors."""
    out = {}
    for name, extra in (("single", ()), ("ray", ("--ray", "auto", "--ray-actors", "2"))):
        folder = tmp_path_factory.mktemp(name)
        proc = run_cli(
            "calibrate", str(minilm_clean), *CALIB_ARGS, "-o", str(folder / "m.int8.onnx"), *extra, env={"RAY_ADDRESS": ray_cluster}
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = folder
    return out


@pytest.fixture(scope="module")
def single_run(calibrated, minilm_clean, tmp_path_factory):
    """The INT8 ONNX run in one process, checked against the fp32 ONNX: the figures Ray must reproduce."""
    folder = tmp_path_factory.mktemp("single_run")
    proc = run_cli(
        "run",
        str(calibrated["single"] / "m.int8.onnx"),
        *RUN_ARGS,
        "--reference",
        str(minilm_clean),
        "--report",
        str(folder / "r.json"),
        "--save-outputs",
        str(folder / "o.npz"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((folder / "r.json").read_text()), dict(np.load(folder / "o.npz"))


def test_calibration_on_two_actors_writes_the_identical_cache(calibrated):
    single, ray = (calibrated[k] / "m.calib.cache" for k in ("single", "ray"))
    assert single.read_bytes() == ray.read_bytes() and len(single.read_text().splitlines()) > 20
    a, b = (json.loads(p.with_name(p.name + ".json").read_text()) for p in (single, ray))
    assert a["smooth_scales"] == b["smooth_scales"] and a["tensors"] == b["tensors"]


def _assert_same_run(report, outputs, single):
    """Same inputs, chunk plans, merged outputs and errors as the single-process run."""
    ref_report, ref_outputs = single
    assert report["schema"] == ref_report["schema"] and report["inputs"] == ref_report["inputs"]
    assert sorted(outputs) == sorted(ref_outputs) and all(np.array_equal(outputs[k], ref_outputs[k]) for k in ref_outputs)
    assert report["chunking_error"] == ref_report["chunking_error"] and report["chunking_error"]["measured"]
    ours, theirs = report["precision_error"], ref_report["precision_error"]
    assert ours["measured"] and theirs["measured"] and ours["per_output"].keys() == theirs["per_output"].keys()
    for name, metrics in theirs["per_output"].items():
        assert metrics["rel_l2"] > 0.01  # an INT8 model: a real error, not a vacuous 0 == 0
        for key, value in metrics.items():
            if key in EXACT:
                assert ours["per_output"][name][key] == value, key
            else:
                assert ours["per_output"][name][key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    assert report["gates"]["passed"] == ref_report["gates"]["passed"]
    workers = report["workers"]
    assert sum(w["documents"] for w in workers) == len(report["inputs"])
    assert sum(w["chunks"] for w in workers) == sum(i["chunks"] for i in report["inputs"])
    assert sum(w["batches"] for w in workers) == report["batches"] == report["latency"]["all"]["wall"]["count"]


def test_run_on_two_actors_equals_one_process(calibrated, minilm_clean, single_run, ray_cluster, tmp_path):
    proc = run_cli(
        "run",
        str(calibrated["single"] / "m.int8.onnx"),
        *RUN_ARGS,
        "--reference",
        str(minilm_clean),
        "--report",
        str(tmp_path / "r.json"),
        "--save-outputs",
        str(tmp_path / "o.npz"),
        "--ray",
        "auto",
        "--ray-actors",
        "2",
        env={"RAY_ADDRESS": ray_cluster},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    _assert_same_run(report, dict(np.load(tmp_path / "o.npz")), single_run)
    assert report["ray"]["actors"] == 2 and report["ray"]["lost_workers"] == 0 and report["ray"]["retried_units"] == 0
    assert [w["worker"] for w in report["workers"]] == [0, 1] and all(
        w["documents"] > 0 and w["tokens_per_s"] > 0 for w in report["workers"]
    )
    assert report["throughput"]["unit"] == "tokens"
    # Per worker: the same figures over its own share, which add up to the whole.
    items = [w["precision_error"]["per_output"]["last_hidden_state"]["items"] for w in report["workers"]]
    assert all(items) and sum(items) == report["precision_error"]["per_output"]["last_hidden_state"]["items"]
    assert sum(len(w["chunking_error"]["per_input"]) for w in report["workers"]) == len(report["inputs"])
    assert "Ray workers (2 actors" in proc.stdout


def test_killed_actor_is_retried_and_no_document_is_lost_or_doubled(calibrated, minilm_clean, single_run, ray_cluster, tmp_path):
    from trtforge.runtime.options import RunOptions
    from trtforge.scaleout.ray_run import RayOptions, run_ray

    options = RunOptions(
        inputs=ROOT / "calib_data/minilm_long",
        chunk=256,
        overlap=32,
        warmup=1,
        min_cosine=0,
        max_rel_l2=1,
        reference=minilm_clean,
        save_outputs=tmp_path / "o.npz",
    )
    report = run_ray(calibrated["single"] / "m.int8.onnx", options, RayOptions("auto", actors=2, die_after_batches=2))
    assert report["ray"]["lost_workers"] == 1 and report["ray"]["retried_units"] >= 1
    first = report["workers"][0]
    assert first["alive"] is False and first["documents"] == 0  # died inside its first unit: nothing of it committed
    assert len(report["workers"]) == 3  # the dead one, the survivor, the replacement
    _assert_same_run(report, dict(np.load(tmp_path / "o.npz")), single_run)


def test_killed_calibration_actor_changes_nothing(minilm_clean, ray_cluster):
    """Collection with an actor that dies on its first unit: the retried statistics equal one process's."""
    from trtforge.calibrate import data as data_mod
    from trtforge.calibrate.collect import collect
    from trtforge.calibrate.data import tokenizer_factory
    from trtforge.core.onnxio import load_onnx
    from trtforge.graph.index import io_specs
    from trtforge.scaleout.ray_calibrate import collect_ray

    model = load_onnx(minilm_clean)
    specs, _, _ = io_specs(minilm_clean, model)
    _, samples = data_mod.load_samples(ROOT / "calib_data/minilm", specs, tokenizer_factory(minilm_clean), 128, 24)
    batches = list(data_mod.batches(samples, 4))
    tensors = [n.output[0] for n in model.graph.node if n.op_type in ("MatMul", "Gelu", "Softmax")][:6]
    channel = [n.output[0] for n in model.graph.node if n.op_type == "LayerNormalization"][:2]
    one = collect(model, batches, tensors, channel)
    sharded = collect_ray(model, batches, tensors, channel, address="auto", actors=2, die_after_batches=1)
    assert sharded.samples == one.samples == len(samples)
    for t in tensors:
        assert sharded.histograms[t].range == one.histograms[t].range and sharded.histograms[t].amax == one.histograms[t].amax
        assert (sharded.histograms[t].counts == one.histograms[t].counts).all()
    for t in channel:
        assert np.array_equal(sharded.channel_amax[t], one.channel_amax[t])


def test_more_actors_than_the_cluster_holds_is_a_user_error(minilm_clean, ray_cluster):
    from trtforge.core.errors import UserError
    from trtforge.runtime.options import RunOptions
    from trtforge.scaleout.ray_run import RayOptions, run_ray

    with pytest.raises(UserError, match="--ray-actors 3 asks for more ONNX Runtime actors than the Ray cluster's 2 CPUs"):
        run_ray(minilm_clean, RunOptions(inputs=ROOT / "calib_data/minilm_long", chunk=256, overlap=32), RayOptions("auto", actors=3))


@pytest.mark.parametrize("pause", [True, False])
def test_an_actors_units_run_under_the_loops_interpreter_settings(minilm_clean, pause):
    """A Ray actor infers its units as one process's loop does: the GIL switch interval at --switch-interval-us while a
    unit runs (restored after it, also when it fails) and, with --gc-pause, the collector off from setup (after one
    collection) through every unit until judging, which is off the clock. The actor class is driven here in this
    process: what it does needs no cluster to observe."""
    import gc
    import sys
    from dataclasses import replace

    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.prepare import prepare
    from trtforge.scaleout.ray_run import RunWorker

    options = RunOptions(
        inputs=ROOT / "calib_data/minilm_long",
        chunk=256,
        overlap=32,
        batch_size=8,
        warmup=0,
        precision_check=False,
        chunking_check=False,
        gc_pause=pause,
        switch_interval_us=300,
    )
    p = prepare(minilm_clean, options)
    worker = RunWorker(
        replace(p, docs=[], chunks=[], reference=None, tokenizer=None),
        options,
        str(p.tokenizer.directory) if p.tokenizer else None,
        1,
        None,
    )
    interval = sys.getswitchinterval()
    try:
        worker.setup([], 0)
        assert gc.isenabled() is not pause
        seen, run_many = [], worker.target.run_many

        def recording(items, *args, **kwargs):
            seen.append((gc.isenabled(), sys.getswitchinterval()))
            return run_many(items, *args, **kwargs)

        worker.target.run_many = recording
        docs = [(d, doc) for d, doc in enumerate(p.docs)][:2]
        chunks = [c for c in p.chunks if c.doc < 2]
        for unit in (0, 1):
            result = worker.infer(unit, chunks, docs)
            assert result["docs"] == [0, 1] and result["batches"] >= 1
            assert gc.isenabled() is not pause and sys.getswitchinterval() == interval  # between units
        assert seen == [(not pause, pytest.approx(300e-6))] * 2

        def failing(items, *args, **kwargs):
            raise RuntimeError("unit failed")

        worker.target.run_many = failing
        with pytest.raises(RuntimeError, match="unit failed"):
            worker.infer(2, chunks, docs)
        assert gc.isenabled() is not pause and sys.getswitchinterval() == interval
        worker.judge(0, chunks, [(doc, 1) for _, doc in docs])
        assert gc.isenabled()  # judging: the collector back on
    finally:
        gc.enable()
