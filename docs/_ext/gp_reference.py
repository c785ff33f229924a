"""Reference pages generated from the code, so that they cannot drift from it.

* ``.. gp-config-keys::`` — every config key (`gossip_powersgd.training.keydocs.key_reference`,
  the generator `gossip-train --help-config` prints from): type, default, meaning, accepted names.
* ``.. gp-cli:: module:function`` (option ``:prog:``) — a program's options from its argparse
  parser, subcommands included.
* ``.. gp-errors::`` — every one-line error message the package raises (read from the source's
  ``raise`` statements), grouped by what the user was doing (`error_catalogue`).
* ``{repo}`path``` — a link to a file of the repository (a committed result page); a path that
  does not exist fails the build.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

ROOT = Path(__file__).resolve().parents[2]
LOG = logging.getLogger(__name__)


# ---- inline text -------------------------------------------------------------------------------
_CODE = re.compile(r"``(.+?)``|`([^`]+)`")


def rst_inline(text: str) -> str:
    """Plain text with `code` spans, as reStructuredText: the spans literal, the rest escaped."""
    out, position = [], 0
    for match in _CODE.finditer(text):
        out.append(_escape(text[position : match.start()]))
        out.append(f"``{match.group(1) or match.group(2)}``")
        position = match.end()
    out.append(_escape(text[position:]))
    return "".join(out)


def _escape(text: str) -> str:
    text = text.replace("\\", "\\\\")
    return re.sub(r"([*_`|])", r"\\\1", text)


def _parse(directive: SphinxDirective, lines: List[str]) -> List[nodes.Node]:
    """`lines` of reStructuredText (section titles allowed) as nodes."""
    holder = nodes.section()
    holder.document = directive.state.document
    nested_parse_with_titles(directive.state, StringList(lines, "<generated>"), holder)
    return holder.children


# ---- configuration keys ------------------------------------------------------------------------
class ConfigKeys(SphinxDirective):
    """Every config key, grouped: the core keys, then each feature's."""

    has_content = False

    def run(self) -> List[nodes.Node]:
        from gossip_powersgd.training.keydocs import CORE, key_reference

        keys = key_reference()
        groups: Dict[str, list] = {}
        for key in keys:
            groups.setdefault(key.group, []).append(key)
        lines: List[str] = []
        for group, members in groups.items():
            if group == CORE:
                title = "Core keys"
            else:
                section = members[0].section
                title = f"Feature ``{group}``"
                if section:
                    title += f" (section ``{section}:``)"
            lines += [title, "-" * len(title) * 2, ""]
            if group != CORE and members[0].section:
                example = members[0]
                lines += [
                    f"These keys may also be written nested: ``{example.section}: "
                    f"{{{example.nested}: ...}}`` is ``{example.name}``, and "
                    f"``--set {example.section}.{example.nested}=...`` sets it.",
                    "",
                ]
            for key in members:
                lines += self._entry(key)
        return _parse(self, lines)

    @staticmethod
    def _entry(key) -> List[str]:
        lines = [
            f".. confval:: {key.name}",
            f"   :type: {rst_inline(key.type_name)}",
            f"   :default: ``{key.default!r}``",
            "",
            f"   {rst_inline(key.doc) or 'Not documented.'}",
            "",
        ]
        if key.nested:
            lines += [f"   Nested spelling: ``{key.section}: {{{key.nested}: ...}}``.", ""]
        if key.choices:
            names = ", ".join(f"``{c}``" for c in key.choices)
            lines += [f"   Accepted: {names}.", ""]
        return lines


