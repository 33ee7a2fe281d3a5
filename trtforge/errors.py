"""The two kinds of failure a user sees, and their exit codes.

UserError (exit 2): the input is wrong (file, tensor, config key); its message is one sentence that
says what and what to do. GateFailed (exit 1): everything ran, but a measured figure missed its gate.
"""


class TrtforgeError(Exception):
    exit_code = 2


class UserError(TrtforgeError):
    """Bad input: a file, tensor, config key or option the user can fix. Exit code 2."""

    exit_code = 2


class GateFailed(TrtforgeError):
    """A check ran and failed its threshold (accuracy or latency). Exit code 1."""

    exit_code = 1
