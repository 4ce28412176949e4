"""The RBLN NPU runtime: the single boundary to the RBLN SDK (``rbln_runtime``, with the ahead-of-time ATOM route in
``rbln_aot``) and the compile cache's manifest and pins (``artifacts``). Imported on hosts without the SDK: rebel
only inside functions.

Stages it may import: nothing
"""
