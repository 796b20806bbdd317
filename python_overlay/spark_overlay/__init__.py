"""spark-kit's vLLM overlay.

A vLLM general plugin (entry point group ``vllm.general_plugins``, target
``spark_overlay.plugin:register``). spark-kit materialises this package plus a
``spark_overlay-<version>.dist-info`` carrying that entry point into a
versioned directory on ``PYTHONPATH``, so every vLLM process (API server,
EngineCore, workers) finds and calls :func:`spark_overlay.plugin.register`.

Importing this package is cheap and has no side effects: it does not import
vLLM or torch.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
