"""A reader's frame on every tutorial: what it teaches, what it needs, how long it runs, where it sits.

Under each tutorial's title, a box says

- **You will learn**: two or three things, written here in :data:`TUTORIALS`;
- **Before this**: the tutorials (and knowledge) it builds on, linked;
- **Track**: which track the page is in and its place there, each step linked;
- **Run time**: how long the page took to execute in this build, and on what: read from
  MyST-NB's execution data (the same numbers as the execution report), never written by hand;
- **Terms**: the glossary entries (``docs/glossary.md``) for the jargon the page's prose uses.

A tutorial is named by its file's prefix: ``06a_unit_scaled_ops`` is tutorial "6a" (a topic
told in two pages is numbered once, lettered a and b). Previous/Next at the foot of a page follow
the sidebar (the home page's toctrees), track by track: tutorial 7b's Next is 10, the next step of
the scaling track, and Next from the track's last tutorial (12) reaches "Against the reference"
and then the stages track, so every page of the sidebar is reachable by Next.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

TRACKS = {
    "fx": ("The torch.fx track", ["1", "2", "3", "4"]),
    "scaling": ("The scaling track", ["5", "6a", "6b", "7a", "7b", "10", "12"]),
    "stages": ("Stages and real models", ["8", "9", "11"]),
}


@dataclass(frozen=True)
class Frame:
    track: str
    learn: tuple[str, ...]
    before: tuple[str, ...]  # tutorials this one builds on
    knowledge: str  # what a reader should know besides


TUTORIALS: dict[str, Frame] = {
    "1": Frame(
        "fx",
        (
            "what a `torch.fx` tracer does, and which hook sees what",
            "how to write a 15-line tracer that records the module of every node",
            "what `ModulePathTracer` adds to it",
        ),
        (),
        "PyTorch modules; no `torch.fx` needed",
    ),
    "2": Frame(
        "fx",
        (
            "how to choose which modules stay whole in a trace (leaves)",
            "how to tag every node, and record the order modules run and parameters are used",
            "how tracers combine into one trace by inheritance",
        ),
        ("1",),
        "",
    ),
    "3": Frame(
        "fx",
        (
            "how to splice a module's body into the graph that calls it, with a `Proxy`",
            "how `unitscale.inline` inlines every call, or the ones a predicate picks",
        ),
        ("1", "2"),
        "",
    ),
    "4": Frame(
        "fx",
        (
            "how to invert a function by walking its graph backwards",
            "where an inverse holds only on part of the domain, and what cannot be inverted",
        ),
        ("3",),
        "",
    ),
    "5": Frame(
        "scaling",
        (
            "how to measure the scale of every tensor, forward and backward",
            "how those scales compare with what FP16, BF16 and FP8 can represent",
            "how to watch scales move over training",
        ),
        (),
        "a PyTorch training step; tutorial 1 helps with the graphs",
    ),
    "6a": Frame(
        "scaling",
        (
            "what a unit-scaled op multiplies by, forward and backward, and why",
            "when forward and backward scales must be equal (constraints)",
            "how residual adds are weighted so that the sum stays at unit scale",
        ),
        ("5",),
        "",
    ),
    "6b": Frame(
        "scaling",
        (
            "what the unit-scaled layers of `unitscale.nn` give at initialisation",
            "which torch functions `unit_scale` swaps, and how to swap them yourself",
            "what FP8 formats hold, simulated on any machine",
        ),
        ("6a",),
        "",
    ),
    "7a": Frame(
        "scaling",
        (
            "how `unit_scale` rewrites a whole model as a graph transform",
            "what happens to gradients in simulated FP8, with and without unit scaling",
        ),
        ("5", "6b"),
        "",
    ),
    "7b": Frame(
        "scaling",
        (
            "how `unit_scale` holds models with batch norm, gates and a `transformers` decoder",
            "why every scale stays a constant during training",
            "how `scale_check` names the ops that move a model off unit scale",
        ),
        ("7a",),
        "",
    ),
    "8": Frame(
        "stages",
        (
            "how to cut a model into pipeline stages whose slowest stage is as fast as it can be",
            "how that split compares with the usual heuristics",
            "how to run the stages as a pipeline on `torch.distributed.pipelining`",
        ),
        (),
        "PyTorch modules; tutorial 2 shows the execution order the split follows",
    ),
    "9": Frame(
        "stages",
        (
            "how every tool of this library applies to a `transformers` model",
            "how a model `torch.fx` cannot trace is captured with `torch.export`",
        ),
        ("5", "8"),
        "",
    ),
    "10": Frame(
        "scaling",
        (
            "what u-μP adds to unit scaling: parameter roles and learning-rate rules",
            "how to check that the best learning rate transfers from a narrow model to a wide one",
        ),
        ("7a",),
        "",
    ),
    "11": Frame(
        "stages",
        (
            "how to plan a pipeline for a schedule (GPipe, 1F1B, interleaved) under a memory limit",
            "how well the planner's predicted step time matches a measured one",
            "how to launch the plan with `torchrun`",
        ),
        ("8",),
        "",
    ),
    "12": Frame(
        "scaling",
        (
            "how to compare plain and unit-scaled training, in FP32 and simulated FP8, each at its best learning rate",
            "why a unit-scaled model needs its own learning-rate rule to match the plain one",
        ),
        ("7a", "10"),
        "",
    ),
}

# Glossary terms and the words in a page's prose that use them. A term whose word has other
# senses is listed only where the page also has the context named second.
TERMS: dict[str, tuple[str, str | None]] = {
    "aten": (r"\baten\b", None),
    "bottleneck": (r"\bbottlenecks?\b", r"\bstages?\b"),
    "bubble": (r"\bbubbles?\b", r"\bpipeline"),
    "coordinate check": (r"\bcoord(inate)?[ _]checks?\b", None),
    "E4M3, E5M2": (r"\bE[45]M[32]\b", None),
    "FSDP": (r"\bFSDP\b", None),
    "gloo": (r"\bgloo\b", None),
    "GPipe": (r"\bgpipe\b", None),
    "gradient accumulation": (r"\baccumulat(e|es|ed|ing|ion)\b", r"\bgradients?\b"),
    "1F1B": (r"\b1f1b\b", None),
    "interleaved 1F1B": (r"\binterleaved\b", r"\b1f1b\b"),
    "loss scaling": (r"\bloss scal(e|ing)\b", None),
    "microbatch": (r"\bmicrobatch(es)?\b", None),
    "μP, SP": (r"(?<!u-)\bμP\b", None),
    "octave": (r"\boctaves?\b", None),
    "quadrature": (r"\bquadrature\b", None),
    "rank": (r"\branks?\b", r"\b(pipeline|distributed|torchrun)"),
    "residual stream": (r"\bresidual stream\b", None),
    "roles": (r"\broles?\b", r"u-μP"),
    "stage": (r"\bstages?\b", r"\bpipeline"),
    "subnormal": (r"\bsubnormals?\b", None),
    "SwiGLU": (r"\bSwiGLU\b", None),
    "TorchDynamo": (r"\b(Torch)?Dynamo\b", None),
    "unit scaling": (r"\bunit[- ]scal(ing|ed)\b", None),
    "u-μP": (r"u-μP", None),
}


def number(docname: str) -> str | None:
    """The tutorial's label, from its file's prefix: ``tutorials/06a_x`` is "6a"."""
    match = re.fullmatch(r"tutorials/(\d\d)([a-z]?)_\w+", docname)
    return f"{int(match[1])}{match[2]}" if match else None


def order(label: str) -> tuple[int, str]:
    """A label's place in reading order: "6a" before "6b" before "7a" before "10"."""
    match = re.fullmatch(r"(\d+)([a-z]?)", label)
    assert match, label
    return int(match[1]), match[2]


