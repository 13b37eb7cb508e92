"""Real engines, built by TensorRT-RTX on this CPU for compute capability 8.9 (no GPU needed).

Running an engine needs a GPU; what these tests check is that TensorRT accepts the graph,
the profile and the precision, and that the plan is written atomically with a true summary.
"""

from __future__ import annotations

import onnx
import pytest

from deployfuse.engine import ShapeProfile, build_engine

CC = ("--compute-capability", "8.9")
BERT_PROFILE = ("--profile", "input_ids:1x8:2x16:4x32")


def test_bert_dynamic_fp32_cli(bert_onnx, tmp_path, cli):
    engine, log = tmp_path / "bert.plan", tmp_path / "build.log"
    code, out, err = cli("build", bert_onnx, "-o", engine, *BERT_PROFILE, *CC, "--log-file", log)
    assert code == 0, err
    assert engine.stat().st_size > 100_000
    assert f"engine     {engine} (" in out and "tensorrt-rtx" in out and "compute capability 8.9" in out
    assert "profile    attention_mask:1x8:2x16:4x32" in out  # follows input_ids through the shared axes
    assert "Building engine" in err  # progress from TensorRT's phases
    # stdout is the summary alone: Polygraphy's and TensorRT's [W]/[I] lines went to the log
    assert {line.split()[0] for line in out.splitlines()} <= {"engine", "builder", "precision", "layers", "nodes", "profile"}, out
    assert "[W]" not in err and "[I]" not in err
    written = log.read_text()
    assert "deployfuse.tensorrt: Building engine with configuration:" in written and "parsed: " in written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert.plan", "bert.plan.build.json", "build.log"]  # no temporaries left behind


def test_tensorrt_failure_is_one_line_with_its_reason(bert_onnx, tmp_path, cli):
    """TensorRT's own error (logged, not raised) is the message: not Polygraphy's 'Invalid Engine'."""
    code, out, err = cli("build", bert_onnx, "-o", tmp_path / "e.plan", *BERT_PROFILE, *CC, "--workspace", "1", "-q")
    assert code == 2 and out == "", out
    assert err.startswith("deployfuse build: error: TensorRT could not build the engine: ") and err.count("\n") == 1, err
    assert "workspace" in err and "Invalid Engine" not in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_bert_low_precision(bert_onnx, tmp_path, precision):
    result = build_engine(bert_onnx, tmp_path / "bert.plan", precision=precision, compute_capability="8.9", profiles=[ShapeProfile.parse("input_ids:1x8:2x16:4x32")])
    assert result.precision == precision and result.network_layers > 100
    assert "Cast" in result.preflight.native  # the float32 interface casts in and out
    assert result.engine.stat().st_size == result.size_bytes


