"""Hugging Face folders (save_pretrained) exported by task: inputs as the processor names them,
Optimum's output names, batch and sequence axes dynamic by default, `--static` to pin them.

Small models are built from configs (random weights) and saved into tmp folders. Each
artefact is checked again here, independently of deployfuse's own verification: ONNX Runtime
at a shape the export never saw, against the transformers model loaded from the folder.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers as T

import deployfuse

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Tiny BERT (masked LM), ViT (image classification), GPT-2 (LM head) and Whisper folders."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    T.BertForMaskedLM(T.BertConfig(vocab_size=99, max_position_embeddings=64, **TINY)).save_pretrained(root / "bert")
    T.ViTForImageClassification(T.ViTConfig(image_size=32, patch_size=8, num_labels=3, **TINY)).save_pretrained(root / "vit")
    T.GPT2LMHeadModel(T.GPT2Config(vocab_size=99, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0)).save_pretrained(root / "gpt2")
    whisper = T.WhisperConfig(vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                              encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16, max_target_positions=16,
                              pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2)
    T.WhisperForConditionalGeneration(whisper).save_pretrained(root / "whisper")
    return root


def _axes(path):
    model = onnx.load(path)
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    return {v.name: dims(v) for v in model.graph.input}, {v.name: dims(v) for v in model.graph.output}


def _shapes(verify):
    """How many distinct input shapes the export was verified at."""
    return len({json.dumps(v["shapes"], sort_keys=True) for v in verify})


def _run_onnx(path, feed):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {k: v.numpy() for k, v in feed.items()})))


def _assert_matches(path, model, feed, output, rtol=1e-4):
    """The artefact on ONNX Runtime against the transformers model on `feed`."""
    got = _run_onnx(path, feed)[output]
    with torch.inference_mode():
        want = getattr(model(**feed), output).numpy()
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= rtol * max(np.max(np.abs(want)), 1.0)


def test_bert_folder_feature_extraction_by_cli_is_dynamic(cli, folders, tmp_path):
    out, report = tmp_path / "bert.onnx", tmp_path / "bert.json"
    code, stdout, stderr = cli("export", folders / "bert", "-o", out, "--task", "feature-extraction", "--report", report)
    assert code == 0, stderr
    inputs, outputs = _axes(out)
    assert list(inputs) == ["input_ids", "attention_mask", "token_type_ids"]  # BertTokenizer's names, in forward order
    assert all(dims == ["batch_size", "sequence_length"] for dims in inputs.values())
    assert outputs == {"last_hidden_state": ["batch_size", "sequence_length", 32]}
    data = json.loads(report.read_text())
    assert data["form"] == "huggingface" and data["task"] == "feature-extraction"
    assert _shapes(data["verify"]) == 2 and all(o["passed"] for v in data["verify"] for o in v["outputs"])

    feed = {"input_ids": torch.randint(0, 99, (3, 23)), "attention_mask": torch.ones(3, 23, dtype=torch.int64), "token_type_ids": torch.zeros(3, 23, dtype=torch.int64)}
    feed["attention_mask"][1, 15:] = 0  # padding: the mask is a real input, not folded away
    _assert_matches(out, T.AutoModel.from_pretrained(folders / "bert"), feed, "last_hidden_state")


def test_gpt2_text_generation_has_logits_without_cache(folders, tmp_path):
    out = tmp_path / "gpt2.onnx"
    result = deployfuse.export(folders / "gpt2", out, task="text-generation")
    inputs, outputs = _axes(out)
    assert inputs == {"input_ids": ["batch_size", "sequence_length"], "attention_mask": ["batch_size", "sequence_length"]}
    assert outputs == {"logits": ["batch_size", "sequence_length", 99]}  # no past_key_values: use_cache=False
    assert result.report.task == "text-generation" and _shapes(result.report.verify) == 2

    feed = {"input_ids": torch.randint(0, 99, (1, 7)), "attention_mask": torch.ones(1, 7, dtype=torch.int64)}
    _assert_matches(out, T.AutoModelForCausalLM.from_pretrained(folders / "gpt2"), feed, "logits")


def test_vit_image_classification_has_dynamic_batch(folders, tmp_path):
    out = tmp_path / "vit.onnx"
    deployfuse.export(folders / "vit", out)  # the task comes from the saved architecture
    inputs, outputs = _axes(out)
    assert inputs == {"pixel_values": ["batch_size", 3, 32, 32]} and outputs == {"logits": ["batch_size", 3]}
    feed = {"pixel_values": torch.randn(5, 3, 32, 32)}
    _assert_matches(out, T.AutoModelForImageClassification.from_pretrained(folders / "vit"), feed, "logits")


def test_whisper_speech_recognition_exports_the_encoder(folders, tmp_path):
    out = tmp_path / "whisper.onnx"
    result = deployfuse.export(folders / "whisper", out, task="automatic-speech-recognition")
    inputs, outputs = _axes(out)
    assert inputs == {"input_features": ["batch_size", 16, 32]}  # Whisper fixes the frame count: 2 per encoder position
    assert outputs == {"last_hidden_state": ["batch_size", 16, 32]}
    assert _shapes(result.report.verify) == 2, "verified at a second batch size"
    feed = {"input_features": torch.randn(3, 16, 32)}
    _assert_matches(out, T.AutoModelForSpeechSeq2Seq.from_pretrained(folders / "whisper").get_encoder(), feed, "last_hidden_state")


def test_ctc_speech_recognition_has_dynamic_samples(tmp_path):
    folder = tmp_path / "wav2vec2"
    T.Wav2Vec2ForCTC(T.Wav2Vec2Config(vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                      conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                      num_conv_pos_embedding_groups=2, pad_token_id=0)).save_pretrained(folder)
    out = tmp_path / "wav2vec2.onnx"
    result = deployfuse.export(folder, out)  # the saved Wav2Vec2ForCTC: automatic-speech-recognition, the CTC head
    inputs, outputs = _axes(out)
    assert result.report.task == "automatic-speech-recognition"
    assert inputs == {"input_values": ["batch_size", "sequence_length"], "attention_mask": ["batch_size", "sequence_length"]}  # the feature extractor's names
    assert list(outputs) == ["logits"] and outputs["logits"][0] == "batch_size"
    feed = {"input_values": torch.randn(1, 2345), "attention_mask": torch.ones(1, 2345, dtype=torch.int64)}
    _assert_matches(out, T.AutoModelForCTC.from_pretrained(folder), feed, "logits")


def test_saved_tokenizer_names_the_inputs_and_static_pins_the_axes(folders, tmp_path):
    folder = tmp_path / "bert_with_tokenizer"
    T.AutoModelForMaskedLM.from_pretrained(folders / "bert").save_pretrained(folder)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(94))]))
    T.BertTokenizer(vocab_file=str(vocab), model_input_names=["input_ids", "attention_mask"]).save_pretrained(folder)

    out = tmp_path / "bert.onnx"
    result = deployfuse.export(folder, out, static=True)
    inputs, outputs = _axes(out)
    assert inputs == {"input_ids": [2, 16], "attention_mask": [2, 16]}  # the saved tokenizer's names; no token_type_ids
    assert outputs == {"logits": [2, 16, 99]}  # fill-mask, the saved BertForMaskedLM's task
    assert result.report.task == "fill-mask" and result.report.dynamic == [] and _shapes(result.report.verify) == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--task", "fill-mask"], "has no fill-mask head"),  # ViT has no masked-LM class
    (["--task", "summarization"], "invalid choice"),
    (["--task", "fill-mask", "--static", "--dynamic", "pixel_values:0:b"], "--static pins every axis"),
])
def test_bad_task_arguments_exit_2(cli, folders, tmp_path, args, message):
    code, _, stderr = cli("export", folders / "vit", "-o", tmp_path / "x.onnx", *args)
    assert code == 2 and message in stderr
    assert not (tmp_path / "x.onnx").exists()


def test_task_needs_a_folder_and_a_folder_needs_a_config(cli, tmp_path):
    code, _, stderr = cli("export", "examples.tiny_bert:build", "-o", tmp_path / "x.onnx", "--task", "fill-mask")
    assert code == 2 and "needs a Hugging Face model folder" in stderr
    code, _, stderr = cli("export", tmp_path, "-o", tmp_path / "x.onnx")
    assert code == 2 and "without config.json" in stderr


@pytest.mark.parametrize(("task", "head", "shape"), [
    ("text-classification", T.AutoModelForSequenceClassification, (2, 2)),  # BertConfig's default 2 labels
    ("token-classification", T.AutoModelForTokenClassification, (2, 16, 2)),
    ("fill-mask", T.AutoModelForMaskedLM, (2, 16, 99)),
])
def test_text_tasks_load_their_head_and_return_only_its_logits(folders, task, head, shape):
    from deployfuse.hf import load_pretrained

    loaded = load_pretrained(folders / "bert", task)
    assert loaded.task == task and loaded.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    with torch.inference_mode():
        got = loaded.module(**loaded.example_inputs)
        model = head.from_pretrained(folders / "bert")
    assert type(loaded.module.model) is type(model)  # transformers' own class for the task
    assert list(got) == ["logits"] and tuple(got["logits"].shape) == shape
    if task == "fill-mask":  # the saved head (the others are initialised at random on each load)
        with torch.inference_mode():
            torch.testing.assert_close(got["logits"], model(**loaded.example_inputs).logits)


def test_optimum_older_task_names_are_accepted(folders):
    from deployfuse.hf import load_pretrained

    loaded = load_pretrained(folders / "gpt2", "causal-lm")
    assert loaded.task == "text-generation" and not loaded.module.model.config.use_cache


@pytest.mark.parametrize(("save", "task", "recorded", "inputs", "output"), [
    # GPT-2 saved as the bare model (feature-extraction by its architecture); its LM head is tied to the embeddings, so nothing is new.
    (lambda: T.GPT2Model(T.GPT2Config(vocab_size=99, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0)),
     "causal-lm", "text-generation", ["input_ids", "attention_mask"], "logits"),
    # BERT saved as a masked LM: the token-classification head is new, drawn from a fixed seed on every load.
    (lambda: T.BertForMaskedLM(T.BertConfig(vocab_size=99, max_position_embeddings=64, **TINY)),
     "token-classification", "token-classification", ["input_ids", "attention_mask", "token_type_ids"], "logits"),
])
def test_compare_loads_the_folder_for_the_task_the_export_recorded(cli, tmp_path, save, task, recorded, inputs, output):
    folder, out, report = tmp_path / "model", tmp_path / "m.onnx", tmp_path / "cmp.json"
    torch.manual_seed(1)
    save().save_pretrained(folder)
    code, _, stderr = cli("export", folder, "-o", out, "--task", task, "-q")
    assert code == 0, stderr
    model = onnx.load(out)
    assert {p.key: json.loads(p.value) for p in model.metadata_props}["deployfuse.task"] == recorded
    assert [v.name for v in model.graph.output] == [output]

    # No --task: compare reads it from the ONNX file, so PyTorch runs the same head on the same input names.
    code, stdout, stderr = cli("compare", folder, out, "--iterations", "0", "--json", report)
    assert code == 0, stdout + stderr
    data = json.loads(report.read_text())
    assert data["passed"] and data["task"] == recorded and all(list(a["shapes"]) == inputs for a in data["accuracy"])
    assert {o["name"] for a in data["accuracy"] for o in a["outputs"]} == {output}
    assert max(o["max_abs_error"] for a in data["accuracy"] for o in a["outputs"]) < 1e-3
    row = next(line.split() for line in stdout.splitlines() if line.startswith(f"{output} "))  # the piped table: plain columns
    assert float(row[1]) == pytest.approx(data["accuracy"][0]["outputs"][0]["max_abs_error"], rel=1e-2) and row[-1] == "ok"

    # The architecture's own task is another model: compare says so instead of passing.
    code, stdout, stderr = cli("compare", folder, out, "--iterations", "0", "--task", "feature-extraction" if task == "causal-lm" else "fill-mask")
    assert code == 1 and "beyond tolerance" in stderr
