"""The exported folder's model card (README.md) in the form the Hugging Face Hub reads.

The YAML header carries the Hub's metadata: license, language, datasets, `pipeline_tag`, and a `model-index`
with the held-out perplexity (the last eval row of logs/metrics.jsonl) and, when `transfer.json` lies beside
the export (written by `python -m adapt transfer`), the fine-tuned vs random-init accuracies. The body says in
plain words what data, cleaning, tokens, recipe and compute produced the model, and how to use it. Shard hashes
and the full config go to files beside the card (`data_manifest.json`, `resolved_config.yaml`), not into it.

`write_model_card` reads everything from the run and export folders, so it can be re-run after `transfer`
(`python -m pretrain card --config C`).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from core.layout import CLEAN_STATS, RESOLVED_CONFIG, TOKEN_MANIFEST
from core.registry import ADAPT_METHODS
from core.run_layout import RunLayout
from data_pipeline.objectives import get_objective
from pretrain.export.card_lm_eval import bound_lm_eval, lm_eval_card
from pretrain.export.folder import TRAINING_STATE, weights_hash
from runconfig import RunConfig
from runconfig.finetune import primary_method
from runconfig.load import to_dict

logger = logging.getLogger(__name__)

CARD = "README.md"
MANIFEST_FILE = "data_manifest.json"
CONFIG_FILE = RESOLVED_CONFIG
TRANSFER_FILE = "transfer.json"

# The Hub's pipeline tag, the eval task name and the Auto class of the usage snippet, by the family's task
# (its registered spec decides, so a new family needs no entry here). Every tag exists in transformers 4.40
# through 5.x: 5.x removed text2text-generation (and translation, summarization), so a seq2seq export is tagged
# text-generation, the Hub's category for generative text models, and its snippet calls generate() itself;
# ELECTRA's discriminator has no LM pipeline, its encoder serves feature-extraction.
TASKS = {
    "masked_lm": ("fill-mask", "Masked language modeling", "AutoModelForMaskedLM"),
    "causal_lm": ("text-generation", "Causal language modeling", "AutoModelForCausalLM"),
    # the Hub's tag for text-to-text models: 4.x's pipeline of that name runs it; text-generation loads
    # AutoModelForCausalLM and never ran one (5.x has no seq2seq pipeline: the usage calls generate())
    "seq2seq": ("text2text-generation", "Span corruption (text-to-text)", "AutoModelForSeq2SeqLM"),
    "token_detection": ("feature-extraction", "Replaced-token detection", "AutoModel"),
}


def card_task(family: str, objective: str | None = None) -> str:
    """The export's task (masked_lm | causal_lm | seq2seq | token_detection): the objective's where it sets one
    (replaced-token detection exports a discriminator whatever the family), else the family's registered task."""
    from pretrain.families import get_family

    own = get_objective(objective).card_task if objective is not None else None
    return own if own is not None else get_family(family).task


def _rtd_text(cfg: RunConfig) -> str:
    """What replaced-token detection trained, for the card: the generator beside the discriminator, the loss."""
    from pretrain.families.shapes import generator_shape
    from pretrain.objectives.electra import ElectraOptions

    opts = ElectraOptions.model_validate(cfg.objective.options)
    g = generator_shape(cfg.model.hidden_size, cfg.model.num_layers, opts)
    return (
        f"Trained by replaced-token detection (RTD, ELECTRA: Clark et al. 2020): a {cfg.model.family} generator "
        f"{g['hidden_size']} wide ({opts.generator_hidden_fraction:g} of the discriminator's width) sharing its "
        f"embeddings filled {cfg.objective.mlm_probability:.0%} of the tokens with samples at temperature "
        f"{opts.temperature:g}, and the discriminator labelled every token original or replaced; loss = generator "
        f"MLM + {opts.discriminator_weight:g} x discriminator BCE"
        + (
            f" + {opts.contrastive_weight:g} x COCO-LM's sequence-contrastive loss (Meng et al. 2021) between "
            f"the discriminator's mean-pooled states of each corrupted sequence and of a {opts.contrastive_crop:.0%} "
            f"crop of its original, temperature {opts.contrastive_temperature:g}"
            if opts.contrastive_weight > 0
            else ""
        )
        + ". This folder is the discriminator."
    )


