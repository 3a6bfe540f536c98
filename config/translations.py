"""The zh-Hans catalogues: rebuilding them, and the check that fails on a string left in English.

Where strings go (makemessages sends each file's strings to the nearest `locale/` above it):
  locale/                      templates/, config/, portal/, common/ and static/js (domain djangojs)
  <app>/locale/                teams, inventory, allocations, monitoring, audit, accounting: their Python and
                               templates
The compiled .mo files are committed beside their .po, so `make run` needs no gettext tools.

`check()` finds three kinds of fault:
  - a catalogue that is not current: makemessages, run on a copy of the tree, would change it (a string
    was marked, changed or removed and `manage.py translations` was not run), or its .mo is older;
  - an entry with an empty or fuzzy translation;
  - text that is not marked at all: words in a template outside {% translate %}/{% blocktranslate %},
    and a literal message in Python where people read it (the portal's errors, Django's and DRF's
    ValidationError, messages.*, verbose_name, help_text, label, choices' labels, admin descriptions).
"""
from __future__ import annotations

import ast
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

from django.template.base import Lexer, TokenType

BASE_DIR = Path(__file__).resolve().parent.parent
LANGUAGE = "zh_Hans"
# What makemessages reads; the rest of the tree is not shown to portal users (tests, the host agent, the
# benchmarks, the command line, which has its own catalogue in cli/).
SOURCES = ["templates", "config", "portal", "common", "teams", "inventory", "allocations", "monitoring",
           "audit", "accounting", "static"]
IGNORE = ["tests", "migrations", "management", "*.min.js", "placement", "cli", "agent", "benchmarks", "scripts",
          "docs", "deploy", "var", "staticfiles", "node_modules"]
# The apps with a catalogue of their own (their Python and their templates/).
APPS = ["teams", "inventory", "allocations", "monitoring", "audit", "accounting"]
MAKEMESSAGES = ["makemessages", "--locale", LANGUAGE, "--no-obsolete", "--add-location=file", "--no-wrap"]
for pattern in IGNORE:
    MAKEMESSAGES += ["--ignore", pattern]

