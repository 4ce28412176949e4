"""Pooled rows to what callers get: sparse weights and multi-vectors finished on the host, MaxSim,
long texts' windows combined, rankings, quantized vectors, and the precision each compute dtype promises.

outputs.py (the outputs besides dense vectors, and their MaxSim; ``normalized``, the one host-side
normalization), windows.py (a long text's window rows -> its vector or ChunkedEmbedding; a document's best window),
ranking.py (scores -> (index, score) pairs, best first, NaN last), quantize.py (int8/uint8/binary vectors),
precision.py (the bounds against float32), finite.py (NaN and infinities refused, naming the input). Shared by the
local engine, the remote client and the framework integrations, so all finish results the same way.

Which outputs a family gives and how its vectors compare are the family's spec's (models/specs/).

May import: models
Engine libraries: none
"""
