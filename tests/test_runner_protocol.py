"""One Runner protocol (backends/base.py): every runner, target, stepper, reference and wrapper has input_names,
output_names, run(feeds), close() and `with`; leaving a `with` block frees what the runner holds, also on an error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtforge.backends.base import Runner, RunnerLifecycle
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.backends.stored import RecordingReference, StoredReference
from trtforge.backends.tensorrt_runtime import TrtRunner
from trtforge.calibrate.engine_check import NamedOutputs, RunOnce
from trtforge.runtime.steppers import OrtStepper, TrtStepper
from trtforge.runtime.targets import OrtTarget, TrtTarget


@pytest.fixture
def double_onnx(tmp_path):
    """y = x + x on [batch, 4] float32."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    path = tmp_path / "double.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize(
    "cls", [OrtRunner, TrtRunner, OrtTarget, TrtTarget, OrtStepper, TrtStepper, NamedOutputs, RunOnce, RecordingReference, StoredReference]
)
def test_every_runner_shape_has_the_lifecycle(cls):
    """GPU-only classes cannot be built here: their class carries the whole protocol, closing included."""
    assert issubclass(cls, RunnerLifecycle)
    for method in ("run", "close", "__enter__", "__exit__"):
        assert callable(getattr(cls, method, None)), f"{cls.__name__} lacks {method}"
    assert cls.close is not RunnerLifecycle.close, f"{cls.__name__} frees nothing on close"


def test_onnx_runtime_runner_target_and_wrappers_close_what_they_hold(double_onnx):
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    with OrtRunner(double_onnx) as runner:
        assert isinstance(runner, Runner)
        np.testing.assert_array_equal(runner.run(feeds)["y"], feeds["x"] * 2)
    assert runner.session is None

    with OrtTarget(double_onnx, []) as target:
        assert isinstance(target, Runner) and target.run(feeds)["y"].shape == (2, 4)
    assert target.runner.session is None

    inner = OrtRunner(double_onnx)
    with pytest.raises(RuntimeError), RunOnce(NamedOutputs(inner, ["y"])) as once:
        assert isinstance(once, Runner)
        first = once.run(feeds)
        assert once.run(feeds) is first  # the same feeds answered from what it kept
        raise RuntimeError("a failing check inside the block")
    assert inner.session is None and not once._outputs  # closed on the error, the wrapped runner too


def test_stored_references_are_runners(double_onnx, tmp_path):
    feeds = {"x": np.ones((3, 4), np.float32)}
    inner = OrtRunner(double_onnx)
    with RecordingReference(inner, double_onnx, None) as recording:
        expected = recording.run(feeds)
        recording.save(tmp_path / "ref.npz")
    assert inner.session is None
    with StoredReference(tmp_path / "ref.npz") as stored:
        assert isinstance(stored, Runner)
        np.testing.assert_array_equal(stored.run(feeds)["y"], expected["y"])
    assert stored._npz.fid is None  # the npz file is closed
