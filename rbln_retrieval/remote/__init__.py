"""The remote client: the PoolingEngine API against `rbln-retrieval serve` replicas, sending prompted text (and an
image-text model's images) over HTTP.

client.py (RemoteEngine), image_calls.py (its images, sent as data URLs), calls.py (the client's loop and the calls
in flight on it), served_model.py (the served model's family, from every replica's description, and the name it is
served under), replicas.py (HTTP spread over the healthy replicas, retried elsewhere with backoff under one deadline
per call). This package's names are RemoteEngine and its errors, re-exported here.

May import: errors, models, text, results, engines
Engine libraries: none
"""

from rbln_retrieval.engines.protocol import DESCRIBE_PATH
from rbln_retrieval.remote.calls import RemoteClosedError
from rbln_retrieval.remote.client import RemoteEngine
from rbln_retrieval.remote.replicas import RemoteAuthError, RemoteError, UntrustedAnswerError
from rbln_retrieval.remote.served_model import ReplicaMismatchError

__all__ = [
    "DESCRIBE_PATH",
    "RemoteAuthError",
    "RemoteClosedError",
    "RemoteEngine",
    "RemoteError",
    "ReplicaMismatchError",
    "UntrustedAnswerError",
]