def docname_of(app: Sphinx, n: str) -> str:
    return next(d for d in sorted(app.env.found_docs) if number(d) == n)


def machine() -> str:
    """The build machine: CPU model, cores, torch version (what every run time here ran on)."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
        model = found[1].strip() if found else model
    import torch  # the kernel's torch: the same environment built the site

    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__.split('+')[0]}"


def _link(app: Sphinx, fromdoc: str, todoc: str, text: str, anchor: str = "") -> nodes.reference:
    uri = app.builder.get_relative_uri(fromdoc, todoc) + (f"#{anchor}" if anchor else "")
    return nodes.reference("", text, internal=True, refuri=uri)


def _title(app: Sphinx, docname: str) -> str:
    return app.env.titles[docname].astext()


def _prose(doctree: nodes.document) -> str:
    """The page's prose: paragraphs, list items and titles, without code or outputs."""
    texts = []
    for paragraph in doctree.findall(lambda n: isinstance(n, nodes.paragraph | nodes.title)):
        if not any(
            isinstance(a, nodes.literal_block) or "cell_output" in a.get("classes", []) for a in _ancestors(paragraph)
        ):
            texts.append(paragraph.astext())
    return "\n".join(texts)


def _ancestors(node: nodes.Node) -> list[Any]:
    out = []
    while node.parent is not None:
        node = node.parent
        out.append(node)
    return out


