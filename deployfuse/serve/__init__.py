"""Serving deployfuse artefacts with Triton Inference Server.

    from deployfuse.serve import package_triton          # a model repository (config.pbtxt, model, library)
    from deployfuse.serve.server import LocalServer      # PyTriton on loopback, the model run by deployfuse.InferenceSession
"""

from deployfuse.serve.repository import PackageResult, package_triton

__all__ = ["PackageResult", "package_triton"]
