"""Downstream evaluation: labelled classification tasks, the fine-tune recipe, and the transfer comparison
(pretrained export vs the same architecture from random initialisation, LR picked per arm on a dev slice,
several seeds, frozen-feature probe)."""

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from runconfig.base import Section, check_path_component

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


# Adaptation methods (the NAACL 2019 transfer-learning tutorial's menu), each run for every arm:
# full: every weight fine-tuned; frozen: the body frozen, a linear probe per layer and an ELMo scalar mix of all
# layers; lora: low-rank adapters through peft (targets from the family spec); ulmfit: discriminative LRs, gradual
# unfreezing from the top, slanted triangular schedule (Howard & Ruder 2018).
Method = Literal["full", "frozen", "lora", "ulmfit"]
DEFAULT_METHODS: tuple[Method, ...] = ("full",)


class LoraSection(Section):
    """peft's LoraConfig: rank, scaling and dropout of the adapters (LoRA paper defaults for small models)."""

    r: int = Field(8, gt=0)
    alpha: int = Field(16, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    # The LR grid of LoRA runs is finetune.lr_grid times this: adapters train at ~10x full fine-tuning's LR.
    lr_scale: float = Field(10.0, gt=0)


class UlmfitSection(Section):
    """ULMFiT's fine-tuning schedule (Howard & Ruder 2018), with the paper's defaults."""

    decay: float = Field(2.6, ge=1)  # each layer group's LR is the one above's / decay
    cut_frac: float = Field(0.1, gt=0, lt=1)  # slanted triangular: share of steps spent rising
    ratio: float = Field(32, ge=1)  # slanted triangular: peak LR / lowest LR
    # Steps between unfreezing the next layer group (from the top); None: one epoch, as in the paper.
    unfreeze_every: int | None = Field(None, gt=0)


class FrozenSection(Section):
    """The frozen-body method: a logistic-regression probe per layer and an ELMo-style scalar mix."""

    mix_lr_grid: list[float] = Field(default_factory=lambda: [1e-3, 1e-2, 1e-1], min_length=1)
    mix_steps: int = Field(300, gt=0)  # full-batch Adam steps of the scalar mix and its linear head


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
    # update scaled by its parameter's RMS, no momentum; pretrain.optimizers), for models whose parameters differ
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
    # Adaptation methods, each run for every arm: full (every weight), frozen (probe per layer + ELMo scalar mix),
    # lora (peft adapters on the family's target modules, head trained and saved), ulmfit (discriminative LRs,
    # gradual unfreezing, slanted triangular schedule). full's results stay under `arms` in transfer.json.
    methods: list[Method] = Field(default_factory=lambda: list(DEFAULT_METHODS), min_length=1)
    lora: LoraSection = Field(default_factory=LoraSection)
    ulmfit: UlmfitSection = Field(default_factory=UlmfitSection)
    frozen: FrozenSection = Field(default_factory=FrozenSection)
    eval_batch_size: int = Field(64, gt=0)
    threads: int | None = None  # torch intra-op threads (None: torch's default, all cores)
    # Transfer evaluation: arms fine-tuned at once, each in its own process (small models use 2 cores better as two
    # 1-thread runs than as one 2-thread run); each worker gets `threads` or cores // workers intra-op threads.
    workers: int = Field(1, ge=1)

    @field_validator("methods")
    @classmethod
    def _methods_once(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"finetune.methods: {v} names a method twice")
        return v

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
