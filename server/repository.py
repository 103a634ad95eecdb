"""The model repository contract: `<repo>/<name>/config.json` and `<repo>/<name>/<version>/` artifacts.

`config.json` is written by model_export; it is validated here once, at start-up, so a bad repository
is refused before the server reports ready.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ONNX_FILE = "model.onnx"
TORCH_FILE = "model.safetensors"
TRITON_CONFIG = "config.pbtxt"  # a Triton repository's model config; LARA Serve reads config.json instead
OOD_OUTPUT = "ood_score"  # optional second output: [batch] FP32, higher = less like the training data
CONFIG_FILE = "config.json"
# Bounds on config.json's values, checked before anything is sized by them (docs/serving.md, "Limits"): a
# text model's max_length (the shipped long-document models take 1 MiB), an image model's height and width,
# the number of labels, and the size of config.json itself.
MAX_TEXT_LENGTH = 1 << 20
MAX_IMAGE_SIDE = 4096
MAX_LABELS = 100_000
MAX_CONFIG_BYTES = 16 * 1024 * 1024


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    datatype: str
    shape: list[int]


class TextPreprocessing(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    # "bytes": ids are UTF-8 bytes + byte_offset; "wordpiece": the model folder's `tokenizer` file (Hugging
    # Face tokenizers JSON) gives [CLS] + pieces + [SEP], and max_length counts pieces.
    kind: Literal["bytes", "wordpiece"]
    max_length: int = Field(gt=0, le=MAX_TEXT_LENGTH)
    pad_id: int = 0
    byte_offset: int = 1
    tokenizer: str | None = None  # wordpiece: a file in the model folder; read_config makes it absolute
    # What a text over max_length keeps when the request does not say (`lara train` writes "head" for a
    # model trained on documents cut so); false, the default, answers 413 as before.
    truncate: Literal[False, "head", "tail", "head+tail"] = False


class ImagePreprocessing(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Literal["image"]
    height: int = Field(gt=0, le=MAX_IMAGE_SIDE)
    width: int = Field(gt=0, le=MAX_IMAGE_SIDE)
    channels: Literal[1, 3] = 1  # 1: grayscale (L), 3: RGB
    mean: float = 0.0
    std: float = Field(1.0, gt=0.0)
    # Preparation of a user's image into the training convention (server.preprocess.prepare_image). Each
    # step is off when its key is absent, so a model whose config.json predates them is served as before.
    background: int = Field(0, ge=0, le=255)  # grey level of the training images' background
    composite_alpha: bool = False  # transparent pixels become `background` (else Pillow drops alpha)
    invert_light_background: bool = False  # a border on the other side of mid-grey is inverted
    keep_aspect_ratio: bool = False  # fit inside height x width, pad with `background` (else stretch)
    trim_margins: bool = False  # background beyond the model's aspect ratio around the object is cut first


class ModelConfig(BaseModel):
    """The part of config.json the server needs; the rest (architecture, metrics) is passed through."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())

    name: str
    version: str = "1"
    task: Literal["text", "image"]
    labels: list[str] = Field(min_length=1, max_length=MAX_LABELS)
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    preprocessing: Annotated[TextPreprocessing | ImagePreprocessing, Field(discriminator="kind")]
    # Largest input (one text or image file, in bytes) this model takes, refused with 413 before decoding:
    # the memory a long document costs grows with its length (docs/deploy.md). None: no cap of its own.
    max_input_bytes: int | None = Field(None, gt=0)

    @field_validator("version")
    @classmethod
    def _one_folder_name(cls, value: str) -> str:
        """The version is a folder of the model's own: one plain name, never a path (`..`, `/etc`)."""
        if not value or value in (".", "..") or not all(c.isalnum() or c in "._-" for c in value):
            raise ValueError("must be one folder name (letters, digits, '.', '_', '-'; not '..' or a path)")
        return value

    @property
    def vocab_size(self) -> int:
        """Largest token id + 1 the embedding accepts (the architecture config may state it)."""
        arch = getattr(self, "model", None)
        if isinstance(arch, dict) and isinstance(arch.get("vocab_size"), int):
            return int(arch["vocab_size"])
        assert isinstance(self.preprocessing, TextPreprocessing)
        return 256 + self.preprocessing.byte_offset

    @property
    def read_window(self) -> int:
        """config.json model.window: a word-piece model that reads its text in fixed windows of that many
        pieces (model_export.models.bert_lara.window_layout); 0 when it reads the text whole."""
        arch = getattr(self, "model", None)
        window = arch.get("window") if isinstance(arch, dict) else None
        return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else 0

    @property
    def has_ood_output(self) -> bool:
        return any(spec.name == OOD_OUTPUT for spec in self.outputs)

    @property
    def rows_alone(self) -> bool:
        """config.json export.quantization (model_export.export.quantize): the graph quantizes activations with
        one scale per call, over the whole batch, so a row's answer would depend on its batchmates and its
        padding; such a graph runs each row alone, at its own length."""
        export = (self.model_extra or {}).get("export")
        return isinstance(export, dict) and isinstance(export.get("quantization"), dict)

    @property
    def ood_threshold(self) -> float | None:
        """config.json's ood.threshold: an item is in distribution when its ood_score <= threshold."""
        ood = (self.model_extra or {}).get("ood")
        return float(ood["threshold"]) if isinstance(ood, dict) and "threshold" in ood else None

    @property
    def float_graph_temperature(self) -> float | None:
        """config.json calibration.temperature_float_graph: where the served graph is int8 and its temperature was
        refitted on its own logits, the temperature the float weights' logits take (the torch backend's)."""
        calibration = (self.model_extra or {}).get("calibration")
        value = calibration.get("temperature_float_graph") if isinstance(calibration, dict) else None
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None

    def ood_threshold_of(self, backend: str) -> float | None:
        """The threshold for the scores `backend` computes: an int8 graph's threshold is refitted on its own
        scores (config.json ood.threshold_float_graph keeps the float head's), and the torch backend computes
        with the float weights."""
        ood = (self.model_extra or {}).get("ood")
        if backend == "torch" and isinstance(ood, dict) and "threshold_float_graph" in ood:
            return float(ood["threshold_float_graph"])
        return self.ood_threshold


