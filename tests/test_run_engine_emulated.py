"""`trtforge run` on an ENGINE, end to end, without a GPU: a real TensorRT-RTX engine file and sidecar for MiniLM,
executed by a stand-in whose "kernel" runs the engine's ONNX on ONNX Runtime, on the fake CUDA of test_runloop (host
memory, synchronous streams, graph capture by recording). Everything of the GPU path above the CUDA calls is the
real code: TrtTarget, TrtRunner (pinned staging of chunk parts, CUDA graphs, shared context memory, the GIL-holding
submit calls through a fake libcuda), the pipelined loop, the merge straight out of the output slot, the report.
The merged outputs must equal `run` on ONNX Runtime over the same documents."""

import json
import os
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import require
from test_runloop import FakeCudart, FakeLogger, fake_driver

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.artifacts import read_sidecar


class OrtEngine:
    """A deserialized engine whose execution is ONNX Runtime on `onnx_path` (I/O names and types from the sidecar)."""

    device_memory_size = 1 << 16

    def __init__(self, onnx_path, io, cudart):
        self.ort = OrtRunner(onnx_path)
        self.io, self.cudart = io, cudart
        self.names = [t["name"] for t in io]
        self.shapes_for: dict = {}

    @property
    def num_io_tensors(self):
        return len(self.names)

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_mode(self, name):
        return next(t["mode"] for t in self.io if t["name"] == name)

    def get_tensor_dtype(self, name):
        return np.dtype(next(t["dtype"] for t in self.io if t["name"] == name))

    def create_execution_context_without_device_memory(self):
        return OrtContext(self)

    def output_shapes(self, inputs):
        key = tuple(sorted((k, v) for k, v in inputs.items()))
        if key not in self.shapes_for:  # the engine's shape inference: ORT on zeros of these shapes, once
            feeds = {k: np.ones(v, self.get_tensor_dtype(k)) for k, v in inputs.items()}
            self.shapes_for[key] = {k: v.shape for k, v in self.ort.run(feeds).items()}
        return self.shapes_for[key]


class OrtContext:
    def __init__(self, engine):
        self.engine, self.inputs, self.addresses, self.runs = engine, {}, {}, 0

    def set_device_memory(self, ptr, size):
        pass

    def set_optimization_profile_async(self, profile, stream):
        self.profile = profile

    def set_input_shape(self, name, dims):
        self.inputs[name] = tuple(int(d) for d in dims)
        return True

    def get_tensor_shape(self, name):
        if name in self.inputs:
            return self.inputs[name]
        return self.engine.output_shapes(self.inputs)[name]

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr

    def execute_async_v3(self, stream):
        import ctypes

        engine, shapes, addresses = self.engine, dict(self.inputs), dict(self.addresses)
        outs = engine.output_shapes(shapes)

        def view(name, shape):
            dtype = engine.get_tensor_dtype(name)
            raw = (ctypes.c_byte * (int(np.prod(shape)) * dtype.itemsize)).from_address(addresses[name])
            return np.frombuffer(raw, dtype).reshape(shape)

        def kernel():
            self.runs += 1
            got = engine.ort.run({k: view(k, s).copy() for k, s in shapes.items()})
            for name, shape in outs.items():
                view(name, shape)[...] = got[name]

        engine.cudart.op(stream, kernel)
        return True


class NullContext(OrtContext):
    def execute_async_v3(self, stream):
        return True  # computes nothing: for the loop's own behaviour and cost (benchmarks/host_overhead.py)


class NullEngine(OrtEngine):
    """An engine that runs nothing: its outputs hold whatever the buffers held."""

    def create_execution_context_without_device_memory(self):
        return NullContext(self)

    def output_shapes(self, inputs):
        """TensorRT's shape inference is free; OrtEngine's runs ONNX Runtime. Once, then by substitution: an
        output dim equal to the first input shape's batch or sequence follows the new one."""
        if not self.shapes_for:
            return super().output_shapes(inputs)
        ((first_in, first_out),) = list(self.shapes_for.items())[:1]
        (b0, s0), (b, s) = next(iter(dict(first_in).values()))[:2], next(iter(inputs.values()))[:2]
        swap = {b0: b, s0: s} if b0 != s0 else {b0: b}
        return {k: tuple(swap.get(d, d) if i < 2 else d for i, d in enumerate(v)) for k, v in first_out.items()}


