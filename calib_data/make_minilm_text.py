"""Extract English prose from CPython standard-library docstrings (PSF licence) for calibration data."""

import importlib
import inspect
import json
import random
import re
import sys
import warnings

warnings.simplefilter("ignore")
CAL_MODS = [
    "argparse",
    "collections",
    "json",
    "logging",
    "pathlib",
    "subprocess",
    "threading",
    "asyncio",
    "email",
    "http.client",
    "urllib.request",
    "unittest",
    "typing",
    "datetime",
    "decimal",
    "fractions",
    "statistics",
    "random",
    "itertools",
    "functools",
    "contextlib",
    "dataclasses",
    "enum",
    "inspect",
    "pickle",
    "shutil",
    "tarfile",
    "zipfile",
    "csv",
    "sqlite3",
    "xml.etree.ElementTree",
    "socket",
    "ssl",
    "select",
    "selectors",
    "heapq",
    "bisect",
    "textwrap",
    "string",
    "re",
    "codecs",
    "io",
    "os",
    "tempfile",
    "glob",
    "fnmatch",
    "gettext",
    "locale",
    "calendar",
    "difflib",
    "pprint",
    "traceback",
    "warnings",
    "weakref",
    "copy",
    "abc",
    "numbers",
    "math",
    "cmath",
    "operator",
    "queue",
    "sched",
    "signal",
    "mmap",
    "ftplib",
    "smtplib",
    "imaplib",
    "poplib",
    "mailbox",
    "mimetypes",
    "base64",
    "binascii",
    "hashlib",
    "hmac",
    "secrets",
    "uuid",
    "ipaddress",
    "webbrowser",
    "wsgiref.simple_server",
    "xmlrpc.client",
    "html.parser",
    "configparser",
    "netrc",
    "plistlib",
    "shelve",
    "dbm",
    "gzip",
    "bz2",
    "lzma",
    "zlib",
    "struct",
    "array",
    "types",
    "pdb",
    "timeit",
    "trace",
    "tracemalloc",
    "gc",
    "importlib",
    "runpy",
    "ast",
    "dis",
    "tokenize",
    "pydoc",
    "doctest",
    "optparse",
    "getopt",
    "shlex",
    "cmd",
    "platform",
    "sysconfig",
    "site",
    "zipimport",
    "concurrent.futures",
    "multiprocessing",
    "graphlib",
    "contextvars",
    "codeop",
    "code",
    "stat",
    "filecmp",
    "fileinput",
    "linecache",
    "reprlib",
    "colorsys",
    "wave",
    "chunk",
    "turtle",
    "curses",
]


def paragraphs(mod):
    out = []
    objs = [mod] + [
        v
        for k, v in vars(mod).items()
        if not k.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v)) and getattr(v, "__module__", "") == mod.__name__
    ]
    for cls in list(objs):
        if inspect.isclass(cls):
            objs += [m for n, m in vars(cls).items() if not n.startswith("_") and inspect.isfunction(m)]
    for o in objs:
        doc = inspect.getdoc(o) or ""
        for p in re.split(r"\n\s*\n", doc):
            p = " ".join(p.split())
            words = p.split()
            if 12 <= len(words) <= 150 and sum(c.isalpha() for c in p) / max(len(p), 1) > 0.7 and not p.startswith((">>>", "-", "*", "|")):
                out.append(p)
    return out


docs = {}
for name in CAL_MODS:
    try:
        mod = importlib.import_module(name)
    except Exception:
        continue
    ps = list(dict.fromkeys(paragraphs(mod)))
    if ps:
        docs[name] = ps
names = sorted(docs)
rng = random.Random(0)
rng.shuffle(names)
# Long documents: whole modules' prose, from modules kept out of calibration and evaluation.
words = {n: sum(len(p.split()) for p in docs[n]) for n in names}
print("total words", sum(words.values()), file=sys.stderr)
groups, current = [], []
for n in sorted(names, key=lambda n: -words[n]):
    if len(groups) == 6:
        break
    current.append(n)
    if sum(words[m] for m in current) >= 4000:
        groups.append(current)
        current = []
long_names = [n for g in groups for n in g]
rest = [n for n in names if n not in long_names]
eval_names = rest[: len(rest) // 3]
cal_names = rest[len(rest) // 3 :]
cal = [p for n in cal_names for p in docs[n]]
ev = [p for n in eval_names for p in docs[n]]
rng.shuffle(cal)
rng.shuffle(ev)
print(len(cal), len(ev), [(g, sum(words[n] for n in g)) for g in groups], file=sys.stderr)


def dump(path, items):
    with open(path, "w") as f:
        for t in items:
            f.write(json.dumps({"text": t}) + "\n")


dump("calib_data/minilm/stdlib_docs.jsonl", cal[:320])
dump("calib_data/minilm_eval/stdlib_docs.jsonl", ev[:160])


def joined(paragraphs, count, seed):
    """Longer samples (about 80-400 words) by joining consecutive paragraphs: activations at the lengths
    the longer profiles run, so the scales are not fitted to short sentences only."""
    r = random.Random(seed)
    out, i = [], 0
    while len(out) < count and i < len(paragraphs):
        target, words, parts = r.randint(80, 400), 0, []
        while words < target and i < len(paragraphs):
            parts.append(paragraphs[i])
            words += len(paragraphs[i].split())
            i += 1
        out.append(" ".join(parts))
    return out


dump("calib_data/minilm/stdlib_docs_long.jsonl", joined(cal[320:], 64, 1))
dump("calib_data/minilm_eval/stdlib_docs_long.jsonl", joined(ev[160:], 40, 2))
for g in groups:
    with open(f"calib_data/minilm_long/{'_'.join(n.replace('.', '_') for n in g)}.txt", "w") as f:
        f.write("\n\n".join(p for n in g for p in docs[n]) + "\n")
