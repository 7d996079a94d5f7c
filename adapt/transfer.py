"""Does pretraining pay off? The export vs the same architecture from random initialisation, fine-tuned with the
HF `Trainer` on the same splits, plus a frozen-feature probe.

Protocol (ULMFiT / BERT practice, made honest about noise):
- each arm (pretrained, random) picks its learning rate from the same grid on a dev slice of the training
  split, with the first seed; the test split is never looked at for the choice;
- with that LR, each seed fine-tunes on the training split (dev excluded) and is scored on the test split;
  test accuracy is reported as mean ± sd over seeds, with the margin and Welch's t-test p-value;
- the probe: mean-pooled last hidden state of the frozen model -> logistic regression (scikit-learn).

Family-agnostic through transformers' Auto classes: `AutoModelForSequenceClassification` for encoders and
decoders, text-to-text (`AutoModelForSeq2SeqLM`, the label string as target) where the config says
`is_encoder_decoder` (T5). The random arm is `from_config` of the export's own config.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.optimization import Adafactor
from transformers.trainer_callback import PrinterCallback

from adapt.methods import frozen, lora
from adapt.methods.ulmfit import GradualUnfreezing, UlmfitTrainer
from adapt.report import method_lines, write_layer_report
from core.errors import DiskFullError, is_disk_full
from core.io import atomic_write, json_bytes
from core.layout import LOGS
from core.log import get_logger, route_third_party, verbose_requested
from core.run_layout import RunLayout
from data_pipeline.labelled import Row, TaskData, load_tasks
from pretrain.export_folder import verify_export, weights_hash
from pretrain.optimizers import PAPER_ADAFACTOR
from runconfig import RunConfig
from runconfig.finetune import FinetuneConfig

logger = get_logger(__name__)

RESULT_FILE = "transfer.json"
# A fine-tune that predicts one class for at least this share of an evaluation split, where that class is below
# COLLAPSE_LABEL_SHARE of the split's labels, has collapsed (learned the prior, not the task): it is reported as
# such, kept out of the means and the margin, and never picked as the dev-best LR.
COLLAPSE_PREDICTED_SHARE = 0.95
COLLAPSE_LABEL_SHARE = 0.80


def _log(msg: str) -> None:
    logger.info(msg)


# --- inputs ------------------------------------------------------------------------------------------------
def model_positions(config) -> int | None:
    """Tokens the model can attend to (None: relative positions, no table bound), from the family registry
    where the export's model type is a registered family (RoBERTa reserves padding_idx + 1 rows)."""
    from pretrain.families import family_names, get_family

    n = getattr(config, "max_position_embeddings", None)
    if n is None or getattr(config, "is_encoder_decoder", False):
        return None
    if config.model_type in family_names():
        return get_family(config.model_type).position_limit(n)
    return n


def resolve_max_length(ft: FinetuneConfig, config) -> int:
    limit = model_positions(config)
    if ft.max_length == "model":
        if limit is None:
            raise ValueError(
                "finetune.max_length: 'model' needs a model with a position table; give a number"
            )
        return limit
    if limit is not None and ft.max_length > limit:
        raise ValueError(
            f"finetune.max_length ({ft.max_length}) exceeds the {limit} positions of the model; "
            f"use at most {limit} (or 'model')"
        )
    return ft.max_length


def windows(ids: list[int], budget: int, ft: FinetuneConfig) -> list[list[int]]:
    """Token ids (no special tokens) -> the pieces that fit `budget`: one (truncate, head+tail) or several
    overlapping windows (sliding_window)."""
    if len(ids) <= budget:
        return [ids]
    if ft.long_inputs == "truncate":
        return [ids[:budget]]
    if ft.long_inputs == "head_tail":
        head = round(budget * ft.head_fraction)
        return [ids[:head] + ids[len(ids) - (budget - head) :]]
    stride = max(1, round(budget * ft.window_stride))
    out = [ids[i : i + budget] for i in range(0, len(ids) - budget + stride, stride)]
    return [w for w in out if w]


@dataclass
class Encoded:
    features: list[dict[str, Any]]  # one per window
    owner: np.ndarray  # example index of each window
    gold: np.ndarray  # label index per example


