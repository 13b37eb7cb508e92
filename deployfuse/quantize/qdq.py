"""QuantizeLinear/DequantizeLinear placement for the tensorrt and ort-cuda targets (int8, fp8).

For int8, ONNX Runtime's static quantizer (`onnxruntime.quantization.quantize_static`, QDQ
format) does the calibration and the placement, and this module chooses its settings and mends
what its output lacks for TensorRT; fp8 is placed here (`_fp8_qdq`, see below). Either way:

- only GEMM-bearing nodes with a constant weight are quantized (`quantizable_nodes`): MatMul
  and Gemm (attention projections, MLPs, heads), and Conv in int8. Activation x activation
  MatMuls (QK^T, PV), norms, softmax and residual sums stay in the float type;
- scales are symmetric (zero point 0, which TensorRT requires) and biases stay float, so
  TensorRT folds them into its GEMM epilogue; int8 weights are per output channel, fp8 weights
  per tensor;
- each quantized node gets its own Q -> DQ pair on its activation input and none on its output:
  `Q(X, s_x, 0) -> DQ -> MatMul(., DQ(W_q, s_w, 0)) [-> Add bias] [-> activation]`, the pattern
  TensorRT fuses into an int8/fp8 GEMM (deployfuse's GemmAct rule takes constant weights only and
  leaves these GEMMs alone);
- a tensor quantized for a GEMM reaches its other consumers (a residual Add) unquantized (int8:
  ONNX Runtime hands them the dequantized copy, `_unquantized_elsewhere` gives the original back);
- fp8 scales are amax / 448 (E4M3's largest finite value), per tensor, for activations
  (calibrated) and weights alike: the max calibration of TensorRT's own recipes and torchao's
  float8. ONNX Runtime's quantizer offers only its Distribution method for float8, which matches
  the standard deviation of the float8 grid and saturates outliers, and leaves weights short of
  the range (a tiny BERT's pooler: |Wq| <= 352); so fp8 Q/DQ are placed here (`_fp8_qdq`) after
  one MinMax calibration pass, without ONNX Runtime's quantizer, which is also the slow part of
  each of the gate's re-quantizations (BERT-base fp16 on a 2-core CPU: 19 s each, now 2 s);
- in an fp16/bf16 graph the scales take the graph's type (ONNX Runtime writes float32 ones).

Calibration runs once per model and sample set in a process (`_CalibrationCache`): the gate
quantizes the same model again with more layers excluded, and its fp8 switchboard
(`fp8_switchboard`) takes the same scales and float8 weights (`fp8_activation_scales`, `fp8_weight`).

Why not nvidia-modelopt's ONNX PTQ: it runs on a CPU, but pins onnx 1.21, onnxruntime-gpu 1.24
and cupy for CUDA 12 (this project is on onnx 1.23, onnxruntime 1.32, CUDA 13), and it puts
Q/DQ on residual Adds and attention MatMuls too, which the issue keeps in float.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from deployfuse.io import default_opset
from deployfuse.ops.schema import E4M3_MAX, to_element_type

if TYPE_CHECKING:
    from deployfuse.quantize.calibration import Calibration

PRECISIONS = ("int8", "fp8")
GEMM_OPS = {"int8": ("MatMul", "Gemm", "Conv"), "fp8": ("MatMul", "Gemm")}
MIN_OPSET = {"int8": 13, "fp8": 19}  # per-axis DequantizeLinear (13), float8 types (19)
PROTOBUF_LIMIT = 2 * 1024**3  # protobuf cannot serialise a model above 2 GiB (saved with external data, no session from memory)


def quantizable_nodes(model: onnx.ModelProto, precision: str = "int8") -> list[str]:
    """Names of the nodes `place_qdq` quantizes in `precision`, in graph order: MatMul and Gemm
    whose weight (input B) is a 2-D initializer (per-channel scales then run along its output
    columns), and for int8 Conv with an initializer kernel."""
    _check_precision(precision)
    rank = {t.name: len(t.dims) for t in model.graph.initializer}
    ops = GEMM_OPS[precision]
    return [n.name for n in model.graph.node
            if n.name and n.domain in ("", "ai.onnx") and n.op_type in ops and len(n.input) > 1 and n.input[1] in rank and (n.op_type == "Conv" or rank[n.input[1]] == 2)]


def untransposed_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """`model` with each MatMul weight read through a Transpose of a 2-D initializer stored
    transposed as an initializer of its own, so that `quantizable_nodes` finds the GEMM, and the
    stored copies by name, each with the initializer it transposes (the input model is not
    modified; the same model and no copies when there is none).

    A tied LM head (BertForMaskedLM, GPT2LMHeadModel) multiplies by the embedding table [V, D]
    transposed, which the exporter leaves to run time because a Gather reads the table too: the
    model's largest GEMM would stay in float. ONNX Runtime folds the Transpose into a copy when the
    session starts, so the stored copy costs no memory at run time (an int8 or float8 one, once
    quantized); `retransposed_weights` undoes it for a copy that stays float.
    """
    graph = model.graph
    weights = {t.name: t for t in graph.initializer if len(t.dims) == 2}
    producer = {o: n for n in graph.node for o in n.output}
    tied = {}
    for node in graph.node:
        transpose = producer.get(node.input[1]) if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(node.input) > 1 else None
        perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), [1, 0]) if transpose is not None else None
        if transpose is not None and transpose.op_type == "Transpose" and transpose.input[0] in weights and perm == [1, 0]:
            tied[node.input[1]] = transpose.input[0]
    if not tied:
        return model, {}
    out = _copy(model)
    taken = {t.name for t in out.graph.initializer} | {o for n in out.graph.node for o in n.output}
    stored = {value: fresh_name(f"{weight}_transposed", taken) for value, weight in tied.items()}
    out.graph.initializer.extend(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(weights[w]).T), stored[v]) for v, w in tied.items())
    for node in out.graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in stored:
            node.input[1] = stored[node.input[1]]
    read = {i for n in out.graph.node for i in n.input} | {o.name for o in out.graph.output}
    kept = [n for n in out.graph.node if n.output[0] not in tied or n.output[0] in read]  # a Transpose nothing else reads goes
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out, {stored[v]: w for v, w in tied.items()}


def retransposed_weights(model: onnx.ModelProto, copies: Mapping[str, str]) -> onnx.ModelProto:
    """`model` (modified in place, and returned) with each of `copies` (`untransposed_weights`'
    stored copy -> the initializer it transposes) that is still a float initializer, its GEMM
    left in float by the gate, made by a Transpose of that initializer again: the artefact then
    holds one float copy of a tied table, not two (GPT-2's: 154 MB each). A quantized copy is no
    longer there (the quantizer stores the GEMM's weight as int8) and stays as it is."""
    initializers = {t.name: t for t in model.graph.initializer}
    floating = [c for c, table in copies.items() if c in initializers and table in initializers
                and initializers[c].data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)]
    if not floating:
        return model
    kept = [t for t in model.graph.initializer if t.name not in floating]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    transposes = [helper.make_node("Transpose", [copies[c]], [c], name=f"{c}_Transpose", perm=[1, 0]) for c in floating]
    nodes = transposes + list(model.graph.node)  # a Transpose reads an initializer only: first is in order
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def place_qdq(model: onnx.ModelProto, precision: str, calibration: Calibration, exclude: set[str]) -> onnx.ModelProto:
    """`model` with Q/DQ pairs on its GEMM-bearing nodes in `precision` ("int8" or "fp8"),
    scales calibrated on `calibration.samples`, the nodes named in `exclude` left in float.

    The input model is not modified; the returned one keeps its opset and node names.

    Names in `exclude` that `quantizable_nodes` does not list (an attention MatMul, a Conv in
    fp8) are in float already.

    Raises:
        ValueError: an unknown precision, an opset too old for it, or `exclude` naming a node
            the model does not have.
    """
    _check_precision(precision)
    opset = default_opset(model)
    if opset is None or opset < MIN_OPSET[precision]:
        raise ValueError(f"{precision} Q/DQ needs opset {MIN_OPSET[precision]} or newer; the model is at opset {opset}")
    unknown = set(exclude) - {n.name for n in model.graph.node}
    if unknown:
        raise ValueError(f"exclude names nodes the model does not have: {', '.join(sorted(unknown))}")
    nodes = [n for n in quantizable_nodes(model, precision) if n not in exclude]
    if not nodes:
        return _copy(model)
    if precision == "fp8":
        return _fp8_qdq(model, set(nodes), fp8_activation_scales(model, calibration))
    samples = _samples(model, calibration.samples)
    with tempfile.TemporaryDirectory(prefix="deployfuse-qdq.") as tmp:
        source, target = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
        external = _save(model, source)
        ranges = _CACHE.entry(source, samples, precision)
        _quantize(source, target, nodes, samples, external, ranges.path)
        quantized = onnx.load(os.fspath(target))
    if default_opset(quantized) != opset:  # the quantizer raises opsets it finds too old: never silently
        raise ValueError(f"ONNX Runtime's quantizer moved the model from opset {opset} to {default_opset(quantized)}")
    _unquantized_elsewhere(quantized, set(nodes))
    _scales_in_graph_type(quantized, model, nodes)
    return quantized


def fp8_activation_scales(model: onnx.ModelProto, calibration: Calibration) -> dict[str, float]:
    """The float8 scale of each fp8-quantizable GEMM's activation input, by node name: amax / 448
    rounded up to a power of two, as the GEMM's float type holds it (`_fp8_scale`), amax over
    `calibration.samples` by ONNX Runtime's MinMax calibrator, once per model and samples in this
    process.

    Why a power of two: x / s is then x * (1 / s) exactly (1 / s is exact, and both round the same
    real number), so the kernels that write a float8 activation (SkipLayerNormFp8's and FusedMHA's
    YQ, the GEMM's quantize pass, cuBLASLt's D scale in Fp8Mlp) multiply instead of dividing and
    still match QuantizeLinear's x / s bit for bit. What it costs: amax lands in (224, 448]
    instead of at 448, which moves E4M3's subnormal floor up by at most one binade; a normal value's
    relative rounding error (2^-4) does not change."""
    samples = _samples(model, calibration.samples)
    with tempfile.TemporaryDirectory(prefix="deployfuse-qdq.") as tmp:
        source = Path(tmp) / "float.onnx"
        _save(model, source)
        ranges = _CACHE.entry(source, samples, "fp8")
        if ranges.amax is None:
            ranges.amax = _activation_amax(source, model, samples, Path(tmp))
        amax = ranges.amax
    weight_type = {t.name: helper.tensor_dtype_to_np_dtype(t.data_type) for t in model.graph.initializer}
    gemms = set(quantizable_nodes(model, "fp8"))
    return {n.name: _fp8_scale(amax[n.input[0]], weight_type[n.input[1]], power_of_two=True) for n in model.graph.node if n.name in gemms}


def fp8_weight(weight: onnx.TensorProto) -> tuple[np.ndarray, float]:
    """`weight` in float8 e4m3 per tensor, and its scale max|W| / 448 as the weight's float type
    holds it (`_fp8_scale`), as a float: the values and scale `place_qdq` stores."""
    values = numpy_helper.to_array(weight).astype(np.float32)
    scale = _fp8_scale(float(np.abs(values).max()), helper.tensor_dtype_to_np_dtype(weight.data_type))
    return to_element_type(values / np.float32(scale), "float8e4m3fn"), scale


def _save(model: onnx.ModelProto, path: Path) -> bool:
    """Save `model` for ONNX Runtime's calibrator; whether its weights went to external data (above 2 GiB)."""
    external = model.ByteSize() > PROTOBUF_LIMIT
    onnx.save_model(model, path, save_as_external_data=external, all_tensors_to_one_file=True, location=path.name + ".data")
    return external


@dataclass
class _Ranges:
    """One calibration's results: ONNX Runtime's calibration cache file, and the fp8 amax per tensor."""

    path: Path
    amax: dict[str, float] | None = None


class _CalibrationCache:
    """Calibration results per (model, samples, precision) for this process.

    The accuracy gate quantizes one model again and again with more layers excluded; the ranges
    do not change (ONNX Runtime calibrates every tensor of the GEMM op types, whichever nodes
    are quantized), and calibrating is the slow part. Files live in a temporary folder removed
    when the process ends.
    """

    def __init__(self) -> None:
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._entries: dict[str, _Ranges] = {}

    def entry(self, source: Path, samples: list[dict[str, np.ndarray]], precision: str) -> _Ranges:
        digest = hashlib.sha256(precision.encode())
        for path in sorted(source.parent.glob(source.name + "*")):  # the model and its external data
            digest.update(path.read_bytes())
        for sample in samples:
            for name, array in sorted(sample.items()):
                digest.update(f"{name}{array.dtype}{array.shape}".encode())
                digest.update(np.ascontiguousarray(array).tobytes())
        key = digest.hexdigest()
        if key not in self._entries:
            if self._folder is None:
                self._folder = tempfile.TemporaryDirectory(prefix="deployfuse-calibration.")
            self._entries[key] = _Ranges(Path(self._folder.name) / f"{key}.json")
        return self._entries[key]


_CACHE = _CalibrationCache()


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown quantized precision {precision!r}; choose one of {', '.join(PRECISIONS)}")


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    return copied


def _samples(model: onnx.ModelProto, samples: Iterable[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
    """The calibration inputs as numpy feeds for the model's inputs (torch tensors or arrays),
    floats in the input's type (an fp16 graph calibrated on fp32 samples)."""
    weights = {t.name for t in model.graph.initializer}
    types = {i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input if i.name not in weights}
    feeds = [{k: _array(v, types[k]) for k, v in sample.items() if k in types} for sample in samples]
    if not feeds:
        raise ValueError("no calibration samples: Q/DQ scales need at least one input set")
    return feeds


def _array(value: Any, dtype: np.dtype) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor; bf16 has no numpy type
        from deployfuse.verify import to_numpy

        value = to_numpy(value)
    array = np.asarray(value)
    return array.astype(dtype) if np.issubdtype(array.dtype, np.floating) and array.dtype != dtype else array


def _reader(samples: list[dict[str, np.ndarray]]) -> Any:
    """An ONNX Runtime CalibrationDataReader over `samples` (a fresh one per calibration run)."""
    from onnxruntime.quantization import CalibrationDataReader

    class SampleReader(CalibrationDataReader):
        def __init__(self) -> None:
            self._feeds = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._feeds, None)

    return SampleReader()


def _quantize(source: Path, target: Path, nodes: list[str], samples: list[dict[str, np.ndarray]], external: bool, cache: Path) -> None:
    """int8 Q/DQ by ONNX Runtime's static quantizer (MinMax calibration, per-channel weights)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    options = {
        "ActivationSymmetric": True,  # zero point 0: TensorRT rejects any other
        "WeightSymmetric": True,
        "QuantizeBias": False,  # float bias: TensorRT and GemmAct add it in the GEMM epilogue
        "DedicatedQDQPair": True,  # one Q -> DQ per GEMM, each a pattern of its own
        "OpTypesToExcludeOutputQuantization": list(GEMM_OPS["int8"]),  # float GEMM outputs
    }
    quantize_static(
        os.fspath(source), os.fspath(target), _reader(samples), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
        op_types_to_quantize=list(GEMM_OPS["int8"]), nodes_to_quantize=nodes, calibrate_method=CalibrationMethod.MinMax,
        use_external_data_format=external, extra_options=options, calibration_cache_path=cache,
    )


def _activation_amax(source: Path, model: onnx.ModelProto, samples: list[dict[str, np.ndarray]], tmp: Path) -> dict[str, float]:
    """max |x| over the samples of every fp8-quantizable GEMM's activation input, measured by
    ONNX Runtime's MinMax calibrator."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    candidates = set(quantizable_nodes(model, "fp8"))
    activations = {n.input[0] for n in model.graph.node if n.name in candidates}
    calibrator = create_calibrator(source, op_types_to_calibrate=list(GEMM_OPS["fp8"]), augmented_model_path=tmp / "augmented.onnx",
                                   calibrate_method=CalibrationMethod.MinMax, extra_options={"symmetric": True})
    calibrator.collect_data(_reader(samples))
    ranges = calibrator.compute_data()
    return {name: max(abs(float(np.asarray(v).max())) for v in ranges[name].range_value) for name in activations}


def _fp8_qdq(model: onnx.ModelProto, nodes: set[str], x_scales: Mapping[str, float]) -> onnx.ModelProto:
    """`model` with each of `nodes` reading a float8 e4m3 Q -> DQ pair of its activation (its
    scale from `x_scales`, by node) and its weight stored in float8 behind a DequantizeLinear (scale
    max|W| / 448), per tensor, zero points 0, scales in the weight's float type: the form TensorRT
    fuses into its fp8 GEMMs and the fp8_gemm rule into Fp8GemmAct. A weight only quantized nodes
    read is stored in float8 alone."""
    out = _copy(model)
    graph = out.graph
    weights = {t.name: t for t in graph.initializer}
    zero = fresh_name("fp8_zero_point", {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output})
    added = [numpy_helper.from_array(to_element_type(0.0, "float8e4m3fn"), zero)]
    stored: dict[str, tuple[str, str]] = {}  # float weight -> (float8 weight, its scale)
    order: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.name in nodes:
            x, w = node.input[0], node.input[1]
            dtype = helper.tensor_dtype_to_np_dtype(weights[w].data_type)
            if w not in stored:
                values, scale = fp8_weight(weights[w])
                stored[w] = (f"{w}_fp8", f"{w}_fp8_scale")
                added += [numpy_helper.from_array(values, stored[w][0]), numpy_helper.from_array(np.array(scale, dtype=dtype), stored[w][1])]
            x_scale, x_q, x_dq, w_dq = (f"{node.name}_{part}" for part in ("x_scale", "x_q", "x_dq", "w_dq"))
            added.append(numpy_helper.from_array(np.array(x_scales[node.name], dtype=dtype), x_scale))
            order += [helper.make_node("QuantizeLinear", [x, x_scale, zero], [x_q], name=f"{node.name}_x_QuantizeLinear"),
                      helper.make_node("DequantizeLinear", [x_q, x_scale, zero], [x_dq], name=f"{node.name}_x_DequantizeLinear"),
                      helper.make_node("DequantizeLinear", [*stored[w], zero], [w_dq], name=f"{node.name}_w_DequantizeLinear")]
            node.input[0], node.input[1] = x_dq, w_dq
        order.append(node)
    del graph.node[:]
    graph.node.extend(order)
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name not in stored or t.name in read]  # only float weights made float8 go (a subgraph may read others)
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    return out


def _fp8_scale(amax: float, dtype: Any, power_of_two: bool = False) -> float:
    """amax / 448 as `dtype` holds it (1 for an all-zero tensor; at least `dtype`'s smallest
    normal number, so that fp16 never rounds a scale to 0): the weights are quantized with the
    scale the graph stores. `power_of_two`: that scale rounded up to a power of two (activations,
    `fp8_activation_scales` says why)."""
    tiny = float(np.finfo(np.float16).tiny) if np.dtype(dtype) == np.float16 else float(np.finfo(np.float32).tiny)
    scale = max(amax / E4M3_MAX, tiny) if amax > 0 else 1.0
    if power_of_two:
        mantissa, exponent = math.frexp(scale)  # scale = mantissa * 2^exponent, mantissa in [0.5, 1)
        scale = math.ldexp(1.0, exponent - 1 if mantissa == 0.5 else exponent)
    return float(np.array(scale, dtype=dtype).astype(np.float32))


def fresh_name(name: str, taken: set[str]) -> str:
    """`name`, or `name` with a number after it, not yet in `taken` (then added to it)."""
    fresh, count = name, 0
    while fresh in taken:
        count += 1
        fresh = f"{name}_{count}"
    taken.add(fresh)
    return fresh


def _scales_in_graph_type(model: onnx.ModelProto, float_model: onnx.ModelProto, quantized: list[str]) -> None:
    """Scales in the type of the tensors they quantize (int8): ONNX Runtime writes float32 scales, and in
    an fp16 or bf16 graph QuantizeLinear needs its input's type and DequantizeLinear outputs its
    scale's (the GEMM's weight gives the type: both GEMM inputs share it)."""
    weight_type = {t.name: t.data_type for t in float_model.graph.initializer}
    gemm_type = {n.name: weight_type[n.input[1]] for n in float_model.graph.node if n.name in set(quantized)}
    producer = {o: n for n in model.graph.node for o in n.output}
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        dtype = gemm_type.get(node.name, TensorProto.FLOAT)
        if dtype == TensorProto.FLOAT:
            continue
        for dq in (producer.get(i) for i in node.input[:2]):
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            q = producer.get(dq.input[0])
            for scale in [dq.input[1]] + ([q.input[1]] if q is not None and q.op_type == "QuantizeLinear" else []):
                tensor = initializers[scale]
                if tensor.data_type == TensorProto.FLOAT:
                    array = numpy_helper.to_array(tensor).astype(helper.tensor_dtype_to_np_dtype(dtype))
                    tensor.CopyFrom(numpy_helper.from_array(array, scale))


def _unquantized_elsewhere(model: onnx.ModelProto, quantized: set[str]) -> None:
    """Rewire the consumers of a dequantized activation that are not quantized GEMMs (a residual
    Add beside the GEMM that shares its input) to the float tensor the Q node read."""
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    restore: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] in weights:
            continue
        q = producer.get(node.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            restore[node.output[0]] = q.input[0]
    for node in graph.node:
        if node.name not in quantized and node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            node.input[:] = [restore.get(i, i) for i in node.input]


__all__ = ["PRECISIONS", "PROTOBUF_LIMIT", "fp8_activation_scales", "fp8_weight", "fresh_name", "place_qdq", "quantizable_nodes", "retransposed_weights", "untransposed_weights"]