def _inline_markup(text: str) -> list[nodes.Node]:
    """``text`` with its `backticks` as inline code."""
    parts = re.split(r"`([^`]+)`", text)
    return [nodes.literal(p, p) if i % 2 else nodes.Text(p) for i, p in enumerate(parts) if p]


def _field(name: str, body: list[nodes.Node] | nodes.Node) -> nodes.field:
    return nodes.field(
        "", nodes.field_name("", name), nodes.field_body("", *(body if isinstance(body, list) else [body]))
    )


def frame(app: Sphinx, docname: str, doctree: nodes.document) -> nodes.Element:
    """The box for tutorial ``docname``."""
    n = number(docname)
    assert n is not None
    spec = TUTORIALS[n]
    fields = nodes.field_list(classes=["reader-frame-fields"])

    learn = nodes.bullet_list()
    for item in spec.learn:
        learn += nodes.list_item("", nodes.paragraph("", "", *_inline_markup(item)))
    fields += _field("You will learn", learn)

    before = nodes.paragraph()
    for i, m in enumerate(spec.before):
        target = docname_of(app, m)
        before += [nodes.Text(", " if i else ""), _link(app, docname, target, _title(app, target))]
    if spec.knowledge:
        before += [nodes.Text("; " if spec.before else "")] + _inline_markup(spec.knowledge)
    if not spec.before and not spec.knowledge:
        before += nodes.Text("nothing but PyTorch")
    fields += _field("Before this", before)

    name, members = TRACKS[spec.track]
    track = nodes.paragraph("", f"{name}, {members.index(n) + 1} of {len(members)}: ")
    for i, m in enumerate(members):
        track += nodes.Text(" → " if i else "")
        track += nodes.strong("", m) if m == n else _link(app, docname, docname_of(app, m), m)
    fields += _field("Track", track)

    fields += _field("Run time", nodes.paragraph("", "", *run_time(app, docname)))

    found = terms_used(_prose(doctree))
    if found:
        objects = app.env.domains["std"]._terms  # type: ignore[attr-defined]
        terms = nodes.paragraph()
        for i, term in enumerate(found):
            glossary_doc, anchor = objects[term.lower()]
            terms += [nodes.Text(", " if i else ""), _link(app, docname, glossary_doc, term, anchor)]
        fields += _field("Terms", terms)

    box = nodes.container(classes=["reader-frame"])
    box += fields
    return box


def terms_used(prose: str) -> list[str]:
    """The glossary terms whose words ``prose`` uses, in the glossary's order."""
    return [
        term
        for term, (word, context) in TERMS.items()
        if re.search(word, prose, re.I) and (context is None or re.search(context, prose, re.I))
    ]


def run_time(app: Sphinx, docname: str) -> list[nodes.Node]:
    from myst_nb.sphinx_ import NbMetadataCollector

    data = NbMetadataCollector.get_exec_data(app.env, docname)  # type: ignore[arg-type]
    report = _link(app, docname, "docs/execution", "execution report")
    if not data or data.get("runtime") is None:
        return [nodes.Text("not executed in this build; see the "), report]
    when = datetime.datetime.fromtimestamp(data["mtime"], datetime.UTC).strftime("%Y-%m-%d")
    seconds = data["runtime"]
    shown = f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    # class "measured": a number the build measured, not prose (tests/site/test_claims_bound.py)
    return [
        nodes.inline(shown, shown, classes=["measured"]),
        nodes.Text(f", executed {when} when this site was built, on {app.config.reader_frame_machine} ("),
        report,
        nodes.Text(")"),
    ]


def _insert(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    if number(docname) not in TUTORIALS:
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    title = next(iter(section.findall(nodes.title)))
    title.parent.insert(title.parent.index(title) + 1, frame(app, docname, doctree))


def _description(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    """The link-preview description (OpenGraph) from what the page teaches, not from the box's
    labels. Previous/Next are Sphinx's own: the sidebar's order, track by track."""
    n = number(pagename)
    if n not in TUTORIALS:
        return
    learn = "; ".join(item.replace("`", "") for item in TUTORIALS[n].learn)
    context["meta"] = {"og:description": f"You will learn {learn}.", **(context.get("meta") or {})}


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("reader_frame_machine", machine(), "env")
    app.connect("doctree-resolved", _insert)
    app.connect("html-page-context", _description, priority=400)  # before sphinxext.opengraph reads "meta"
    return {"parallel_read_safe": True, "parallel_write_safe": True}