def median_speed(metrics_file: Path) -> tuple[float, float] | None:
    """(tokens/s, MFU) medians over the logged training rows."""
    import statistics

    if not metrics_file.is_file():
        return None
    rows = [json.loads(x) for x in metrics_file.read_text().splitlines() if x.strip().startswith("{")]
    tps = [r["tokens_per_s"] for r in rows if r.get("split") == "train" and "tokens_per_s" in r]
    mfu = [r.get("mfu", 0.0) for r in rows if r.get("split") == "train" and "tokens_per_s" in r]
    return (statistics.median(tps), statistics.median(mfu)) if tps else None


def held_out_perplexity(metrics_file: Path, step: int | None) -> tuple[float, int] | None:
    """(perplexity, step) of the last eval row at or before the exported step."""
    if not metrics_file.is_file():
        return None
    best = None
    for line in metrics_file.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (
            row.get("split") == "eval"
            and "perplexity" in row
            and (step is None or row.get("step", 0) <= step)
        ):
            best = (float(row["perplexity"]), int(row.get("step", 0)))
    return best


def eval_row_sources(metrics_file: Path, step: int) -> list[str] | None:
    """The sources the eval row at `step` measured (its `perplexity/<source>` keys): a source with no held-out
    samples has none. None where the row names no source (older rows: the card then lists every source)."""
    if not metrics_file.is_file():
        return None
    found: list[str] | None = None
    for line in metrics_file.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("split") == "eval" and row.get("step") == step and "perplexity" in row:
            found = [k.split("/", 1)[1] for k in row if k.startswith("perplexity/")] or None
    return found


def _usage(task: str, auto_cls: str, repo: str, mask: str | None, generator: bool = False) -> str:
    if task == "masked_lm":
        call = f'fill("The company said its shares {mask} on Tuesday.")'
        return (
            f'from transformers import pipeline\n\nfill = pipeline("fill-mask", model="{repo}")\nprint({call})\n'
            f'\n# fine-tune: AutoModelForSequenceClassification.from_pretrained("{repo}", num_labels=N)'
        )
    if task == "causal_lm":
        return (
            f'from transformers import AutoTokenizer, {auto_cls}\n\ntok = AutoTokenizer.from_pretrained("{repo}")'
            f'\nmodel = {auto_cls}.from_pretrained("{repo}")\n'
            'batch = tok(["The company said", "Shares in"], padding=True, return_tensors="pt")  # left padding\n'
            "out = model.generate(**batch, max_new_tokens=20, do_sample=False)\n"
            "print(tok.batch_decode(out, skip_special_tokens=True))"
        )
    if task == "token_detection":
        return (
            f"from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer\n\n"
            f'tok = AutoTokenizer.from_pretrained("{repo}")\nmodel = AutoModel.from_pretrained("{repo}")\n'
            f'# fine-tune: AutoModelForSequenceClassification.from_pretrained("{repo}", num_labels=N)'
            + (
                f'\n# the generator trained beside it: AutoModelForMaskedLM.from_pretrained("{repo}", '
                'subfolder="generator")'
                if generator
                else ""
            )
        )
    return (
        f'from transformers import AutoTokenizer, {auto_cls}\n\ntok = AutoTokenizer.from_pretrained("{repo}")\n'
        f'model = {auto_cls}.from_pretrained("{repo}")\n'
        'batch = tok(["The company said its <extra_id_0> rose on Tuesday."], return_tensors="pt")\n'
        "out = model.generate(**batch, max_new_tokens=10)\nprint(tok.batch_decode(out))"
    )