def special_frame(tok: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer's post-processor puts before and after a text (e.g. <s> .. </s>), found
    by encoding a probe with and without them (fast tokenizers expose no build_inputs_with_special_tokens)."""
    plain = tok("hello world", add_special_tokens=False)["input_ids"]
    full = tok("hello world", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain) :]
    raise ValueError(f"cannot locate the text inside the special-token frame of {type(tok).__name__}")


def encode(
    tok: PreTrainedTokenizerBase,
    rows: list[Row],
    labels: dict[str, int],
    max_length: int,
    ft: FinetuneConfig,
    text_to_text: bool,
) -> Encoded:
    prefix, suffix = special_frame(tok)
    budget = max_length - len(prefix) - len(suffix)
    raw = tok([r[1] for r in rows], add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    label_ids = (
        {name: tok(name, add_special_tokens=True)["input_ids"] for name in labels} if text_to_text else {}
    )
    feats, owner = [], []
    for i, (ids, row) in enumerate(zip(raw, rows, strict=True)):
        for piece in windows(ids, budget, ft):
            f = {"input_ids": prefix + piece + suffix}
            f["labels"] = label_ids[row[2]] if text_to_text else labels[row[2]]
            feats.append(f)
            owner.append(i)
    return Encoded(feats, np.asarray(owner), np.asarray([labels[r[2]] for r in rows]))


class Collator:
    """Right-pads input ids (attention mask from lengths) and, for text-to-text, the target ids with -100."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, feats: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        n = max(len(f["input_ids"]) for f in feats)
        ids = torch.full((len(feats), n), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(feats), n), dtype=torch.long)
        for i, f in enumerate(feats):
            ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
            mask[i, : len(f["input_ids"])] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        if isinstance(feats[0]["labels"], list):
            m = max(len(f["labels"]) for f in feats)
            lab = torch.full((len(feats), m), -100, dtype=torch.long)
            for i, f in enumerate(feats):
                lab[i, : len(f["labels"])] = torch.tensor(f["labels"])
            out["labels"] = lab
        else:
            out["labels"] = torch.tensor([f["labels"] for f in feats])
        return out


class _ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: list[dict[str, Any]]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


# --- models ------------------------------------------------------------------------------------------------
class Arms:
    """Builds each arm's model from one export folder: the export's weights, or its config from random init."""

    def __init__(self, model_dir: Path, labels: list[str], pad_id: int | None):
        self.model_dir = model_dir
        self.labels = labels
        self.pad_id = pad_id  # decoders without a pad token classify from the last non-pad token
        base = AutoConfig.from_pretrained(str(model_dir))
        self.text_to_text = bool(getattr(base, "is_encoder_decoder", False))
        kwargs = (
            {}
            if self.text_to_text
            else {
                "num_labels": len(labels),
                "id2label": dict(enumerate(labels)),
                "label2id": {n: i for i, n in enumerate(labels)},
            }
        )
        self.config = AutoConfig.from_pretrained(str(model_dir), **kwargs)
        self.cls = AutoModelForSeq2SeqLM if self.text_to_text else AutoModelForSequenceClassification

    def build(self, arm: str, method: str = "full", ft: FinetuneConfig | None = None) -> torch.nn.Module:
        """Called by the Trainer after it seeds torch: the head (and the random arm's body) depend on the seed.
        `lora`: the model wrapped with peft's adapters (the family's target modules)."""
        if arm == "pretrained":
            model = self.cls.from_pretrained(str(self.model_dir), config=self.config)
        elif arm == "random":
            model = self.cls.from_config(self.config)
        else:
            raise ValueError(f"finetune.arms: unknown arm {arm!r} (pretrained, random)")
        if model.config.pad_token_id is None and self.pad_id is not None:
            model.config.pad_token_id = self.pad_id
        if method == "lora":
            model = lora.wrap(model, (ft or FinetuneConfig()).lora, self.text_to_text)
        return model

    def encoder(self, arm: str) -> torch.nn.Module:
        """The body without a head, for the frozen-feature probe (the encoder of an encoder-decoder)."""
        config = AutoConfig.from_pretrained(str(self.model_dir))
        model = (
            AutoModel.from_pretrained(str(self.model_dir))
            if arm == "pretrained"
            else AutoModel.from_config(config)
        )
        return model.get_encoder() if self.text_to_text else model


# --- one fine-tune -----------------------------------------------------------------------------------------
def _device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights are: the Trainer moves a fine-tuned model to the GPU, and scoring must follow."""
    return next(model.parameters()).device


def _on(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def _predict(
    model: torch.nn.Module,
    tok,
    enc: Encoded,
    ft: FinetuneConfig,
    text_to_text: bool,
    label_ids: list[list[int]] | None,
) -> np.ndarray:
    """Predicted label index per example. Classifiers average window logits per example; text-to-text scores
    every label string (rank classification: the label with the lowest target loss), which never produces an
    out-of-label answer."""
    collate = Collator(tok.pad_token_id)
    model.eval()
    device = _device(model)
    n_labels = int(enc.gold.max(initial=0)) + 1 if label_ids is None else len(label_ids)
    scores = np.zeros((len(enc.gold), n_labels))
    with torch.no_grad():
        for s in range(0, len(enc.features), ft.eval_batch_size):
            chunk = enc.features[s : s + ft.eval_batch_size]
            owners = enc.owner[s : s + ft.eval_batch_size]
            batch = collate(chunk)
            batch.pop("labels")
            batch = _on(batch, device)
            if text_to_text:
                for j, target in enumerate(label_ids):
                    lab = torch.tensor(target, device=device).repeat(len(chunk), 1)
                    logits = model(**batch, labels=lab).logits
                    nll = torch.nn.functional.cross_entropy(
                        logits.float().transpose(1, 2), lab, reduction="none"
                    ).sum(1)
                    np.add.at(scores[:, j], owners, -nll.cpu().numpy())
            else:
                logits = model(**batch).logits.float().log_softmax(-1).cpu().numpy()
                np.add.at(scores, owners, logits)
    return scores.argmax(1)


def planned_steps(n_train: int, ft: FinetuneConfig) -> int:
    """Optimizer steps of one fine-tune: `epochs` over the training features (the Trainer's count, last partial
    batch included), raised to `min_steps`."""
    return max(math.ceil(ft.epochs * math.ceil(n_train / ft.batch_size)), ft.min_steps)


def collapse(pred: np.ndarray, gold: np.ndarray) -> dict[str, Any] | None:
    """None, or why the predictions count as collapsed: one class predicted for >= 95% of the examples while
    that class is < 80% of the gold labels (a majority-class task may legitimately be answered mostly one way)."""
    if len(pred) == 0:
        return None
    classes, counts = np.unique(pred, return_counts=True)
    top = int(classes[counts.argmax()])
    predicted = float(counts.max() / len(pred))
    label = float((gold == top).mean())
    if predicted >= COLLAPSE_PREDICTED_SHARE and label < COLLAPSE_LABEL_SHARE:
        return {"class": top, "predicted_share": round(predicted, 4), "label_share": round(label, 4)}
    return None


@dataclass
class RunScore:
    """One fine-tune's outcome per evaluation split: accuracy, and the collapse finding where it collapsed."""

    accuracy: dict[str, float]
    collapsed: dict[str, dict[str, Any]]
    steps: int  # optimizer steps taken (fewer than planned where early stopping ended the run)


