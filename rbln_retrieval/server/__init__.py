"""`rbln-retrieval serve`: the package's own HTTP server over a PoolingEngine, speaking the OpenAI, TEI, Cohere v2 and
Jina dialects and the package's own routes, with an API key on every route.

serve.py (the server's setup and run: options after `--`, the engine, uvicorn, the watchdog), app.py (the one app:
the route table, the probes, the key, backpressure), routes.py (a route and how it is answered), served.py (the table
of served models), check.py (the check of every body, each dialect's error body), media.py (the one check of
images), engine_calls.py and the dialects' route modules (openai_routes, tei_routes, cohere_routes, rerank_routes,
own_routes), auth.py (the API key), limits.py (backpressure: 429, 413, 408), cost.py (a request's cost, read from
its body before anything is tokenized).

May import: errors, quiet, models, text, engines, local, results, backend
Engine libraries: vllm
"""
