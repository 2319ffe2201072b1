// Long dotted names in the sidebar (unitscale.capture.GRAPH_ROUTE_NAMES) may break after a dot,
// so a narrow sidebar wraps them between their parts instead of inside a word.
document.addEventListener("DOMContentLoaded", () => {
  for (const link of document.querySelectorAll(".bd-sidebar-primary a.reference")) {
    const text = link.textContent;
    if (!/^[\w.]+$/.test(text) || !text.includes(".")) continue;
    const parts = text.split(/(?<=\.)/);
    link.replaceChildren(...parts.flatMap((part, i) => (i ? [document.createElement("wbr"), part] : [part])));
  }
});