class BestOnDev(TrainerCallback):
    """Dev-based checkpoint selection (the Trainer's `load_best_model_at_end` with dev accuracy as the metric):
    scores the dev split at `at_steps` and keeps a copy of the best weights (ties: the later step). Our own
    callback because the Trainer's evaluation loop scores windows, not examples, and cannot rank label strings
    for text-to-text; the copy is held in memory rather than as checkpoint folders (small models, many runs)."""

    def __init__(self, score: Callable[[torch.nn.Module], float], at_steps: set[int], patience: int = 0):
        self.score = score
        self.at_steps = at_steps
        # > 0: stop after this many scores in a row without a new best (early stopping)
        self.patience = patience
        self.best: float = -1.0
        self.best_step = 0
        self.by_step: dict[int, float] = {}
        self.weights: dict[str, torch.Tensor] | None = None
        self.stale = 0  # scores since the last strict improvement
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.at_steps:
            # _predict puts the model in eval mode; the Trainer sets train() every step
            acc = self.score(model)
            self.by_step[state.global_step] = acc
            self.stale = 0 if acc > self.best else self.stale + 1
            if acc >= self.best:
                self.best, self.best_step = acc, state.global_step
                self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if self.patience and self.stale >= self.patience:
                control.should_training_stop = True
                self.stopped_at = state.global_step
        return control


def finetune_optimizer(optim: str, lr: float) -> tuple[type[torch.optim.Optimizer], dict[str, Any]] | None:
    """The Trainer's `optimizer_cls_and_kwargs` for `finetune.optim`: adafactor is the T5 paper's (the Trainer builds
    it over its own weight-decay groups); adamw is None, the Trainer's default AdamW."""
    return (Adafactor, {"lr": lr, **PAPER_ADAFACTOR}) if optim == "adafactor" else None


def dev_eval_steps(total: int, n: int) -> set[int]:
    """`n` evaluation points evenly spaced over `total` steps, the last step always among them."""
    return {max(1, round(total * k / n)) for k in range(1, n + 1)} if n > 0 else set()