class RepositoryError(RuntimeError):
    """The repository is unusable; raised at start-up."""


def confined(root: Path, path: Path) -> Path:
    """`path` resolved (symlinks followed), refused unless it lies inside `root` (the repository): a model's
    files are the repository's, never reached through `..`, an absolute path or a symlink to elsewhere.
    The refusal names the path as given, never where it leads."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise RepositoryError(
            f"{path}: leads outside the model repository (through '..', an absolute path or a symlink); "
            "a model's files must lie inside the repository"
        )
    return resolved


def read_config(model_dir: Path, root: Path | None = None) -> ModelConfig:
    """`<model_dir>/config.json`, checked. `root`: the repository the file must lie in (default: the model
    folder's parent). A refusal names the file and the rule, never the file's contents."""
    path = model_dir / CONFIG_FILE
    try:
        resolved = confined(model_dir.parent if root is None else root, path)
        if resolved.is_file() and resolved.stat().st_size > MAX_CONFIG_BYTES:
            raise RepositoryError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; is it a model config?")
        config = ModelConfig.model_validate(json.loads(resolved.read_text()))
    except ValidationError as exc:  # the field and the rule; pydantic's own text would quote the values
        failed = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False)[:5])
        raise RepositoryError(f"{path}: unusable model config: {failed}") from None
    except (OSError, ValueError) as exc:  # json's messages give a position, never the text
        raise RepositoryError(f"{path}: unusable model config: {type(exc).__name__}: {exc}") from None
    expected = {"text": ("bytes", "wordpiece"), "image": ("image",)}[config.task]
    if config.preprocessing.kind not in expected:
        raise RepositoryError(f"{path}: task {config.task!r} needs preprocessing kind {' or '.join(expected)}")
    _check_ood(path, config)
    return _with_tokenizer(path, config)


def _with_tokenizer(path: Path, config: ModelConfig) -> ModelConfig:
    """A wordpiece model's tokenizer file, confined to its folder and made absolute (the server loads it once)."""
    prep = config.preprocessing
    if not isinstance(prep, TextPreprocessing) or prep.kind != "wordpiece":
        return config
    if not prep.tokenizer or "/" in prep.tokenizer or prep.tokenizer in (".", ".."):
        raise RepositoryError(
            f"{path}: preprocessing kind 'wordpiece' needs `tokenizer`, a file name in the model folder"
        )
    file = confined(path.parent, path.parent / prep.tokenizer)
    if not file.is_file():
        raise RepositoryError(f"{path}: the tokenizer file {prep.tokenizer!r} is not in {path.parent}")
    return config.model_copy(update={"preprocessing": prep.model_copy(update={"tokenizer": str(file)})})


def _check_ood(path: Path, config: ModelConfig) -> None:
    """An `ood` section needs a finite threshold and an ood_score output to compare it with."""
    ood = (config.model_extra or {}).get("ood")
    if ood is None:
        return
    threshold = ood.get("threshold") if isinstance(ood, dict) else None
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
        raise RepositoryError(f"{path}: ood.threshold must be a finite number, got {threshold!r}")
    if not config.has_ood_output:
        raise RepositoryError(
            f"{path}: ood.threshold is set but outputs {[s.name for s in config.outputs]} have no {OOD_OUTPUT!r}"
        )


def discover(repository: Path, names: list[str] | None = None) -> dict[str, Path]:
    """Model name -> model folder, for every folder holding a config.json (or only `names`)."""
    try:
        folders = sorted(p for p in repository.iterdir() if p.is_dir())
    except OSError as exc:  # glob() would silently find nothing in a folder it cannot list
        raise RepositoryError(f"cannot read model_repository {str(repository)!r}: {exc.strerror or exc}") from None
    found = {p.name: p for p in folders if (p / "config.json").is_file()}
    triton = sorted(p.name for p in folders if p.name not in found and (p / TRITON_CONFIG).is_file())
    hint = (
        f"; {triton} have Triton's {TRITON_CONFIG} but no config.json, which LARA Serve reads (written by "
        "model_export's export next to model.onnx)"
        if triton
        else ""
    )
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise RepositoryError(f"models {missing} not in {repository} (it has {sorted(found)}){hint}")
        found = {n: found[n] for n in names}
    if not found:
        raise RepositoryError(f"no model (folder with config.json) in {repository}{hint}")
    return found


def served_version(model_dir: Path, config: ModelConfig) -> ModelConfig:
    """`config` with `version` set to the version folder its version_policy serves (Triton's rules).

    No version_policy: Triton's default, the highest numeric folder (`latest`, num_versions 1); a
    repository without numeric folders keeps config.json's `version` as before. One version per model is
    served: a policy that selects more is refused here, at start-up.
    """
    path = model_dir / CONFIG_FILE
    numeric = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdecimal())
    policy = (config.model_extra or {}).get("version_policy")
    if policy is None and not numeric:
        return config
    chosen = _select_versions(path, policy if policy is not None else {"latest": {"num_versions": 1}}, numeric)
    if not chosen:
        raise RepositoryError(
            f"{path}: version_policy {json.dumps(policy)} selects no version folder; it has {numeric}"
        )
    if len(chosen) > 1:
        raise RepositoryError(
            f"{path}: version_policy {json.dumps(policy)} selects versions {chosen}; one version per model is served "
            'here: use {"latest": {"num_versions": 1}} or {"specific": {"versions": [N]}}'
        )
    return config.model_copy(update={"version": str(chosen[0])})


