"""What paging in `run`'s merged outputs costs the host (issue 11: `run` wall <= 1.1x GPU). On the H200 box the
planning threads' `prepare_outputs` (allocate a document's merged output and write it once) summed 1.9-2.6 s over
BERT-base's 192 documents (1.85 GB of fp16 outputs) against 0.69 s of GPU, and starved the loop when 2 threads did
it. This times the same work outside `run`: N arrays of one document's size, allocated and written once, on 1, 2
and 8 threads, with numpy's transparent-huge-page advice on and off, and prints the kernel's THP settings. No GPU.

    python benchmarks/pagein.py --docs 192 --mb 9.6 --out pagein.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def _thp() -> dict[str, str]:
    out = {}
    for name in ("enabled", "defrag"):
        try:
            out[name] = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text().strip()
        except OSError as exc:
            out[name] = f"unreadable ({exc.__class__.__name__})"
    return out


def _madvise(on: bool) -> bool | None:
    """numpy's MADV_HUGEPAGE advice for large allocations (private API; None where this numpy lacks it)."""
    core = getattr(np, "_core", None) or np.core
    setter = getattr(core.multiarray, "_set_madvise_hugepage", None)
    return None if setter is None else setter(on)


def page_in(docs: int, nbytes: int, threads: int) -> float:
    """Seconds to allocate and write `docs` arrays of `nbytes` on `threads` threads; the arrays are kept until the end,
    as run keeps its merged outputs."""
    kept = []

    def one(_: int) -> None:
        a = np.empty(nbytes // 2, np.float16)
        a[...] = 0
        kept.append(a)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(docs)))
    seconds = time.perf_counter() - start
    del kept
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=192)
    ap.add_argument("--mb", type=float, default=9.6, help="one document's merged output (BERT-base docs32v: ~9.6 MB)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    nbytes = int(args.mb * 1e6)
    rows = []
    for advice in (True, False):
        before = _madvise(advice)
        for threads in args.threads:
            for r in range(args.repeat):
                s = page_in(args.docs, nbytes, threads)
                rows.append({"hugepage_advice": advice, "threads": threads, "repeat": r, "seconds": round(s, 4),
                             "gb_per_s": round(args.docs * nbytes / s / 1e9, 3)})
        if before is not None:
            _madvise(before)
    result = {"machine": platform.node(), "numpy": np.__version__, "thp": _thp(), "docs": args.docs, "mb": args.mb, "rows": rows}
    print(f"THP {result['thp']}  numpy {np.__version__}  {args.docs} x {args.mb} MB")
    print("| hugepage advice | threads | seconds | GB/s |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['hugepage_advice']} | {row['threads']} | {row['seconds']:.3f} | {row['gb_per_s']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