def _accuracy(t: dict[str, Any]) -> str:
    """mean ± sd (n seeds); no sd from a single seed."""
    n = len(t.get("values", [])) or 1
    sd = f" ± {t.get('sd', 0.0):.3f}" if n >= 2 else ""
    return f"{t['mean']:.3f}{sd} ({n} seed{'s' if n != 1 else ''})"


def _arm_cell(e: dict[str, Any] | None) -> str:
    if e and e["test_accuracy"].get("mean") is None:  # every seed collapsed (adapt.transfer)
        return "collapsed"
    return _accuracy(e["test_accuracy"]) if e else "n/a"


def margin_text(margin: float | None, metric: str) -> str:
    """A margin in the metric's own units: accuracy in points (x100), a correlation as a difference of r."""
    if margin is None:
        return "n/a"
    return f"{100 * margin:+.1f} points" if metric == "accuracy" else f"{margin:+.3f}"


def _transfer_row(name: str, metric: str, method: str, arms: dict[str, Any], margin: float | None) -> str:
    """One body row: a task, its metric, one adaptation method, both arms (with their probes) and the margin."""
    row = [name, METRIC_TEXT.get(metric, metric), method_text(method)]
    for arm in ("pretrained", "random"):
        e = arms.get(arm)
        row.append(_arm_cell(e))
        row.append(f"{e['probe_accuracy']:.3f}" if e and "probe_accuracy" in e else "n/a")
    row.append(margin_text(margin, metric))
    return "| " + " | ".join(row) + " |"


def best_against_best_lines(report: dict[str, Any] | None) -> list[str]:
    """The card's headline: per task, the best adaptation method from this model against the best from random
    init, each picked on dev (adapt/statistics.py best_against_best)."""
    out = []
    for name, r in sorted((report or {}).get("tasks", {}).items()):
        bb = r.get("best_against_best")
        if not bb:
            continue
        metric = r.get("metric", "accuracy")
        p = bb.get("p_value")
        out.append(
            f"- **{name}**: {method_text(bb['pretrained']['method'])} from this model {bb['pretrained']['test']:.3f} "
            f"against {method_text(bb['random']['method'])} from random init {bb['random']['test']:.3f}, "
            f"{margin_text(bb['margin'], metric)}" + (f" (Welch p={p:.3g})" if p is not None else "")
        )
    if not out:
        return []
    return [
        "Best against best (each side's best adaptation method, picked on dev; test metric):",
        "",
        *out,
        "",
    ]


def _transfer_results(report: dict[str, Any]) -> tuple[list[EvalResult], list[str]]:
    """This model's eval results (the fine-tuned-from-this-model arm and its probe) and the body's table rows, a
    row per task and adaptation method, where the random-init arm appears as the baseline: it is not this model's
    result."""
    results, lines = [], []
    for name, r in sorted(report.get("tasks", {}).items()):
        metric = r.get("metric", "accuracy")
        common: dict[str, Any] = {
            "task_type": "text-classification",
            "task_name": "Text regression" if metric == "pearsonr" else "Text classification",
            "dataset_type": name,
            "dataset_name": name,
            "dataset_split": "test",
        }
        by_method = {primary_method(): (r.get("arms", {}), r.get("margin"))}
        by_method |= {m: (v.get("arms", {}), v.get("margin")) for m, v in r.get("methods", {}).items()}
        for method, (method_arms, margin) in by_method.items():
            lines.append(_transfer_row(name, metric, method, method_arms, margin))
            results += _method_results(common, metric, method, method_arms.get("pretrained"))
    return results, lines


def method_text(method: str) -> str:
    """What an adaptation method's result is called on the card and in the transfer report: its spec's own
    description, or its name where the method is no longer registered (a transfer.json of an outside plug-in)."""
    return ADAPT_METHODS.get(method).description if method in ADAPT_METHODS else method


