"""Scale-tracking overhead on a zoo of models: ``analyse_module`` time / plain forward+backward time.

The ratio is the cost of scale tracking: capturing the model, running it so that every tensor
is seen, and one std per tensor in forward and backward. The "first call" column starts from
empty caches (the capture and the code listing are made again); "cached" is every later call
on the same model and input shapes (an fx trace's code, compiled with a recording call per
node on the first call, is run directly). Target: <= 1.15x for a later call. Models: TinyGPT, FusedGPT (a GPT
written differently: one fused qkv projection, explicit ``torch.softmax`` attention),
``unitscale.examples.resnet18``, and GPT-2 and Llama from ``transformers`` configs (built here, random
weights, no download). The capture route is the one ``analyse_module`` took: ``fx`` where
``torch.fx`` traces the model, else ``eager`` (ops recorded as they run); a model fx cannot
trace gets a second row with ``route="export"`` (the exported graph's listing; quick mode:
Llama only). Each ratio is taken within a round (every function timed once per round, in turn) and
recorded as the median over rounds with its min and max; by wall time and by process CPU time.
The "cached, no stds" column is the cached call with the std itself replaced by a constant:
capture, hooks and bookkeeping without the two reads of every tensor (a sum and a dot
product) that the std costs; the gap to "cached" is the std's share.
The "floor" columns bound from below what any implementation of the same report could cost
here: the capture the route itself needs before anything runs (the ``torch.fx`` trace the
code listing is made from, one ``torch.export``; nothing for the op recorder, which captures while the model runs)
plus one read of every tensor (the cached call with the std replaced by one ``sum``, less the
call with no std at all). Hooks and bookkeeping are left out, so a floor above 1.15 means no
code reaches the target on this machine while it keeps an exact std of every tensor.
The "two reads" floor is the same with a sum and a sum of squares in place of the one ``sum``:
the least an exact std costs when it is built from torch's CPU kernels, none of which reads a
tensor once for both. Above 1.15, no code on torch's kernels reaches the target here.
``--threads N`` (default 1: on cores shared with other work, threads that wait on each other time
the load more than the code). If Graphcore's ``unit-scaling`` is importable, its ratio (it
traces on every call) is printed for the GPTs.
"""

from __future__ import annotations

import gc
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the unitscale beside this file, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spread import spread  # noqa: E402  (beside this script)

from unitscale.capture import DeepTracing, capture, clear_capture_cache  # noqa: E402
from unitscale.examples.models import TinyGPT, resnet18  # noqa: E402
from unitscale.tracking import analyse_module, report, stats, track_scales  # noqa: E402

BATCH, SEQ, WIDTH, LAYERS, HEADS, VOCAB = 8, 128, 256, 4, 4, 512
#: rounds of the full run: each round times every function once, the plain pass among them, and
#: a ratio is taken within a round. Five keep `make bench` to minutes; each ratio's min and max
#: (recorded beside its median) say how far the rounds moved
REPEATS = 5
#: what the page checks each row against (``benchmarks/record.py`` records it)
TARGETS = [
    {
        "what": "a later call of analyse_module, over a plain forward and backward",
        "column": "cached",
        "where": {"default route": True},
        "at most": 1.15,
    }
]


