"""The pages' ```python blocks tagged `<!-- snippet: ray -->`, on this module's local Ray cluster
(tests/project/test_docs.py runs the other blocks): a file of their own, so that they share the worker of the other
files on a Ray cluster (tests/workers.py: no two local clusters at once) while the rest of the pages' blocks run on the
other worker."""

from __future__ import annotations

import pytest
from servers import free_port
from snippets import Snippet, docs_hub, params, run

__all__ = ["docs_hub"]  # a fixture this module's tests use

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("snippet", params({"ray"}))
def test_snippet_runs_on_ray(snippet: Snippet, docs_hub, request):
    request.getfixturevalue("ray_cluster")  # after docs_hub: the cluster's processes inherit its HF_HUB_CACHE
    try:
        run(snippet, snippet.code.replace("8000", str(free_port())))
    finally:
        if "serve." in snippet.code:
            from ray import serve

            serve.shutdown()
