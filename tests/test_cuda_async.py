"""cuda_async: GIL-holding driver calls and pinned staging (pure parts; the driver is faked)."""

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from trtforge.backends.cuda_async import AsyncCuda, adjacent_runs, load_driver, stack_into


def _lib(codes=None):
    codes = codes or {}
    seen = []

    def entry(name):
        def call(*args):
            seen.append((name, args))
            return codes.get(name, 0)

        return call

    lib = SimpleNamespace(seen=seen)
    for name in (
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2",
        "cuMemcpy2DAsync_v2",
        "cuEventRecord",
        "cuStreamWaitEvent",
        "cuGraphLaunch",
        "cuEventElapsedTime",
    ):
        setattr(lib, name, entry(name))

    def error_name(code, out):
        out._obj.value = b"CUDA_ERROR_INVALID_HANDLE"
        return 0

    lib.cuGetErrorName = error_name

    def get_current(out):
        out._obj.value = 0xC0
        return 0

    lib.cuCtxGetCurrent = get_current
    lib.cuCtxSetCurrent = entry("cuCtxSetCurrent")
    return lib


def test_every_driver_entry_gets_its_argument_types():
    from trtforge.backends.cuda_async import _SIGNATURES

    lib = load_driver(_lib())
    for name, argtypes in _SIGNATURES.items():
        assert getattr(lib, name).argtypes == list(argtypes) and getattr(lib, name).restype is ctypes.c_int, name
    # the driver API's prototypes: CUdeviceptr is 64-bit, handles are pointers, flags an unsigned int
    assert _SIGNATURES["cuMemcpyHtoDAsync_v2"] == (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    assert _SIGNATURES["cuStreamWaitEvent"] == (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
    assert _SIGNATURES["cuEventElapsedTime"][0] == ctypes.POINTER(ctypes.c_float)


def test_calls_pass_handles_through_and_errors_name_the_call():
    cuda = AsyncCuda(_lib())
    cuda.copy_to_device(1, 2, 3, 4)
    cuda.wait(5, 6)
    assert cuda.lib.seen == [("cuMemcpyHtoDAsync_v2", (1, 2, 3, 4)), ("cuStreamWaitEvent", (5, 6, 0))]
    failing = AsyncCuda(_lib({"cuGraphLaunch": 400}))
    with pytest.raises(RuntimeError, match=r"cuGraphLaunch failed: CUDA error 400 \(CUDA_ERROR_INVALID_HANDLE\)"):
        failing.launch(7, 8)


def test_a_2d_copy_passes_cuda_h_s_struct():
    """cuMemcpy2DAsync_v2 reads a CUDA_MEMCPY2D: its x86-64 layout (cuda.h: size_t, size_t, enum, pointers, ...; 128 bytes)
    and a device-to-host copy of rows `pitch` apart into page-locked rows `host_pitch` apart."""
    from trtforge.backends.cuda_async import Memcpy2D

    offsets = {name: getattr(Memcpy2D, name).offset for name, _ in Memcpy2D._fields_}
    assert ctypes.sizeof(Memcpy2D) == 128
    assert [
        offsets[n]
        for n in ("srcMemoryType", "srcHost", "srcDevice", "srcPitch", "dstMemoryType", "dstHost", "dstPitch", "WidthInBytes", "Height")
    ] == [16, 24, 32, 48, 72, 80, 104, 112, 120]
    cuda = AsyncCuda(_lib())
    cuda.copy_2d_to_host(0x1000, 896, 0x2000, 1024, 896, 15, 9)
    ((name, (pointer, stream)),) = cuda.lib.seen
    copy = pointer._obj
    assert name == "cuMemcpy2DAsync_v2" and stream == 9
    assert (copy.srcMemoryType, copy.srcDevice, copy.srcPitch, copy.srcXInBytes, copy.srcY) == (2, 0x2000, 1024, 0, 0)
    assert (copy.dstMemoryType, copy.dstHost, copy.dstPitch, copy.WidthInBytes, copy.Height) == (1, 0x1000, 896, 896, 15)


def test_the_cuda_python_fallback_passes_a_2d_copys_pitches_in_cudas_order():
    """cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream): host first (its pitch), device second."""
    from trtforge.backends.cuda_async import CudaPythonCalls

    seen = []
    cudart = SimpleNamespace(
        cudaMemcpyKind=SimpleNamespace(cudaMemcpyDeviceToHost=2), cudaMemcpy2DAsync=lambda *args: (seen.append(args), (0,))[1]
    )
    CudaPythonCalls(cudart, lambda result: None).copy_2d_to_host(0x1000, 896, 0x2000, 1024, 896, 15, 9)
    assert seen == [(0x1000, 896, 0x2000, 1024, 896, 15, 2, 9)]


@pytest.mark.parametrize("case", ["parts", "array", "cast", "strided", "other_rows"])
def test_stack_into_equals_numpy(case, monkeypatch):
    import trtforge.backends.cuda_async as cuda_async

    moves = []
    real = cuda_async.memmove_holding_gil
    monkeypatch.setattr(cuda_async, "memmove_holding_gil", lambda dst, src, n: (moves.append(n), real(dst, src, n))[1])
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 30000, size=(n, 5)) for n in (1, 3, 2)]
    if case == "parts":
        value, expected = parts, np.concatenate(parts)
    elif case == "array":
        value = expected = parts[1]
    elif case == "cast":  # int32 parts into an int64 view: numpy's cast, not a byte copy
        value = [p.astype(np.int32) for p in parts]
        expected = np.concatenate(parts)
    elif case == "strided":
        value = [p[:, ::-1] for p in parts]
        expected = np.concatenate(value)
    else:  # equal bytes, other row shape: refused like np.concatenate would
        value = [rng.integers(0, 9, size=(6, 5)).reshape(5, 6)]
        view = np.zeros((6, 5), np.int64)
        with pytest.raises(ValueError):
            stack_into(view, value)
        return
    view = np.zeros(expected.shape, np.int64)
    stack_into(view, value)
    assert np.array_equal(view, expected)
    # the GIL-holding memmove for C-contiguous parts of the view's type, numpy's copy (cast, strides) otherwise
    assert sum(moves) == (view.nbytes if case in ("parts", "array") else 0)


