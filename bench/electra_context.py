"""Does a replaced-token-detection discriminator learn context at our budgets? (issue 27: electra-budget's
discriminator stays at its prior and its body degenerates.)

The task is the easiest form of ELECTRA's: 15% of the non-special tokens of BBC text are replaced by a uniform draw
from the non-special vocabulary (a generator that knows nothing), and a discriminator labels every token replaced
or original. A model that sees only each token's identity, not its context, can still beat the prior (a rare token
is more often a replacement than a real one); the best such model's BCE is computed exactly from the corpus's
token counts: the token-identity bound (the peer). Anything below it is context.

Ours: the discriminator electra-budget ships (`ElectraForPreTraining` from our family's `build_config` of
configs/electra-budget.yaml: 4 x 128, post-LN), trained on the task in a plain single-process loop with the preset's
AdamW settings (betas, eps, weight decay, clipping), 10% warmup and linear decay, at peak LR 1e-3 (twice the
preset's, so the bound is reached within the steps). For information, the same loop trains modernbert-budget's
pre-LN body (`ModernBertModel` + a linear head): whether the layer-norm placement matters. `--bodies roformer`
trains electra-budget's discriminator with rotary positions instead of its learned position table
(`RoFormerModel`, BERT's post-LN layers with RoPE, + a linear head): whether the position encoding matters.
Held-out BCE on fixed corruptions of 10% of the sequences, every 100 steps.
`--ablate SWITCH ...` (issue 46) also trains the ModernBERT body once per switch with that one difference from the
BERT-style bodies reverted (ABLATIONS: `post_ln`, `abs_pos`, `geglu`, `bias`, `embedding_norm`, `depth_init`,
`local_attention`; `post_ln+abs_pos` reverts pre-LN and RoPE together): which of them lets it learn context. Each
variant gets a VERDICT against the same bound and goal (`..._modernbert_without_<switch>`: passing means that body
still learns context without the difference); such a run writes `electra_context-ablation.txt`.

VERDICT electra_context_lower_is_better: ours = held-out BCE at the end, peer = the bound, passes when
ours <= 0.95 x bound (the discriminator uses context for at least 5% of the bound).

The tokenizer is a 4K WordPiece trained here with `tokenizers` on the same text (electra-budget's type and size);
the corpus is only the BBC package's, so this is a diagnostic of the objective, not a tuning target.

`python bench/electra_context.py [--steps 1000] [--bodies electra modernbert] [--lr 1e-3] [--set model.num_layers=2]
[--ablate geglu post_ln+abs_pos ...] [--no-save]` (a run at another LR or with `--set` overrides of both presets is printed, not saved)
On a GPU (issue 46: the preset's discriminator for as many steps as some minutes allow):
`python3 bench/electra_context.py --device cuda --batch 128 --minutes 4 --bodies electra modernbert` (each body
trained for 4 minutes' worth of steps, timed first; writes electra_context-gpu.txt)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SEQ_LEN, BATCH, MASK_RATE, PEAK_LR, GOAL = 128, 32, 0.15, 1e-3, 0.95


def corpus(vocab_size: int) -> tuple[Any, list[int]]:
    """(HF tokenizer, token stream of every BBC article, each followed by [SEP])."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import PreTrainedTokenizerFast

    C.ensure_bbc()
    texts = [p.read_text(errors="ignore") for p in sorted(C.BBC.glob("*/*.txt"))]
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(texts, vocab_size=vocab_size, show_progress=False)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=wp._tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    stream: list[int] = []
    for t in texts:
        stream += wp.encode(t, add_special_tokens=False).ids + [hf.sep_token_id]
    return hf, stream


