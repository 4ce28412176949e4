"""Exceptions raised by rbln-retrieval; each message is one sentence naming the offending item.

May import: nothing
Engine libraries: none
"""


class RBLNRetrievalError(Exception):
    """Base class of this package's errors."""


class ModelNotSupportedError(RBLNRetrievalError, ValueError):
    """The model directory is missing, unreadable, or of an architecture we do not serve."""


class ModelNotFoundError(ModelNotSupportedError):
    """A Hugging Face model id could not be resolved: not cached while offline, unknown, a revision that does not
    exist, or gated without a token."""


class DeviceUnavailableError(RBLNRetrievalError, RuntimeError):
    """The requested device (or its runtime) is not present on this machine."""


class EngineStartError(RBLNRetrievalError, RuntimeError):
    """vLLM could not start an engine for the model."""


class EngineDeadError(RBLNRetrievalError, RuntimeError):
    """The engine (a failed step in process, or its dead engine process) failed the requests in flight; the next
    call starts a fresh engine."""


class EngineForkedError(RBLNRetrievalError, RuntimeError):
    """A local engine was used in a process forked after it started; its engine thread exists only in the
    parent. Shared engines (PoolingEngine.shared, get_engine, the framework classes) start a fresh one instead."""
