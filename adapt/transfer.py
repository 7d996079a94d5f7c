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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.optimization import Adafactor
from transformers.trainer_callback import PrinterCallback

from adapt.arms import Arms
from adapt.inputs import (
    Collator,
    Encoded,
    ListDataset,
    encode,
    frame_pair_task,
    model_device,
    on_device,
    resolve_max_length,
    save_finetuned_tokenizer,
    uses_segments,
)
from adapt.probes import DEGENERATE_TOKEN_COSINE, probe, token_cosine
from adapt.report import accuracy_text, steps_text, to_tensorboard, write_layer_report, write_report
from adapt.scoring import RunScore, collapse, pick_lr, score, spearman, task_metric
from adapt.statistics import aggregate_seeds, best_against_best, compare_arms, mean_sd
from core.io import atomic_write, json_bytes
from core.layout import LOGS
from core.log import get_logger, route_third_party, verbose_requested
from core.registry import ADAPT_METHODS
from core.run_layout import RunLayout
from data_pipeline.labelled import TaskData, load_tasks
from pretrain.export.folder import verify_export, weights_hash
from pretrain.run.optimizers import PAPER_ADAFACTOR
from runconfig import RunConfig
from runconfig.finetune import FinetuneConfig, primary_method

logger = get_logger(__name__)


def _log(msg: str) -> None:
    logger.info(msg)


# --- one fine-tune -----------------------------------------------------------------------------------------
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
    out-of-label answer; regression (one output) averages the windows' predicted values."""
    collate = Collator(tok.pad_token_id)
    model.eval()
    device = model_device(model)
    regression = getattr(model.config, "problem_type", None) == "regression"
    # a column per output of the head (a split need not show every label), or per label string (text-to-text)
    n_labels = len(label_ids) if label_ids is not None else 1 if regression else int(model.config.num_labels)
    scores = np.zeros((len(enc.gold), n_labels))
    with torch.no_grad():
        for s in range(0, len(enc.features), ft.eval_batch_size):
            chunk = enc.features[s : s + ft.eval_batch_size]
            owners = enc.owner[s : s + ft.eval_batch_size]
            batch = collate(chunk)
            batch.pop("labels")
            batch = on_device(batch, device)
            if text_to_text:
                for j, target in enumerate(label_ids or []):  # text-to-text: always given
                    lab = torch.tensor(target, device=device).repeat(len(chunk), 1)
                    logits = model(**batch, labels=lab).logits
                    nll = torch.nn.functional.cross_entropy(
                        logits.float().transpose(1, 2), lab, reduction="none"
                    ).sum(1)
                    np.add.at(scores[:, j], owners, -nll.cpu().numpy())
            else:
                logits = model(**batch).logits.float()
                np.add.at(scores, owners, (logits if regression else logits.log_softmax(-1)).cpu().numpy())
    if regression:
        return scores[:, 0] / np.bincount(enc.owner, minlength=len(enc.gold)).clip(min=1)
    return scores.argmax(1)