METRIC_TEXT = {"accuracy": "accuracy", "pearsonr": "Pearson r", "spearmanr": "Spearman rho"}


def _method_results(
    common: dict[str, Any], metric: str, method: str, mine: dict[str, Any] | None
) -> list[EvalResult]:
    """One task's results for one method, this model's (pretrained) arm: the task's metric (accuracy, or Pearson's r
    and Spearman's rho for regression) over seeds, and, for `full`, the last-layer linear probe. An arm whose every
    seed collapsed has no result."""
    if not mine or mine["test_accuracy"].get("mean") is None:
        return []
    figures = [(metric, mine["test_accuracy"])]
    if metric == "pearsonr" and mine.get("test_spearman", {}).get("mean") is not None:
        figures.append(("spearmanr", mine["test_spearman"]))
    how = method_text(method)
    out = []
    for kind, t in figures:
        n = len(t.get("values", [])) or 1
        out.append(
            EvalResult(
                **common,
                metric_type=kind,
                metric_value=round(float(t["mean"]), 4),
                metric_name=f"Test {METRIC_TEXT[kind]}, {how} (mean of {n} seed{'s' if n != 1 else ''})",
                metric_config=method,
            )
        )
    if "probe_accuracy" in mine:  # the primary method's alone
        out.append(
            EvalResult(
                **common,
                metric_type=metric,
                metric_value=round(float(mine["probe_accuracy"]), 4),
                metric_name=f"Linear probe {METRIC_TEXT[metric]} (frozen features, last layer)",
                metric_config="probe",
            )
        )
    return out


def _warmup_text(plan: dict[str, Any], cfg: RunConfig) -> str:
    """The warmup as the schedule ran it: by elapsed time in a time-budget run, in steps otherwise."""
    budget = plan.get("budget_s")
    if budget:
        frac = float(plan.get("warmup_fraction") or 0.0)
        text = (
            f"warmup over the first {frac:.0%} of a {budget / 60:g}-minute budget ({frac * budget:.0f} s), "
            f"then {cfg.schedule.decay} decay by elapsed time"
        )
        return text + (f" ({plan['phases']})" if cfg.schedule.decay == "wsd" and plan.get("phases") else "")
    if plan.get("phases"):  # warmup, stable and decay in steps
        return str(plan["phases"])
    return f"{plan.get('warmup_steps', cfg.schedule.warmup)} warmup steps and {cfg.schedule.decay} decay"


def _speed_text(cfg: RunConfig, speed: tuple[float, float]) -> str:
    """Throughput, and MFU only against a stated peak (a CPU matmul probe is no peak a reader can compare)."""
    out = f"- Throughput {speed[0]:,.0f} tokens/s (median of the logged steps)"
    peak = cfg.logging.peak_flops
    if peak:
        return (
            out
            + f"; MFU {speed[1]:.1%} of a stated peak of {peak / 1e12:g} TFLOP/s per rank (logging.peak_flops)"
        )
    return out + (
        "; MFU not reported: its denominator was a matmul probe on this host, not a published peak "
        "(set logging.peak_flops)"
    )


