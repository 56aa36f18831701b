"""Sphinx configuration of the fleetops site: ``make docs`` builds it strictly (warnings fail)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "fleetops"
author = "fleetops maintainers"
copyright = author
release = version = yaml.safe_load((DOCS.parent / "galaxy.yml").read_text())["version"]

extensions = ["myst_parser", "sphinx_antsibull_ext", "fleetops_docs"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 4  # [text](page.md#a-heading) links, checked like any other reference
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings = ["myst.header"]  # some pages start at ## under their title
nitpicky = True

html_theme = "sphinx_ansible_theme"
html_title = f"fleetops {release}"
html_show_sphinx = False
html_copy_source = False
html_theme_options = {"collapse_navigation": False}
pygments_style = "ansible"

# antsibull-docs's pages link to the Ansible docsite: resolved offline through a local inventory
# (fleetops_docs.ANSIBLE_TARGETS, written before the build reads it).
extensions.append("sphinx.ext.intersphinx")
intersphinx_mapping = {
    "ansible": ("https://docs.ansible.com/projects/ansible/latest/", str(DOCS / "reference" / "ansible.inv"))
}
intersphinx_timeout = 1

# The theme's top bar links to the Ansible project's pages by default: none here.
html_theme_options["topbar_links"] = {}