def test_resnet_static(resnet_onnx, tmp_path, cli):
    code, out, err = cli("build", resnet_onnx, "-o", tmp_path / "r.plan", *CC, "--workspace", "256", "--timing-cache", tmp_path / "t.cache", "--fp16", "-q")
    assert code == 0, err
    assert "profile" not in out and "precision  fp16" in out
    assert "timing cache" not in out and not (tmp_path / "t.cache").exists()  # TensorRT-RTX has none


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("missing.onnx", "-o", "e.plan"), "no such ONNX file"),
        (("junk.onnx", "-o", "e.plan"), "not a readable ONNX model"),
        (("MODEL", "-o", "e.plan", "--compute-capability", "89"), "expected MAJOR.MINOR"),
        (("MODEL", "-o", "e.plan", "--profile", "input_ids:1x8:2x8"), "expected NAME:MIN:OPT:MAX"),
        (("MODEL", "-o", "e.plan", "--profile", "ids:1x8:2x8:4x8"), "not a model input"),
        (("BARE", "-o", "e.plan"), "give --profile input_ids:"),
        (("MODEL", "-o", "no/such/dir/e.plan"), "output directory does not exist"),
        (("MODEL", "-o", "e.plan", "--workspace", "0"), "--workspace must be a positive"),
        (("MODEL", "-o", "e.plan", "--plugins", "nope.so", *BERT_PROFILE), "--plugins nope.so: no such file"),
        (("MODEL", "-o", "e.plan", "--fp16", "--bf16"), "not allowed with"),
        (("MODEL", "-o", "e.plan", "--builder", "onnxruntime"), "invalid choice"),
    ],
)
def test_bad_input_exits_2(bert_onnx, tmp_path, monkeypatch, cli, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all \xff\xfe")
    bare = tmp_path / "bare.onnx"  # the same model without the export's recorded input shapes
    model = onnx.load(bert_onnx)
    del model.metadata_props[:]
    onnx.save(model, bare)
    code, _, err = cli("build", *[{"MODEL": bert_onnx, "BARE": bare}.get(a, a) for a in args])
    assert code == 2 and message in err, err
    assert not (tmp_path / "e.plan").exists()


def test_dynamic_model_builds_from_its_export_shapes(bert_onnx, tmp_path, cli):
    """No --profile: min 1, opt = the shapes recorded at export, max = twice them."""
    code, out, err = cli("build", bert_onnx, "-o", tmp_path / "e.plan")
    assert code == 0, err
    assert (tmp_path / "e.plan").stat().st_size > 0


def test_two_optimization_profiles(bert_onnx, tmp_path, cli):
    """One profile for batch 1, one for batch 4-8 (inputs left out follow through shared axes);
    TensorRT takes both (counted on its builder config before the build)."""
    engine = tmp_path / "bert.plan"
    code, out, err = cli("build", bert_onnx, "-o", engine, "--profile", "input_ids:1x8:1x16:1x32",
                         "--profile", "input_ids:4x8:8x16:8x32,attention_mask:4x8:8x16:8x32", *CC, "-q")
    assert code == 0, err
    assert "profile 1  input_ids:1x8:1x16:1x32\nprofile 1  attention_mask:1x8:1x16:1x32" in out
    assert "profile 2  input_ids:4x8:8x16:8x32\nprofile 2  attention_mask:4x8:8x16:8x32" in out
    code, _, err = cli("build", bert_onnx, "-o", engine, "--profile", "input_ids:1x8:1x16:1x32", "--profile", "input_ids:4x8:8x16:8x32,attention_mask:4x8:8x9:8x32", *CC)
    assert code == 2 and "profile 2 of 2: --profile values disagree on axis 'seq'" in err, err


def test_compare_trt_backend_picks_the_profile_that_holds_the_feed(bert_onnx, tmp_path, cli):
    """The trt runner's engine-independent half on a real two-profile engine's build record:
    batch 1 runs on profile 1, batch 6 on profile 2, batch 2 on none (a one-line error)."""
    import json

    from deployfuse.backends.trt import choose_profile
    from deployfuse.engine.inspect import record_path
    from deployfuse.errors import UsageError

    engine = tmp_path / "bert.plan"
    code, _, err = cli("build", bert_onnx, "-o", engine, "--profile", "input_ids:1x8:1x16:1x32",
                       "--profile", "input_ids:4x8:8x16:8x32", *CC, "-q")
    assert code == 0, err
    profiles = json.loads(record_path(engine).read_text())["profiles"]
    assert len(profiles) == 2
    assert choose_profile(profiles, {"input_ids": (1, 20), "attention_mask": (1, 20)}) == 0
    assert choose_profile(profiles, {"input_ids": (6, 32), "attention_mask": (6, 32)}) == 1
    with pytest.raises(UsageError, match=r"no optimisation profile .* input_ids:2x16.*profile 1: input_ids 1x8..1x32"):
        choose_profile(profiles, {"input_ids": (2, 16), "attention_mask": (2, 16)})
    with pytest.raises(UsageError):  # sequence 40 is past both profiles' max
        choose_profile(profiles, {"input_ids": (1, 40), "attention_mask": (1, 40)})