# A word people read: it has a lowercase letter ("GPU", "MIG", "ECC" are names in every language).
WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*[a-z][A-Za-z'’-]*|[a-z]{2,}")
# Units and names that stay as they are in Chinese text.
KEPT_WORDS = {"GiB", "MiB", "MHz", "vGPU", "gpupool", "kubectl", "nvidia-smi", "HAMi", "e.g"}


def rebuild() -> None:
    """Re-extract every catalogue in place and compile it (what a developer runs after editing strings)."""
    _extract(BASE_DIR)
    _compile(BASE_DIR)


def check() -> list[str]:
    """Every fault, as a line naming the file; empty when the catalogues are complete and current."""
    faults = unmarked_template_text() + unmarked_python_text()
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "tree"
        copy.mkdir()
        shutil.copy2(BASE_DIR / "manage.py", copy / "manage.py")
        for name in [*SOURCES, "locale"]:
            if (BASE_DIR / name).exists():
                shutil.copytree(BASE_DIR / name, copy / name,
                                ignore=shutil.ignore_patterns("__pycache__", "tests", "*.mo"))
        _extract(copy)
        for po in sorted(copy.rglob(f"locale/{LANGUAGE}/LC_MESSAGES/*.po")):
            relative = po.relative_to(copy)
            mine = BASE_DIR / relative
            if not mine.exists():
                faults.append(f"{relative}: missing; run `python manage.py translations`")
                continue
            if _without_dates(po) != _without_dates(mine):
                faults.append(f"{relative}: not current (strings were marked, changed or removed); "
                              "run `python manage.py translations` and translate what it adds")
            faults += [f"{relative}: not translated: {msgid}" for msgid in _entries(mine, "--untranslated")]
            faults += [f"{relative}: fuzzy (check the translation, then drop the flag): {msgid}"
                       for msgid in _entries(mine, "--only-fuzzy")]
            compiled = Path(scratch) / "compiled.mo"
            subprocess.run(["msgfmt", "--check-format", "-o", str(compiled), str(mine)], check=True)
            mo = mine.with_suffix(".mo")
            if not mo.exists() or not filecmp.cmp(compiled, mo, shallow=False):
                faults.append(f"{relative.with_suffix('.mo')}: not compiled from its .po; "
                              "run `python manage.py translations`")
    return faults


def _extract(root: Path) -> None:
    for name in ["locale", *(f"{app}/locale" for app in APPS)]:
        (root / name).mkdir(exist_ok=True)
    before = {po: po.read_text(encoding="utf-8") for po in root.rglob(f"locale/{LANGUAGE}/LC_MESSAGES/*.po")}
    env = {**os.environ, "PYTHONPATH": str(root)}
    for domain in ("django", "djangojs"):
        subprocess.run([sys.executable, "manage.py", *MAKEMESSAGES, "--domain", domain], cwd=root, env=env,
                       check=True, stdout=subprocess.DEVNULL)
    for po in root.rglob(f"locale/{LANGUAGE}/LC_MESSAGES/*.po"):
        if not _entries(po, "--no-obsolete"):
            po.unlink()  # a domain with no string gets a catalogue of just its header: nothing to keep
            continue
        text = po.read_text(encoding="utf-8")
        if text.find(HEADER_TEMPLATE[0]) != -1:  # a new catalogue: say what it is, once
            po.write_text(_filled_header(text), encoding="utf-8")
        elif po in before and _without_dates(po) == _without_dates_of(before[po]):
            # Nothing changed but makemessages' timestamp: keep the file as it was, so that branches
            # that did not touch a catalogue do not collide on its date line.
            po.write_text(before[po], encoding="utf-8")


# makemessages starts a catalogue with a template header (marked fuzzy, so msgfmt would drop it);
# msgmerge keeps whatever header the catalogue has from then on.
HEADER_TEMPLATE = ('#, fuzzy\nmsgid ""', '"Project-Id-Version: PACKAGE VERSION\\n"', '"Language: \\n"')


def _filled_header(text: str) -> str:
    head, rest = text.split("\n\n", 1)
    head = "\n".join(line for line in head.splitlines() if not line.startswith("#") or line == "#, fuzzy")
    head = (head.replace(HEADER_TEMPLATE[0], 'msgid ""')
            .replace(HEADER_TEMPLATE[1], '"Project-Id-Version: GPU Pool Portal\\n"')
            .replace(HEADER_TEMPLATE[2], '"Language: zh_Hans\\n"'))
    return f"# Simplified Chinese for GPU Pool Portal.\n{head}\n\n{rest}"


def _compile(root: Path) -> None:
    for po in root.rglob(f"locale/{LANGUAGE}/LC_MESSAGES/*.po"):
        subprocess.run(["msgfmt", "--check-format", "-o", str(po.with_suffix(".mo")), str(po)], check=True)


def _without_dates(po: Path) -> list[str]:
    return _without_dates_of(po.read_text(encoding="utf-8"))


def _without_dates_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith(('"POT-Creation-Date:', '"PO-Revision-Date:'))]


def _entries(po: Path, selection: str) -> list[str]:
    """The msgids msgattrib selects (`--untranslated`, `--only-fuzzy`), without the header."""
    out = subprocess.run(["msgattrib", selection, "--no-wrap", str(po)], check=True, capture_output=True,
                         text=True).stdout
    return [line[len("msgid "):] for line in out.splitlines() if line.startswith("msgid ") and line != 'msgid ""']


# --- Text that is not marked -------------------------------------------------------------------------

def _people_words(text: str) -> list[str]:
    return [word for word in WORD.findall(text) if word.strip("'’-") not in KEPT_WORDS]