def identity_bound(counts: Counter, candidates: list[int], special: set[int]) -> float:
    """Expected BCE of the Bayes-optimal token-identity classifier: at a position showing token w, P(replaced) is
    the uniform draws that landed on w and differ from the original, over all positions showing w."""
    k, total, h = len(candidates), 0.0, 0.0
    n_plain = sum(c for w, c in counts.items() if w not in special)
    for w in candidates:
        c = counts.get(w, 0)
        kept = (1 - MASK_RATE) * c + MASK_RATE * c / k  # not selected, or selected and drawn as itself
        replaced = MASK_RATE * (n_plain - c) / k  # another token's position, drawn as w
        seen = kept + replaced
        if seen <= 0:
            continue
        p = replaced / seen
        if 0 < p < 1:
            h -= seen * (p * math.log(p) + (1 - p) * math.log(1 - p))
        total += seen
    specials = sum(c for w, c in counts.items() if w in special)  # never replaced: BCE 0 for the ideal model
    return h / (total + specials)


def corrupt(batch: Any, candidates: Any, special: Any, gen: Any) -> tuple[Any, Any]:
    import torch

    # the generator lives on the batch's device: a GPU run draws there, with no host round trip
    dev = batch.device
    sel = (torch.rand(batch.shape, generator=gen, device=dev) < MASK_RATE) & ~torch.isin(batch, special)
    draw = candidates[torch.randint(0, len(candidates), batch.shape, generator=gen, device=dev)]
    corrupted = torch.where(sel, draw, batch)
    return corrupted, (corrupted != batch).float()


# ModernBERT's differences from the BERT-style bodies, each revertible on its own (`--ablate`): the ModernBERT body
# with one of them taken back to what electra-budget's body has. `+` joins switches into one variant
# (`post_ln+abs_pos`: pre-LN and RoPE taken away together).
ABLATIONS = {
    "post_ln": "post-LN layers (norm after each residual sum, no final norm) instead of pre-LN",
    "abs_pos": "a learned absolute position table added to the token embeddings instead of RoPE",
    "geglu": "a plain GELU feed-forward (same inner width) instead of GeGLU",
    "bias": "biases in every linear layer and LayerNorm instead of none",
    "embedding_norm": "no LayerNorm on the embeddings",
    "depth_init": "every output projection at the plain initializer_range instead of the depth-scaled one",
    "local_attention": "global attention in every layer instead of alternating sliding windows",
}


def _parse_ablation(name: str) -> tuple[str, ...]:
    parts = tuple(name.split("+"))
    unknown = [p for p in parts if p not in ABLATIONS]
    if unknown:
        raise ValueError(f"--ablate: unknown switch(es) {unknown} (known: {sorted(ABLATIONS)})")
    return parts


