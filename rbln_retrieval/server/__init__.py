"""`rbln-retrieval serve`: vLLM's own OpenAI-compatible server with the bundled backend, the family's presets, the
model's description route and an API key on every route.

serve.py (vLLM's serve arguments from the preset table the local engine uses; running the server), auth.py (the
API key on every route but the probes), quantized.py (quantized embeddings on the wire), limits.py (backpressure:
429 past the requests and tokens in flight, 413 past what one request may cost), cost.py (that cost, read from the
body before anything is tokenized), images.py (images in requests: data URLs decoded and checked, URLs not fetched).

May import: errors, quiet, models, text, engines, local, results, backend
Engine libraries: vllm
"""
