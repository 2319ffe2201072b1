// Outputs on a phone.
// - An output that scrolls sideways (a printed table, a report's HTML table wider than the column)
//   shows a shadow at the edge where more is hidden (unitscale.css, .scrolls-x): a reader sees
//   that the table goes on.
// - A table a page's code printed as Markdown or HTML (the Benchmarks page's) that is wider than a
//   phone's column becomes cards: one block per row, each value under its column's name
//   (.as-cards). A report's own table (.unitscale-table) keeps its key columns and scrolls.
// - A prose table of long sentences (class cards-on-phone, from a page's {table} directive) is
//   cards on a phone whatever its width (unitscale.css): one block per row, the row's first cell
//   its title and each other value after its column's name, which this script gives each cell.
//   The Execution report's table (execution-report) is cards on a phone the same way.
// - Any other box that still scrolls (a cell's code, a static ```text table, a prose table) shows
//   the same cue.
// - A glued number in prose ("1.6e-07", "-0.25", "12%") stays on one line (.glued-number): a
//   line break at its "e-" or sign reads as two numbers. A glued phrase wraps as prose does.
// Both are checked again when the window's width changes or a folded table is opened.
(() => {
  const phone = () => window.matchMedia("(max-width: 540px)").matches;
  const boxes = () => document.querySelectorAll(".bd-article .cell_output pre, .bd-article div.highlight pre, .bd-article .unitscale-table, .bd-article .benchmark-table, .bd-article .pst-scrollable-table-container");
  const label = (table) => {
    const heads = [...table.querySelectorAll("thead th")].map((th) => th.innerText.trim());
    for (const row of table.querySelectorAll("tbody tr")) {
      [...row.cells].forEach((cell, i) => { cell.dataset.label = heads[i] || ""; });
    }
  };
  const cards = () => {
    // the stylesheet stacks these on a phone; the labels name each value there
    for (const table of document.querySelectorAll(".bd-article table.cards-on-phone, .bd-article table.execution-report")) label(table);
    for (const table of document.querySelectorAll(".bd-article .cell_output table")) {
      if (table.closest(".unitscale-table")) continue;
      table.classList.remove("as-cards");
      // the table scrolls in its own box, or in the theme's container around it
      const wide = [table, table.closest(".pst-scrollable-table-container"), table.closest(".benchmark-table")]
        .some((box) => box && box.scrollWidth > box.clientWidth + 1);
      if (!phone() || !table.getClientRects().length || !wide) continue;
      label(table);
      table.classList.add("as-cards");
    }
  };
  const mark = () => {
    for (const box of boxes()) {
      const hidden = box.scrollWidth > box.clientWidth + 1;
      box.classList.toggle("scrolls-x", hidden);
      box.classList.toggle("scrolled-to-end", hidden && box.scrollLeft + box.clientWidth >= box.scrollWidth - 1);
    }
  };
  const all = () => { cards(); mark(); };
  const NUMBER = /^[-+\u2212]?[\d.,]+(e[-+\u2212]?\d+)?\s?%?$/i;
  const numbers = () => {
    for (const span of document.querySelectorAll(".bd-article span.pasted-text")) {
      if (NUMBER.test(span.textContent.trim())) span.classList.add("glued-number");
    }
  };
  document.addEventListener("DOMContentLoaded", () => {
    numbers();
    all();
    for (const box of boxes()) box.addEventListener("scroll", mark, { passive: true });
    for (const details of document.querySelectorAll(".bd-article details")) details.addEventListener("toggle", all);
  });
  window.addEventListener("resize", all);
})();
