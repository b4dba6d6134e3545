"""errors.py — the exceptions raised for a failed fd_status.

Each class derives from the built-in exception a Python caller expects
(ValueError, MemoryError, RuntimeError) and from FlashDecodeError, and
carries the C library's one-line message plus the status:

=================================  =======================  ======================
C status                           exception                also an instance of
=================================  =======================  ======================
FD_STATUS_INVALID_ARGUMENT         InvalidArgumentError     ValueError
FD_STATUS_UNSUPPORTED              UnsupportedError         ValueError
FD_STATUS_WORKSPACE_TOO_SMALL      WorkspaceTooSmallError   ValueError
FD_STATUS_OUT_OF_MEMORY            OutOfMemoryError         MemoryError
FD_STATUS_BACKEND_ERROR            BackendError             RuntimeError
=================================  =======================  ======================
"""

__all__ = [
    "FlashDecodeError", "InvalidArgumentError", "UnsupportedError", "WorkspaceTooSmallError",
    "OutOfMemoryError", "BackendError", "error_for_status",
]


class FlashDecodeError(Exception):
    """Base of the errors libflashdecode reports.

    Attributes
    ----------
    status : int
        The fd_status value (see flashdecode.h).
    status_name : str
        Its C name, e.g. ``'FD_STATUS_INVALID_ARGUMENT'``.
    c_message : str
        The library's message, naming the argument at fault and why.
    """

    def __init__(self, c_message, status, status_name):
        super().__init__("%s (%s)" % (c_message, status_name))
        self.c_message = c_message
        self.status = status
        self.status_name = status_name


class InvalidArgumentError(FlashDecodeError, ValueError):
    """FD_STATUS_INVALID_ARGUMENT: an argument is wrong (bad shape, out of range)."""


class UnsupportedError(FlashDecodeError, ValueError):
    """FD_STATUS_UNSUPPORTED: valid, but not supported by this backend or build."""


class WorkspaceTooSmallError(FlashDecodeError, ValueError):
    """FD_STATUS_WORKSPACE_TOO_SMALL: the workspace is smaller than the plan needs."""


class OutOfMemoryError(FlashDecodeError, MemoryError):
    """FD_STATUS_OUT_OF_MEMORY: an allocation inside the library failed."""


class BackendError(FlashDecodeError, RuntimeError):
    """FD_STATUS_BACKEND_ERROR: the CUDA runtime or the thread runtime failed."""


_BY_STATUS = {
    1: InvalidArgumentError,
    2: UnsupportedError,
    3: WorkspaceTooSmallError,
    4: OutOfMemoryError,
    5: BackendError,
}


def error_for_status(status, c_message, status_name):
    """The exception instance for a failed ``status`` (an unknown value: BackendError)."""
    return _BY_STATUS.get(int(status), BackendError)(c_message, int(status), status_name)
