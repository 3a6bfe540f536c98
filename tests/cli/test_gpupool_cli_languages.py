"""`gpupool` in Simplified Chinese and in English: the help (the CLI's and click's own words), the CLI's
messages and headings, the portal's errors (asked for with Accept-Language), --json the same in both; and
the catalogues complete and current (gpupool_cli/i18n.py, `python -m gpupool_cli.i18n check`)."""
from __future__ import annotations

import json
import subprocess
import sys
import unicodedata

import pytest

from tests.cli.conftest import CLI_DIR, cli_environment
from tests.factories import PASSWORD

ZH = {"LANG": "zh_CN.UTF-8"}


def test_the_catalogues_are_complete_and_current():
    """Fails on a CLI string left unmarked (help=, echo, errors, headings, a command's docstring), one marked
    but not in the catalogue or no longer in the code, an empty or fuzzy translation, a .mo not compiled from
    its .po, or click's strings changed by an upgrade. Fix: `cd cli && python -m gpupool_cli.i18n rebuild`,
    translate what it lists, rebuild again."""
    done = subprocess.run([sys.executable, "-m", "gpupool_cli.i18n", "check"], cwd=CLI_DIR, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_finds_unmarked_text():
    code = """if True:
        from gpupool_cli.i18n import unmarked_in
        source = '''
@cli.command()
@click.option("--x", help="Some words")
def f(x):
    \\"\\"\\"Shown as the help.\\"\\"\\"
    click.echo(f"Hello {x}")
    click.echo(f"{x}: {x}")
    click.echo(f"export X={x}")  # i18n: keep
    table(rows, ["POOL", _("NAME")])
    raise click.UsageError(_("Give one of %(a)s.") % {"a": f"{x:g}"})
'''
        print([what for line, what in unmarked_in(source)])
    """
    done = subprocess.run([sys.executable, "-c", code], cwd=CLI_DIR, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['help=', \"a command's docstring as its help\", 'echo(…)', 'table headings']"


def test_the_tests_run_this_checkouts_cli():
    done = subprocess.run([sys.executable, "-c", "import gpupool_cli; print(gpupool_cli.__file__)"],
                          env=cli_environment(), capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(CLI_DIR / "gpupool_cli" / "__init__.py")


def test_help_follows_the_locale(offline_gpupool):
    chinese = offline_gpupool("--help", **ZH).stdout
    for words in ("用法: gpupool [OPTIONS] COMMAND [ARGS]...", "在终端里预约和查看 GPU Pool Portal 的 GPU。",
                  "选项:", "命令:", "显示此帮助信息并退出。", "显示版本并退出。", "预约 POOL 中的 GPU、份额或 MIG 实例。",
                  "退出码：0 完成", "Shell 补全（bash）"):
        assert words in chinese
    assert "Usage:" not in chinese and "Show this message" not in chinese
    english = offline_gpupool("--help", LANG="C").stdout
    for words in ("Usage: gpupool [OPTIONS] COMMAND [ARGS]...", "Book and watch GPUs of a GPU Pool Portal",
                  "Options:", "Commands:", "Show this message and exit.", "Exit codes: 0 done"):
        assert words in english
    # The other spellings of Simplified Chinese, and what stays English.
    for env in ({"LANG": "zh_SG.UTF-8"}, {"LC_ALL": "zh_CN.UTF-8", "LANG": "C"}, {"LANGUAGE": "fr:zh_Hans"},
                {"LC_MESSAGES": "zh_Hans"}, {"GPUPOOL_LANG": "zh-Hans"}):
        assert offline_gpupool("--help", **env).stdout == chinese, env
    for env in ({"LANG": "zh_TW.UTF-8"}, {"LANG": "fr_FR.UTF-8"}, {"LC_ALL": "C", "LANG": "zh_CN.UTF-8"},
                {"LANG": "zh_CN.UTF-8", "GPUPOOL_LANG": "en"}):
        assert offline_gpupool("--help", **env).stdout == english, env
    assert offline_gpupool("--lang", "zh-Hans", "--help").stdout == chinese
    assert offline_gpupool("--lang=en", "--help", **ZH).stdout == english


@pytest.mark.parametrize("command", ["login", "logout", "whoami", "pools", "availability", "reserve", "list", "show",
                                     "extend", "release", "usage", "completion"])
def test_every_commands_help_is_chinese(offline_gpupool, command):
    chinese = offline_gpupool(command, "--help", **ZH).stdout
    english = offline_gpupool(command, "--help").stdout
    assert chinese.startswith(f"用法: gpupool {command} ") and "选项:" in chinese and "显示此帮助信息并退出。" in chinese
    # Every line of help text changed language (option names, metavars and bare names aside).
    described = [line for line in english.splitlines() if line.strip() and " " in line.strip()
                 and any(word.islower() and len(word) > 3 for word in line.replace("-", " ").split())]
    assert described and not set(described) & set(chinese.splitlines())


def columns(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in line)


@pytest.mark.parametrize("args", [["--help"], ["reserve", "--help"], ["login", "--help"], ["list", "--help"]])
def test_chinese_help_is_wrapped_by_terminal_columns(offline_gpupool, args):
    """A Chinese character takes two columns and a line may break between two of them (click counts
    characters and breaks at spaces): no line runs past an 80-column terminal."""
    lines = offline_gpupool(*args, **ZH).stdout.splitlines()
    assert max(columns(line) for line in lines) <= 80, [line for line in lines if columns(line) > 80]


def test_usage_errors_and_the_language_option(offline_gpupool):
    done = offline_gpupool("reserve", "a100", "--gpus", "1", check=2, **ZH)
    assert "错误：--for 和 --until 必须且只能给出一个。" in done.stderr
    done = offline_gpupool("reserve", "a100", "--gpus", "1", check=2)
    assert "Error: Give exactly one of --for and --until." in done.stderr
    done = offline_gpupool("reserve", "a100", "--for", "soon", check=2, **ZH)
    assert "'--for' 的值无效：'soon' 不是有效的时长" in done.stderr and "运行 'gpupool reserve --help' 查看帮助。" in done.stderr
    assert "错误：没有命令 'nope'。" in offline_gpupool("nope", check=2, **ZH).stderr
    done = offline_gpupool("--lang", "fr", "whoami", check=2)
    assert "'fr' is not a language gpupool speaks: en or zh-Hans." in done.stderr
    assert "未登录：请运行 `gpupool login`" in offline_gpupool("whoami", check=3, **ZH).stderr
    done = offline_gpupool("--token", "x", "pools", check=8, **ZH)
    assert "门户 http://127.0.0.1:9 没有应答" in done.stderr


@pytest.mark.django_db(transaction=True)
def test_the_portals_errors_come_back_in_the_cli_language(world, gpupool):
    # DRF's own words, refused before any view: a token with a space in it (401 → exit 3).
    english = gpupool("whoami", check=3, GPUPOOL_TOKEN="not a token").stderr
    chinese = gpupool("whoami", check=3, GPUPOOL_TOKEN="not a token", **ZH).stderr
    assert "Error: Invalid token header. Token string should not contain spaces." in english
    assert "错误：认证令牌字符串不应该包含空格" in chinese
    gpupool("login", "--username", "member", "--password-stdin", stdin=PASSWORD + "\n", **ZH)
    # Not found (404 → exit 5): the message translated, the rule kept as the code it is.
    english = gpupool("show", "999999", check=5).stderr
    chinese = gpupool("show", "999999", check=5, **ZH).stderr
    assert "not_found]" in english and "not_found]" in chinese
    assert english.splitlines()[0] != chinese.splitlines()[0] and chinese.startswith("错误："), chinese


@pytest.mark.django_db(transaction=True)
def codes(data):
    """A JSON answer without its words for people: the reasons (stored as messages, read in the asker's
    language) and the queue's explanation; every code, number, name and instant stays."""
    if isinstance(data, list):
        return [codes(item) for item in data]
    if isinstance(data, dict):
        return {key: codes(value) for key, value in data.items() if key not in ("reason", "queue")}
    return data


def test_json_is_the_same_in_both_languages_and_text_is_chinese(world, gpupool):
    signed_in = gpupool("login", "--username", "member", "--password-stdin", stdin=PASSWORD + "\n", **ZH).stdout
    assert signed_in.startswith("已以 member 身份登录 ") and "（读写，" in signed_in
    booked = json.loads(gpupool("reserve", "a100", "--gpus", "2", "--until", "+2h", "--json", **ZH).stdout)
    assert booked["state"] in ("scheduled", "applying", "active") and booked["gpus"] == 2
    for args in (["whoami", "--json"], ["pools", "--json"], ["list", "--json"], ["show", str(booked["id"]), "--json"]):
        english, chinese = gpupool(*args).stdout, gpupool(*args, **ZH).stdout
        assert codes(json.loads(chinese)) == codes(json.loads(english)), args
    pools = gpupool("pools", **ZH).stdout.splitlines()
    assert pools[0].split() == ["资源池", "名称", "模式", "空闲", "GPU", "数", "可排队"]
    assert "独占" in pools[2] and "exclusive" not in pools[2]
    # The columns line up by terminal width: a Chinese character takes two.
    assert len(pools[1]) == max(columns(line) for line in pools)
    listed = gpupool("list", **ZH).stdout
    assert "状态" in listed and "2 个 GPU" in listed
    shown = gpupool("show", str(booked["id"]), **ZH).stdout
    assert f"#{booked['id']} " in shown and "的 2 个 GPU" in shown and "CST" in shown
    assert "2 GPUs of a100 for ml" in gpupool("show", str(booked["id"])).stdout