def _cleaning_text(cfg: RunConfig, clean_stats: dict[str, Any] | None) -> str:
    """The card's "Cleaning:" line: the quality filters and language ID, PII redaction and URL blocklists where a
    source ran them, the n-gram decontamination where the clean stage indexed evaluation text (its report says;
    without one, where the config would), and deduplication."""
    clean = cfg.data.clean
    per_source = [cfg.data.clean_for(s.name) for s in cfg.data.sources]
    filters = [f for f in ("c4", "gopher_quality", "gopher_repetition") if getattr(clean, f).enabled]
    steps = [f"{', '.join(filters) or 'no'} filters"]
    if clean.langid.enabled:
        steps.append(f"language ID ({', '.join(clean.langid.languages)})")
    if any(c.pii.enabled for c in per_source):
        steps.append(f"PII redaction ({', '.join(clean.pii.kinds)})")
    if any(c.url.active() for c in per_source):
        steps.append("URL blocklists")
    dc = cfg.data.decontaminate
    ran = (clean_stats or {}).get("decontamination")
    if ran is not None and ran.get("enabled") and ran.get("ngrams"):
        steps.append(f"{ran['n']}-gram decontamination against {', '.join(ran.get('eval_sets', {}))}")
    elif ran is None and dc.enabled and ((dc.tasks and cfg.finetune.tasks) or dc.sources):
        steps.append(f"{dc.n}-gram decontamination against the evaluation text")
    dedup = [
        x
        for x, on in (
            ("exact", cfg.data.dedup.exact),
            ("MinHash near-duplicate", cfg.data.dedup.minhash.enabled),
        )
        if on
    ]
    return f"Cleaning: {', '.join(steps)}; deduplication: {', '.join(dedup) or 'none'}."


def _training_data_text(
    cfg: RunConfig, manifest: dict[str, Any] | None, clean_stats: dict[str, Any] | None
) -> list[str]:
    """The card's per-source lines: documents kept of those read, tokens, the share held out of pretraining."""
    per_src_tokens = {k: v.get("tokens") for k, v in (manifest or {}).get("sources", {}).items()}
    stats = (clean_stats or {}).get("per_source", {})
    body: list[str] = []
    body += ["## Training data", ""]
    for s in cfg.data.sources:
        st = stats.get(s.name, {})
        kept = (
            f"{st['kept']:,} of {st['read']:,} documents kept"
            if "kept" in st and "read" in st
            else "documents"
        )
        tok = per_src_tokens.get(s.name)
        held = f"; {s.holdout_fraction:.0%} held out of pretraining by id hash" if s.holdout_fraction else ""
        body.append(
            f"- **{s.name}** ({s.format}, weight {s.weight:g}): {kept}"
            + (f", {tok:,} tokens" if isinstance(tok, int) else "")
            + held
        )
    return body


def _evaluation_text(
    cfg: RunConfig, task: str, ppl: tuple[float, int] | None, transfer_rows: list[str], parity: float | None
) -> list[str]:
    """The card's evaluation lines: held-out perplexity (or why there is none), the transfer table, export parity."""
    body: list[str] = []
    if ppl is not None:
        body.append(
            f"Held-out perplexity: **{ppl[0]:.2f}** (step {ppl[1]}; {cfg.loader.eval_fraction:.0%} of the "
            "packed token stream never trained on)."
        )
    elif task == "token_detection":
        body.append(
            "Held-out perplexity: none (this head's loss is not a language model's likelihood; "
            "logs/metrics.jsonl has the training and eval losses)."
        )
    else:
        body.append("Held-out perplexity: not measured (no eval rows in logs/metrics.jsonl).")
    if transfer_rows:
        body += [
            "",
            "Downstream adaptation (each task's test metric: accuracy, or Pearson r for a regression task; "
            "mean, ± sd where there are 2 or more seeds), a row per adaptation method. The random-init arm "
            "(same architecture and adaptation, no pretraining) is the baseline, not a result of this model:",
            "",
            "| task | metric | method | from this model | its linear probe | random init (baseline) "
            "| baseline probe | margin |",
            "|---|---|---|---|---|---|---|---|",
            *transfer_rows,
        ]
    else:
        body.append(
            "Downstream transfer: not run yet (`python -m adapt transfer`, then `python -m pretrain card`)."
        )
    if parity is not None:
        body.append(f"\nExport parity: max |logit difference| vs the training engine {parity:.3g}.")
    return body


