"""Sphinx configuration of the gossip_powersgd documentation (`make docs`).

Pages are Markdown (MyST), the tutorials are sphinx-gallery scripts executed at build time
(docs/examples/ -> docs/tutorials/), the API reference is autodoc with napoleon, and the
configuration, CLI and error references are generated from the code (docs/_ext/gp_reference.py).
Nothing is fetched from the network: no intersphinx, no remote images.
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import gossip_powersgd  # noqa: E402

project = "gossip_powersgd"
author = "the gossip_powersgd authors"
copyright = "the gossip_powersgd authors"
release = version = gossip_powersgd.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx_gallery.gen_gallery",
    "gp_reference",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "examples"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

# API reference: the public names, documented by their docstrings (Google style via napoleon).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"undoc-members": False, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# doctest: `{doctest}` / `{testcode}` blocks in the pages, run by `sphinx-build -b doctest`.
doctest_global_setup = "import torch\ntorch.set_num_threads(1)"

# Tutorials: every script in docs/examples/ runs at build time (in this process, each a few
# seconds); an error in one fails the build.
sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "tutorials",
    "filename_pattern": r"/",
    "ignore_pattern": r"(__init__|_helpers)\.py",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "abort_on_example_error": True,
    "remove_config_comments": True,
    "show_memory": False,
    "min_reported_time": 10**9,
    "reset_modules": ("matplotlib",),
    "capture_repr": ("_repr_html_", "__repr__"),
}

html_theme = "furo"
html_title = f"gossip_powersgd {release}"
html_static_path = []
html_show_sourcelink = False

# Where the repository's committed result pages are linked from ({repo} role): the repository's
# web view when GOSSIP_DOCS_REPO_URL is set, else the files of the checkout the site was built in.
gp_repo_url = os.environ.get("GOSSIP_DOCS_REPO_URL", "")