def _select_versions(path: Path, policy: object, numeric: list[int]) -> list[int]:
    allowed = '{"latest": {"num_versions": N}}, {"all": {}} or {"specific": {"versions": [N, ...]}}'
    if not isinstance(policy, dict) or len(policy) != 1 or next(iter(policy)) not in ("latest", "all", "specific"):
        raise RepositoryError(f"{path}: version_policy must be one of {allowed}, got {json.dumps(policy)}")
    kind, body = next(iter(policy.items()))
    body = body if isinstance(body, dict) else {}
    if kind == "all":
        return numeric
    if kind == "latest":
        count = body.get("num_versions", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise RepositoryError(f"{path}: version_policy latest.num_versions must be an integer >= 1, got {count!r}")
        return numeric[-count:]
    versions = body.get("versions")
    if not isinstance(versions, list) or not versions or not all(_is_version(v) for v in versions):
        raise RepositoryError(
            f"{path}: version_policy specific.versions must be a list of version numbers, got {versions!r}"
        )
    wanted = sorted({int(v) for v in versions})
    absent = [v for v in wanted if v not in numeric]
    if absent:
        raise RepositoryError(f"{path}: version_policy names versions {absent} that have no folder; it has {numeric}")
    return wanted


def _is_version(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
        isinstance(value, str) and value.isdecimal()
    )


def served_config(name: str, model_dir: Path) -> ModelConfig:
    """config.json, checked, with the version its version_policy serves (served_version); the version
    folder and the artifacts in it lie inside the repository (the model folder's parent)."""
    root = model_dir.parent
    config = read_config(model_dir, root)
    if config.name != name:
        raise RepositoryError(f"{model_dir}/config.json names the model {config.name!r}, not {name!r}")
    config = served_version(model_dir, config)
    version_dir = model_dir / config.version
    confined(root, version_dir)
    for artifact in (ONNX_FILE, TORCH_FILE):
        if (version_dir / artifact).exists() or (version_dir / artifact).is_symlink():
            confined(root, version_dir / artifact)
    return config


def check_repository(repository: Path, names: list[str] | None = None, strict: bool = False) -> None:
    """Before any model loads: the named models exist and their config.json and version folders are usable.

    Raises RepositoryError (start-up: one line, exit 2) for an unreadable repository, an unknown name, or an
    unusable config when `strict` (strict_models) or no model would be left; otherwise such a model is left
    for lara_serve.server.models.load_repository to report as failed, as it always was, and the others serve.
    """
    found = discover(repository, names)
    problems: list[str] = []
    for name, model_dir in found.items():
        try:
            served_config(name, Path(model_dir))
        except RepositoryError as exc:
            problems.append(" ".join(str(exc).split()))
    if problems and (strict or len(problems) == len(found)):
        more = f" (and {len(problems) - 1} more model(s) with config problems)" if len(problems) > 1 else ""
        raise RepositoryError(problems[0] + more)