class _TextCollector(HTMLParser):
    """The text a page shows: element text and the attributes people read, not code, scripts or styles."""

    READ_ATTRIBUTES = {"title", "placeholder", "aria-label", "alt", "data-confirm"}
    CODE = {"script", "style", "code", "pre", "kbd", "samp"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self._code_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.CODE:
            self._code_depth += 1
        attributes = dict(attrs)
        for name, value in attrs:
            if value and (name in self.READ_ATTRIBUTES
                          or (name == "value" and attributes.get("type") in ("submit", "button"))):
                self.texts.append(value)

    def handle_endtag(self, tag):
        if tag in self.CODE and self._code_depth:
            self._code_depth -= 1

    def handle_data(self, data):
        if not self._code_depth:
            self.texts.append(data)


def page_words(html: str) -> list[str]:
    """The words people read on a rendered page (its text and the attributes people read, not code, scripts
    or styles) that the check's word rule calls untranslated: empty for a page fully in Chinese."""
    collector = _TextCollector()
    collector.feed(html)
    collector.close()
    return [word for text in collector.texts for word in _people_words(text)]


def template_texts(source: str) -> list[str]:
    """The pieces of a template's text outside every template tag and variable and outside
    {% blocktranslate %}: what would reach people untranslated."""
    pieces: list[str] = []
    inside: list[str] = []  # the open blocktranslate / comment / verbatim tags
    for token in Lexer(source).tokenize():
        if token.token_type == TokenType.BLOCK:
            name = token.split_contents()[0] if token.contents else ""
            if name in ("blocktranslate", "blocktrans", "comment", "verbatim"):
                inside.append(name)
            elif name.startswith("end") and inside and name[3:] == inside[-1]:
                inside.pop()
            pieces.append("\x00")  # a tag's output, not text
        elif token.token_type == TokenType.TEXT and not inside:
            pieces.append(token.contents)
        else:
            pieces.append("\x00")
    collector = _TextCollector()
    collector.feed("".join(pieces))
    collector.close()
    return [text.replace("\x00", " ").strip() for text in collector.texts if _people_words(text.replace("\x00", " "))]


def unmarked_template_text() -> list[str]:
    faults = []
    roots = [BASE_DIR / "templates", *(BASE_DIR / app / "templates" for app in APPS)]
    for template in sorted(path for root in roots for path in root.rglob("*")):
        if template.suffix in (".html", ".txt"):
            for text in template_texts(template.read_text(encoding="utf-8")):
                faults.append(f"{template.relative_to(BASE_DIR)}: not marked for translation: {text[:80]!r}")
    return faults


# Calls whose message people read: the portal's errors (common.errors and its kin), Django's and DRF's
# ValidationError, and the messages framework.
MESSAGE_CALLS = {"ApplicationError", "ValidationFailed", "PermissionDenied", "NotFound", "Conflict",
                 "PayloadTooLarge", "ServiceUnavailable", "ClusterUnavailable", "InvalidCredentials",
                 "Flooding", "StorageBusy", "ValidationError", "success", "error", "info", "warning",
                 "add_message", "add_error"}
# Where the message is among the arguments: messages.success(request, message), add_message(request, level,
# message), form.add_error(field, message); the errors take it first.
MESSAGE_POSITION = {"success": 1, "error": 1, "info": 1, "warning": 1, "add_message": 2, "add_error": 1}
TEXT_KEYWORDS = {"message", "verbose_name", "verbose_name_plural", "help_text", "label", "empty_label"}
TEXT_ATTRIBUTES = {"verbose_name", "verbose_name_plural", "short_description"}
CHOICES_BASES = {"TextChoices", "IntegerChoices", "Choices"}


def _literal_text(node: ast.AST | None) -> bool:
    """A str literal with words in it, an f-string, or a literal formatted with % or .format()."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(_people_words(node.value))
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return _literal_text(node.left) or _literal_text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _literal_text(node.func.value)
    if isinstance(node, ast.Dict):
        return any(_literal_text(value) for value in node.values)
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_literal_text(item) for item in node.elts)
    if isinstance(node, ast.IfExp):
        return _literal_text(node.body) or _literal_text(node.orelse)
    return False


def _called(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def python_faults(source: str) -> list[tuple[int, str]]:
    """(line, what) for each literal message in `source` that people read and gettext does not wrap."""
    faults: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _called(node)
            if name in MESSAGE_CALLS:
                position = MESSAGE_POSITION.get(name, 0)
                if len(node.args) > position and _literal_text(node.args[position]):
                    faults.append((node.lineno, f"{name}(…) message"))
            if name == "display":  # @admin.display(description=…)
                for keyword in node.keywords:
                    if keyword.arg == "description" and _literal_text(keyword.value):
                        faults.append((node.lineno, "admin description"))
            for keyword in node.keywords:
                if keyword.arg in TEXT_KEYWORDS and _literal_text(keyword.value):
                    faults.append((node.lineno, f"{keyword.arg}="))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                attribute = getattr(target, "id", None) or getattr(target, "attr", None)
                if attribute in TEXT_ATTRIBUTES and _literal_text(node.value):
                    faults.append((node.lineno, attribute))
        elif isinstance(node, ast.ClassDef) and {getattr(b, "attr", getattr(b, "id", "")) for b in node.bases} & CHOICES_BASES:
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Tuple)
                        and len(statement.value.elts) == 2 and _literal_text(statement.value.elts[1])):
                    faults.append((statement.lineno, "choice label"))
    return sorted(faults)


def unmarked_python_text() -> list[str]:
    faults = []
    for name in SOURCES:
        for path in sorted((BASE_DIR / name).rglob("*.py")):
            relative = path.relative_to(BASE_DIR)
            if set(relative.parts) & {"tests", "migrations", "management", "placement"} or relative.name == "settings.py":
                continue
            for line, what in python_faults(path.read_text(encoding="utf-8")):
                faults.append(f"{relative}:{line}: {what} not marked for translation")
    return faults