class FusedBlock(nn.Module):
    """A pre-norm GPT block written as many codebases write it: fused qkv, explicit softmax attention."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        # one size tuple: their tracer wraps ones(size)
        mask = torch.ones((s, s), dtype=torch.bool, device=x.device).triu(1)
        att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class FusedGPT(nn.Module):
    """TinyGPT's shape, written with :class:`FusedBlock` and no ``nn.MultiheadAttention``."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.h = nn.ModuleList(FusedBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _transformers(model_type: str, **config: Any) -> nn.Module:
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=VOCAB, use_cache=False, **config)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _zoo() -> dict[str, tuple[Callable[[], nn.Module], torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    zoo: dict[str, tuple[Callable[[], nn.Module], torch.Tensor]] = {
        "TinyGPT": (lambda: TinyGPT(VOCAB, WIDTH, LAYERS, HEADS, SEQ), ids),
        "FusedGPT": (lambda: FusedGPT(VOCAB, WIDTH, LAYERS, HEADS, SEQ), ids),
        "resnet18": (lambda: resnet18(num_classes=10), torch.randn(BATCH, 3, 64, 64)),
    }
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("(transformers is not installed: no GPT-2 or Llama rows)")
        return zoo
    gpt2 = dict(n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=SEQ, bos_token_id=0, eos_token_id=0)
    llama = dict(
        hidden_size=WIDTH,
        intermediate_size=4 * WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS // 2,
        max_position_embeddings=SEQ,
    )
    zoo["GPT-2"] = (lambda: _transformers("gpt2", **gpt2), ids)
    zoo["Llama"] = (lambda: _transformers("llama", **llama), ids)
    return zoo


def _time(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and process CPU time of one call with Python's cyclic garbage collector off, as in :mod:`timeit`."""
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        gc.enable()


def _round_times(fns: dict[str, Callable[[], object]], repeats: int) -> list[dict[str, tuple[float, float]]]:
    """Wall and process CPU time of each function in each of ``repeats`` rounds, taking turns in each round.

    Taking turns makes a busy machine slow them alike, so a ratio within one round is the steadier
    measure; CPU time is the steadier of the two clocks on a machine shared with other jobs.
    """
    return [{name: _time(fn) for name, fn in fns.items()} for _ in range(repeats)]


def _forget_captures() -> None:
    """Empty every cache a first call fills: captures (fx traces, exports), parsed code, compiled tracking code."""
    clear_capture_cache()  # a compiled tracking program lives on its capture's graph: gone with it
    report._code_lines.cache_clear()


def _output(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits if hasattr(out, "logits") else out[0]


def main(quick: bool = False, threads: int = 1) -> list[dict]:
    """Time plain forward+backward and ``analyse_module`` (first call, cached) per model; print and return rows."""
    torch.set_num_threads(threads)
    repeats = 1 if quick else REPEATS  # quick: does it run (tests/test_benchmarks.py); the page shows full runs
    batch = BATCH // 4 if quick else BATCH
    try:
        from unit_scaling.utils import analyse_module as theirs  # type: ignore[import-not-found]
    except ImportError:
        theirs = None
    rows = []
    print(
        f"batch {batch}; GPTs: width {WIDTH}, {LAYERS} layers, {HEADS} heads, seq {SEQ}, vocab {VOCAB}; "
        f"resnet18: width 64, 64x64 images; {threads} threads, median of {repeats} rounds, GC off while timed"
    )
    print("ratios to plain forward+backward, by wall time (by CPU time); floor: first call / cached")
    header = (
        f"{'model':<10} {'capture':>8} {'first call':>17} {'cached':>15} {'no stds':>8} {'floor':>13}"
        f" {'2 reads':>8} {'plain ms':>9}"
    )
    print(f"{header}  unit_scaling")
    for name, (build, x) in _zoo().items():
        torch.manual_seed(0)
        model, x = build(), x[:batch]
        grad = torch.randn_like(_output(model(x)))
        _forget_captures()
        route = track_scales(model, x, grad, abs_max=False).route
        # where fx cannot trace, also the export route (what "auto" took before it recorded eagerly);
        # quick mode times it on Llama only: one export costs about a second
        routes = [route] if route == "fx" or (quick and name != "Llama") else [route, "export"]
        for taken in routes:
            row = _measure(name, model, x, grad, taken, repeats, theirs if name.endswith("GPT") else None)
            row["capture"] = taken
            row["default route"] = taken == route  # the target is for the route analyse_module takes
            rows.append(row)
            theirs_cell = f"{row['unit_scaling']:.2f}x" if "unit_scaling" in row else "-"
            print(
                f"{name:<10} {taken:>8} {row['first call']:>7.2f}x ({row['first call cpu']:.2f}x)"
                f" {row['cached']:>6.2f}x ({row['cached cpu']:.2f}x) {row['cached, no stds']:>7.2f}x"
                f" {row['floor, first call']:>6.2f}x/{row['floor, cached']:.2f}x {row['floor, two reads']:>7.2f}x"
                f" {row['plain ms']:>9.1f}  {theirs_cell}"
            )
    if theirs is None:
        print("(unit-scaling is not installed: no side-by-side column)")
    return rows


def _measure(
    name: str, model: nn.Module, x: torch.Tensor, grad: torch.Tensor, route: str, repeats: int, theirs: Any
) -> dict[str, Any]:
    def plain() -> None:
        _output(model(x)).backward(grad)
        model.zero_grad(set_to_none=True)

    def cached() -> None:
        analyse_module(model, x, grad, syntax_highlight=False, route=route)

    def first() -> None:
        _forget_captures()
        cached()

    def cached_with(std: Callable[[torch.Tensor], float]) -> Callable[[], None]:
        """The cached call with the std replaced by ``std``: what is left costs the rest."""

        def call() -> None:
            std_stat = stats.std_stat
            stats.std_stat = std  # type: ignore[assignment]
            try:
                cached()
            finally:
                stats.std_stat = std_stat

        return call

    no_stds = cached_with(lambda t: 1.0)
    one_read = cached_with(lambda t: t.detach().sum().item())
    two_reads = cached_with(_sum_and_squares)

    fns: dict[str, Callable[[], object]] = {
        "plain": plain,
        "cached": cached,
        "first": first,
        "no stds": no_stds,
        "one read": one_read,
        "two reads": two_reads,
        "route alone": _route_alone(model, x, route),
    }
    if theirs is not None:
        fns["theirs"] = lambda: theirs(model, x, grad, syntax_highlight=False)
    plain()  # warm-up: allocator, lazy imports, one-time kernel choices
    cached()
    rounds = _round_times(fns, repeats)

    def ratio(name: str, clock: int = 0) -> list[float]:
        """``name``'s time over the plain pass's in each round (``clock`` 0: wall, 1: CPU)."""
        return [r[name][clock] / r["plain"][clock] for r in rounds]

    def median(name: str) -> float:
        return statistics.median(ratio(name))

    row: dict[str, Any] = {"model": name, "capture": route, "n": repeats}
    row |= spread("first call", ratio("first")) | spread("cached", ratio("cached"))
    row["first call cpu"] = statistics.median(ratio("first", 1))
    row["cached cpu"] = statistics.median(ratio("cached", 1))
    row["cached, no stds"] = median("no stds")
    read = max(0.0, median("one read") - median("no stds"))
    row["floor, first call"] = 1 + median("route alone") + read
    row["floor, cached"] = 1 + read
    row["floor, two reads"] = 1 + max(0.0, median("two reads") - median("no stds"))
    row["plain ms"] = statistics.median(r["plain"][0] for r in rounds) * 1e3
    if "theirs" in fns:
        row["unit_scaling"] = median("theirs")
    return row


def _sum_and_squares(t: torch.Tensor) -> float:
    """A sum and a sum of squares of ``t``, the two reads of torch's cheapest exact std on the CPU.

    Nothing in torch reads a CPU tensor once for both: ``torch.var_mean`` and the one-pass
    moments inside ``layer_norm`` measure slower than the pair here.
    """
    x = t.detach()
    if x.is_contiguous():
        flat = x.view(-1)
        return x.sum().item() + torch.dot(flat, flat).item()
    return x.sum().item() + torch.linalg.vector_norm(x).item()


def _route_alone(model: nn.Module, x: torch.Tensor, route: str) -> Callable[[], object]:
    """What the route needs before anything runs: fx's trace, or one export; nothing when recorded eagerly."""
    if route == "fx":
        deep = DeepTracing()
        return lambda: capture(model, x, deep=deep, check=False)
    if route == "export":
        return lambda: torch.export.export(model, (x,), strict=False)
    return lambda: None


if __name__ == "__main__":
    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
    main(quick="--quick" in sys.argv, threads=threads)