def _origin_lines(state: dict[str, Any]) -> list[str]:
    """Where the weights came from, when not from one run from scratch: continued pretraining, a decay branch,
    a merge of checkpoints."""
    lines: list[str] = []
    started = state.get("init_from")
    if started:  # continued pretraining: the card says from what, as the literature's DAPT models do
        prior = (
            f" (step {started['step']}, {started['tokens_seen']:,} tokens)"
            if "tokens_seen" in started
            else ""
        )
        lines += [
            "",
            f"Continued pretraining from `{started['path']}`{prior}, weights sha256 "
            f"`{started['weights_sha256'][:16]}…`; its tokenizer is this model's.",
        ]
    branch = state.get("decay_branch")
    if branch:  # `pretrain decay`: a cool-down of the main run, not a run of its own
        cooled = f"a {branch['steps']}-step {branch['decay_shape']} cool-down from step {branch['from_step']}"
        lines += ["", f"A decay branch: {cooled} of the warmup-stable-decay run in `{branch['run']}`."]
    merged = state.get("merged_from")
    if merged:  # `pretrain export --merge-last K`: not one checkpoint's weights
        lines += [
            "",
            f"Its weights are the mean of {len(merged)} checkpoints' ({', '.join(merged)}), merged at export.",
        ]
    return lines


def _recipe_lines(
    cfg: RunConfig,
    state: dict[str, Any],
    manifest: dict[str, Any] | None,
    clean_stats: dict[str, Any] | None,
    speed: tuple[float, float] | None,
) -> list[str]:
    """The card's data, recipe and compute sections, up to the evaluation heading."""
    tokens_seen, steps = state.get("tokens_seen"), state.get("step")
    lc, ds = cfg.launch, cfg.deepspeed
    plan = state.get("plan") or {}
    totals = (manifest or {}).get("totals", {})
    body: list[str] = []
    body += _training_data_text(cfg, manifest, clean_stats)
    body += [
        "",
        _cleaning_text(cfg, clean_stats),
        f"Tokenizer: {cfg.tokenizer.type} trained on the cleaned corpus, vocabulary {cfg.tokenizer.vocab_size:,}"
        + (
            f"; corpus: {totals['tokens']:,} tokens in {totals.get('docs', 0):,} documents"
            if "tokens" in totals
            else ""
        )
        + ".",
        "",
        "## Training recipe",
        "",
        f"- Objective `{cfg.objective.type}`, packing `{cfg.packing.mode}`, sequence length {cfg.packing.seq_len}",
        f"- Global batch {cfg.batch.global_batch_size} sequences, {steps} steps, {tokens_seen:,} tokens seen"
        if isinstance(tokens_seen, int)
        else f"- Global batch {cfg.batch.global_batch_size} sequences, {steps} steps",
        f"- Optimizer {cfg.optim.name}, peak LR {plan.get('peak_lr', cfg.optim.lr):g} with {_warmup_text(plan, cfg)}, "
        f"weight decay {cfg.optim.weight_decay}; precision {ds.precision}",
        "",
        "## Compute",
        "",
        f"- {lc.nodes} node(s) × {lc.procs_per_node} rank(s), backend {lc.backend}, DeepSpeed ZeRO stage {ds.zero_stage}",
        *([_speed_text(cfg, speed)] if speed else []),
        "",
        "## Evaluation",
        "",
    ]
    return body


