// An output that scrolls sideways (a printed table, a report's HTML table wider than the column)
// shows a shadow at the edge where more is hidden (unitscale.css, .scrolls-x): a reader on a
// phone sees that the table goes on. Checked again when the window's width changes.
(() => {
  const boxes = () => document.querySelectorAll(".bd-article .cell_output pre, .bd-article .unitscale-table");
  const mark = () => {
    for (const box of boxes()) {
      const hidden = box.scrollWidth > box.clientWidth + 1;
      box.classList.toggle("scrolls-x", hidden);
      box.classList.toggle("scrolled-to-end", hidden && box.scrollLeft + box.clientWidth >= box.scrollWidth - 1);
    }
  };
  document.addEventListener("DOMContentLoaded", () => {
    mark();
    for (const box of boxes()) box.addEventListener("scroll", mark, { passive: true });
  });
  window.addEventListener("resize", mark);
})();
