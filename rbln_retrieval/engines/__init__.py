"""What every engine, local or remote, shares: the RetrievalEngine contract and its typed call options, the
options that select an engine, the loop thread it runs on, the process-wide shared engines, and the decisions made
the same way whatever pools the rows: how a query scores, and how a long text's windows are pooled.

protocol.py (RetrievalEngine; the route a server describes its model on), requests.py (the call options of
embed/score/rerank, typed once), options.py (EngineOptions), loop.py (EngineLoop: sync and async callers on one
event-loop thread), shared.py (reference-counted claims on process-wide engines: EngineSpec names the engine class,
so the registry depends on no engine), scoring.py (the scoring router over an engine's primitives), windows.py
(windows planned by text.chunks, pooled through the engine's call, combined by results.windows).

May import: errors, models, results, text
Engine libraries: none
"""
