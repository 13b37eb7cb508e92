"""TensorRT engines from fused ONNX models, through Polygraphy's TensorRT loaders.

Works with TensorRT >= 10 and with TensorRT-RTX, which builds engines without a GPU for a
chosen compute capability (that is how the tests build real engines on a CPU machine).
"""

from deployfuse.build.builders import BUILDERS
from deployfuse.build.engine import PRECISIONS, BuildResult, build_engine
from deployfuse.build.preflight import Offender, Preflight
from deployfuse.build.profiles import EXPORT_SHAPES_KEY, ShapeProfile

__all__ = ["BUILDERS", "EXPORT_SHAPES_KEY", "PRECISIONS", "BuildResult", "Offender", "Preflight", "ShapeProfile", "build_engine"]
