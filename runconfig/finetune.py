"""Downstream evaluation: labelled classification tasks, the fine-tune recipe, and the transfer comparison
(pretrained export vs the same architecture from random initialisation, LR picked per arm on a dev slice,
several seeds, frozen-feature probe)."""

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.registry import ADAPT_METHODS
from runconfig.base import Section, check_path_component, unknown_key_text

LabelledFormat = Literal["auto", "csv", "tsv", "jsonl", "folder", "hf_dataset"]


Arm = Literal["pretrained", "random"]
ARMS: tuple[Arm, ...] = ("pretrained", "random")


class FinetuneTask(Section):
    """One labelled task, given the way teams hold it: explicit train/dev/test files, or a data source's
    pretraining hold-out. A split given by files is used as is; a split made here (test_fraction, dev_fraction)
    hashes example ids with the task name, never with a seed, so seeds never move the test set."""

    name: str
    source: str | None = None  # a data.sources entry whose hold-out documents carry labels
    # Files (local paths; $VARS, ~, {prefix}, {site_packages} expand): CSV (a BOM is fine), TSV, JSONL, a folder
    # with one sub-folder per label, or an HF `datasets` folder (save_to_disk).
    train: str | None = None
    dev: str | None = None
    test: str | None = None
    dataset: str | None = None  # an HF DatasetDict folder: its train / validation|dev / test splits
    format: LabelledFormat = "auto"
    text_column: str = "text"
    # Sentence-pair tasks (NLI, paraphrase, STS): the second text's column, encoded as the tokenizer's pair
    # (tokenizer(text, text_pair)); None: one text per example.
    text_pair_column: str | None = None
    label_column: str = "label"
    # classification: the label is a class name, scored by accuracy. regression: the label is a number (one
    # output, AutoModelForSequenceClassification's problem_type "regression", MSE), scored by Pearson's r (the
    # figure reported and picked on) and Spearman's rho.
    problem: Literal["classification", "regression"] = "classification"
    test_fraction: float = Field(0.3, gt=0, lt=1)  # only when no test file is given
    dev_fraction: float = Field(0.15, gt=0, lt=1)  # slice of train for picking the LR, when no dev file
    # Caps for large tasks (HF run_glue's max_train_samples / max_predict_samples): a fixed subset chosen by a hash
    # of the example id, the same for every seed; the dev slice is then taken from the capped train split.
    max_train_examples: int | None = Field(None, gt=0)
    max_test_examples: int | None = Field(None, gt=0)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        return check_path_component(v)

    @model_validator(mode="after")
    def _one_origin(self) -> "FinetuneTask":
        given = [k for k in ("source", "train", "dataset") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"finetune.tasks ({self.name}): set exactly one of source, train (with optional dev/test) "
                f"or dataset; got {given or 'none'}"
            )
        if self.source is not None and (self.dev or self.test):
            raise ValueError(f"finetune.tasks ({self.name}): dev/test files need train files, not source")
        if self.source is not None and self.text_pair_column is not None:
            raise ValueError(
                f"finetune.tasks ({self.name}).text_pair_column: a data source's documents hold one text; "
                "sentence pairs come from train/test files or a dataset"
            )
        if self.format == "folder" and self.text_pair_column is not None:
            raise ValueError(
                f"finetune.tasks ({self.name}).text_pair_column: the folder format holds one text per file; "
                "give sentence pairs as csv, tsv, jsonl or an HF dataset"
            )
        return self


# lm-evaluation-harness tasks `python -m data_pipeline eval-tasks` writes from each fine-tune task's held-out
# splits (data_pipeline/eval_tasks.py), named here so that the config can check `eval.tasks` before anything runs.
# Every such task carries the tag: `--tasks lmstack` (or eval.tasks: [lmstack]) runs them all.
HARNESS_TAG = "lmstack"


def harness_task_base(task: FinetuneTask) -> str:
    """The prefix of one fine-tune task's harness task names (`lmstack_<name>`, odd characters as underscores)."""
    return HARNESS_TAG + "_" + re.sub(r"[^A-Za-z0-9_]", "_", task.name)


def harness_task_names(task: FinetuneTask) -> dict[str, str]:
    """Harness task name -> kind (choice, cloze, ppl) of one fine-tune task. A pair or regression task gets no
    choice: its labels are not words to choose."""
    base = harness_task_base(task)
    kinds = (
        ["cloze", "ppl"]
        if task.problem == "regression" or task.text_pair_column
        else ["choice", "cloze", "ppl"]
    )
    return {f"{base}_{k}": k for k in kinds}


