"""What framework objects (langchain-rbln, the LlamaIndex packages) are built on: one entry point that hands out
claims on shared local engines or remote clients, and the engine settings every framework object declares.

connect.py (get_engine; EngineHandle and its typed call options), settings.py (EngineSettings and the
EngineHolder lifecycle), attach.py, holder.py and rendezvous.py (one engine per model and options across a user's
processes: the holder process that runs it, and how the others find it and attach).

May import: models, text, engines, local, remote
Engine libraries: none
"""
