"""What describes a deployfuse op (`OpSpec`, `Attr`) and the reference math the ops share.

One `OpSpec` per op, defined in its own module under `deployfuse/ops/defs/`: the schema
(inputs, outputs, attributes with defaults), the math as a PyTorch reference, the builder of
its ONNX function body and of example inputs. `deployfuse.ops.specs` collects them.

Attributes that change the *shape of the math* (an activation name, `causal`, whether the
optional mask is present) are "variants": each combination gets its own function body,
selected through the ONNX node's `overload` field. Numeric attributes (`epsilon`, `axis`,
`num_groups`, `num_heads`, `scale`) reach the body as attribute references.

Inputs and outputs take the op's float type T (float32, float16 or bfloat16, the graph's type)
unless `OpSpec.input_types` fixes an input's element type (a float32 scale, a float8 weight).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx
import torch
import torch.nn.functional as F

from deployfuse.ops.body import MIN_OPSET

if TYPE_CHECKING:
    import numpy as np

    from deployfuse.ops.body import Body

DOMAIN = "deployfuse"
VERSION = 1

BodyFn = Callable[["Body", dict[str, Any]], str]
"""Writes one variant of an op's function body: (body, variant values) -> the output's name."""
RandFn = Callable[..., "np.ndarray"]
"""`rand(*dims, scale=1.0, shift=0.0)`: a random array of the requested dtype."""
ExampleFn = Callable[[Sequence[int], RandFn, dict[str, Any]], "list[np.ndarray | None]"]
"""Example inputs: (main shape, rand, attributes) -> one array (or None) per spec input."""


def case_flags(attrs: dict[str, Any]) -> set[str]:
    """The input flags an op case's attrs["mask"] names, comma-separated (SkipLayerNormFp8's "skip,ids", Fp8GemmAct's
    "no_bias"); none for a missing or boolean one (FusedMHA's True: a mask)."""
    mask = attrs.get("mask")
    return set(mask.split(",")) if isinstance(mask, str) and mask else set()


E4M3_MAX = 448.0
"""The largest finite float8e4m3fn value; conversions saturate to ±E4M3_MAX (QuantizeLinear's saturate=1)."""

FIXED_TYPES: dict[str, tuple[int, torch.dtype]] = {
    "float": (onnx.TensorProto.FLOAT, torch.float32),
    "float8e4m3fn": (onnx.TensorProto.FLOAT8E4M3FN, torch.float8_e4m3fn),
    "int64": (onnx.TensorProto.INT64, torch.int64),
}
"""The ONNX element types `OpSpec.input_types` may give an input (ONNX's names, as in its type
strings ``tensor(float8e4m3fn)``): name -> (TensorProto type, torch dtype)."""


def to_element_type(x: Any, name: str) -> Any:
    """`x` (a numpy array or scalar, or a torch tensor) in the fixed element type `name`: a float32
    array / tensor, float8e4m3fn saturated to ±E4M3_MAX and rounded to nearest even (what
    QuantizeLinear with a float8e4m3fn zero point writes; a plain cast would give NaN past 464), or
    int64 (floats truncated toward zero). Example inputs call it so that numpy and torch callers get
    the same types."""
    onnx_type, torch_type = FIXED_TYPES[name]
    indices = onnx_type == onnx.TensorProto.INT64  # SkipLayerNormFp8's Ids
    saturate = onnx_type == onnx.TensorProto.FLOAT8E4M3FN
    if isinstance(x, torch.Tensor):
        return x.long() if indices else (x.float().clamp(-E4M3_MAX, E4M3_MAX) if saturate else x.float()).to(torch_type)
    import numpy as np

    if indices:
        return np.asarray(x, dtype=np.int64)
    values = np.asarray(x, dtype=np.float32)
    return (np.clip(values, -E4M3_MAX, E4M3_MAX) if saturate else values).astype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))


@dataclass(frozen=True)
class Attr:
    """One node attribute.

    Attributes:
        kind: "int", "float" or "string".
        default: the value when the node omits it; None means the attribute is required.
        choices: the allowed values (strings, or ints such as a 0/1 flag).
        variant: True when the value selects a different function body (an overload).
    """

    kind: str
    default: Any = None
    choices: tuple[Any, ...] = ()
    variant: bool = False


