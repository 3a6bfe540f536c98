"""The CLI's languages: English (the msgids in the code) and Simplified Chinese.

Two catalogues ship in the package, under gpupool_cli/locale/zh_Hans/LC_MESSAGES/ (.po and compiled .mo):
  gpupool  the CLI's own help texts, messages and table headings (xgettext over gpupool_cli/*.py);
  click    click's own strings ("Usage:", "Options", "Show this message and exit.", its parse errors),
           extracted from the installed click. Click translates with the standard library's
           gettext.gettext, that is the process's text domain in the language named by LANGUAGE, LC_ALL,
           LC_MESSAGES or LANG; activate() points that domain at our click catalogue and sets LANGUAGE
           (in this process only) to the language chosen here.

The language: --lang, else GPUPOOL_LANG, else the first of LANGUAGE, LC_ALL, LC_MESSAGES, LANG that is set
(zh_CN, zh_SG, zh_Hans…, zh → Simplified Chinese; C, en… or anything else → English; in LANGUAGE's list a
language the CLI does not speak is skipped). Help texts are built when gpupool_cli.main is imported, so the
choice is made from the command line before click parses it (choose()). The portal is asked for the same
language (Accept-Language: zh-Hans or en), so its error messages match.

After changing a marked string (or upgrading click):
    python -m gpupool_cli.i18n rebuild   # re-extract both catalogues (translations kept), compile the .mo
    python -m gpupool_cli.i18n check     # what is untranslated, fuzzy or stale; exit 1 if anything
Both need GNU gettext (xgettext, msgmerge, msgattrib, msgfmt); running the CLI does not.
"""
from __future__ import annotations

import ast
import filecmp
import gettext as _gettext
import os
import re
import subprocess
import sys
import tempfile
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

ENGLISH = "en"
CHINESE = "zh_Hans"
LANGUAGES = {ENGLISH: "en", CHINESE: "zh-Hans"}  # the catalogue's name → the BCP 47 tag (--lang, Accept-Language)
DOMAIN = "gpupool"
CLICK_DOMAIN = "click"
PACKAGE_DIR = Path(__file__).resolve().parent
LOCALE_DIR = PACKAGE_DIR / "locale"
ENVIRONMENT = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")

_translation: _gettext.NullTranslations = _gettext.NullTranslations()
_language = ENGLISH


# --- choosing the language ------------------------------------------------------------------------

def spoken(name: str | None) -> str | None:
    """CHINESE or ENGLISH for a language or locale name (zh-Hans, zh_CN.UTF-8, en_GB, C), None for one
    the CLI does not speak (fr_FR, zh_TW: traditional Chinese is not simplified)."""
    normal = (name or "").strip().split(".")[0].split("@")[0].replace("-", "_").lower()
    if normal in ("zh", "zh_cn", "zh_sg", "zh_my") or normal.startswith("zh_hans"):
        return CHINESE
    if normal in ("en", "c", "posix") or normal.startswith("en_"):
        return ENGLISH
    return None


def _on_command_line(argv: Sequence[str]) -> str | None:
    for n, arg in enumerate(argv):
        if arg == "--":
            return None
        if arg == "--lang" and n + 1 < len(argv):
            return argv[n + 1]
        if arg.startswith("--lang="):
            return arg.split("=", 1)[1]
    return None