@pytest.fixture(scope="module")
def engine(minilm_clean, tmp_path_factory):
    """A real engine file and sidecar (TensorRT-RTX builds without a GPU), one profile of chunks up to 256."""
    require("tensorrt_rtx")
    from trtforge.build.step import build

    out = tmp_path_factory.mktemp("emulated") / "minilm.engine"
    result = build(minilm_clean, out, "fp32", "seq=256", backend="tensorrt_rtx")
    return result.engine_path


def _emulate(monkeypatch, onnx_path, engine_path, engine_cls=None):
    """Patch trtforge so that TrtTarget loads `engine_path` and runs it as `engine_cls` (OrtEngine: ORT on
    `onnx_path`) over the fake CUDA; benchmarks/host_overhead.py passes a null engine."""
    import trtforge.backends.tensorrt as tensorrt_mod
    import trtforge.backends.tensorrt_runtime as rt
    import trtforge.core.platform as doctor
    from trtforge.backends.cuda_async import submit_calls

    cudart = FakeCudart()
    driver = fake_driver(cudart)
    engines = []

    def runtime(logger):
        def deserialize(data):
            side = read_sidecar(engine_path)
            engines.append((engine_cls or OrtEngine)(onnx_path, side["io"], cudart))
            return engines[-1]

        return SimpleNamespace(deserialize_cuda_engine=deserialize)

    trt = SimpleNamespace(Logger=FakeLogger, TensorIOMode=SimpleNamespace(INPUT="input"), nptype=lambda t: t, Runtime=runtime)
    emulated = {"engines": engines, "driver": driver, "cudart": cudart}
    monkeypatch.setattr(tensorrt_mod, "load_trt", lambda backend="auto": tensorrt_mod.TrtModule(trt, "tensorrt", "8.6.0"))
    monkeypatch.setattr("trtforge.backends.engine_layers.runtime_identity", lambda mod: {})
    monkeypatch.setattr("trtforge.build.engine_record.check_engine_compat", lambda path, sidecar, identity: None)
    monkeypatch.setattr(doctor, "gpu_info", lambda: {"name": "emulated", "compute_capability": "9.0"})
    monkeypatch.setattr(rt, "cuda_runtime", lambda: cudart)
    monkeypatch.setattr("trtforge.backends.cuda_memory.cuda_runtime", lambda: cudart)
    monkeypatch.setattr(rt, "check_gpu_supported", lambda flavour, path: None)
    monkeypatch.setattr(rt, "submit_calls", lambda c, check, event, stream: submit_calls(c, check, event, stream, driver))
    return emulated