def fine_tune_once(
    arms: Arms,
    arm: str,
    tok,
    train: Encoded,
    evals: dict[str, Encoded],
    lr: float,
    seed: int,
    ft: FinetuneConfig,
    out_dir: Path,
    label_ids,
    save_model: bool = False,
    method: str = "full",
) -> RunScore:
    """One Trainer run; returns accuracy on each of `evals` and which of them it collapsed on. With
    `finetune.dev_evals` > 0 the weights scored best on `evals["dev"]` are the ones evaluated (and saved).
    `method`: full (every weight), lora (peft adapters + head; the adapter folder is what is saved) or ulmfit
    (discriminative LRs, slanted triangular schedule, gradual unfreezing)."""
    steps = planned_steps(len(train.features), ft)  # the same count as epochs give, or min_steps
    args = TrainingArguments(
        output_dir=str(out_dir),
        learning_rate=lr,
        num_train_epochs=ft.epochs,
        max_steps=steps,
        per_device_train_batch_size=ft.batch_size,
        weight_decay=ft.weight_decay,
        warmup_steps=ft.warmup_ratio,
        lr_scheduler_type="linear",
        seed=seed,
        data_seed=seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        remove_unused_columns=False,
        max_grad_norm=1.0,
    )
    select = None
    if ft.dev_evals > 0 and "dev" in evals and len(evals["dev"].gold):
        dev = evals["dev"]
        select = BestOnDev(
            lambda m: float((_predict(m, tok, dev, ft, arms.text_to_text, label_ids) == dev.gold).mean()),
            dev_eval_steps(steps, ft.dev_evals),
            ft.early_stopping_patience,
        )
    callbacks: list[TrainerCallback] = [select] if select else []
    extra: dict[str, Any] = {"optimizer_cls_and_kwargs": finetune_optimizer(ft.optim, lr)}
    trainer_cls: type[Trainer] = Trainer
    if method == "ulmfit":  # its own optimizer groups and schedule; unfreezing one group per epoch by default
        trainer_cls, extra = UlmfitTrainer, {"ulmfit": ft.ulmfit}
        per_epoch = math.ceil(len(train.features) / ft.batch_size)
        callbacks.append(GradualUnfreezing(ft.ulmfit.unfreeze_every or per_epoch))
    trainer = trainer_cls(
        model_init=lambda: arms.build(arm, method, ft),
        args=args,
        train_dataset=_ListDataset(train.features),
        data_collator=Collator(tok.pad_token_id),
        callbacks=callbacks or None,
        **extra,
    )
    # disable_tqdm makes the Trainer print every log dict to stdout (`{'train_runtime': ...}`); the result.json and
    # our one-line summaries carry what a run reports.
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    model = trainer.model
    if select is not None and select.weights is not None:
        model.load_state_dict(select.weights)
    out, collapsed, preds = {}, {}, {}
    for name, enc in evals.items():
        pred = _predict(model, tok, enc, ft, arms.text_to_text, label_ids)
        preds[name] = pred.tolist()
        out[name] = float((pred == enc.gold).mean())
        if (c := collapse(pred, enc.gold)) is not None:
            collapsed[name] = c
    if save_model:
        trainer.save_model(str(out_dir))
        tok.save_pretrained(str(out_dir))
    record: dict[str, Any] = {
        "arm": arm,
        "method": method,
        "lr": lr,
        "optim": ft.optim,
        "seed": seed,
        "accuracy": out,
        "steps": trainer.state.global_step,
        "planned_steps": steps,
    }
    if collapsed:
        record["collapsed"] = collapsed
    if save_model:  # what the saved model predicts (label index per example): a reload must give the same
        record["predictions"] = preds
    if select is not None:
        record.update(best_dev_step=select.best_step, dev_accuracy_by_step=select.by_step)
    atomic_write(out_dir / "result.json", json_bytes(record))
    return RunScore(out, collapsed, trainer.state.global_step)


# --- probe -------------------------------------------------------------------------------------------------
def _pooled(model: torch.nn.Module, tok, enc: Encoded, ft: FinetuneConfig) -> np.ndarray:
    """Mean-pooled last hidden state per example (averaged over its windows)."""
    collate = Collator(tok.pad_token_id)
    model.eval()
    feats: np.ndarray | None = None
    device = _device(model)
    counts = np.bincount(enc.owner, minlength=len(enc.gold))[:, None]
    with torch.no_grad():
        for s in range(0, len(enc.features), ft.eval_batch_size):
            batch = _on(collate(enc.features[s : s + ft.eval_batch_size]), device)
            mask = batch["attention_mask"].unsqueeze(-1).float()
            h = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).last_hidden_state.float()
            pooled = ((h * mask).sum(1) / mask.sum(1).clamp(min=1)).cpu().numpy()
            if feats is None:
                feats = np.zeros((len(enc.gold), pooled.shape[1]))
            np.add.at(feats, enc.owner[s : s + ft.eval_batch_size], pooled)
    return feats / counts


# A body whose last-layer token states all point the same way (mean pairwise cosine above this) ignores its input:
# what a pretraining run stuck on its prior produces (an ELECTRA discriminator at the replaced-fraction entropy,
# a T5 encoder on the unigram plateau). Fine-tunes from it start from a constant and tend to collapse.
DEGENERATE_TOKEN_COSINE = 0.95


def token_cosine(
    body: torch.nn.Module, tok, enc: Encoded, ft: FinetuneConfig, n_tokens: int = 512, seed: int = 0
) -> float:
    """Mean pairwise cosine similarity of the body's last-layer states over `n_tokens` real tokens drawn from the
    first examples of `enc`: near 1 when every token maps to the same vector (random init: ~0.3-0.4)."""
    collate = Collator(tok.pad_token_id)
    body.eval()
    batch = _on(collate(enc.features[: ft.eval_batch_size]), _device(body))
    with torch.no_grad():
        h = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    states = h[batch["attention_mask"].bool()].float().cpu()
    pick = torch.randperm(len(states), generator=torch.Generator().manual_seed(seed))[:n_tokens]
    x = torch.nn.functional.normalize(states[pick], dim=-1)
    n = len(x)
    return float(((x @ x.T).sum() - n) / max(1, n * n - n))


def probe(arms: Arms, arm: str, tok, train: Encoded, test: Encoded, ft: FinetuneConfig, seed: int) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    set_seed(seed)
    body = arms.encoder(arm)
    x_train, x_test = _pooled(body, tok, train, ft), _pooled(body, tok, test, ft)
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0))
    clf.fit(x_train, train.gold)
    return float((clf.predict(x_test) == test.gold).mean())


