"""The kinds of failure a user sees, and their exit codes.

Exit codes of every command:
  0  success.
  1  GateFailed: everything ran, but a measured figure missed its gate.
  2  UserError: the input is wrong (file, tensor, config key, option value, command-line usage); its message is
     one sentence that says what and what to do.
  3  INTERNAL_ERROR: an unexpected exception (a bug in trtforge or a library under it); the command prints one line
     naming the step and the exception, and writes the full traceback to a log file whose path it prints.
  130  interrupted (Ctrl-C).
"""

import re

INTERNAL_ERROR = 3
INTERRUPTED = 130


class TrtforgeError(Exception):
    exit_code = 2

    def __init__(self, *args: object, detail: str | None = None):
        super().__init__(*args)
        # Long text behind the one-sentence message (what a native library printed): written to a log file.
        self.detail = detail


class UserError(TrtforgeError):
    """Bad input: a file, tensor, config key or option the user can fix. Exit code 2."""

    exit_code = 2


class GateFailed(TrtforgeError):
    """A check ran and failed its threshold (accuracy or latency). Exit code 1."""

    exit_code = 1


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[@-Z\\-_]")
_BOILERPLATE = (
    "For more information",  # torch.export / dynamo: "run with TORCH_LOGS=..." hints
    "Set TORCH_LOGS",
    "To execute this test, run",
    "from user code:",
)
# Where torch's FX interpreter starts appending the failing node and the traced code to the reason.
_TRACE_MARKERS = ("While executing %", "Original traceback:", "Use tlparse")


def strip_ansi(text: str) -> str:
    """Remove terminal colour/cursor escapes: torch colours its messages and they garble logs and JSON."""
    return _ANSI_ESCAPE.sub("", text)


def root_cause(exc: BaseException) -> BaseException:
    """The last exception of the chain (`raise ... from`, or raised while handling another): wrappers such
    as torch.onnx's 'Failed to export the model with torch.export' put the actual reason there."""
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def exception_summary(exc: BaseException, limit: int = 600) -> str:
    """'Type: message' of the root cause on one line, ANSI-free, keeping its END when too long: torch puts
    a long preamble (the traced code, the export step) first and the reason last; what torch's FX interpreter
    appends after the reason (the failing node, the traced code) is dropped."""
    cause = root_cause(exc)
    message = strip_ansi(str(cause))
    cut = min((i for i in (message.find(m) for m in _TRACE_MARKERS) if i > 0), default=len(message))
    lines = [line.strip() for line in message[:cut].splitlines()]
    lines = [line for line in lines if line and not line.startswith(_BOILERPLATE)]
    text = " ".join(" ".join(lines).split())
    if len(text) > limit:
        tail = text[-limit:]
        text = "... " + tail[tail.find(" ") + 1 :] if " " in tail[:80] else "... " + tail
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__
