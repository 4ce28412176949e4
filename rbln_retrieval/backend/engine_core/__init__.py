"""What vLLM's engine-core process runs for the bundled backend: the packing scheduler (``scheduler``), the worker
(``worker``) and its model runner (``model_runner``: packed, bucket-padded, compiled steps), and the warmup that
compiles every bucket before serving (``warmup``). vLLM loads the scheduler and worker by the names
``config.engine_overrides`` gives it; nothing in the package imports this stage.

Stages it may import: step, graph, npu, config, vllm_compat
"""