# --- the comparison ----------------------------------------------------------------------------------------
def _stats(xs: list[float]) -> dict[str, Any]:
    """Mean ± sd of the kept runs (None when no run is kept)."""
    if not xs:
        return {"mean": None, "sd": None, "values": []}
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0, "values": xs}


def pick_lr(grid: list[float], dev_acc: dict[float, float], dev_collapsed: dict[float, bool]) -> float:
    """The dev-best LR: a run that collapsed on dev is never preferred to one that did not; ties: the first."""
    return max(grid, key=lambda x: (not dev_collapsed.get(x, False), dev_acc[x], -grid.index(x)))


def aggregate_seeds(
    test_by_seed: dict[int, float], collapsed_by_seed: dict[int, dict[str, Any] | None]
) -> dict:
    """One arm's test figures over seeds: collapsed runs are listed by seed and kept out of the mean and sd."""
    kept = [acc for seed, acc in test_by_seed.items() if not collapsed_by_seed.get(seed)]
    out: dict[str, Any] = {"test_accuracy": _stats(kept)}
    bad = {str(seed): c for seed, c in collapsed_by_seed.items() if c}
    if bad:
        out["collapsed"] = bad
        out["collapsed_accuracy"] = {
            str(seed): test_by_seed[seed] for seed in collapsed_by_seed if collapsed_by_seed[seed]
        }
    return out


def compare_arms(result: dict[str, Any], probe_on: bool) -> None:
    """Margin and Welch p over the kept runs of both arms; a task with any collapsed run says so
    (`collapsed`: the arms concerned), and gets no margin when an arm has no kept run."""
    arms = result["arms"]
    result["collapsed"] = sorted(a for a, e in arms.items() if e.get("collapsed"))
    if not {"pretrained", "random"} <= set(arms):
        return
    pre, rnd = arms["pretrained"]["test_accuracy"], arms["random"]["test_accuracy"]
    if pre["mean"] is not None and rnd["mean"] is not None:
        result["margin"] = pre["mean"] - rnd["mean"]
        result["p_value"] = _welch_p(pre["values"], rnd["values"])
    if probe_on:
        result["probe_margin"] = arms["pretrained"]["probe_accuracy"] - arms["random"]["probe_accuracy"]