# ---- command lines -----------------------------------------------------------------------------
class CommandLine(SphinxDirective):
    """A program's options, from the parser `module:function` returns."""

    required_arguments = 1
    option_spec = {"prog": directives.unchanged_required}

    def run(self) -> List[nodes.Node]:
        module, _, name = self.arguments[0].partition(":")
        parser = getattr(importlib.import_module(module), name)()
        prog = self.options.get("prog", parser.prog)
        return _parse(self, list(self._program(parser, prog)))

    def _program(self, parser: argparse.ArgumentParser, prog: str) -> Iterator[str]:
        parser.prog = prog
        yield f".. program:: {prog}"
        yield ""
        if parser.description:
            yield rst_inline(parser.description)
            yield ""
        yield ".. code-block:: text"
        yield ""
        for line in parser.format_usage().rstrip().splitlines():
            yield f"   {line}"
        yield ""
        formatter = parser._get_formatter()
        subcommands = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                subcommands.append(action)
                continue
            if isinstance(action, argparse._HelpAction):
                continue
            yield from self._option(action, formatter)
        if parser.epilog:
            yield rst_inline(parser.epilog)
            yield ""
        for action in subcommands:
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                title = f"{prog} {name}"
                yield title
                yield "~" * (len(title) + 4)
                yield ""
                if helps.get(name) and not sub.description:
                    sub.description = helps[name]
                yield from self._program(sub, title)

    @staticmethod
    def _option(action: argparse.Action, formatter) -> Iterator[str]:
        if action.option_strings:
            metavar = ""
            if action.nargs != 0:
                metavar = " " + formatter._format_args(action, action.dest.upper())
            signature = ", ".join(f"{o}{metavar}" for o in action.option_strings)
        else:
            signature = formatter._format_args(action, action.dest)
        help_text = formatter._expand_help(action) if action.help else ""
        default = action.default
        if (
            action.option_strings
            and default not in (None, False, [], argparse.SUPPRESS)
            and "default" not in help_text
        ):
            help_text += f" (default: {default})"
        yield f".. option:: {signature}"
        yield ""
        yield f"   {rst_inline(help_text) or 'See the usage line.'}"
        yield ""


# ---- error messages ----------------------------------------------------------------------------
#: What the user was doing when a module raises, by path prefix (first match wins).
AREAS: List[Tuple[str, Tuple[str, ...]]] = [
    (
        "Writing a config or a spec",
        (
            "gossip_powersgd/training/config.py",
            "gossip_powersgd/training/validation.py",
            "gossip_powersgd/training/yaml_loader.py",
            "gossip_powersgd/training/features.py",
            "gossip_powersgd/training/extensions.py",
            "gossip_powersgd/specs.py",
            "topologies/grammar.py",
        ),
    ),
    ("Choosing a topology or a schedule", ("topologies/",)),
    (
        "Choosing an algorithm or a compressor",
        ("gossip_powersgd/algorithms/", "gossip_powersgd/compressors/"),
    ),
    (
        "Bringing data or a model",
        (
            "gossip_powersgd/training/data.py",
            "gossip_powersgd/training/records.py",
            "gossip_powersgd/training/torch_datasets.py",
            "gossip_powersgd/training/partition.py",
            "gossip_powersgd/training/models.py",
            "gossip_powersgd/training/zoo.py",
            "gossip_powersgd/training/synthetic_images.py",
            "gossip_powersgd/training/batches.py",
            "gossip_powersgd/training/batchnorm.py",
        ),
    ),
    (
        "Launching (mpiexec, torchrun, in-process) and while peers talk",
        (
            "gossip_powersgd/launch.py",
            "gossip_powersgd/runner.py",
            "gossip_powersgd/cli/",
            "gossip_powersgd/comm/",
            "gossip_powersgd/metrics.py",
            "gossip_powersgd/utils.py",
        ),
    ),
    (
        "Run directories, checkpoints and resuming",
        (
            "gossip_powersgd/training/checkpoint.py",
            "gossip_powersgd/training/resume.py",
            "gossip_powersgd/training/rundir.py",
            "gossip_powersgd/training/churn_resume.py",
            "gossip_powersgd/training/records.py",
        ),
    ),
    (
        "Peers that leave and join",
        (
            "gossip_powersgd/membership/",
            "gossip_powersgd/training/churn.py",
            "gossip_powersgd/training/churn_run.py",
        ),
    ),
    ("Differential privacy and attacks", ("gossip_powersgd/privacy/",)),
    ("The emulated cluster", ("gossip_powersgd/cluster/",)),
    ("Training", ("gossip_powersgd/training/",)),
]
#: Raised for programming errors inside the package, not for anything a user did.
INTERNAL = {"AssertionError", "NotImplementedError", "StopIteration"}
PLACEHOLDER = "…"


