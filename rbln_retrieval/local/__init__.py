"""The local engine: token ids through vLLM's pooling engine (with the bundled backend) to pooled rows.

engine.py (PoolingEngine: embed, score, rerank, sync and async), vllm_calls.py (starting vLLM for a model,
submitting token prompts and collecting rows in order), inproc.py (vLLM's V1 engine run inside this process),
engine_args.py (a family's preset and the options as vLLM engine arguments, shared with the server), device.py
(the NPU when present, else the CPU). vLLM itself is imported only when an engine starts, never with the package.

May import: errors, cpu_features, quiet, models, text, results, engines, backend
Engine libraries: vllm (deferred)
"""