def primary_method() -> str:
    """The registered adaptation method whose results are each task's own `arms` (full fine-tuning): the default
    of finetune.methods, read from the specs (MethodSpec.primary) rather than written here."""
    primary = [name for name, spec in ADAPT_METHODS.items() if spec.primary]
    if len(primary) != 1:
        raise ValueError(
            f"finetune.methods: exactly one registered adaptation method must be primary, got {primary}"
        )
    return primary[0]


class FinetuneConfig(Section):
    """The fine-tune recipe shared by every task, arm and seed (HF `Trainer`)."""

    tasks: list[FinetuneTask] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    lr_grid: list[float] = Field(default_factory=lambda: [1e-4, 3e-4, 1e-3])
    epochs: float = Field(3, gt=0)
    # At least this many optimizer steps, however few the epochs give: small labelled sets need more iterations
    # than 3 epochs (Mosbach et al. 2021, "On the stability of fine-tuning BERT"); 0 = epochs alone.
    min_steps: int = Field(0, ge=0)
    batch_size: int = Field(16, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    # adamw: the Trainer's AdamW. adafactor: the T5 paper's fine-tune optimizer (transformers' Adafactor with each
    # update scaled by its parameter's RMS, no momentum; pretrain.run.optimizers), for models whose parameters differ
    # in scale by orders of magnitude, as T5's do.
    optim: Literal["adamw", "adafactor"] = "adamw"
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    # Token budget per example (special tokens included); "model" = the model's position table.
    max_length: int | Literal["model"] = 128
    # Inputs longer than max_length: head+tail keeps the first head_fraction and the end (Sun et al. 2019),
    # truncate keeps the head, sliding_window trains on every window and averages the logits per example.
    long_inputs: Literal["head_tail", "truncate", "sliding_window"] = "head_tail"
    head_fraction: float = Field(0.25, ge=0, le=1)
    window_stride: float = Field(0.5, gt=0, le=1)  # sliding_window: stride as a fraction of max_length
    # Labelled text gets the pretraining corpus's unicode repair (data.clean's `unicode` filter, its settings), so
    # fine-tuning sees the characters pretraining saw ("didn't", not "didn&#039;t"); off: the files' text as is.
    repair_text: bool = True
    # Dev-based checkpoint selection (the HF Trainer's load_best_model_at_end, metric: dev accuracy): each run scores
    # its dev split at `dev_evals` evenly spaced steps and keeps the best weights; 0 = the weights of the last step.
    dev_evals: int = Field(0, ge=0)
    # Early stopping on dev (the HF Trainer's EarlyStoppingCallback): a run ends once this many dev scores in a
    # row bring no new best, and keeps its best-on-dev weights; needs dev_evals. 0 = every run takes all its steps.
    # Each arm then trains until its own dev accuracy stops rising (a random init is not cut short).
    early_stopping_patience: int = Field(0, ge=0)
    probe: bool = True  # frozen-feature probe: mean-pooled last hidden state -> logistic regression
    arms: list[Arm] = Field(default_factory=lambda: list(ARMS), min_length=1)
    # Adaptation methods, each run for every arm: registered adaptation methods (the built-ins: full, every weight;
    # frozen, a probe per layer and an ELMo scalar mix; lora, peft adapters; ulmfit, discriminative LRs, gradual
    # unfreezing and a slanted triangular schedule), or `module.path:SPEC`. Each method's own settings are the
    # section `finetune.<method>` (see "finetune.<method>" below). The primary method's (full's) results stay
    # under `arms` in transfer.json.
    methods: list[str] = Field(default_factory=lambda: [primary_method()], min_length=1)
    eval_batch_size: int = Field(64, gt=0)
    threads: int | None = None  # torch intra-op threads (None: torch's default, all cores)
    # Transfer evaluation: arms fine-tuned at once, each in its own process (small models use 2 cores better as two
    # 1-thread runs than as one 2-thread run); each worker gets `threads` or cores // workers intra-op threads.
    workers: int = Field(1, ge=1)

    # `finetune.<method>`: a registered method's settings, kept as extra keys typed by its spec (MethodSpec.settings)
    model_config = ConfigDict(extra="allow")

    @field_validator("methods")
    @classmethod
    def _methods_once(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"finetune.methods: {v} names a method twice")
        for name in v:
            ADAPT_METHODS.get(name)  # a built-in or an outside spec; raises naming the registered ones
        return v

    @model_validator(mode="after")
    def _method_settings(self) -> "FinetuneConfig":
        """Each `finetune.<name>` key that is no field must be a registered method's settings, typed by its spec
        (a misspelled key is refused naming the method's keys); the settings of every chosen method are filled
        with their defaults, so a resolved config and transfer.json's protocol record what ran."""
        extra = self.__pydantic_extra__ if self.__pydantic_extra__ is not None else {}
        for key, value in list(extra.items()):
            if key not in ADAPT_METHODS:
                valid = [*type(self).model_fields, *(n for n, s in ADAPT_METHODS.items() if s.settings)]
                raise ValueError(f"finetune.{key}: {unknown_key_text(key, valid, 'finetune')}")
            extra[key] = _parse_settings(key, value)
        for name in self.methods:
            spec = ADAPT_METHODS.get(name)
            if spec.settings is not None and name not in extra:
                extra[name] = spec.parse_settings(None)
        return self

    def settings_of(self, method: str) -> Any:
        """The typed `finetune.<method>` settings (its defaults where the config sets none); None for a method
        that takes none."""
        extra = self.__pydantic_extra__ or {}
        return extra[method] if method in extra else ADAPT_METHODS.get(method).parse_settings(None)

    @model_validator(mode="before")
    @classmethod
    def _single_task_shorthand(cls, data: Any) -> Any:
        """`finetune: {source: bbc}` / `{path: file_or_folder}` / `{lr: x}` / `{seed: n}`: one task, one LR,
        one seed (the older single-task keys)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        task: dict[str, Any] = {}
        for k in ("source", "path"):
            if data.get(k) is not None and data.get("tasks"):
                raise ValueError(
                    f"finetune.{k} is the single-task shorthand, but finetune.tasks is set: give the "
                    f"task in finetune.tasks (e.g. finetune.tasks.0.{'source' if k == 'source' else 'train'})"
                )
        if data.get("source") is not None:
            task = {"name": data["source"], "source": data["source"]}
        elif data.get("path") is not None:
            task = {"name": "task", "train": data["path"]}
        data.pop("source", None)
        data.pop("path", None)
        if "test_fraction" in data:
            task["test_fraction"] = data.pop("test_fraction")
        if task.get("name") and not data.get("tasks"):
            data["tasks"] = [task]
        for one, many in (("lr", "lr_grid"), ("seed", "seeds")):
            if one in data:
                if many in data:
                    raise ValueError(f"finetune.{one} and finetune.{many} are both set: keep finetune.{many}")
                data[many] = [data.pop(one)]
        return data

    @model_validator(mode="after")
    def _valid(self) -> "FinetuneConfig":
        if not self.lr_grid:
            raise ValueError("finetune.lr_grid is empty: give at least one learning rate")
        if any(lr <= 0 for lr in self.lr_grid):
            raise ValueError(f"finetune.lr_grid: learning rates must be > 0, got {self.lr_grid}")
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"finetune.tasks: duplicate task names {names}")
        if self.early_stopping_patience and not self.dev_evals:
            raise ValueError(
                "finetune.early_stopping_patience needs finetune.dev_evals > 0 (the dev scores it watches)"
            )
        if isinstance(self.max_length, int) and self.max_length < 8:
            raise ValueError(f"finetune.max_length ({self.max_length}) must be >= 8")
        return self


def _parse_settings(method: str, value: Any) -> Any:
    """One method's `finetune.<method>` section against its spec, each refusal naming the key and the method."""
    spec = ADAPT_METHODS.get(method)
    if spec.settings is None:
        raise ValueError(f"finetune.{method}: adaptation method '{method}' takes no settings (got {value!r})")
    if isinstance(value, spec.settings):
        return value
    if not isinstance(value, dict):
        raise ValueError(
            f"finetune.{method}: the settings of adaptation method '{method}' are a mapping, got {value!r}"
        )
    try:
        return spec.parse_settings(value)
    except ValidationError as e:
        raise ValueError(
            "; ".join(_settings_error(method, spec.settings, err) for err in e.errors())
        ) from None


def _settings_error(method: str, settings: type[BaseModel], err: Any) -> str:
    """One pydantic error of `finetune.<method>` as a line naming the key (a settings class's own check, such as a
    removed key's, already names it)."""
    own = err.get("ctx", {}).get("error")
    if err["type"] == "value_error" and str(own).startswith(f"finetune.{method}"):
        return str(own)
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"finetune.{method}.{where}: not a key of adaptation method '{method}' (its keys: {', '.join(settings.model_fields)})"
    return f"finetune.{method}.{where}: {err['msg']} (adaptation method '{method}')"
