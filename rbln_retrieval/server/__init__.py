"""`rbln-retrieval serve`: vLLM's own OpenAI-compatible server with the bundled backend, the family's presets, the
model's description route and an API key on every route.

serve.py (vLLM's serve arguments from the preset table the local engine uses; running the server), auth.py (the
API key on every route but the probes), quantized.py (quantized embeddings on the wire).

May import: errors, quiet, models, engines, local, results, backend
Engine libraries: vllm
"""
