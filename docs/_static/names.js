// Long names break between their parts, never inside a word: after a dot
// (unitscale.capture.GRAPH_ROUTE_NAMES), between the words of a CamelCase name
// (ScaleTracking|Interpreter) and, in the narrow sidebar, after an underscore
// (scaled_dot_product_|attention); in a title, after an underscore only inside a long part. The
// sidebar, an API page's title and the names of an API table then wrap where a reader would,
// instead of letter by letter where the line runs out (or a table too wide for the page).
const NAME = /^[\w.]+(\(\))?$/; // a name, or a function's with its "()"
// an API page (docs/api/*, docs/generated/*): its names break only where names.js says
const API_PAGE = /\/docs\/(api|generated)\//;
const PARTS = /(?<=\.)(?=\w)|(?<=[a-z0-9])(?=[A-Z])/;
const WORDS = /(?<=[._])(?=\w)|(?<=[a-z0-9])(?=[A-Z])/;

// a title's breaks: after a dot and between CamelCase words; after an underscore only in a part
// longer than 12 characters, too long for a phone's line (FORMAT_RANGES and the title's "#" are
// 13 capitals and a link: wider than a phone's line, they broke as FORMAT_RANGE|S)
const TITLE = (text) =>
  text.split(PARTS).flatMap((part) => (part.length > 12 ? part.split(/(?<=_)(?=\w)/) : [part]));

function breakName(node, breaks = WORDS) {
  const text = node.textContent.trim();
  if (!NAME.test(text) || text.length <= 12) return;
  const parts = typeof breaks === "function" ? breaks(text) : text.split(breaks);
  node.replaceWith(...parts.flatMap((part, i) => (i ? [document.createElement("wbr"), part] : [part])));
}

document.addEventListener("DOMContentLoaded", () => {
  for (const link of document.querySelectorAll(".bd-sidebar-primary a.reference")) {
    if (link.childNodes.length === 1 && link.firstChild.nodeType === Node.TEXT_NODE) breakName(link.firstChild);
  }
  // an API page's title: its first text node is the name, then the theme's "#" link. It breaks
  // after a dot; after an underscore only inside a part too long for a phone's line
  // (unitscale.|unit_scale, not unitscale.unit_|scale)
  for (const title of document.querySelectorAll(".bd-article h1")) {
    if (title.firstChild && title.firstChild.nodeType === Node.TEXT_NODE) breakName(title.firstChild, TITLE);
  }
  // the footer's Previous/Next titles, in half a phone's width: as in the sidebar
  for (const title of document.querySelectorAll(".prev-next-area .prev-next-title")) {
    if (title.childNodes.length === 1 && title.firstChild.nodeType === Node.TEXT_NODE) breakName(title.firstChild);
  }
  // the right-hand "On this page" column's entries (TransformedModule.|to_|graph_|module()), in
  // its 240 px: as in the left sidebar (api.css lets them wrap)
  for (const name of document.querySelectorAll(".bd-sidebar-secondary code span.pre")) {
    if (name.childNodes.length === 1 && name.firstChild.nodeType === Node.TEXT_NODE) breakName(name.firstChild);
  }
  // on an API page, every name in code and signatures breaks as a title does (api.css then
  // stops the theme's break anywhere inside a word: FORMAT_RANGE|S, scal|ed_dot): a summary's
  // torch.nn.functional.scaled_dot_product_attention() wraps in its cell instead of running past it
  if (API_PAGE.test(window.location.pathname)) {
    document.documentElement.classList.add("api-page");
    for (const name of document.querySelectorAll(".bd-article span.pre")) {
      if (name.closest("table.autosummary td:first-child")) continue;
      if (name.childNodes.length === 1 && name.firstChild.nodeType === Node.TEXT_NODE) breakName(name.firstChild, TITLE);
    }
  } else {
    // elsewhere (tutorials, guides) a name in inline code breaks as a title does too: on a phone
    // unitscale.tracking.|ScaleTracking|Interpreter, not ScaleTrackingInterpret|er
    // (an expression, torch.distributed.pipelining.pipeline(model, ...), also after "(" and ",")
    const EXPRESSION = /(?<=[.(,])(?=\w)|(?<=[a-z0-9])(?=[A-Z])/;
    for (const name of document.querySelectorAll(".bd-article code.literal span.pre")) {
      if (name.childNodes.length !== 1 || name.firstChild.nodeType !== Node.TEXT_NODE) continue;
      const text = name.firstChild.textContent;
      if (NAME.test(text.trim())) breakName(name.firstChild, TITLE);
      else if (text.length > 12) {
        const parts = text.split(EXPRESSION);
        name.firstChild.replaceWith(...parts.flatMap((part, i) => (i ? [document.createElement("wbr"), part] : [part])));
      }
    }
  }
  // an API table's names (unitscale.functional.scaled_dot_product_attention)
  for (const name of document.querySelectorAll(".bd-article table.autosummary td:first-child span.pre")) {
    if (name.childNodes.length === 1 && name.firstChild.nodeType === Node.TEXT_NODE) breakName(name.firstChild, PARTS);
  }
});