def render_model_card(
    cfg: RunConfig,
    export_dir: Path,
    state: dict[str, Any],
    model_config: dict[str, Any],
    manifest: dict[str, Any] | None,
    clean_stats: dict[str, Any] | None,
    ppl: tuple[float, int] | None,
    transfer: dict[str, Any] | None,
    mask_token: str | None = None,
    speed: tuple[float, float] | None = None,
    ppl_sources: list[str] | None = None,
    lm_eval: dict[str, Any] | None = None,
) -> str:
    task = card_task(cfg.model.family, cfg.objective.type)
    pipeline_tag, task_name, auto_cls = TASKS[task]
    name = cfg.export.model_name or cfg.run.name
    repo = cfg.export.repo_id or f"path/to/{export_dir.name}"
    sources = cfg.data.sources
    datasets = list(cfg.export.datasets) or [s.paths[0] for s in sources if s.format == "hf_dataset"]
    languages = list(
        cfg.export.language or (cfg.data.clean.langid.languages if cfg.data.clean.langid.enabled else [])
    )

    results: list[EvalResult] = []
    if task == "token_detection":
        ppl = None  # a head with no LM pipeline (ELECTRA: MLM + lambda x BCE): its eval loss is no perplexity
    if ppl is not None:
        results.append(
            EvalResult(
                task_type=pipeline_tag,
                task_name=task_name,
                dataset_type=f"{cfg.run.name}-heldout",
                dataset_name=f"Held-out {cfg.loader.eval_fraction:.0%} of the pretraining token stream "
                f"({', '.join(ppl_sources or [s.name for s in sources])})",
                dataset_split="validation",
                metric_type="perplexity",
                metric_value=round(ppl[0], 3),
                metric_name=f"Held-out perplexity (step {ppl[1]})",
            )
        )
    transfer_results, transfer_rows = _transfer_results(transfer) if transfer else ([], [])
    harness_results, harness_lines = lm_eval_card(lm_eval) if lm_eval else ([], [])
    results += transfer_results + harness_results

    data = ModelCardData(
        license=cfg.export.license,
        language=languages or None,
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        datasets=datasets or None,
        model_name=name if results else None,
        eval_results=results or None,
        tags=[
            cfg.model.family,
            cfg.objective.type.replace("_", "-"),
            "continued-pretraining" if state.get("init_from") else "pretrained-from-scratch",
            "lmstack",
            "deepspeed",
            *cfg.export.tags,
        ],
    )
    min_tf = _min_transformers(cfg.model.family)

    n_params = state.get("n_params")
    ds = cfg.deepspeed

    body = [f"# {name}", ""]
    body.append(
        f"A {cfg.model.family} ({cfg.model.size}, {n_params:,} parameters) language model pretrained from scratch with "
        f"{cfg.objective.type.replace('_', ' ')} on {len(sources)} source(s) by lmstack (DeepSpeed ZeRO-{ds.zero_stage})."
        if isinstance(n_params, int)
        else f"A {cfg.model.family} ({cfg.model.size}) model pretrained from scratch."
    )
    if state.get("init_from"):
        body[-1] = body[-1].replace("pretrained from scratch", "continued from existing weights")
    body += _origin_lines(state)
    if cfg.objective.spec.card_task == "token_detection":  # RTD, whichever family
        body += ["", _rtd_text(cfg)]
    body += [
        "",
        "## Usage",
        "",
        "```python",
        _usage(task, auto_cls, repo, mask_token, (export_dir / "generator").is_dir()),
        "```",
        "",
    ]
    body += [
        f"Loads with transformers >={min_tf} (the oldest release the compat test loads it in) and 5.x; "
        f"tokenizer class `{state.get('tokenizer_class', '?')}`." + _pair_text(state.get("pair_separator")),
        "",
    ]
    lora = _lora_modules(cfg.model.family)
    if lora:
        body += [
            f"LoRA with peft: peft has no default target modules for `{cfg.model.family}`; pass "
            f"`LoraConfig(target_modules={list(lora)})`.",
            "",
        ]

    body += _recipe_lines(cfg, state, manifest, clean_stats, speed)
    body += best_against_best_lines(transfer)
    body += _evaluation_text(cfg, task, ppl, transfer_rows, state.get("parity_max_abs_diff")) + harness_lines
    body += [
        "",
        "## Files",
        "",
        f"- `{MANIFEST_FILE}`: token shards with their sha256 (the exact data the model saw)",
        f"- `{CONFIG_FILE}`: the full resolved run configuration",
        "- `training_state.json`: step, tokens seen, final loss, the checkpoint it came from",
    ]
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body) + "\n")
    return str(card)


