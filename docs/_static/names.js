// Long names break between their parts, never inside a word: after a dot
// (unitscale.capture.GRAPH_ROUTE_NAMES) and between the words of a CamelCase name
// (ScaleTracking|Interpreter). A narrow sidebar, and an API page's title on a phone, then wrap
// where a reader would, instead of letter by letter where the line runs out.
const NAME = /^[\w.]+$/;
const BREAKS = /(?<=\.)|(?<=[a-z0-9])(?=[A-Z])/;

function breakable(text) {
  const parts = text.split(BREAKS);
  return parts.flatMap((part, i) => (i ? [document.createElement("wbr"), part] : [part]));
}

document.addEventListener("DOMContentLoaded", () => {
  for (const link of document.querySelectorAll(".bd-sidebar-primary a.reference")) {
    const text = link.textContent;
    if (NAME.test(text) && text.length > 12) link.replaceChildren(...breakable(text));
  }
  // an API page's title: its first text node is the name, then the theme's "#" link
  for (const title of document.querySelectorAll(".bd-article h1")) {
    const first = title.firstChild;
    if (first && first.nodeType === Node.TEXT_NODE && NAME.test(first.textContent.trim())) {
      first.replaceWith(...breakable(first.textContent.trim()));
    }
  }
});
