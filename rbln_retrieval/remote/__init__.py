"""The remote client: the PoolingEngine API against `rbln-retrieval serve` replicas, sending prompted text over HTTP.

client.py (RemoteEngine), served_model.py (the served model's family, from the server's description, and the name
it is served under), replicas.py (HTTP spread over the healthy replicas, retried elsewhere with backoff). This
package's names are RemoteEngine and its errors, re-exported here.

May import: errors, models, text, results, engines
Engine libraries: none
"""

from rbln_retrieval.engines.protocol import DESCRIBE_PATH
from rbln_retrieval.remote.client import RemoteEngine
from rbln_retrieval.remote.replicas import RemoteAuthError, RemoteError

__all__ = ["DESCRIBE_PATH", "RemoteAuthError", "RemoteEngine", "RemoteError"]
