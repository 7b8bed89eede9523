"""vLLM plugin (entry point `vllm.general_plugins`, pyproject.toml): registers FastEagle's cascade as a
draft model architecture. vLLM calls `register` in each of its processes, possibly more than once; it
imports nothing heavy (the model class is named, imported by vLLM when a checkpoint asks for it)."""

ARCHITECTURE = "FastEagleCascadeForCausalLMEagle3"  # vLLM keeps names ending in "Eagle3" for method eagle3


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, f"fasteagle.vllm_cascade:{ARCHITECTURE}")
