"""hybridsim: vLLM v1 serving of hybrid Mamba + attention models under KV-cache pressure."""

__version__ = "0.1.0"
