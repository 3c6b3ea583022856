"""tern.Error: every failure of the native library, with its code.

The codes are tern's error-code registry (include/tern/status.h, the C
API's tern_code): stable numbers, so a caller can branch on `e.code` (or
compare with the Code enum) instead of parsing text.
"""
import enum


class Code(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    CORRUPT = 2
    NOT_FOUND = 3
    ALREADY_EXISTS = 4
    IO = 5
    MISMATCH = 6
    UNSUPPORTED = 7
    OUT_OF_RANGE = 8
    RESOURCE_EXHAUSTED = 9
    UNAVAILABLE = 10
    TIMEOUT = 11
    CANCELLED = 12
    INTERNAL = 13
    PROTOCOL = 14
    AUTH = 15


class Error(Exception):
    """A tern call failed. `code` is the registry number (a Code when this
    module knows it), `code_name` its stable name ("timeout"), `message` the
    library's text ("<code name>: <file:line>: <what>")."""

    def __init__(self, code, code_name, message):
        super().__init__(message or code_name)
        try:
            self.code = Code(code)
        except ValueError:
            self.code = code
        self.code_name = code_name
        self.message = message

    def __reduce__(self):  # picklable, e.g. across multiprocessing
        return (type(self), (int(self.code), self.code_name, self.message))