def planned_steps(n_train: int, ft: FinetuneConfig) -> int:
    """Optimizer steps of one fine-tune: `epochs` over the training features (the Trainer's count, last partial
    batch included), raised to `min_steps`."""
    return max(math.ceil(ft.epochs * math.ceil(n_train / ft.batch_size)), ft.min_steps)


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
    method: str | None = None,
) -> RunScore:
    """One Trainer run; returns accuracy on each of `evals` and which of them it collapsed on. With
    `finetune.dev_evals` > 0 the weights scored best on `evals["dev"]` are the ones evaluated (and saved).
    `method`: a registered adaptation method (default: the primary one, every weight); its spec may wrap the model
    (LoRA), bring its own Trainer and callbacks (ULMFiT) and write more into a saved folder."""
    method = method or primary_method()
    spec = ADAPT_METHODS.get(method)
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
            lambda m: score(
                _predict(m, tok, dev, ft, arms.text_to_text, label_ids), dev.gold, arms.regression
            ),
            dev_eval_steps(steps, ft.dev_evals),
            ft.early_stopping_patience,
        )
    callbacks: list[TrainerCallback] = [select] if select else []
    extra: dict[str, Any] = {"optimizer_cls_and_kwargs": finetune_optimizer(ft.optim, lr)}
    trainer_cls: type[Trainer] = Trainer
    if spec.trainer is not None:  # its own optimizer groups, schedule or callbacks (ULMFiT)
        per_epoch = math.ceil(len(train.features) / ft.batch_size)
        trainer_cls, extra, more = spec.trainer(ft.settings_of(method), per_epoch)
        callbacks += more
    trainer = trainer_cls(
        model_init=lambda: arms.build(arm, method, ft),
        args=args,
        train_dataset=ListDataset(train.features),
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
    out, collapsed, preds, rho = {}, {}, {}, {}
    for name, enc in evals.items():
        pred = _predict(model, tok, enc, ft, arms.text_to_text, label_ids)
        preds[name] = pred.tolist()
        out[name] = score(pred, enc.gold, arms.regression)
        if arms.regression:
            rho[name] = spearman(pred, enc.gold)
        if (c := collapse(pred, enc.gold, arms.regression)) is not None:
            collapsed[name] = c
    if save_model:
        _save_folder(trainer, tok, arms, out_dir, spec.save, out)
    record: dict[str, Any] = {
        "arm": arm,
        "method": method,
        "lr": lr,
        "optim": ft.optim,
        "seed": seed,
        "metric": task_metric(arms.regression),
        "accuracy": out,  # the task's metric per split (accuracy, or Pearson's r for regression)
        **({"spearman": rho} if arms.regression else {}),
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
    return RunScore(out, collapsed, trainer.state.global_step, rho or None)


def _save_folder(
    trainer: Trainer,
    tok,
    arms: Arms,
    out_dir: Path,
    save: Callable[..., None] | None,
    scores: dict[str, float],
) -> None:
    """The fine-tuned folder: the model and the tokenizer, as transformers and peft users load them, and what the
    method's spec adds (`save`: a LoRA folder's model card naming the labels)."""
    trainer.save_model(str(out_dir))
    save_finetuned_tokenizer(tok, out_dir, arms.model_dir)
    if save is not None:
        save(out_dir, trainer.model, arms.model_dir, arms.labels, arms.regression, scores)


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
        method: str | None = None,
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
    """The task's splits encoded for the export's model. A pair task first gets a tokenizer that frames pairs with
    a separator (frame_pair_task), and a model without a segment table a tokenizer that returns no segment ids:
    `tok` is changed in place, and it is what every fine-tuned folder saves, so the folder encodes as training did."""
    arms = Arms(model_dir, data.labels, tok.pad_token_id, data.regression)
    max_len = resolve_max_length(ft, arms.config)
    if data.pair:
        frame_pair_task(tok, model_dir)
    segments = uses_segments(arms.config)
    if not segments and "token_type_ids" in tok.model_input_names:
        tok.model_input_names = [n for n in tok.model_input_names if n != "token_type_ids"]
    index = {n: i for i, n in enumerate(data.labels)}
    enc = {
        s: encode(tok, rows, index, max_len, ft, arms.text_to_text, data.regression, segments)
        for s, rows in (("train", data.train), ("dev", data.dev), ("test", data.test))
    }
    label_ids = [tok(n)["input_ids"] for n in data.labels] if arms.text_to_text else None
    return PreparedTask(arms, max_len, enc, label_ids, tok, ft)


def method_lr_grid(ft: FinetuneConfig, method: str) -> list[float]:
    """The LR grid a method's dev pick runs over: its spec's (LoRA's is the full grid times
    `finetune.lora.lr_scale`), else finetune.lr_grid."""
    spec = ADAPT_METHODS.get(method)
    return (
        list(ft.lr_grid) if spec.lr_grid is None else spec.lr_grid(list(ft.lr_grid), ft.settings_of(method))
    )


def _evaluate_arm(
    task: PreparedTask, arm: str, out_dir: Path, name: str, method: str | None = None, log=_log
) -> dict[str, Any]:
    """One arm of the protocol: the LR picked on dev with the first seed, then the other seeds at that LR, and
    the probe. Self-contained (picklable arguments), so arms can run in worker processes. Methods other than
    the primary one write under out_dir/<method>/<arm>; a method with its own protocol (`evaluate_arm`: the
    frozen body's probes) runs that instead."""
    method = method or primary_method()
    spec = ADAPT_METHODS.get(method)
    ft, tok, arms, enc = task.ft, task.tok, task.arms, task.enc
    if spec.evaluate_arm is not None:
        return spec.evaluate_arm(task, arm, name, ft.settings_of(method), log)
    seed0 = ft.seeds[0]
    folder = out_dir / arm if spec.primary else out_dir / method / arm
    label = arm if spec.primary else f"{method}/{arm}"
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
    rho_by_seed = {seed0: (runs[best].spearman or {}).get("test")}
    steps_by_seed = {seed0: runs[best].steps}
    collapsed_by_seed = {seed0: runs[best].collapsed.get("test")}
    for seed in ft.seeds[1:]:
        r = task.fine_tune(arm, best, seed, folder / f"lr{best:g}-seed{seed}", method=method)
        test_by_seed[seed], collapsed_by_seed[seed] = r.accuracy["test"], r.collapsed.get("test")
        rho_by_seed[seed] = (r.spearman or {}).get("test")
        steps_by_seed[seed] = r.steps
    entry: dict[str, Any] = {
        "lr": best,
        "dev_accuracy_by_lr": {f"{k:g}": v for k, v in dev_acc.items()},
        **aggregate_seeds(test_by_seed, collapsed_by_seed),
        "steps": planned_steps(len(enc["train"].features), ft),
        "steps_by_seed": {str(k): v for k, v in steps_by_seed.items()},
    }
    if arms.regression:  # test_accuracy holds Pearson's r; Spearman's rho beside it, over the same kept seeds
        entry["test_spearman"] = mean_sd(
            [v for s, v in rho_by_seed.items() if v is not None and not collapsed_by_seed.get(s)]
        )
    dev_collapsed = [f"{lr:g}" for lr, r in runs.items() if "dev" in r.collapsed]
    if dev_collapsed:
        entry["dev_collapsed_lrs"] = dev_collapsed
    if len(grid) >= 3:  # with two points every pick is an edge: the flag would say nothing
        entry["lr_at_grid_edge"] = best in (min(grid), max(grid))
        if entry["lr_at_grid_edge"]:
            log(
                f"[transfer] {name} {label} warning: dev picked lr {best:g}, the edge of "
                f"{spec.lr_grid_text} "
                f"{grid}; the best LR may lie outside the grid"
            )
    # the probe and the body's token cosine describe the body: reported once, by the primary method
    if not spec.primary:
        log(f"[transfer] {name} {label:<10} lr {best:g}: test {accuracy_text(entry)} over seeds {ft.seeds}")
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
        f"[transfer] {name} {arm:<10} lr {best:g}: test {accuracy_text(entry)} over seeds {ft.seeds} "
        f"({steps_text(entry)})" + (f", probe {entry['probe_accuracy']:.3f}" if ft.probe else "")
    )
    return entry


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
        "metric": task_metric(data.regression),  # what every `test_accuracy` of this task holds
        "pair": data.pair,
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
    n = len(ft.arms)
    by_method = {
        m: dict(zip(ft.arms, entries[i * n : (i + 1) * n], strict=True)) for i, m in enumerate(ft.methods)
    }
    # the primary method (full fine-tuning) keeps the task's own `arms`: the figures the card and benches read
    result["arms"] = by_method.pop(primary_method(), {})
    compare_arms(result, ft.probe and bool(result["arms"]))
    if by_method:
        result["methods"] = {}
        for m, arms_of in by_method.items():
            result["methods"][m] = {"arms": arms_of}
            compare_arms(result["methods"][m], False)
    result["primary_method"] = primary_method()
    decision = best_against_best(result)
    if decision is not None:
        result["best_against_best"] = decision
    result["seconds"] = round(time.time() - t0, 1)
    return result


# finetune.* keys that say how fast the protocol runs, not what it measures
RUNTIME_ONLY = ("workers", "threads", "eval_batch_size")


def transfer_protocol(ft: FinetuneConfig) -> dict[str, Any]:
    """The finetune settings a transfer report's figures depend on (tasks, seeds, LR grid, steps, lengths,
    methods, ...), as recorded in transfer.json: a figure is only ever compared with one measured alike."""
    return {k: v for k, v in ft.model_dump(mode="json").items() if k not in RUNTIME_ONLY}


def run_transfer(
    cfg: RunConfig, model_dir: str | Path, out_dir: str | Path | None = None, log=_log, publish: bool = True
) -> dict[str, Any]:
    """Every configured task (each task, arm and seed in its own folder); writes `transfer.json` into the output
    folder and (`publish`) beside the export, where the model card reads it, and the headline figures to
    TensorBoard."""
    layout = RunLayout(cfg)
    model_dir = Path(model_dir)
    # a local model folder (nothing is looked up on a hub), holding the weights the export recorded
    verify_export(model_dir)
    if cfg.finetune.threads:
        torch.set_num_threads(cfg.finetune.threads)
    tasks = load_tasks(cfg)  # every task read and checked before any training
    if any(t.pair for t in tasks):  # and a tokenizer that cannot separate a pair's texts refused before it
        frame_pair_task(AutoTokenizer.from_pretrained(str(model_dir)), model_dir)
    out = Path(out_dir) if out_dir is not None else layout.finetune
    results = [evaluate_task(cfg, t, model_dir, out / t.name, log=log) for t in tasks]
    # bound to the weights it measured: a card of other weights never publishes these figures
    report = {
        "model": str(model_dir),
        "weights_sha256": weights_hash(model_dir),
        "protocol": transfer_protocol(cfg.finetune),
        "tasks": {r["task"]: r for r in results},
    }
    publish_transfer(cfg, report, out, model_dir if publish else None, log)
    return report


def publish_transfer(
    cfg: RunConfig, report: dict[str, Any], out: Path, model_dir: Path | None, log=_log
) -> None:
    """transfer.json into `out` and (`model_dir` given) beside the export, the layer report, TensorBoard; and the
    export's card rewritten from it, so README.md's model-index never lags the transfer.json beside it. Only the
    run's own export is rewritten here (the card reads the run's manifest, stats and metrics); another folder gets
    a line naming the command that rewrites its card."""
    write_report(report, [out, model_dir] if model_dir is not None else [out])
    write_layer_report(report, out)  # the frozen method's probe accuracy by layer: table + PNG
    to_tensorboard(RunLayout(cfg).logs, list(report["tasks"].values()))
    if model_dir is None:
        return
    from pretrain.export.folder import TRAINING_STATE
    from pretrain.export.model_card import CARD, write_model_card

    if not (model_dir / TRAINING_STATE).is_file():  # a plain Hugging Face folder: no card of ours to rewrite
        log(
            f"[transfer] {model_dir}: no {TRAINING_STATE} (not a `pretrain export` folder), no model card rewritten"
        )
    elif Path(model_dir).resolve() == RunLayout(cfg).export.resolve():
        log(f"[transfer] {write_model_card(cfg, model_dir)}: model card rewritten with these results")
    else:
        log(
            f"[transfer] {model_dir / CARD} not rewritten ({model_dir} is not this run's export): run "
            f"`python -m pretrain card --config <its run's config> --model {model_dir}` to put these results on it"
        )
