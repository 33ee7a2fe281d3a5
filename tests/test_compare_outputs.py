"""benchmarks/compare_outputs.py: the GPU validation's proof that two merges wrote the same outputs must be able to fail."""

import subprocess
import sys

import numpy as np


def test_equal_files_pass_and_a_changed_element_or_key_fails(tmp_path):
    a = {"doc/h": np.arange(12, dtype=np.float32).reshape(4, 3), "doc/p": np.ones(3, np.float16)}
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "same.npz", **a)
    changed = dict(a, **{"doc/h": a["doc/h"].copy()})
    changed["doc/h"][2, 1] += 1e-3
    np.savez(tmp_path / "changed.npz", **changed)
    np.savez(tmp_path / "fewer.npz", **{"doc/h": a["doc/h"]})
    signed = dict(a, **{"doc/h": a["doc/h"].copy()})
    signed["doc/h"][0, 0] = -0.0  # equal in value to 0.0, not in bits
    np.savez(tmp_path / "signed.npz", **signed)
    script = "benchmarks/compare_outputs.py"

    def compare(other, *flags):
        return subprocess.run(
            [sys.executable, script, str(tmp_path / "a.npz"), str(tmp_path / other), *flags], capture_output=True, text=True
        )

    same = compare("same.npz", "--json", str(tmp_path / "r.json"))
    assert same.returncode == 0 and "EQUAL" in same.stdout and "0 not bit-equal" in same.stdout
    assert compare("changed.npz").returncode == 1
    assert compare("changed.npz", "--atol", "1e-2").returncode == 0
    assert compare("fewer.npz").returncode == 1
    bits = compare("signed.npz")
    assert bits.returncode == 0 and "1 not bit-equal" in bits.stdout
