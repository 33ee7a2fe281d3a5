"""Plugin libraries (libtrtforge_plugins.so: TrtforgeFlashAttention): where cuDNN is looked for, what a build records
and what a run needs again, and the one-sentence errors for a library that is missing or cannot load."""

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_user_error, run_cli

from trtforge.backends import plugin_libraries as trt_backend
from trtforge.backends.plugin_libraries import CUDNN_LIB_ENV, cudnn_lib_dirs, load_engine_plugin_libraries, load_plugin_libraries
from trtforge.backends.tensorrt import TrtModule
from trtforge.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def _cudnn_dir(root: Path) -> Path:
    d = root / "nvidia" / "cudnn" / "lib"
    d.mkdir(parents=True)
    (d / "libcudnn.so.9").write_bytes(b"")
    return d


def test_cudnn_is_looked_for_in_the_env_first_then_the_wheels_layout(tmp_path):
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    (env_dir / "libcudnn.so.9").write_bytes(b"")
    site_a, site_b = tmp_path / "a", tmp_path / "b"
    wheel_b = _cudnn_dir(site_b)
    site_a.mkdir()  # no cuDNN here: skipped
    assert cudnn_lib_dirs({CUDNN_LIB_ENV: str(env_dir)}, [str(site_a), str(site_b)]) == [env_dir, wheel_b]
    assert cudnn_lib_dirs({}, [str(site_a), str(site_b), ""]) == [wheel_b]
    assert cudnn_lib_dirs({CUDNN_LIB_ENV: str(tmp_path / "nothing")}, [str(site_a)]) == []


def test_a_missing_plugin_library_is_one_clear_sentence(tmp_path):
    mod = TrtModule(trt=None, flavour="tensorrt", version="8.6.0")
    with pytest.raises(UserError, match=r"plugin library .*missing\.so does not exist.*build\.plugin_libraries"):
        load_plugin_libraries(mod, [str(tmp_path / "missing.so")])


def test_tensorrt_rtx_refuses_a_plugin_library(tmp_path):
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"")
    with pytest.raises(UserError, match="does not load plugins"):
        load_plugin_libraries(TrtModule(trt=None, flavour="tensorrt_rtx", version="1.7.0"), [str(lib)])


def test_an_unloadable_library_names_the_file_and_where_cudnn_came_from(tmp_path, monkeypatch):
    """A file that is not a shared library (or whose cuDNN is absent) fails with the loader's words and a hint."""
    lib = tmp_path / "libbroken.so"
    lib.write_bytes(b"not an ELF file")
    monkeypatch.setattr(trt_backend, "init_plugins", lambda mod: None)
    monkeypatch.setenv(CUDNN_LIB_ENV, str(tmp_path / "none"))
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(UserError, match=rf"cannot load plugin library {lib}.*no cuDNN 9 found.*{CUDNN_LIB_ENV}"):
        load_plugin_libraries(TrtModule(trt=None, flavour="tensorrt", version="8.6.0"), [str(lib)])


def test_a_loaded_library_is_recorded_with_its_hash_and_loaded_once(tmp_path, monkeypatch):
    """A real shared library (compiled here) is loaded globally, once per process, and recorded as {path, sha256}."""
    src = tmp_path / "p.c"
    src.write_text("int trtforge_test_symbol(void) { return 42; }\n")
    lib = tmp_path / "libp.so"
    if subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True).returncode:
        pytest.skip("no C compiler")
    calls = []
    monkeypatch.setattr(trt_backend, "init_plugins", lambda mod: calls.append(mod))
    monkeypatch.setattr(trt_backend, "_preload_cudnn", lambda: None)
    mod = TrtModule(trt=None, flavour="tensorrt", version="8.6.0")
    first = load_plugin_libraries(mod, [str(lib)])
    again = load_plugin_libraries(mod, [str(lib)])
    assert first == again and first[0]["path"] == str(lib.resolve()) and len(first[0]["sha256"]) == 64
    assert len(calls) == 1  # the second call found it loaded
    assert first[0] in trt_backend.loaded_plugin_libraries()  # what the next build's sidecar records, whoever loaded it
    assert ctypes.CDLL(None).trtforge_test_symbol() == 42  # RTLD_GLOBAL: its symbols are visible process-wide


def test_an_engine_whose_plugin_library_is_gone_says_how_to_fix_it(tmp_path):
    mod = TrtModule(trt=None, flavour="tensorrt", version="8.6.0")
    side = {"plugin_libraries": [{"path": str(tmp_path / "gone.so"), "sha256": "0" * 64}]}
    with pytest.raises(UserError, match=r"engine m\.engine holds plugin layers from .*gone\.so.*--plugin-library"):
        load_engine_plugin_libraries(mod, side, "m.engine")
    assert load_engine_plugin_libraries(mod, {}, "m.engine") == []
    assert load_engine_plugin_libraries(mod, {"plugin_libraries": None}, "m.engine") == []


def test_cli_build_with_a_missing_plugin_library_exits_2(tmp_path):
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(b"")
    proc = run_cli("build", str(onnx_path), "--precision", "fp16", "--plugin-library", str(tmp_path / "nope.so"))
    assert_user_error(proc, "nope.so does not exist")


def test_the_plugin_source_and_its_build_script_agree_with_the_pass():
    """The C++ plugin's name, version and fields are the ones the attention pass writes (a rename on one side only
    would build engines whose plugin nodes resolve to nothing)."""
    from trtforge.fusion.plugins import FLASH_PLUGIN, FLASH_VERSION

    src = (ROOT / "trtforge" / "native" / "sdpa_plugin.cpp").read_text()
    assert f'kPluginName = "{FLASH_PLUGIN}"' in src and f'kPluginVersion = "{FLASH_VERSION}"' in src
    for field in ("hidden_size", "num_heads", "scale", "causal"):
        assert f'PluginField("{field}"' in src
    assert "sdpa_plugin.cpp" in (ROOT / "trtforge" / "native" / "build.sh").read_text()
    from trtforge.fusion.gelu import GEMM_PLUGIN, GEMM_VERSION

    src = (ROOT / "trtforge" / "native" / "gemm_plugin.cpp").read_text()
    assert f'kPluginName = "{GEMM_PLUGIN}"' in src and f'kPluginVersion = "{GEMM_VERSION}"' in src
    for field in ("weight", "bias", "k", "n"):  # the attributes fusion.gelu writes on the node
        assert f'PluginField("{field}"' in src
    from trtforge.fusion.gemm import PLUGIN as GEMM_ONLY
    from trtforge.fusion.gemm import PLUGIN_VERSION as GEMM_ONLY_VERSION

    assert f'kGemmPluginName = "{GEMM_ONLY}"' in src and GEMM_ONLY_VERSION == GEMM_VERSION  # one kPluginVersion for both
    assert "REGISTER_TENSORRT_PLUGIN(GemmPluginCreator)" in src and "REGISTER_TENSORRT_PLUGIN(GemmGeluPluginCreator)" in src
    assert "gemm_plugin.cpp" in (ROOT / "trtforge" / "native" / "build.sh").read_text()


def test_stateful_run_refuses_a_plugin_library_override(tmp_path):
    proc = run_cli("run", str(tmp_path / "m.engine"), "--stateful", "--plugin-library", str(tmp_path / "x.so"))
    assert_user_error(proc, "--plugin-library does not combine with --stateful")
