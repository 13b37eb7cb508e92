"""Hugging Face models by folder: a `save_pretrained` directory and a task, ready to export.

A task (Optimum's names) picks the transformers auto class to load with and the outputs to
export (Optimum's output names). The inputs are those the model's processor produces
(its tokenizer, image processor or feature extractor, saved beside the model or else the class
transformers maps the model type to), in the order the forward takes them. Batch and sequence
axes are dynamic by default, named as Optimum names them (for raw audio, the samples axis).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deployfuse.errors import UsageError, first_line
from deployfuse.inputs import DynamicAxis, InputSpec, make_inputs

BATCH, SEQUENCE = "batch_size", "sequence_length"  # Optimum's axis names
DEFAULT_BATCH, DEFAULT_SEQUENCE, DEFAULT_SAMPLES = 2, 16, 1600  # 1600 samples: 0.1 s of 16 kHz audio
NEW_WEIGHTS_SEED = 0  # the seed of weights a task's head adds to a folder that lacks them


@dataclass(frozen=True)
class Task:
    """What a task exports: the auto class to load with, its outputs, and which processor
    names its inputs ("tokenizer", "image_processor" or "feature_extractor")."""

    auto_class: str
    outputs: tuple[str, ...]
    processor: str
    mapping: str  # transformers' MODEL_FOR_..._MAPPING_NAMES that lists the task's architectures
    encoder_only: bool = False  # export the model's encoder (get_encoder()), as Optimum's encoder_model.onnx


TASKS: dict[str, Task] = {
    "feature-extraction": Task("AutoModel", ("last_hidden_state",), "tokenizer", "MODEL_MAPPING_NAMES"),
    "fill-mask": Task("AutoModelForMaskedLM", ("logits",), "tokenizer", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    "text-classification": Task("AutoModelForSequenceClassification", ("logits",), "tokenizer", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    "token-classification": Task("AutoModelForTokenClassification", ("logits",), "tokenizer", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    "image-classification": Task("AutoModelForImageClassification", ("logits",), "image_processor", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    "text-generation": Task("AutoModelForCausalLM", ("logits",), "tokenizer", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "automatic-speech-recognition": Task("AutoModelForSpeechSeq2Seq", ("last_hidden_state",), "feature_extractor",
                                         "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", encoder_only=True),
}
# automatic-speech-recognition for CTC models (wav2vec2, HuBERT): the whole model, logits per frame.
ASR_CTC = Task("AutoModelForCTC", ("logits",), "feature_extractor", "MODEL_FOR_CTC_MAPPING_NAMES")
# Optimum's older names for the same tasks.
SYNONYMS = {"default": "feature-extraction", "masked-lm": "fill-mask", "sequence-classification": "text-classification",
            "causal-lm": "text-generation", "speech2seq-lm": "automatic-speech-recognition"}
# The files a saved processor leaves beside the model.
_PROCESSOR_FILES = {"tokenizer": "tokenizer_config.json", "image_processor": "preprocessor_config.json", "feature_extractor": "preprocessor_config.json"}


def is_pretrained_folder(path: Path) -> bool:
    """True when `path` is a directory written by `save_pretrained` (it has config.json)."""
    return path.is_dir() and (path / "config.json").is_file()


class TaskModel(torch.nn.Module):
    """A transformers model called with the task's inputs by name, returning only the task's
    outputs as a dict (so the ONNX outputs carry Optimum's names).

    `task_model` makes one with a forward whose signature names exactly the task's inputs:
    torch.export binds inputs and dynamic shapes by that signature.
    """

    def __init__(self, model: torch.nn.Module, input_names: list[str], output_names: tuple[str, ...]):
        super().__init__()
        self.model, self.input_names, self.output_names = model, input_names, output_names
        self.config = model.config  # random token ids stay below config.vocab_size
        self.train(model.training)

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> dict[str, torch.Tensor]:
        named = dict(zip(self.input_names, args), **kwargs)
        out = self.model(**named)
        return {name: out[name] for name in self.output_names}


def task_model(model: torch.nn.Module, input_names: list[str], output_names: tuple[str, ...]) -> TaskModel:
    """A `TaskModel` whose forward's signature is `(input_names...)`."""

    def forward(self: TaskModel, *args: torch.Tensor, **kwargs: torch.Tensor) -> dict[str, torch.Tensor]:
        return TaskModel.forward(self, *args, **kwargs)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    forward.__signature__ = inspect.Signature([inspect.Parameter(n, kind) for n in ["self", *input_names]])  # type: ignore[attr-defined]
    named = type(TaskModel.__name__, (TaskModel,), {"forward": forward, "__module__": __name__})
    return named(model, input_names, output_names)


@dataclass
class Pretrained:
    """A loaded folder: the model to export, its input names, example inputs and default
    dynamic axes."""

    module: TaskModel
    task: str
    input_names: list[str]
    example_inputs: dict[str, torch.Tensor] | None  # None when an input's shape is not known: the user gives --input
    dynamic: list[DynamicAxis]


def load_pretrained(folder: str | Path, task: str | None = None, seed: int | None = 0) -> Pretrained:
    """Load a `save_pretrained` folder for `task` (None: the task of the saved architecture)."""
    transformers = _transformers()
    with _quiet(transformers):
        return _load(Path(folder), task, seed, transformers)


def _load(folder: Path, task: str | None, seed: int | None, transformers: Any) -> Pretrained:
    config = _config(folder, transformers)
    name = _resolve_task(task, config)
    spec = ASR_CTC if name == "automatic-speech-recognition" and _saved_in(config, ASR_CTC) else TASKS[name]
    auto = getattr(transformers, spec.auto_class)
    options: dict[str, Any] = {"use_cache": False} if name == "text-generation" else {}
    try:
        # Weights the folder lacks (a head the saved architecture has not, e.g. token-classification
        # on a masked-LM checkpoint) are drawn from one seed: export and compare load one model.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(NEW_WEIGHTS_SEED)
            model = auto.from_pretrained(str(folder), **options)
    except (ValueError, KeyError) as exc:  # transformers: this config has no class for that auto class
        raise UsageError(f"{folder}: a {config.model_type} model has no {name} head ({spec.auto_class}): {first_line(exc)}") from exc
    except Exception as exc:
        raise UsageError(f"could not load {folder}: {first_line(exc, typed=True)}") from exc
    if spec.encoder_only:
        model = model.get_encoder()
    model.eval()
    names = _input_names(folder, config, spec, model, transformers)
    module = task_model(model, names, spec.outputs)
    shapes = {n: _shape_and_dtype(n, config, names) for n in names}
    known = all(s is not None for s in shapes.values())
    example = make_inputs([InputSpec(n, *s) for n, s in shapes.items() if s is not None], module, seed) if known else None
    dynamic = [DynamicAxis(n, 0, BATCH) for n in names] + [DynamicAxis(n, 1, SEQUENCE) for n in names if _has_sequence_axis(n)]
    return Pretrained(module, name, names, example, dynamic)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise UsageError("a Hugging Face folder needs transformers: pip install 'deployfuse[hf]'") from exc
    return transformers


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """No progress bars or load reports from transformers: our steps report the load."""
    logging, bars = transformers.utils.logging, transformers.utils.logging.is_progress_bar_enabled()
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _config(folder: Path, transformers: Any) -> Any:
    try:
        return transformers.AutoConfig.from_pretrained(str(folder))
    except Exception as exc:
        raise UsageError(f"{folder / 'config.json'} is not a transformers config: {first_line(exc, typed=True)}") from exc


def _resolve_task(task: str | None, config: Any) -> str:
    if task is not None:
        name = SYNONYMS.get(task, task)
        if name not in TASKS:
            raise UsageError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
        return name
    for name, spec in [*TASKS.items(), ("automatic-speech-recognition", ASR_CTC)]:
        if _saved_in(config, spec):
            return name
    saved = ", ".join(sorted(getattr(config, "architectures", None) or [])) or "no architecture"
    raise UsageError(f"cannot tell the task of {saved}; give --task ({', '.join(TASKS)})")


def _saved_in(config: Any, spec: Task) -> bool:
    """True when the folder's saved architecture is one transformers lists for `spec`."""
    from transformers.models.auto import modeling_auto

    listed = getattr(modeling_auto, spec.mapping)
    classes = {c for v in listed.values() for c in ((v,) if isinstance(v, str) else v)}
    return bool(set(getattr(config, "architectures", None) or []) & classes)


def _input_names(folder: Path, config: Any, spec: Task, model: torch.nn.Module, transformers: Any) -> list[str]:
    """The processor's input names that the model's forward takes, in the forward's order."""
    produced = _processor_input_names(folder, config, spec.processor, transformers)
    taken = list(inspect.signature(model.forward).parameters)
    names = [n for n in taken if n in produced]
    if not names:
        raise UsageError(f"the {spec.processor.replace('_', ' ')} of {config.model_type} produces {', '.join(produced) or 'nothing'}, "
                         f"which the model's forward does not take; is the task right?")
    return names


def _processor_input_names(folder: Path, config: Any, kind: str, transformers: Any) -> list[str]:
    saved = folder / _PROCESSOR_FILES[kind]
    if saved.is_file() and (kind != "tokenizer" or _has_tokenizer_files(folder)):
        auto = {"tokenizer": "AutoTokenizer", "image_processor": "AutoImageProcessor", "feature_extractor": "AutoFeatureExtractor"}[kind]
        try:
            return list(getattr(transformers, auto).from_pretrained(str(folder)).model_input_names)
        except Exception as exc:
            raise UsageError(f"could not load the {kind.replace('_', ' ')} saved in {folder}: {first_line(exc, typed=True)}") from exc
    cls = _processor_class(config.model_type, kind)
    if cls is None:
        raise UsageError(f"transformers names no {kind.replace('_', ' ')} for model type {config.model_type!r}; save one beside the model")
    return list(cls.model_input_names)


def _has_tokenizer_files(folder: Path) -> bool:
    return any((folder / f).is_file() for f in ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model"))


def _processor_class(model_type: str, kind: str) -> Any:
    """The processor class transformers maps `model_type` to (not instantiated: no files needed)."""
    from transformers.models.auto import feature_extraction_auto, image_processing_auto, tokenization_auto

    names: Any  # a class name, names per backend, or None
    if kind == "tokenizer":
        names, lookup = tokenization_auto.TOKENIZER_MAPPING_NAMES.get(model_type), tokenization_auto.tokenizer_class_from_name
    elif kind == "image_processor":
        names, lookup = image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type), image_processing_auto.get_image_processor_class_from_name
    else:
        names, lookup = feature_extraction_auto.FEATURE_EXTRACTOR_MAPPING_NAMES.get(model_type), feature_extraction_auto.feature_extractor_class_from_name
    if isinstance(names, Mapping):  # image processors by backend
        names = tuple(names.values())
    for name in (names,) if isinstance(names, str) else names or ():
        cls = lookup(name) if name else None
        if cls is not None and getattr(cls, "model_input_names", None):
            return cls
    return None


_TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def _has_sequence_axis(name: str) -> bool:
    """Axis 1 is the sequence: tokens, or raw audio samples (an attention mask follows either)."""
    return name in _TOKEN_INPUTS or name == "input_values"


def _shape_and_dtype(name: str, config: Any, names: list[str]) -> tuple[tuple[int, ...], torch.dtype] | None:
    """The example shape of a processor input (sizes the model fixes come from its config);
    None for an input of unknown layout."""
    if name == "input_values" or (name == "attention_mask" and "input_values" in names):  # raw audio and its mask
        return (DEFAULT_BATCH, DEFAULT_SAMPLES), torch.float32 if name == "input_values" else torch.int64
    if name in _TOKEN_INPUTS:
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or DEFAULT_SEQUENCE
        return (DEFAULT_BATCH, min(DEFAULT_SEQUENCE, limit)), torch.int64
    if name == "pixel_values":
        size = getattr(config, "image_size", 224)
        height, width = (size, size) if isinstance(size, int) else tuple(size)[:2]
        return (DEFAULT_BATCH, getattr(config, "num_channels", 3), height, width), torch.float32
    if name == "input_features":
        # Speech encoders (Whisper) check the frame count: two per encoder position (stride-2 conv).
        return (DEFAULT_BATCH, config.num_mel_bins, 2 * config.max_source_positions), torch.float32
    return None


__all__ = ["BATCH", "SEQUENCE", "SYNONYMS", "TASKS", "Pretrained", "Task", "TaskModel", "is_pretrained_folder", "load_pretrained", "task_model"]
