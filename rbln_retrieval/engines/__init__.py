"""What every engine, local or remote, shares: the RetrievalEngine contract, the options that select an engine,
the loop thread it runs on, and the process-wide shared engines.

protocol.py (RetrievalEngine; the route a server describes its model on), options.py (EngineOptions),
loop.py (EngineLoop: sync and async callers on one event-loop thread), shared.py (reference-counted claims on
process-wide engines: EngineSpec names the engine class, so the registry depends on no engine).

May import: errors, models, results, text
Engine libraries: none
"""
