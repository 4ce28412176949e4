"""The bundled vLLM platform plugin (entry point group ``vllm.platform_plugins``)."""


def register() -> str | None:
    """vLLM calls this in every process; the plugin activates only when an engine asks for it."""
    return None
