// A figure shrinks with the column (on a phone, to about half its size): a click or tap opens
// it at full size.
document.addEventListener("DOMContentLoaded", () => {
  for (const img of document.querySelectorAll(".bd-article .cell_output img")) {
    if (img.closest("a")) continue;
    // a figure drawn for two widths (figure_widths.py) is a <picture>: the link holds all of it
    // and opens the desktop drawing, the larger one
    const figure = img.closest("picture") || img;
    const link = document.createElement("a");
    link.href = img.src;
    link.title = "Open the figure at full size";
    figure.replaceWith(link);
    link.appendChild(figure);
  }
});