def pair_separator(export_dir: Path) -> str | None:
    """What the export's own tokenizer puts between a pair's two texts (`tokenizer(a, b)`), read from the folder so
    the card says what it does ('' for nothing; None where the folder has no fast tokenizer to ask)."""
    if not (export_dir / "tokenizer.json").is_file():
        return None
    from transformers import AutoTokenizer

    from data_pipeline.tokenizers import pair_frame

    tok = AutoTokenizer.from_pretrained(str(export_dir))
    frame = pair_frame(tok)
    return None if frame is None else "".join(tok.convert_ids_to_tokens(frame[1]))


def _pair_text(sep: str | None) -> str:
    """The card's sentence on pairs: what `tokenizer(a, b)` of this folder does (issue 66: no stale text)."""
    if sep is None:
        return ""
    if not sep:
        return (
            " Sentence pairs: `tokenizer(a, b)` puts nothing between the two texts; `pretrain finetune` adds the "
            "end-of-text token there, and its fine-tuned folders save that pair template."
        )
    return f" Sentence pairs: `tokenizer(a, b)` puts `{sep}` between the two texts, as `pretrain finetune` trains."


def _lora_modules(family: str) -> tuple[str, ...]:
    from pretrain.families import get_family

    return get_family(family).lora_target_modules


def _min_transformers(family: str) -> str:
    from pretrain.families import get_family

    return get_family(family).min_transformers


def bound_transfer(export_dir: str | Path) -> dict[str, Any] | None:
    """transfer.json when it was measured on these very weights, else None (an earlier export's results, or
    results without a weight hash, are dropped with a warning instead of being published on this card)."""
    path = Path(export_dir) / TRANSFER_FILE
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    if report.get("weights_sha256") != weights_hash(export_dir):
        logger.warning(
            "%s: measured on other weights than %s holds (weight hash %s, these %s): left off the card; "
            "rerun `python -m adapt transfer`",
            path,
            export_dir,
            report.get("weights_sha256"),
            weights_hash(export_dir),
        )
        return None
    return report


def write_model_card(cfg: RunConfig, export_dir: str | Path) -> Path:
    """(Re)write README.md, data_manifest.json and resolved_config.yaml in the export folder."""
    export_dir = Path(export_dir)
    layout = RunLayout(cfg)
    state = json.loads((export_dir / TRAINING_STATE).read_text())
    model_config = json.loads((export_dir / "config.json").read_text())
    tok_conf_path = export_dir / "tokenizer_config.json"
    tok_conf = json.loads(tok_conf_path.read_text()) if tok_conf_path.is_file() else {}
    state.setdefault("tokenizer_class", tok_conf.get("tokenizer_class"))
    state.setdefault("pair_separator", pair_separator(export_dir))
    manifest_path = layout.tokens / TOKEN_MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    (export_dir / MANIFEST_FILE).write_text(json.dumps(manifest if manifest is not None else {}, indent=1))
    (export_dir / CONFIG_FILE).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    stats_path = layout.clean / CLEAN_STATS
    clean_stats = json.loads(stats_path.read_text()) if stats_path.is_file() else None
    ppl = held_out_perplexity(layout.metrics, state.get("step"))
    if ppl is not None and not math.isfinite(ppl[0]):
        ppl = None
    transfer = bound_transfer(export_dir)
    mask = tok_conf.get("mask_token")
    mask = mask.get("content") if isinstance(mask, dict) else mask
    speed = median_speed(layout.metrics)
    measured = eval_row_sources(layout.metrics, ppl[1]) if ppl is not None else None
    text = render_model_card(
        cfg,
        export_dir,
        state,
        model_config,
        manifest,
        clean_stats,
        ppl,
        transfer,
        mask,
        speed,
        measured,
        bound_lm_eval(export_dir),
    )
    path = export_dir / CARD
    path.write_text(text)
    return path
