"""Sphinx configuration of the course site (`make book`; book/build.py stages the pages and runs Sphinx on them).

Sphinx + sphinx-book-theme + myst-nb, the stack Jupyter Book 1 is made of: search, in-page contents, dark mode, a
mobile menu, copy and download buttons come from the theme. Everything here is configuration; book/_ext/course.py
adds what configuration cannot (an alt text for every figure). Nothing is fetched at build or view time."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "UniCache Workbench"
author = "UniCache Workbench"
copyright = "the UniCache Workbench authors"
root_doc = "index"  # README.md, staged as index.md
extensions = ["myst_nb", "course"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
# docs/TESTING.md's table headings skip a level; docs/ARCHITECTURE.md's mermaid diagram shows as text
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header", "misc.highlighting_failure"]

# the notebooks are shown as committed: executed by `make notebooks`, never re-executed here
nb_execution_mode = "off"
# a page can override the mode in its own settings (book/build.py refuses such a page); excluded here as well
nb_execution_excludepatterns = ["*", "**/*"]
nb_merge_streams = True
# the explorer's widget output carries its kernel-free HTML form (unicache_lib/explorer): show that, never the
# widget view (it needs a kernel and a widget manager); and no ipywidgets scripts from a CDN on any page
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None),
                              ("html", "application/javascript", None)]
nb_ipywidgets_js = {}
nb_render_markdown_format = "myst"

# the lessons link into docs/ with GitHub's heading anchors (../docs/GLOSSARY.md#anchors)
myst_heading_anchors = 6
myst_enable_extensions = ["html_image", "dollarmath", "strikethrough"]
myst_url_schemes = ["http", "https", "mailto"]

html_theme = "sphinx_book_theme"
html_title = "UniCache Workbench"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = ["course.js"]  # the article header's menu buttons open the menu (a theme bug; see the file)
html_favicon = "_static/favicon.svg"  # (without one, every page asks the server for /favicon.ico: a 404)
html_copy_source = True  # the download button offers each lesson's .ipynb (and each page's markdown)
html_show_sourcelink = False
smartquotes = False  # titles and prose keep their straight quotes (code names, the sidebar's lesson titles)
html_last_updated_fmt = None
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "home_page_in_toc": True,
    "navigation_with_keys": False,
    "show_navbar_depth": 1,
}
html_context = {"default_mode": "auto"}