@pytest.mark.parametrize(
    "precision_check,overlap_merges,copy_engine,reserve,threads",
    [
        (False, True, True, None, 2),
        (False, True, True, 0, 2),
        (False, True, False, None, 2),
        (False, False, True, None, 2),
        (True, True, True, None, 2),
        (False, True, True, None, 0),
        (False, True, False, None, 0),
    ],
    ids=[
        "copy-engine-merge",
        "copy-engine-merge-nothing-reserved",
        "merged-from-the-slot",
        "merged-from-the-slot-waiting",
        "with-reference",
        "copy-engine-merge-no-threads",
        "merged-from-the-slot-no-threads",
    ],
)
def test_run_on_an_engine_merges_what_onnx_runtime_computes(
    engine, minilm_clean, tmp_path, monkeypatch, precision_check, overlap_merges, copy_engine, reserve, threads
):
    """threads: planning and merging threads each (0: planned on the submitting thread, merged on the collecting one)."""
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("logging_inspect.txt",):
        shutil.copy(f"calib_data/minilm_long/{name}", docs / name)
    # beside it, batched with its windows: a one-window text (merged on the host from the slot's rows, also with the copy
    # engine) and a text of a few windows
    text = Path("calib_data/minilm_long/pdb_difflib_ssl.txt").read_text()
    (docs / "short.txt").write_text(text[:300])
    (docs / "middle.txt").write_text(text[:2500])
    common = dict(inputs=docs, chunk=256, overlap=32, batch_size=4, warmup=1)
    want = run(
        minilm_clean, RunOptions(**common, merge_workers=2, plan_workers=2, precision_check=False, save_outputs=tmp_path / "ort.npz")
    )
    common.update(merge_workers=threads, plan_workers=threads)
    emulated = _emulate(monkeypatch, minilm_clean, engine)
    import trtforge.runtime.step as run_mod

    merged_rows, merging_threads, add = [], set(), run_mod.Merger.add

    def recording_add(self, batch, out, rows=None, copy=False, placed=None):  # how each batch reached the merge
        merged_rows.append(None if rows is None else list(rows))
        merging_threads.add(threading.current_thread().name.split("_")[0])
        return add(self, batch, out, rows, copy, placed)

    monkeypatch.setattr(run_mod.Merger, "add", recording_add)

    from trtforge.backends.cuda_memory import allocate_pinned as allocate

    pinned, freed = [], []

    def recording_allocate(nbytes):  # the merged outputs' page-locked memory: every allocation freed by the end
        raw, free = allocate(nbytes)
        pinned.append(raw.ctypes.data)
        return raw, lambda: (freed.append(raw.ctypes.data), free())

    monkeypatch.setattr("trtforge.backends.cuda_memory.allocate_pinned", recording_allocate)
    report = run(
        engine,
        RunOptions(
            **common,
            reference=minilm_clean,
            precision_check=precision_check,
            overlap_merges=overlap_merges,
            copy_engine_merge=copy_engine,
            pinned_reserve_mb=reserve,
            save_outputs=tmp_path / "engine.npz",
            report=tmp_path / "report.json",
        ),
    )
    ort, got = np.load(tmp_path / "ort.npz"), np.load(tmp_path / "engine.npz")
    assert sorted(ort.files) == sorted(got.files) and len(got.files) == len(list(docs.iterdir())) * len(want["outputs"])
    for key in ort.files:
        np.testing.assert_allclose(got[key], ort[key], rtol=1e-5, atol=1e-5, err_msg=key)
    assert report["batches"] == want["batches"] and report["backend"].startswith("tensorrt 8.6.0")
    runtime = report["runtime"]
    assert (runtime["plan_workers"], runtime["merge_workers"]) == (threads, threads)
    assert merging_threads == ({"trtforge-collect"} if threads == 0 else {"trtforge-merge"})
    assert runtime["submit_calls"] == "libcuda through ctypes, GIL held"
    assert runtime["cuda_graphs"]["captured"] >= 1 and runtime["cuda_graphs"]["replayed"] >= 1
    assert {"stage_inputs", "submit", "wait_gpu"} <= set(runtime["host"]["stages"])
    assert {"htod", "launch", "dtoh", "elapsed"} <= set(emulated["driver"].calls)
    if precision_check:  # the engine's outputs ARE ORT's: measured, and the gates hold
        worst = report["precision_error"]["worst"]
        assert report["precision_error"]["measured"] is not False and worst["rel_l2"] < 1e-5 and report["gates"]["passed"]
    else:
        assert report["precision_error"] == {"measured": False, "reason": "--no-precision-check"}
    assert runtime["overlap_merges"] is (overlap_merges and not precision_check)
    copied = runtime["copy_engine_merge"]
    if copy_engine and overlap_merges and not precision_check:  # every multi-window row written by the copy engine
        single = [i for i in report["inputs"] if i["chunks"] == 1]
        assert copied["enabled"] and copied["outputs"] == ["last_hidden_state"] and len(single) == 1
        assert copied["host_rows"] == 1 and copied["rows"] == sum(i["chunks"] for i in report["inputs"]) - 1
        assert "dtoh_2d" in emulated["driver"].calls
        assert runtime["output_pool"]["memory"] == "page-locked" and pinned and sorted(pinned) == sorted(freed)  # all freed
        held = runtime["output_pool"]["reserved"]  # page-locked before the clock, the pool's buffers carved out of it
        if reserve is None:
            assert held["reserved_mb"] > 0 and held["carved"] == runtime["output_pool"]["fresh"] > 0 and held["beyond"] == 0
            assert len(pinned) == 1  # the one block, page-locked before the loop
        else:  # nothing reserved: each pooled buffer page-locked when first needed
            assert held["reserved_mb"] == 0 and held["carved"] == 0 and held["beyond"] == runtime["output_pool"]["fresh"] == len(pinned)
    else:
        assert not copied["enabled"] and copied["reason"] and "dtoh_2d" not in emulated["driver"].calls
        assert runtime["output_pool"]["memory"] == "numpy" and "reserved" not in runtime["output_pool"]
    if not precision_check:  # overlapped: each batch whole on one merge thread; waiting: its rows split over the 2
        assert all(rows is None for rows in merged_rows) if overlap_merges else all(rows is not None for rows in merged_rows)
    # 31 + 3 windows of 256 at batch 4: the last two ran padded to the warm-up's 4 rows, their outputs equal ORT's above
    # all the same; the one-window text's shape never ran at more rows, so it ran as it is
    assert [i["chunks"] for i in report["inputs"]] == [31, 3, 1] and runtime["padding"] == {"enabled": True, "batches": 1, "rows": 2}
    json.loads((tmp_path / "report.json").read_text())


