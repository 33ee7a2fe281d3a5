"""Ctrl-C at every moment of a build: SIGINT sent to `trtforge build` after each of DELAYS seconds; prints, per delay,
the exit code, the seconds the process lived, its last stderr line and the files left under the output's name, and
writes JSON. The contract (tests/test_bad_input.py, trtforge/interrupts.py): exit 130 and nothing written under the
final names, or, when the signal comes after the command finished, its own exit code and its complete outputs.
Needs a cleaned ONNX (e.g. `trtforge export --model minilm -o out/minilm.onnx && trtforge clean out/minilm.onnx`).

    python benchmarks/sigint_sweep.py out/minilm.clean.onnx --out sweep.json [--delays 1 2 3 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("onnx", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--delays", type=float, nargs="+", default=[1, 2, 3, 3.5, 4, 5, 6, 6.5, 7, 7.5, 8, 9])
    args = ap.parse_args()
    env = dict(os.environ, CI="true", PYTHONPATH=str(ROOT))
    rows = []
    for delay in args.delays:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "m.engine"
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "trtforge", "build", str(args.onnx.resolve()), "--precision", "fp16",
                                     "--tiers", "128,512", "-o", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=900)
            lines = [line for line in err.strip().splitlines() if line.strip()]
            rows.append({"delay_s": delay, "rc": proc.returncode, "lived_s": round(time.perf_counter() - start, 2),
                         "last_stderr": lines[-1][:160] if lines else "",
                         "left": sorted(p.name for p in Path(tmp).iterdir() if not p.name.endswith(".lock"))})
    print(f"{'delay s':>7} {'rc':>4} {'lived s':>7}  files left / last stderr line")
    for r in rows:
        print(f"{r['delay_s']:>7g} {r['rc']:>4} {r['lived_s']:>7g}  {', '.join(r['left']) or '-'} / {r['last_stderr']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp_out.write_text(json.dumps({"onnx": str(args.onnx), "rows": rows}, indent=1))
    os.replace(tmp_out, args.out)


if __name__ == "__main__":
    main()