def ablate_modernbert(model: Any, switches: tuple[str, ...]) -> Any:
    """ModernBERT body `model` (ModernBertModel) with the given differences reverted, in place. Config-level
    switches (`bias`, `local_attention`) are applied by `modernbert_config` before it is built."""
    import torch
    from torch import nn

    c = model.config
    std, cutoff = c.initializer_range, c.initializer_cutoff_factor or 3.0
    if "depth_init" in switches:  # ModernBERT: std / sqrt(2 L) on Wo of attention and MLP
        for layer in model.layers:
            for lin in (layer.attn.Wo, layer.mlp.Wo):
                nn.init.trunc_normal_(lin.weight, std=std, a=-cutoff * std, b=cutoff * std)
    if "geglu" in switches:

        class GeluMLP(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.Wi = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
                self.act = nn.GELU()
                self.Wo = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
                out_std = std if "depth_init" in switches else std / (2.0 * c.num_hidden_layers) ** 0.5
                for lin, s in ((self.Wi, std), (self.Wo, out_std)):
                    nn.init.trunc_normal_(lin.weight, std=s, a=-cutoff * s, b=cutoff * s)
                    if lin.bias is not None:
                        nn.init.zeros_(lin.bias)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.Wo(self.act(self.Wi(x)))

        for layer in model.layers:
            layer.mlp = GeluMLP()
    if "embedding_norm" in switches:
        model.embeddings.norm = nn.Identity()
    if "abs_pos" in switches:

        class NoRotation(nn.Module):
            """RoPE off: cos 1, sin 0 (the rotation is the identity)."""

            def __init__(self, rotary: nn.Module) -> None:
                super().__init__()
                self.rotary = rotary

            def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str):
                cos, sin = self.rotary(x, position_ids, layer_type)
                return torch.ones_like(cos), torch.zeros_like(sin)

        class TokensAndPositions(nn.Module):
            """BERT's sum of a token and a learned absolute position embedding."""

            def __init__(self, tok: nn.Embedding) -> None:
                super().__init__()
                self.tok = tok
                self.pos = nn.Embedding(c.max_position_embeddings, c.hidden_size)
                nn.init.trunc_normal_(self.pos.weight, std=std, a=-cutoff * std, b=cutoff * std)

            @property
            def weight(self) -> torch.Tensor:
                return self.tok.weight

            def forward(self, ids: torch.Tensor) -> torch.Tensor:
                return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))

        model.rotary_emb = NoRotation(model.rotary_emb)
        model.embeddings.tok_embeddings = TokensAndPositions(model.embeddings.tok_embeddings)
    if "post_ln" in switches:

        class PostLN(nn.Module):
            """BERT's layer order: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

            def __init__(self, layer: nn.Module) -> None:
                super().__init__()
                self.layer, self.attention_type = layer, layer.attention_type
                self.attn_norm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps, bias=c.norm_bias)

            def forward(self, hidden_states, attention_mask=None, position_embeddings=None, **kwargs):
                a, _ = self.layer.attn(
                    hidden_states, position_embeddings=position_embeddings, attention_mask=attention_mask
                )
                hidden_states = self.attn_norm(hidden_states + a)
                return self.layer.mlp_norm(hidden_states + self.layer.mlp(hidden_states))

        model.layers = nn.ModuleList(PostLN(layer) for layer in model.layers)
        model.final_norm = nn.Identity()
    return model


def modernbert_config(mcfg: Any, switches: tuple[str, ...]) -> Any:
    """The config-level switches: biases everywhere, global attention in every layer."""
    if "bias" in switches:
        mcfg.attention_bias = mcfg.mlp_bias = mcfg.norm_bias = mcfg.classifier_bias = True
    if "local_attention" in switches:
        mcfg.global_attn_every_n_layers = 1
        mcfg.layer_types = ["full_attention"] * mcfg.num_hidden_layers
    return mcfg


def build(body: str, hf: Any, vocab: int, overrides: list[str]) -> Any:
    """The discriminator: our family's config of the preset, the HF class it exports as. `modernbert:<switches>`:
    the ModernBERT body with those differences reverted (ABLATIONS)."""
    import torch
    from transformers import ElectraForPreTraining, ModernBertModel, RoFormerConfig, RoFormerModel

    from pretrain.families.registry import get_family
    from runconfig import load_config

    body, _, ablation = body.partition(":")
    switches = _parse_ablation(ablation) if ablation else ()
    if switches and body != "modernbert":
        raise ValueError(f"ablation switches {switches} apply to the modernbert body only, not {body}")
    family = "electra" if body == "roformer" else body
    cfg = load_config(C.ROOT / "configs" / f"{family}-budget.yaml", overrides)
    mcfg = get_family(family).build_config(cfg.model, hf, vocab)
    if switches:
        mcfg = modernbert_config(mcfg, switches)
    if body == "electra":
        model = ElectraForPreTraining(mcfg)
        return model, cfg, lambda ids: model(input_ids=ids).logits
    if body == "roformer":
        # electra-budget's discriminator with one change: rotary positions (RoFormer: BERT's post-LN layers with
        # RoPE in attention) instead of a learned absolute position table
        keys = [
            "vocab_size",
            "embedding_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "hidden_act",
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
            "max_position_embeddings",
            "initializer_range",
            "layer_norm_eps",
            "pad_token_id",
        ]
        mcfg = RoFormerConfig(**{k: getattr(mcfg, k) for k in keys})
    body_cls = RoFormerModel if body == "roformer" else ModernBertModel

    class BodyAndHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = body_cls(mcfg), torch.nn.Linear(mcfg.hidden_size, 1)
            if switches:
                ablate_modernbert(self.body, switches)

    m = BodyAndHead()
    return m, cfg, lambda ids: m.head(m.body(input_ids=ids).last_hidden_state).squeeze(-1)


def train_step(
    model: Any,
    logits_of: Any,
    opt: Any,
    data: Any,
    batch: int,
    candidates: Any,
    special: Any,
    gen: Any,
    clip: float,
) -> None:
    """One step on `batch` sequences drawn from `data` and corrupted afresh."""
    import torch
    import torch.nn.functional as F

    idx = torch.randint(0, len(data), (batch,), generator=gen, device=data.device)
    x, y = corrupt(data[idx], candidates, special, gen)
    loss = F.binary_cross_entropy_with_logits(logits_of(x), y)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()


def time_steps(
    body: str,
    hf: Any,
    data: Any,
    candidates: Any,
    special: Any,
    overrides: list[str],
    batch: int,
    n: int = 30,
) -> float:
    """Seconds per training step of `body` (a throwaway copy, after 10 warm-up steps): what `--minutes` buys."""
    import torch

    model, _, logits_of = build(body, hf, len(hf), overrides)
    model.to(data.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=data.device).manual_seed(3)
    sync = torch.cuda.synchronize if data.device.type == "cuda" else (lambda: None)
    for i in range(10 + n):
        if i == 10:
            sync()
            t0 = time.perf_counter()
        train_step(model, logits_of, opt, data, batch, candidates, special, gen, 1.0)
    sync()
    return (time.perf_counter() - t0) / n


def train(
    body: str,
    hf: Any,
    data: Any,
    held: Any,
    candidates: Any,
    special: Any,
    steps: int,
    lr: float,
    overrides: list[str],
    rep: C.Report,
    batch: int = BATCH,
    minutes: float | None = None,
) -> float:
    import torch
    import torch.nn.functional as F

    dev = data.device
    # as many steps as the minutes allow, fixed before training so that the schedule is whole
    if minutes is not None:
        per_step = time_steps(body, hf, data, candidates, special, overrides, batch)
        steps = max(100, int(minutes * 60 / per_step / 1.05))  # 5% for the held-out evaluations
        rep.line(
            f"  {body}: {per_step * 1e3:.2f} ms per step of {batch} sequences on {dev}: {steps} steps "
            f"in {minutes:g} min"
        )
    torch.manual_seed(0)
    model, cfg, logits_of = build(body, hf, len(hf), overrides)
    model.to(dev)
    o = cfg.optim
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=lr,
        betas=tuple(o.betas),
        eps=o.eps,
    )
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, (steps - s) / (steps - warm))
    )
    gen = torch.Generator(device=dev).manual_seed(1)
    held_gen = torch.Generator(device=dev).manual_seed(2)
    held_in, held_y = corrupt(held, candidates, special, held_gen)

    def evaluate() -> float:
        model.eval()
        with torch.no_grad():
            out = [
                F.binary_cross_entropy_with_logits(
                    logits_of(held_in[i : i + 64]), held_y[i : i + 64], reduction="sum"
                )
                for i in range(0, len(held_in), 64)
            ]
        model.train()
        return float(sum(out)) / held_y.numel()

    # every 100 steps on the CPU budgets; about 50 evaluations in all on a long GPU run
    every = max(100, steps // 50 // 100 * 100)
    t0, bce = time.perf_counter(), float("nan")
    for step in range(steps):
        train_step(model, logits_of, opt, data, batch, candidates, special, gen, o.grad_clip or 1.0)
        sched.step()
        if (step + 1) % every == 0 or step + 1 == steps:
            bce = evaluate()
            rep.line(f"  {body}: step {step + 1}: held-out BCE {bce:.4f} ({time.perf_counter() - t0:.0f}s)")
    return bce


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument(
        "--bodies",
        nargs="+",
        default=["electra", "modernbert"],
        choices=["electra", "modernbert", "roformer"],
    )
    ap.add_argument(
        "--ablate",
        nargs="*",
        default=[],
        metavar="SWITCH[+SWITCH]",
        help=f"also train the ModernBERT body with one difference reverted per variant: {sorted(ABLATIONS)} "
        "(a run with ablations writes its own results file, electra_context-ablation.txt)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=PEAK_LR, help="peak LR (a run at another LR is not saved)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="preset overrides (not saved)")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (a GPU run writes electra_context-gpu.txt)")
    ap.add_argument("--batch", type=int, default=BATCH, help="sequences per step")
    ap.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="train each body for as many steps as this allows (timed first), instead of --steps",
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    for name in args.ablate:
        _parse_ablation(name)  # an unknown switch stops before any training
    bodies = [*args.bodies, *(f"modernbert:{a}" for a in args.ablate)]
    gpu = args.device != "cpu"
    default_run = not args.no_save and args.lr == PEAK_LR and not args.set and (gpu or args.batch == BATCH)
    saved = default_run and (bool(args.ablate) or "electra" in args.bodies)
    variant = "-".join(v for v, on in (("ablation", args.ablate), ("gpu", gpu)) if on) or None
    rep = C.Report(__file__, save=saved, variant=variant)
    hf, stream = corpus(4096)
    special_ids = set(hf.all_special_ids)
    candidates = [i for i in range(len(hf)) if i not in special_ids]
    n = len(stream) // SEQ_LEN
    seqs = torch.tensor(stream[: n * SEQ_LEN]).view(n, SEQ_LEN)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    held, data = seqs[perm[: n // 10]], seqs[perm[n // 10 :]]
    held_counts = Counter(held.flatten().tolist())
    bound = identity_bound(held_counts, candidates, special_ids)
    p = MASK_RATE * (1 - 1 / len(candidates))
    rep.line(
        f"{n} sequences of {SEQ_LEN} tokens ({len(data)} train, {len(held)} held out), vocabulary {len(hf)}; "
        f"{MASK_RATE:.0%} of non-special tokens replaced by a uniform draw; "
        f"{f'{args.minutes:g} min' if args.minutes else f'{args.steps} steps'} per body of {args.batch} sequences, "
        f"peak LR {args.lr:g}, on {args.device}"
    )
    rep.line(
        f"held-out BCE: prior (replaced fraction only) about {-(p * math.log(p) + (1 - p) * math.log(1 - p)):.4f}; "
        f"token-identity bound {bound:.4f}"
    )
    dev = torch.device(args.device)
    cand, special = torch.tensor(candidates, device=dev), torch.tensor(sorted(special_ids), device=dev)
    data, held = data.to(dev), held.to(dev)
    results = {
        b: train(
            b, hf, data, held, cand, special, args.steps, args.lr, args.set, rep, args.batch, args.minutes
        )
        for b in bodies
    }
    for b, bce in results.items():
        rep.line(f"{b}: held-out BCE {bce:.4f} = {bce / bound:.3f} x the token-identity bound")
    if "electra" in results:
        rep.verdict("electra_context", results["electra"], bound, GOAL, lower_is_better=True)
    for a in args.ablate:  # does the ModernBERT body still learn context with this difference reverted?
        name = f"electra_context_modernbert_without_{a.replace('+', '_and_')}"
        rep.verdict(name, results[f"modernbert:{a}"], bound, GOAL, lower_is_better=True)
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