def test_adjacent_parts_are_joined_into_one_copy(monkeypatch):
    """Rows of one block (a document's consecutive windows) are staged with one memmove; a gap or a part out of
    order starts a new one, and the result still equals numpy's concatenation."""
    import trtforge.backends.cuda_async as cuda_async

    assert adjacent_runs([(100, 8), (108, 8), (116, 4), (200, 8), (208, 8), (100, 8)]) == [(100, 20), (200, 16), (100, 8)]
    assert adjacent_runs([]) == []
    moves = []
    real = cuda_async.memmove_holding_gil
    monkeypatch.setattr(cuda_async, "memmove_holding_gil", lambda dst, src, n: (moves.append(n), real(dst, src, n))[1])
    block, other = np.arange(40).reshape(8, 5), np.arange(100, 110).reshape(2, 5)
    value = [block[0:1], block[1:2], block[2:3], other[0:1], block[5:6], block[6:7], block[3:4]]
    view = np.zeros((7, 5), np.int64)
    stack_into(view, value)
    assert np.array_equal(view, np.concatenate(value))
    assert moves == [3 * 40, 40, 2 * 40, 40]


def test_a_thread_without_a_context_gets_the_runners_one_and_the_call_is_retried():
    import threading

    lib = _lib()
    current = threading.local()
    calls = []

    def record(event, stream):
        calls.append(threading.current_thread().name)
        return 0 if getattr(current, "ctx", None) == 0xC0 else 201  # CUDA_ERROR_INVALID_CONTEXT

    def set_current(ctx):
        current.ctx = ctx
        return 0

    lib.cuEventRecord, lib.cuCtxSetCurrent = record, set_current
    current.ctx = 0xC0  # the runner's thread
    cuda = AsyncCuda(lib)
    cuda.record(1, 2)
    worker = threading.Thread(target=cuda.record, args=(1, 2), name="collector")
    worker.start()
    worker.join()
    assert calls == ["MainThread", "collector", "collector"]  # refused once, then retried with the context set
    lib.cuCtxSetCurrent = lambda ctx: 0  # a context that does not take: the error reaches the caller
    failures = []
    worker = threading.Thread(target=lambda: failures.append(pytest.raises(RuntimeError, cuda.record, 1, 2)), name="other")
    worker.start()
    worker.join()
    assert failures and "cuEventRecord failed: CUDA error 201" in str(failures[0].value)