def _welch_p(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.stats import ttest_ind

    if statistics.pstdev(a) == 0 and statistics.pstdev(b) == 0:
        return 0.0 if statistics.fmean(a) != statistics.fmean(b) else 1.0
    p = float(ttest_ind(a, b, equal_var=False).pvalue)
    return None if math.isnan(p) else p


@dataclass
class PreparedTask:
    """One task ready to fine-tune on: both arms' model factory, the splits encoded once, (text-to-text) the
    label strings' ids, and the tokenizer and settings they were made with. Shared by `pretrain finetune` and the
    transfer evaluation so both score the same inputs."""

    arms: Arms
    max_len: int
    enc: dict[str, Any]
    label_ids: list[list[int]] | None
    tok: PreTrainedTokenizerBase
    ft: FinetuneConfig

    def fine_tune(
        self,
        arm: str,
        lr: float,
        seed: int,
        out_dir: Path,
        splits: tuple[str, ...] = ("dev", "test"),
        save_model: bool = False,
        method: str = "full",
    ) -> RunScore:
        """One fine-tune of `arm` on the training split, scored on `splits`: the one place that hands the task's
        prepared inputs to `fine_tune_once`, so `pretrain finetune` and the transfer evaluation run alike."""
        return fine_tune_once(
            self.arms,
            arm,
            self.tok,
            self.enc["train"],
            {s: self.enc[s] for s in splits},
            lr,
            seed,
            self.ft,
            out_dir,
            self.label_ids,
            save_model=save_model,
            method=method,
        )


def prepare_task(
    ft: FinetuneConfig, data: TaskData, tok: PreTrainedTokenizerBase, model_dir: Path
) -> PreparedTask:
    arms = Arms(model_dir, data.labels, tok.pad_token_id)
    max_len = resolve_max_length(ft, arms.config)
    index = {n: i for i, n in enumerate(data.labels)}
    enc = {
        s: encode(tok, rows, index, max_len, ft, arms.text_to_text)
        for s, rows in (("train", data.train), ("dev", data.dev), ("test", data.test))
    }
    label_ids = [tok(n)["input_ids"] for n in data.labels] if arms.text_to_text else None
    return PreparedTask(arms, max_len, enc, label_ids, tok, ft)


def method_lr_grid(ft: FinetuneConfig, method: str) -> list[float]:
    """The LR grid a method's dev pick runs over: LoRA's is the full grid times `finetune.lora.lr_scale`."""
    return [lr * ft.lora.lr_scale for lr in ft.lr_grid] if method == "lora" else list(ft.lr_grid)


def _evaluate_arm(
    task: PreparedTask, arm: str, out_dir: Path, name: str, method: str = "full", log=_log
) -> dict[str, Any]:
    """One arm of the protocol: the LR picked on dev with the first seed, then the other seeds at that LR, and
    the probe. Self-contained (picklable arguments), so arms can run in worker processes. Methods other than
    `full` write under out_dir/<method>/<arm>; `frozen` trains no body (frozen_arm)."""
    if method == "frozen":
        return frozen_arm(task, arm, name, log)
    ft, tok, arms, enc = task.ft, task.tok, task.arms, task.enc
    seed0 = ft.seeds[0]
    folder = out_dir / arm if method == "full" else out_dir / method / arm
    label = arm if method == "full" else f"{method}/{arm}"
    grid = method_lr_grid(ft, method)
    runs: dict[float, RunScore] = {}  # test scored now, read only for the LR the dev split picks
    for lr in grid:  # the LR is chosen on dev with the first seed; the test split is not consulted
        runs[lr] = task.fine_tune(arm, lr, seed0, folder / f"lr{lr:g}-seed{seed0}", method=method)
        log(
            f"[transfer] {name} {label:<10} lr {lr:g} seed {seed0}: dev {runs[lr].accuracy['dev']:.3f}"
            + (" COLLAPSED (one class)" if "dev" in runs[lr].collapsed else "")
        )
    dev_acc = {lr: r.accuracy["dev"] for lr, r in runs.items()}
    best = pick_lr(grid, dev_acc, {lr: "dev" in r.collapsed for lr, r in runs.items()})
    test_by_seed = {seed0: runs[best].accuracy["test"]}
    steps_by_seed = {seed0: runs[best].steps}
    collapsed_by_seed = {seed0: runs[best].collapsed.get("test")}
    for seed in ft.seeds[1:]:
        r = task.fine_tune(arm, best, seed, folder / f"lr{best:g}-seed{seed}", method=method)
        test_by_seed[seed], collapsed_by_seed[seed] = r.accuracy["test"], r.collapsed.get("test")
        steps_by_seed[seed] = r.steps
    entry: dict[str, Any] = {
        "lr": best,
        "dev_accuracy_by_lr": {f"{k:g}": v for k, v in dev_acc.items()},
        **aggregate_seeds(test_by_seed, collapsed_by_seed),
        "steps": planned_steps(len(enc["train"].features), ft),
        "steps_by_seed": {str(k): v for k, v in steps_by_seed.items()},
    }
    dev_collapsed = [f"{lr:g}" for lr, r in runs.items() if "dev" in r.collapsed]
    if dev_collapsed:
        entry["dev_collapsed_lrs"] = dev_collapsed
    if len(grid) >= 3:  # with two points every pick is an edge: the flag would say nothing
        entry["lr_at_grid_edge"] = best in (min(grid), max(grid))
        if entry["lr_at_grid_edge"]:
            log(
                f"[transfer] {name} {label} warning: dev picked lr {best:g}, the edge of "
                f"{'finetune.lr_grid' if method != 'lora' else 'finetune.lr_grid x finetune.lora.lr_scale'} "
                f"{grid}; the best LR may lie outside the grid"
            )
    if method != "full":  # the probe and the body's token cosine describe the body: reported once, by `full`
        log(f"[transfer] {name} {label:<10} lr {best:g}: test {_accuracy_text(entry)} over seeds {ft.seeds}")
        return entry
    if ft.probe:
        entry["probe_accuracy"] = probe(arms, arm, tok, enc["train"], enc["test"], ft, seed0)
    set_seed(seed0)
    entry["token_cosine"] = round(token_cosine(arms.encoder(arm), tok, enc["train"], ft), 4)
    if entry["token_cosine"] > DEGENERATE_TOKEN_COSINE:
        log(
            f"[transfer] {name} {arm} warning: the {arm} body's token states are nearly identical (mean cosine "
            f"{entry['token_cosine']:.3f}): it ignores its input, so pretraining collapsed; fine-tunes start "
            "from a constant"
        )
    log(
        f"[transfer] {name} {arm:<10} lr {best:g}: test {_accuracy_text(entry)} over seeds {ft.seeds} "
        f"({_steps_text(entry)})" + (f", probe {entry['probe_accuracy']:.3f}" if ft.probe else "")
    )
    return entry


def frozen_arm(task: PreparedTask, arm: str, name: str, log=_log) -> dict[str, Any]:
    """The frozen-body method for one arm: a probe on every layer's pooled states (seed 0's body) and the ELMo
    scalar mix, whose LR is picked on dev with the first seed and whose test accuracy is taken over every seed
    (each seed: the random arm's body and the mix's head differ)."""
    ft, enc = task.ft, task.enc
    collate = Collator(task.tok.pad_token_id)
    seed0 = ft.seeds[0]
    gold = {s: enc[s].gold for s in ("train", "dev", "test")}
    n_classes = len(task.arms.labels)
    cache: dict[str, np.ndarray] = {}

    def features(seed: int) -> dict[str, np.ndarray]:
        if arm == "pretrained" and cache:  # the same weights for every seed
            return cache
        set_seed(seed)
        body = task.arms.encoder(arm)
        x = {s: frozen.layer_features(body, collate, enc[s], ft) for s in ("train", "dev", "test")}
        if arm == "pretrained":
            cache.update(x)
        return x

    x = features(seed0)
    layers = frozen.probe_layers(x, gold)
    dev_acc, dev_collapsed, mixes = {}, {}, {}
    for lr in ft.frozen.mix_lr_grid:
        mixes[lr] = frozen.fit_scalar_mix(
            x["train"], gold["train"], n_classes, lr, ft.frozen.mix_steps, seed0
        )
        pred = frozen.predict_mix(mixes[lr], x["dev"])
        dev_acc[lr] = float((pred == gold["dev"]).mean()) if len(pred) else 0.0
        dev_collapsed[lr] = collapse(pred, gold["dev"]) is not None
    best = pick_lr(ft.frozen.mix_lr_grid, dev_acc, dev_collapsed)
    test_by_seed, collapsed_by_seed = {}, {}
    for seed in ft.seeds:
        xs = x if seed == seed0 else features(seed)
        mix = (
            mixes[best]
            if seed == seed0
            else frozen.fit_scalar_mix(xs["train"], gold["train"], n_classes, best, ft.frozen.mix_steps, seed)
        )
        pred = frozen.predict_mix(mix, xs["test"])
        test_by_seed[seed] = float((pred == gold["test"]).mean())
        collapsed_by_seed[seed] = collapse(pred, gold["test"])
    by_dev = max(layers, key=lambda r: (r["dev"] if r["dev"] is not None else -1.0, r["layer"]))
    entry: dict[str, Any] = {
        "lr": best,
        "dev_accuracy_by_lr": {f"{k:g}": v for k, v in dev_acc.items()},
        **aggregate_seeds(test_by_seed, collapsed_by_seed),
        "steps": ft.frozen.mix_steps,
        "layers": layers,
        "best_layer": by_dev["layer"],  # picked on dev
        "best_layer_test_accuracy": by_dev["test"],
        "last_layer_test_accuracy": layers[-1]["test"],
        "mix_weights": [round(float(w), 4) for w in mixes[best].scalars.detach().softmax(0)],
    }
    log(
        f"[transfer] {name} frozen/{arm:<10} scalar mix lr {best:g}: test {_accuracy_text(entry)}; layer "
        f"{by_dev['layer']} (best on dev) {by_dev['test']:.3f}, last layer {layers[-1]['test']:.3f}"
    )
    return entry


def _steps_text(entry: dict[str, Any]) -> str:
    """The optimizer steps each seed's run took ('60 steps', or '60/72/64 steps' where early stopping differed)."""
    steps = list(entry.get("steps_by_seed", {}).values()) or [entry.get("steps")]
    return f"{steps[0]} steps" if len(set(steps)) == 1 else f"{'/'.join(map(str, steps))} steps"


def _accuracy_text(entry: dict[str, Any]) -> str:
    """'0.812 ± 0.010', with the collapsed seeds named (kept out of the mean), or 'collapsed' for every seed."""
    t = entry["test_accuracy"]
    bad = entry.get("collapsed", {})
    if t["mean"] is None:
        return f"collapsed (every seed: {', '.join(bad)})"
    txt = f"{t['mean']:.3f} ± {t['sd']:.3f}"
    return txt + (f" (collapsed seeds {', '.join(bad)} left out)" if bad else "")


def _arm_worker_init(threads: int, log_dir: Path) -> None:
    """A spawned arm worker: its intra-op threads, and third-party notices (transformers' load reports) to the
    run's log file as in the parent process, not the terminal."""
    torch.set_num_threads(threads)
    route_third_party(log_dir, verbose_requested())


def evaluate_task(cfg: RunConfig, data: TaskData, model_dir: Path, out_dir: Path, log=_log) -> dict[str, Any]:
    ft = cfg.finetune
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    task = prepare_task(ft, data, tok, model_dir)
    arms, max_len = task.arms, task.max_len
    result: dict[str, Any] = {
        "task": data.name,
        "labels": data.labels,
        "splits": data.sizes(),
        "origin": data.origin,
        "max_length": max_len,
        "long_inputs": ft.long_inputs,
        "seeds": ft.seeds,
        "lr_grid": ft.lr_grid,
        "optim": ft.optim,
        "text_to_text": arms.text_to_text,
        "arms": {},
    }
    jobs = [(task, arm, out_dir, data.name, method) for method in ft.methods for arm in ft.arms]
    if ft.workers > 1 and len(jobs) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        threads = ft.threads or max(1, (torch.get_num_threads()) // min(ft.workers, len(jobs)))
        with ProcessPoolExecutor(
            min(ft.workers, len(jobs)),
            mp_context=mp.get_context("spawn"),
            initializer=_arm_worker_init,
            initargs=(threads, Path(cfg.run.root) / LOGS),
        ) as pool:
            entries = list(pool.map(_evaluate_arm, *zip(*jobs, strict=True)))
    else:
        entries = [_evaluate_arm(*job, log=log) for job in jobs]
    by_method = {m: dict(zip(ft.arms, entries[i * len(ft.arms) : (i + 1) * len(ft.arms)], strict=True))
                 for i, m in enumerate(ft.methods)}  # fmt: skip
    result["arms"] = by_method.pop("full", {})  # today's fine-tune: the figures the card and benches read
    compare_arms(result, ft.probe and bool(result["arms"]))
    if by_method:
        result["methods"] = {}
        for m, arms_of in by_method.items():
            result["methods"][m] = {"arms": arms_of}
            compare_arms(result["methods"][m], False)
    result["seconds"] = round(time.time() - t0, 1)
    return result


def run_transfer(
    cfg: RunConfig, model_dir: str | Path, out_dir: str | Path | None = None, log=_log
) -> dict[str, Any]:
    """Every configured task (each task, arm and seed in its own folder); writes `transfer.json` beside the
    export and into the output folder, and the headline figures to TensorBoard."""
    layout = RunLayout(cfg)
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"no exported model (config.json) in {model_dir}: run `python -m pretrain export` "
            "first or pass --model"
        )
    verify_export(model_dir)  # results are only ever measured on the weights the export recorded
    if cfg.finetune.threads:
        torch.set_num_threads(cfg.finetune.threads)
    tasks = load_tasks(cfg)  # every task read and checked before any training
    out = Path(out_dir) if out_dir is not None else layout.finetune
    results = [evaluate_task(cfg, t, model_dir, out / t.name, log=log) for t in tasks]
    # bound to the weights it measured: a card of other weights never publishes these figures
    report = {
        "model": str(model_dir),
        "weights_sha256": weights_hash(model_dir),
        "tasks": {r["task"]: r for r in results},
    }
    write_report(report, [out, model_dir])
    write_layer_report(report, out)  # the frozen method's probe accuracy by layer: table + PNG
    _to_tensorboard(layout.logs, results)
    return report


def write_report(report: dict[str, Any], folders: list[Path]) -> None:
    """`transfer.json` into each folder, atomically: on a full disk the previous report stays whole (a truncated
    one would drop results from the card and break `pretrain card`)."""
    data = json_bytes(report)
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            atomic_write(folder / RESULT_FILE, data)
        except OSError as e:
            if not is_disk_full(e):
                raise
            raise DiskFullError(
                f"writing {folder / RESULT_FILE} failed: the disk is full "
                f"({shutil.disk_usage(folder).free / 2**20:.1f} MiB free); the previous report there is left whole"
            ) from e


def _to_tensorboard(folder: Path, results: list[dict[str, Any]]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(folder))
    for r in results:
        for arm, e in r["arms"].items():
            if e["test_accuracy"]["mean"] is not None:
                w.add_scalar(f"transfer/{r['task']}/{arm}/test_accuracy", e["test_accuracy"]["mean"], 0)
            w.add_scalar(f"transfer/{r['task']}/{arm}/collapsed_runs", len(e.get("collapsed", {})), 0)
            if "probe_accuracy" in e:
                w.add_scalar(f"transfer/{r['task']}/{arm}/probe_accuracy", e["probe_accuracy"], 0)
        if "margin" in r:
            w.add_scalar(f"transfer/{r['task']}/margin", r["margin"], 0)
    w.close()


def format_report(report: dict[str, Any]) -> str:
    lines = []
    for name, r in report["tasks"].items():
        lines.append(
            f"{name}: {r['splits']['train']} train / {r['splits']['dev']} dev / {r['splits']['test']} test "
            f"({len(r['labels'])} labels; {r['origin']})"
        )
        for arm, e in r["arms"].items():
            n = len(e["test_accuracy"]["values"]) + len(e.get("collapsed", {}))
            probe_txt = f"   probe {e['probe_accuracy']:.3f}" if "probe_accuracy" in e else ""
            lines.append(
                f"  {arm:<10} {_accuracy_text(e)}  (lr {e['lr']:g}, {n} seeds, {_steps_text(e)}){probe_txt}"
            )
        for arm, e in r["arms"].items():
            if e.get("token_cosine", 0.0) > DEGENERATE_TOKEN_COSINE:
                lines.append(
                    f"  DEGENERATE {arm} body: token states' mean cosine {e['token_cosine']:.3f} (it ignores "
                    "its input)"
                )
        if r.get("collapsed"):
            lines.append(
                f"  COLLAPSED  {', '.join(r['collapsed'])}: a run predicted one class for >= "
                f"{COLLAPSE_PREDICTED_SHARE:.0%} of the test set; such runs are not in the means"
            )
        if "margin" in r:
            p = r.get("p_value")
            lines.append(
                f"  margin     {100 * r['margin']:+.1f} points"
                + (f" (Welch p={p:.3g})" if p is not None else "")
                + (f", probe {100 * r['probe_margin']:+.1f} points" if "probe_margin" in r else "")
            )
        lines += method_lines(r, _accuracy_text)
    return "\n".join(lines)