@dataclass(frozen=True)
class OpSpec:
    """One custom op: schema, reference math, function body and example inputs.

    Attributes:
        name: the ONNX op type (also the TensorRT plugin name).
        inputs: input names in order; those in `optional` may be omitted (at the end, or named "" before a present one).
        outputs: output names.
        attrs: attribute name -> `Attr`.
        doc: the math, one paragraph.
        reference_fn: PyTorch reference `(tensors..., **attrs) -> Tensor`.
        body_fn: writes the ONNX function body of one variant (see `deployfuse.ops.body`).
        example_fn: random inputs for a main shape (see `deployfuse.ops.models.example_inputs`).
        users_only: True when no rewrite rule emits the op (only users, through its torch op).
        tf32: True when its CUDA kernels run fp32 in TF32 (as ONNX Runtime's MatMul does by
            default): GPU checks hold its fp32 results to the TF32 tolerance `TF32_TOLERANCE`.
        input_types: input name -> fixed ONNX element type (a key of `FIXED_TYPES`, e.g.
            ``{"XScale": "float", "W": "float8e4m3fn"}``); every other input and the outputs
            take T, the type of the first input. The native kernels check the fixed types
            (plugins/gen_op_specs.py writes them as ``kInputTypes``), `example_fn` returns them
            (`to_element_type`), the one-node models declare them.
        trt_plugin: False when the op has no TensorRT plugin (ONNX Runtime custom op only; the
            tensorrt target never receives it), so the plugin lists leave it out.
        min_opset: the lowest default-domain opset its function body is written for (e.g. 19
            for float8 types and Cast's saturate); `attach_functions` refuses older models.
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Attr]
    doc: str
    reference_fn: Callable[..., torch.Tensor]
    body_fn: BodyFn
    example_fn: ExampleFn
    optional: tuple[str, ...] = field(default=())
    users_only: bool = False
    tf32: bool = False
    input_types: dict[str, str] = field(default_factory=dict)
    trt_plugin: bool = True
    min_opset: int = MIN_OPSET
    domain: str = DOMAIN
    version: int = VERSION

    def __post_init__(self) -> None:
        for name, kind in self.input_types.items():
            if name not in self.inputs or name == self.inputs[0]:
                raise ValueError(f"{self.name}: input_types names {name!r}, not one of its inputs after the first {list(self.inputs[1:])}")
            if kind not in FIXED_TYPES:
                raise ValueError(f"{self.name}: input {name} has element type {kind!r}; fixed types: {sorted(FIXED_TYPES)}")

    def input_type(self, name: str) -> str:
        """The element type of input `name`: its fixed ONNX type name, or "T" (the op's float type)."""
        return self.input_types.get(name, "T")

    def node_attrs(self, node: onnx.NodeProto) -> dict[str, Any]:
        """A node of this op's attributes, decoded, with the defaults filled in (`resolve`)."""
        return self.resolve(**{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute})

    def resolve(self, **attrs: Any) -> dict[str, Any]:
        """All attributes with defaults filled in; raises ValueError naming a bad one."""
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise ValueError(f"{self.name}: unknown attribute(s) {sorted(unknown)}; known: {sorted(self.attrs)}")
        out: dict[str, Any] = {}
        for key, spec in self.attrs.items():
            value = attrs.get(key, spec.default)
            if value is None:
                raise ValueError(f"{self.name}: attribute {key!r} is required")
            if isinstance(value, bytes):
                value = value.decode()
            if spec.choices and value not in spec.choices:
                raise ValueError(f"{self.name}: {key}={value!r} is not one of {list(spec.choices)}")
            out[key] = value
        return out

    def reference(self, *tensors: torch.Tensor | None, **attrs: Any) -> torch.Tensor:
        """The PyTorch reference, computed in float32 (or float64 input) and returned in the
        dtype of the first input (fixed-type inputs, float8 included, reach it as float32)."""
        resolved = self.resolve(**attrs)
        first = tensors[0]
        if first is None:
            raise ValueError(f"{self.name}: input {self.inputs[0]} is required")
        wide = [None if t is None else (t if t.dtype == torch.float64 else t.float()) for t in tensors]
        return self.reference_fn(*wide, **resolved).to(first.dtype)

    def variant_key(self, attrs: dict[str, Any], present_inputs: Collection[str]) -> str:
        """The overload name of the function body for these (resolved) attributes, e.g.
        ``activation=gelu``; "" when the op has a single body. present_inputs: the names of the inputs
        the node gives (an absent optional input may precede a present one: FusedMHA's Mask named ""
        before its YScale)."""
        parts = [f"{k}={attrs[k]}" for k, a in self.attrs.items() if a.variant]
        parts += [f"{name}={int(name in present_inputs)}" for name in self.inputs if name in self.optional]
        return ",".join(parts)


TF32_TOLERANCE = 2e-3
"""Relative L2 error allowed for fp32 results computed in TF32 (10-bit mantissa inputs, fp32
accumulation): H200 GEMMs with K up to 3072 measured 1.7-2.3e-4."""

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")
"""The activation attribute values the ops share (plus "none" where an op allows it); the
native `Act` enum (plugins/common/activation.h) uses the same names."""


def apply_activation(x: torch.Tensor, name: str) -> torch.Tensor:
    """The activations the ops accept, by the names used in their attributes."""
    if name == "relu":
        return torch.relu(x)
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "silu":
        return F.silu(x)
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "none":
        return x
    raise ValueError(f"unknown activation {name!r}")
