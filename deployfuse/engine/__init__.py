"""TensorRT engines from fused ONNX models, through Polygraphy's TensorRT loaders.

Works with TensorRT >= 10 and with TensorRT-RTX, which builds engines without a GPU for a
chosen compute capability (that is how the tests build real engines on a CPU machine).
"""

from deployfuse.engine.builders import BUILDERS
from deployfuse.engine.engine import PRECISIONS, BuildResult, build_engine
from deployfuse.engine.preflight import Offender, Preflight
from deployfuse.engine.profiles import EXPORT_SHAPES_KEY, ShapeProfile

__all__ = ["BUILDERS", "EXPORT_SHAPES_KEY", "PRECISIONS", "BuildResult", "Offender", "Preflight", "ShapeProfile", "build_engine"]
