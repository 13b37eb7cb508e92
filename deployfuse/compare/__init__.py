"""`deployfuse compare`: accuracy and latency of an artefact against PyTorch, across backends.

    from deployfuse.compare import compare
    result = compare("model.pt2", "model.onnx", backends=["torch", "ort-cpu"], json_path="cmp.json")
    print(result.table()); assert result.passed

Runners (PyTorch, ONNX Runtime CPU/CUDA, TensorRT) are Polygraphy runners driven by its
`Comparator`; statistics, tolerances, latency, localisation and the report live beside them.
"""

from deployfuse.compare.accuracy import OutputStats
from deployfuse.compare.driver import BACKENDS, compare
from deployfuse.compare.latency import LatencyStats
from deployfuse.compare.localize import Divergence, Localization
from deployfuse.compare.result import BackendAccuracy, CompareResult
from deployfuse.compare.tolerances import Tolerances

__all__ = ["BACKENDS", "BackendAccuracy", "CompareResult", "Divergence", "LatencyStats", "Localization", "OutputStats", "Tolerances", "compare"]