def test_a_run_that_fails_mid_loop_stops_planning(engine, minilm_clean, tmp_path, monkeypatch):
    """When the loop fails, run closes the batch stream: documents not yet started are never planned (nor their
    merged outputs allocated) after the run gave up."""
    import trtforge.runtime.step as run_mod
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    docs = tmp_path / "docs"
    docs.mkdir()
    for k in range(6):
        for f in sorted(Path("calib_data/minilm_long").glob("*.txt")):
            shutil.copy(f, docs / f"{k}_{f.name}")
    _emulate(monkeypatch, minilm_clean, engine, NullEngine)
    calls, planned = [], []
    plan_document = run_mod.plan_document
    monkeypatch.setattr(run_mod, "plan_document", lambda d, *args: planned.append(d) or plan_document(d, *args))
    add = run_mod.Merger.add

    def failing_add(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("merge failed")
        return add(self, *args, **kwargs)

    monkeypatch.setattr(run_mod.Merger, "add", failing_add)
    with pytest.raises(RuntimeError, match="merge failed"):
        run(engine, RunOptions(inputs=docs, chunk=256, overlap=32, batch_size=4, warmup=1, plan_workers=1, precision_check=False))
    at_failure = len(planned)
    time.sleep(0.3)  # a planning thread left running would plan more documents meanwhile (~40 ms each)
    assert 0 < at_failure == len(planned) < len(list(docs.iterdir()))  # planning stopped with the loop


def test_run_loads_the_engines_plugin_libraries_before_deserializing_it(engine, minilm_clean, tmp_path, monkeypatch):
    """The sidecar's plugin libraries are loaded before TensorRT deserializes the engine (its plugin layers need their
    creators); one that is gone is a one-sentence error naming the engine; --plugin-library gives its new place."""
    import subprocess

    import trtforge.backends.plugin_libraries as plugin_mod
    import trtforge.backends.tensorrt as tensorrt_mod
    from trtforge.core.artifacts import write_sidecar
    from trtforge.core.errors import UserError
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    src = tmp_path / "p.c"
    src.write_text("int trtforge_emulated_plugin(void) { return 7; }\n")
    lib = tmp_path / "libplugins.so"
    if subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True).returncode:
        pytest.skip("no C compiler")
    copy = tmp_path / "m.engine"
    shutil.copy(engine, copy)
    side = read_sidecar(engine)
    write_sidecar(copy, dict(side, plugin_libraries=[{"path": str(tmp_path / "moved.so"), "sha256": "0" * 64}]))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(Path("calib_data/minilm_long/pdb_difflib_ssl.txt").read_text()[:2000])
    options = dict(inputs=docs, chunk=256, overlap=32, batch_size=4, warmup=1, precision_check=False, chunking_check=False)
    emulated = _emulate(monkeypatch, minilm_clean, copy)
    with pytest.raises(UserError, match=r"engine m\.engine holds plugin layers from .*moved\.so.*--plugin-library"):
        run(copy, RunOptions(**options))
    assert not emulated["engines"]  # refused before deserializing
    monkeypatch.setattr(plugin_mod, "_preload_cudnn", lambda: None)
    loaded_at_deserialize = []
    runtime = tensorrt_mod.load_trt().trt.Runtime

    def watching_runtime(logger):
        real = runtime(logger)
        return SimpleNamespace(
            deserialize_cuda_engine=lambda data: (
                loaded_at_deserialize.append(str(lib.resolve()) in plugin_mod._PLUGIN_LIBRARIES) or real.deserialize_cuda_engine(data)
            )
        )

    monkeypatch.setattr(tensorrt_mod.load_trt().trt, "Runtime", watching_runtime)
    report = run(copy, RunOptions(**options, plugin_libraries=[str(lib)]))
    assert loaded_at_deserialize == [True] and report["throughput"]["tokens_per_s"] > 0


