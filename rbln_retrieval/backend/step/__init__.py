"""Step shapes: what a step is padded to and which waiting prompts it takes.

The host kernels' token-count buckets (``buckets``), the static kernels' ``rows x width`` shapes and the layout of a
step's prompts in them (``rows``), and the packing of the waiting queue's front into a step's budget (``packing``).
Pure arithmetic over prompt lengths: the scheduler and the runner in ``engine_core`` apply it.

Stages it may import: nothing
"""
