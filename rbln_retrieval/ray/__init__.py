"""rbln-retrieval on Ray (the ``rbln-retrieval[ray]`` extra): bulk embedding and pair scoring with Ray Data, and
vLLM's OpenAI-compatible server as a Ray Serve deployment. The rest of the package never imports Ray."""

from rbln_retrieval.ray.data import BatchFailedError, embed_dataset, score_dataset
from rbln_retrieval.ray.resources import engine_resources

__all__ = ["BatchFailedError", "embed_dataset", "engine_resources", "score_dataset"]