def choose(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """The language for this run, from the command line's --lang, GPUPOOL_LANG, then the locale variables.
    A value the CLI does not understand in --lang or GPUPOOL_LANG is left for click to refuse."""
    for asked in (_on_command_line(argv), environ.get("GPUPOOL_LANG")):
        if asked and spoken(asked):
            return spoken(asked)
    for variable in ENVIRONMENT:
        value = environ.get(variable)
        if not value:
            continue
        if variable == "LANGUAGE":  # a list in order of preference: the first one the CLI speaks
            for name in value.split(":"):
                if spoken(name):
                    return spoken(name)
            continue
        return spoken(value) or ENGLISH
    return ENGLISH


def activate(language: str) -> None:
    """Speak `language` from now on: the CLI's strings and click's (see the module's docstring)."""
    global _translation, _language
    _language = language
    _translation = _gettext.translation(DOMAIN, LOCALE_DIR, languages=[language], fallback=True)
    _gettext.bindtextdomain(CLICK_DOMAIN, str(LOCALE_DIR))
    _gettext.textdomain(CLICK_DOMAIN)
    os.environ["LANGUAGE"] = language
    if language == CHINESE:
        _wrap_wide_characters()


def columns(text: str) -> int:
    """How many terminal columns `text` takes: a Chinese character (and full-width punctuation) two."""
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


# A Chinese line may break between any two characters, but not before closing punctuation nor after opening.
_CHINESE = "\u2e80-\u2fff\u3040-\u9fff\uf900-\ufaff"
_OPENING = "（《“‘「【"
_CLOSING = "，。、；：！？）》”’」】…"
_PIECES = re.compile(f"[{_OPENING}]*(?:[{_CHINESE}]|[^{_CHINESE}{_OPENING}{_CLOSING}]+)[{_CLOSING}]*"
                     f"|[{_OPENING}{_CLOSING}]+")


def _wrap_wide_characters() -> None:
    """Teach click's help wrapping that Chinese takes two columns a character and may break between any two.

    Click (8.4 and later) measures help text with click._compat.term_len, which counts characters, and only
    breaks lines at spaces: a Chinese help text would run past the terminal's edge. This swaps in a measure
    by columns and a wrapper that splits Chinese runs into characters. Click's own private names, so only
    where they are as expected (else the help is still right, only wrapped too wide)."""
    try:
        from click import _compat, _textwrap, formatting
    except ImportError:
        return
    if not all(hasattr(module, "term_len") for module in (_textwrap, formatting)) or not hasattr(_compat, "strip_ansi"):
        return

    def term_columns(text: str) -> int:
        return columns(_compat.strip_ansi(text))

    _textwrap.term_len = formatting.term_len = term_columns
    if getattr(_textwrap.TextWrapper, "splits_chinese", False):
        return

    class WideTextWrapper(_textwrap.TextWrapper):
        splits_chinese = True

        def _split(self, text):
            return [piece for chunk in super()._split(text) for piece in _PIECES.findall(chunk)]

    _textwrap.TextWrapper = WideTextWrapper


def accept_language() -> str:
    """What the portal is asked for: its error messages in the CLI's language."""
    return LANGUAGES[_language]


def gettext(message: str) -> str:
    return _translation.gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    return _translation.ngettext(singular, plural, n)


def pgettext(context: str, message: str) -> str:
    return _translation.pgettext(context, message)


_ = gettext


# --- the catalogues: rebuilding and checking ------------------------------------------------------

XGETTEXT = ["xgettext", "--language=Python", "--from-code=UTF-8", "--no-wrap", "--add-location=file",
            "--sort-by-file", "--keyword=_", "--keyword=gettext", "--keyword=ngettext:1,2",
            "--keyword=pgettext:1c,2"]
HEADER = {
    DOMAIN: "Simplified Chinese for gpupool, the command line of GPU Pool Portal.",
    CLICK_DOMAIN: "Simplified Chinese for click's own strings, as gpupool shows them (help headings, parse errors).",
}


def _sources(domain: str) -> tuple[Path, list[str]]:
    """Where xgettext runs and the files it reads (relative, so the catalogue names them the same on
    every machine)."""
    if domain == DOMAIN:
        return PACKAGE_DIR.parent, sorted(f"{PACKAGE_DIR.name}/{p.name}" for p in PACKAGE_DIR.glob("*.py"))
    import click

    package = Path(click.__file__).resolve().parent
    # click.testing is for click's users' tests, never shown by gpupool.
    return package.parent, sorted(f"click/{p.name}" for p in package.glob("*.py") if p.name != "testing.py")


def catalogue(domain: str) -> Path:
    return LOCALE_DIR / CHINESE / "LC_MESSAGES" / f"{domain}.po"


def _run(*command: str, cwd: Path | None = None) -> str:
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout


def _template(domain: str, scratch: Path) -> Path:
    pot = scratch / f"{domain}.pot"
    cwd, files = _sources(domain)
    _run(*XGETTEXT, f"--default-domain={domain}", "--package-name=gpupool-cli", "-o", str(pot), *files, cwd=cwd)
    return pot


def _new_catalogue(domain: str, pot: Path) -> str:
    """A first .po from the template: xgettext's header filled in for Simplified Chinese."""
    text = pot.read_text(encoding="utf-8")
    head, rest = text.split("\n\n", 1)
    lines = [line for line in head.splitlines() if not line.startswith("#")]
    replaced = {
        '"Language: \\n"': '"Language: zh_Hans\\n"',
        '"Content-Type: text/plain; charset=CHARSET\\n"': '"Content-Type: text/plain; charset=UTF-8\\n"',
        '"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\\n"': '"Plural-Forms: nplurals=1; plural=0;\\n"',
        '"Last-Translator: FULL NAME <EMAIL@ADDRESS>\\n"': '"Last-Translator: GPU Pool Portal\\n"',
        '"Language-Team: LANGUAGE <LL@li.org>\\n"': '"Language-Team: Simplified Chinese\\n"',
    }
    lines = [replaced.get(line, line) for line in lines]
    return f"# {HEADER[domain]}\n" + "\n".join(lines) + "\n\n" + rest


def _merged(domain: str, scratch: Path) -> str:
    """The catalogue as it should be: the committed translations merged into freshly extracted strings,
    without obsolete entries."""
    pot = _template(domain, scratch)
    po = catalogue(domain)
    if not po.exists():
        return _new_catalogue(domain, pot)
    merged = scratch / f"{domain}.merged.po"
    _run("msgmerge", "--quiet", "--no-wrap", "--no-fuzzy-matching", "--add-location=file", "--sort-by-file",
         "-o", str(merged), str(po), str(pot))
    return _run("msgattrib", "--no-obsolete", "--no-wrap", str(merged))


def _without_dates(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith(('"POT-Creation-Date:', '"PO-Revision-Date:'))]


def _entries(po: Path, selection: str) -> list[str]:
    out = _run("msgattrib", selection, "--no-wrap", str(po))
    return [line[len("msgid "):] for line in out.splitlines() if line.startswith("msgid ") and line != 'msgid ""']


def rebuild() -> None:
    """Re-extract both catalogues in place (translations kept; a new string comes in empty) and compile them."""
    with tempfile.TemporaryDirectory() as scratch:
        for domain in (DOMAIN, CLICK_DOMAIN):
            po = catalogue(domain)
            text = _merged(domain, Path(scratch))
            if not po.exists() or _without_dates(text) != _without_dates(po.read_text(encoding="utf-8")):
                po.parent.mkdir(parents=True, exist_ok=True)
                po.write_text(text, encoding="utf-8")
            _run("msgfmt", "--check-format", "-o", str(po.with_suffix(".mo")), str(po))


# --- text that is not marked ------------------------------------------------------------------------

# A word people read: it has a lowercase letter ("GPU", "MIG", "ID" are names in every language).
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*[a-z][A-Za-z'-]*|[a-z]{2,}")
# Calls whose first argument people read; `table` takes its headings second.
_SHOWN = {"echo", "secho", "prompt", "confirm", "fail", "UsageError", "BadParameter", "ClickException",
          "PortalError"}
_HELP = {"help", "short_help", "epilog"}
KEEP = "# i18n: keep"  # on a line whose text is meant for machines (a shell's `export`), not people


def _shown_text(node: ast.AST | None, *, any_text: bool = False) -> bool:
    """A literal with words in it (any text at all for headings), an f-string with words in its literal
    parts, or such a literal formatted with % or +: text that reaches people without gettext."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(node.value.strip()) if any_text else bool(_WORD.search(node.value))
    if isinstance(node, ast.JoinedStr):
        return any(_shown_text(part, any_text=any_text) for part in node.values if isinstance(part, ast.Constant))
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return _shown_text(node.left, any_text=any_text) or _shown_text(node.right, any_text=any_text)
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_shown_text(item, any_text=any_text) for item in node.elts)
    if isinstance(node, ast.IfExp):
        return _shown_text(node.body, any_text=any_text) or _shown_text(node.orelse, any_text=any_text)
    if isinstance(node, ast.BoolOp):
        return any(_shown_text(value, any_text=any_text) for value in node.values)
    return False


def _called(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def unmarked_in(source: str) -> list[tuple[int, str]]:
    """(line, what) for each piece of text in `source` that people read and gettext does not wrap: a help=,
    short_help= or epilog=; what click.echo, prompt, confirm or an error is given; a table's headings; a
    command's docstring (click would show it as the help, untranslated: use help=_(…))."""
    lines = source.splitlines()
    faults: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _called(node)
            kept = any(KEEP in line for line in lines[node.lineno - 1:(node.end_lineno or node.lineno)])
            for keyword in node.keywords:
                if keyword.arg in _HELP and _shown_text(keyword.value) and not kept:
                    faults.append((node.lineno, f"{keyword.arg}="))
            if name in _SHOWN and node.args and _shown_text(node.args[0]) and not kept:
                faults.append((node.lineno, f"{name}(…)"))
            if name == "table" and len(node.args) > 1 and _shown_text(node.args[1], any_text=True) and not kept:
                faults.append((node.lineno, "table headings"))
        elif isinstance(node, ast.FunctionDef) and ast.get_docstring(node):
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and _called(decorator) in ("command", "group")
                        and not any(k.arg == "help" for k in decorator.keywords)):
                    faults.append((node.lineno, "a command's docstring as its help"))
    return sorted(faults)


def unmarked() -> list[str]:
    return [f"{PACKAGE_DIR.name}/{path.name}:{line}: {what} not marked for translation"
            for path in sorted(PACKAGE_DIR.glob("*.py"))
            for line, what in unmarked_in(path.read_text(encoding="utf-8"))]


def check() -> list[str]:
    """Every fault, one line each: empty when every string is marked and translated and the .mo is current."""
    faults = unmarked()
    with tempfile.TemporaryDirectory() as scratch:
        for domain in (DOMAIN, CLICK_DOMAIN):
            po = catalogue(domain)
            name = po.relative_to(PACKAGE_DIR.parent)
            if not po.exists():
                faults.append(f"{name}: missing; run `python -m gpupool_cli.i18n rebuild`")
                continue
            if _without_dates(_merged(domain, Path(scratch))) != _without_dates(po.read_text(encoding="utf-8")):
                faults.append(f"{name}: not current (strings were marked, changed or removed); run "
                              "`python -m gpupool_cli.i18n rebuild` and translate what it adds")
            faults += [f"{name}: not translated: {msgid}" for msgid in _entries(po, "--untranslated")]
            faults += [f"{name}: fuzzy (check the translation, then drop the flag): {msgid}"
                       for msgid in _entries(po, "--only-fuzzy")]
            compiled = Path(scratch) / f"{domain}.mo"
            _run("msgfmt", "--check-format", "-o", str(compiled), str(po))
            mo = po.with_suffix(".mo")
            if not mo.exists() or not filecmp.cmp(compiled, mo, shallow=False):
                faults.append(f"{name.with_suffix('.mo')}: not compiled from its .po; "
                              "run `python -m gpupool_cli.i18n rebuild`")
    return faults


def _command_line(argv: Sequence[str]) -> int:
    if argv == ["rebuild"]:
        rebuild()
        argv = ["check"]
    if argv == ["check"]:
        faults = check()
        print("\n".join(faults) or "The catalogues are complete and current.")
        return 1 if faults else 0
    print("usage: python -m gpupool_cli.i18n rebuild|check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_command_line(sys.argv[1:]))
