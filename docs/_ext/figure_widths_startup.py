"""Run by every kernel that executes a page of the site, before its first cell (``PYTHONSTARTUP``,
set by the ``figure_widths`` extension): figures come with a rendering for phones.

IPython runs this file in the notebook's namespace with this folder on ``sys.path``; the function
leaves no name behind.
"""


def _unitscale_site_figures() -> None:
    import figure_widths

    figure_widths.install()


_unitscale_site_figures()
del _unitscale_site_figures