def message_template(node: ast.AST) -> Optional[str]:
    """The text of a string literal, f-string or concatenation of them, each interpolated value
    written as `PLACEHOLDER`; None for anything else (a message built by a call)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else PLACEHOLDER for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = message_template(node.left), message_template(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def source_messages(roots=("gossip_powersgd", "topologies")) -> List[Tuple[str, str, str]]:
    """(path, exception name, message template) of every ``raise Name("...")`` in the package."""
    found = []
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), relative)):
                if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                    continue
                if not node.exc.args:
                    continue
                func = node.exc.func
                name = getattr(func, "id", getattr(func, "attr", ""))
                text = message_template(node.exc.args[0])
                if text is not None:
                    found.append((relative, name, text))
    return found


def area_of(path: str) -> str:
    return next(
        (title for title, prefixes in AREAS if path.startswith(prefixes)), "Everything else"
    )


def error_catalogue() -> Dict[str, List[str]]:
    """{area: sorted message templates}: the one-line errors a user can meet, without the
    package's internal checks and without messages that are nothing but a placeholder."""
    catalogue: Dict[str, set] = {}
    for path, name, text in source_messages():
        if name in INTERNAL or "\n" in text.strip():
            continue
        if len(text.replace(PLACEHOLDER, "").strip(" :;,.'\"()")) < 12:
            continue
        catalogue.setdefault(area_of(path), set()).add(" ".join(text.split()))
    order = [title for title, _ in AREAS] + ["Everything else"]
    return {area: sorted(catalogue[area]) for area in order if area in catalogue}


class ErrorIndex(SphinxDirective):
    has_content = False

    def run(self) -> List[nodes.Node]:
        out: List[nodes.Node] = []
        for area, messages in error_catalogue().items():
            section = nodes.section(ids=[nodes.make_id(f"errors {area}")])
            section += nodes.title(text=area)
            section += nodes.paragraph(text=f"{len(messages)} messages.")
            items = nodes.bullet_list()
            for text in messages:
                items += nodes.list_item("", nodes.paragraph("", "", nodes.literal(text=text)))
            section += items
            out.append(section)
        return out


# ---- links to the repository -------------------------------------------------------------------
def repo_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``{repo}`experiments/results/demo.md``` (or ``{repo}`title <path>```): a link to a
    repository file, checked to exist."""
    match = re.match(r"^(.*?)\s*<([^<>]+)>$", text)
    title, path = (match.group(1), match.group(2)) if match else (text, text)
    env = inliner.document.settings.env
    if not (ROOT / path).exists():
        LOG.warning(
            "{repo} link to a file that does not exist: %s", path, location=(env.docname, lineno)
        )
    base = env.config.gp_repo_url.rstrip("/")
    if base:
        uri = f"{base}/{path}"
    else:  # the checkout's own file, from docs/_build/html/<docname>.html
        uri = "../" * (env.docname.count("/") + 3) + path
    node = nodes.reference(rawtext, "", refuri=uri)
    node += nodes.literal(text=title) if title == path else nodes.Text(title)
    return [node], []


def setup(app):
    app.add_config_value("gp_repo_url", "", "html")
    app.add_directive("gp-config-keys", ConfigKeys)
    app.add_directive("gp-cli", CommandLine)
    app.add_directive("gp-errors", ErrorIndex)
    app.add_role("repo", repo_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