def test_pre_tokenized_inputs_on_an_engine_are_planned_on_the_thread_feeding_it_by_default(engine, minilm_clean, tmp_path, monkeypatch):
    """Nothing to tokenize, an engine: no planning threads by default (run.default_plan_workers), every input planned on
    the thread that submits the batches, and the merged outputs those ONNX Runtime gives (planned by 2 threads there)."""
    import trtforge.runtime.step as run_mod
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    rng = np.random.default_rng(0)
    ids = tmp_path / "ids.jsonl"
    ids.write_text(
        "".join(
            json.dumps({"name": f"d{i}", "input_ids": rng.integers(1000, 5000, n).tolist()}) + "\n"
            for i, n in enumerate([1, 30, 251, 252, 253, 700, 2000, 5])
        )
    )
    common = dict(inputs=ids, chunk=256, overlap=32, batch_size=4, warmup=1, precision_check=False, chunking_check=False)
    want = run(minilm_clean, RunOptions(**common, save_outputs=tmp_path / "ort.npz"))
    assert want["runtime"]["plan_workers"] == min(2, os.cpu_count() or 2)
    _emulate(monkeypatch, minilm_clean, engine)
    threads, plan_document = set(), run_mod.plan_document

    def recording(d, *args):
        threads.add(threading.current_thread().name)
        return plan_document(d, *args)

    monkeypatch.setattr(run_mod, "plan_document", recording)
    got = run(engine, RunOptions(**common, save_outputs=tmp_path / "engine.npz"))
    assert got["runtime"]["plan_workers"] == 0 and threads == {threading.current_thread().name}
    assert "wait_plan" not in got["runtime"]["host"]["stages"] and got["runtime"]["host"]["stages"]["plan"]["count"] == 8
    ort, engine_out = np.load(tmp_path / "ort.npz"), np.load(tmp_path / "engine.npz")
    assert sorted(ort.files) == sorted(engine_out.files) and len(ort.files) == 8 * len(want["outputs"])
    for key in ort.files:
        np.testing.assert_allclose(engine_out[key], ort[key], rtol=1e-5, atol=1e-5, err_msg=key)
