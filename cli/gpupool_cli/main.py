"""`gpupool`: the portal's REST API from the terminal.

Every command takes --json (the API's own JSON on stdout, nothing else) and exits with a code a script
can rely on (gpupool_cli.client.ExitCode, listed in `gpupool --help`). Progress and warnings go to
stderr, so stdout stays parseable.
"""
from __future__ import annotations

import json as jsonlib
import os
import re
import sys
import time
from datetime import datetime, timedelta, timezone

import click

from gpupool_cli import config, i18n
from gpupool_cli.client import ExitCode, Portal, PortalError
from gpupool_cli.i18n import _, ngettext, pgettext

# Help texts are built as this module is read, so the language is chosen first (gpupool_cli/i18n.py).
i18n.activate(i18n.choose(sys.argv[1:], os.environ))

EXIT_CODES = _("""\b
Exit codes: 0 done; 1 other error; 2 bad command line; 3 not signed in or token refused;
4 forbidden (not your team, read-only token); 5 not found; 6 refused by the portal's state (no room,
over quota); 7 invalid input (the message names the field and the rule); 8 portal unreachable or
failing; 9 --wait: the reservation failed or ended; 10 --wait: not active within --timeout.

\b
Shell completion (bash): eval "$(gpupool completion bash)"; zsh and fish likewise.""")

MOVING = {"pending", "scheduled", "applying"}
ENDED = {"released", "expired", "failed", "releasing"}
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


# --- parsing ----------------------------------------------------------------------------------

def parse_duration(text: str) -> timedelta:
    """"4h", "90m", "1d12h", "45s" (the portal's own duration forms, ISO 8601 aside)."""
    parts = re.fullmatch(r"\s*(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?\s*", text or "")
    if not text or not parts or not any(parts.groups()):
        raise click.BadParameter(_("%(text)r is not a duration like 4h, 90m or 1d12h") % {"text": text})
    days, hours, minutes, seconds = (int(p or 0) for p in parts.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def parse_time(text: str) -> datetime:
    """An ISO 8601 time; without a zone it is the local one. "+2h" is that long from now."""
    if text.startswith("+"):
        return datetime.now(timezone.utc) + parse_duration(text[1:])
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as error:
        raise click.BadParameter(_("%(text)r is not a time like 2026-11-24T18:30 or +2h") % {"text": text}) from error
    return moment if moment.tzinfo else moment.astimezone()


def parse_memory(text: str) -> int:
    """MiB from "20480", "20GiB", "20G" or "512MiB"."""
    parts = re.fullmatch(r"\s*(\d+)\s*(gib|gb|g|mib|mb|m)?\s*", text.lower())
    if not parts:
        raise click.BadParameter(_("%(text)r is not an amount of memory like 20GiB or 20480 (MiB)") % {"text": text})
    amount, unit = int(parts.group(1)), parts.group(2) or "mib"
    return amount * 1024 if unit.startswith("g") else amount


# --- output -----------------------------------------------------------------------------------

def when(value: str | None) -> str:
    """An API time in the local zone, 24-hour, with the zone's name."""
    if not value:
        return "—"
    moment = datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M %Z")


def table(rows: list[list], headers: list[str]) -> None:
    cells = [[str(c) for c in headers]] + [["—" if c in (None, "") else str(c) for c in row] for row in rows]
    widths = [max(i18n.columns(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        click.echo("  ".join(cell + " " * (wide - i18n.columns(cell)) for cell, wide in zip(row, widths)).rstrip())
        if n == 0:
            click.echo("  ".join("-" * wide for wide in widths))


def yes_no(value: bool) -> str:
    return _("yes") if value else _("no")


def state_label(state: str | None) -> str:
    """A reservation's state as people read it (the API's code in English, its label in Chinese)."""
    labels = {"pending": pgettext("state", "pending"), "scheduled": pgettext("state", "scheduled"),
              "applying": pgettext("state", "applying"), "active": pgettext("state", "active"),
              "releasing": pgettext("state", "releasing"), "released": pgettext("state", "released"),
              "expired": pgettext("state", "expired"), "failed": pgettext("state", "failed")}
    return labels.get(state, state or "·")


def mode_label(mode: str) -> str:
    labels = {"exclusive": pgettext("sharing mode", "exclusive"),
              "time_slicing": pgettext("sharing mode", "time_slicing")}
    return labels.get(mode, mode)


def scope_label(scope: str) -> str:
    labels = {"read": pgettext("token scope", "read"), "write": pgettext("token scope", "write")}
    return labels.get(scope, scope)


def role_label(role: str) -> str:
    labels = {"member": pgettext("team role", "member"), "manager": pgettext("team role", "manager")}
    return labels.get(role, role)


def emit_json(data) -> None:
    click.echo(jsonlib.dumps(data, indent=2, ensure_ascii=False))


def amount(r: dict) -> str:
    mode = r.get("mode")
    if mode in ("time_slicing", "mps"):
        shares = r.get("shares") or 0
        return ngettext("%(shares)d share", "%(shares)d shares", shares) % {"shares": shares}
    if mode == "mig":
        return f"{r.get('count') or 1} × {r.get('mig_profile')}"
    if mode == "vgpu":
        return f"{r.get('gpu_memory_mib')} MiB + {r.get('gpu_cores_pct')} % × {r.get('gpus')}"
    gpus = r.get("gpus") or 0
    return ngettext("%(gpus)d GPU", "%(gpus)d GPUs", gpus) % {"gpus": gpus}


# --- the context: the portal and --json -----------------------------------------------------------

class State:
    def __init__(self, url: str | None, token: str | None) -> None:
        saved = config.load()
        self.url = url or saved.get("url") or config.DEFAULT_URL
        self.token = token or saved.get("token")
        self.saved = saved

    def portal(self, *, signed_in: bool = True) -> Portal:
        if signed_in and not self.token:
            raise PortalError(_("Not signed in: run `gpupool login` (or set GPUPOOL_TOKEN)."),
                             ExitCode.NOT_SIGNED_IN)
        return Portal(self.url, self.token if signed_in else None)


pass_state = click.make_pass_decorator(State)


def json_option(command):
    return click.option("--json", "as_json", is_flag=True,
                        help=_("Print the API's JSON (and nothing else) on stdout."))(command)


def complete_pool(ctx, param, incomplete):
    """Pool slugs, for shell completion (quietly nothing when the portal cannot be asked)."""
    try:
        state = State(None, None)
        return [p["slug"] for p in state.portal().every("/pools/") if p["slug"].startswith(incomplete)]
    except Exception:  # completion must never print a traceback into the shell
        return []


class Language(click.ParamType):
    """en or zh-Hans (a locale name such as zh_CN.UTF-8 or en_US will do); gpupool_cli.i18n already chose
    it from the command line, this only refuses a language the CLI does not speak."""

    name = "language"

    def get_metavar(self, param, ctx=None):
        return "[en|zh-Hans]"

    def convert(self, value, param, ctx):
        if i18n.spoken(value) is None:
            self.fail(_("%(value)r is not a language gpupool speaks: en or zh-Hans.") % {"value": value}, param, ctx)
        return i18n.LANGUAGES[i18n.spoken(value)]


@click.group(help=_("Book and watch GPUs of a GPU Pool Portal from the terminal."), epilog=EXIT_CODES,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--url", envvar="GPUPOOL_URL", help=_("The portal, e.g. https://gpus.example.com (default: the saved "
                                                    "one, else http://127.0.0.1:8000)."))
@click.option("--token", envvar="GPUPOOL_TOKEN", help=_("An API token (default: the one `login` saved)."))
@click.option("--lang", envvar="GPUPOOL_LANG", type=Language(),
              help=_("The language of help and messages, and of the portal's answers: en or zh-Hans (default: "
                     "GPUPOOL_LANG, else LANGUAGE, LC_ALL, LC_MESSAGES or LANG)."))
@click.version_option(package_name="gpupool-cli", prog_name="gpupool")
@click.pass_context
def cli(ctx, url, token, lang):
    # `lang` took effect before click parsed anything (the help texts are built on import); here it was
    # only checked.
    ctx.obj = State(url, token)


# --- signing in -----------------------------------------------------------------------------------

@cli.command(help=_("""Sign in and keep a new API token.

The token is kept in your config folder (mode 0600); GPUPOOL_TOKEN overrides it."""),
             short_help=_("Sign in and keep a new API token."))
@click.option("--username", "-u", help=_("Your portal username (asked if not given)."))
@click.option("--password-stdin", is_flag=True, help=_("Read the password from stdin (for scripts)."))
@click.option("--name", default="gpupool CLI", show_default=True, help=_("What the token is for."))
@click.option("--read-only", is_flag=True, help=_("A token that may only read."))
@click.option("--team", "teams", multiple=True, help=_("Limit the token to this team (repeat for more)."))
@click.option("--days", type=click.IntRange(1, 3650), default=None,
              help=_("The token's life in days (default: the portal's, 90 unless staff changed it)."))
@json_option
@pass_state
def login(state: State, username, password_stdin, name, read_only, teams, days, as_json):
    username = username or click.prompt(_("Username"), err=True)
    password = sys.stdin.readline().rstrip("\n") if password_stdin else click.prompt(
        _("Password"), hide_input=True, err=True)
    body = {"username": username, "password": password, "name": name, "scope": "read" if read_only else "write",
            "teams": list(teams)}
    if days:
        body["expires_at"] = (datetime.now(timezone.utc) + timedelta(days=days)).isoformat()
    try:
        answer = state.portal(signed_in=False).post("/auth/token/", body)
    except PortalError as error:
        if error.body.get("errors", [{}])[0].get("rule") == "invalid_credentials":
            error.exit_code = int(ExitCode.NOT_SIGNED_IN)
        raise
    where = config.save({"url": state.url, "token": answer["token"], "username": username})
    if as_json:
        emit_json({key: value for key, value in answer.items() if key != "token"} | {"config": str(where)})
        return
    click.echo(_("Signed in to %(url)s as %(username)s. Token %(prefix)s… (%(scope)s, expires %(expires)s) "
                 "kept in %(path)s.") % {"url": state.url, "username": username, "prefix": answer["prefix"],
                                         "scope": scope_label(answer["scope"]), "expires": when(answer["expires_at"]),
                                         "path": where})


@cli.command(help=_("Revoke the saved token at the portal and forget it here."))
@json_option
@pass_state
def logout(state: State, as_json):
    revoked = False
    if state.token:
        try:
            state.portal().call("DELETE", "/auth/token/", expect_json=False)
            revoked = True
        except PortalError as error:
            click.echo(_("The portal did not revoke it: %(message)s") % {"message": error.message}, err=True)
    forgotten = config.forget()
    if as_json:
        emit_json({"revoked": revoked, "forgotten": forgotten})
    else:
        click.echo(_("Signed out.") if revoked or forgotten else _("Not signed in."))


@cli.command(help=_("Who you are signed in as, and your teams."))
@json_option
@pass_state
def whoami(state: State, as_json):
    me = state.portal().get("/me/")
    if as_json:
        return emit_json(me)
    who = {"username": me["username"], "url": state.url}
    click.echo((_("%(username)s at %(url)s (staff)") if me["is_staff"] else _("%(username)s at %(url)s")) % who)
    for team in me["teams"]:
        click.echo(f"  {team['slug']}: {role_label(team['role'])}")
    token = me.get("token")
    if token:
        click.echo(_("Token %(prefix)s…: %(scope)s, %(teams)s, expires %(expires)s") % {
            "prefix": token["prefix"], "scope": scope_label(token["scope"]),
            "teams": ", ".join(token["teams"]) or _("all your teams"), "expires": when(token["expires_at"])})


# --- pools ------------------------------------------------------------------------------------------

@cli.command(help=_("The pools you can book, free GPUs now."))
@json_option
@pass_state
def pools(state: State, as_json):
    rows = state.portal().every("/pools/")
    if as_json:
        return emit_json(rows)
    table([[p["slug"], p["name"], mode_label(p["sharing_mode"]), p["gpus_free"], p["gpus_total"],
            yes_no(p["queueing"])] for p in rows],
          [_("POOL"), _("NAME"), _("MODE"), _("FREE"), _("GPUS"), _("QUEUES")])


def shape_options(command):
    for option in reversed([
        click.option("--gpus", type=click.IntRange(1), help=_("Whole GPUs (exclusive pools; vgpu: GPUs).")),
        click.option("--shares", type=click.IntRange(1), help=_("Shares of one GPU (time-slicing and MPS pools).")),
        click.option("--mig", "mig_profile", help=_("A MIG profile, e.g. 1g.10gb (MIG pools).")),
        click.option("--count", type=click.IntRange(1), help=_("MIG instances of the profile (default 1).")),
        click.option("--memory", type=parse_memory_param(), help=_("vGPU memory per GPU, e.g. 20GiB.")),
        click.option("--cores", type=click.IntRange(1, 100), help=_("vGPU compute per GPU, in %.")),
        click.option("--gpu-model", "gpu_models", multiple=True,
                     help=_("Only GPUs of this model, as the pool names it, e.g. 'NVIDIA H100 80GB HBM3' (repeat for "
                            "more; default: any model of the pool).")),
    ]):
        command = option(command)
    return command


def parse_memory_param():
    class Memory(click.ParamType):
        name = "memory"

        def convert(self, value, param, ctx):
            return value if isinstance(value, int) else parse_memory(value)

    return Memory()


def shape_body(gpus, shares, mig_profile, count, memory, cores, gpu_models=()) -> dict:
    """The shape options as the API names them, those given only (`gpu_models` a list: a JSON body's array,
    a query string's repeated parameter)."""
    body = {"gpus": gpus, "shares": shares, "mig_profile": mig_profile, "count": count,
            "gpu_memory_mib": memory, "gpu_cores_pct": cores, "gpu_models": list(gpu_models) or None}
    return {key: value for key, value in body.items() if value is not None}


@cli.command(help=_("""What is free in POOL, slot by slot.

Counts the shape given (default: one of the pool's unit) over the next --hours."""),
             short_help=_("What is free in POOL, slot by slot."))
@click.argument("pool", shell_complete=complete_pool)
@click.option("--hours", type=click.IntRange(1, 24 * 31), default=24, show_default=True, help=_("How far ahead."))
@click.option("--slot", type=parse_duration, default="1h", show_default=True, help=_("Slot length."))
@shape_options
@json_option
@pass_state
def availability(state: State, pool, hours, slot, gpus, shares, mig_profile, count, memory, cores, gpu_models,
                 as_json):
    start = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    slots = state.portal().get(f"/pools/{pool}/availability/", start=start.isoformat(),
                               end=(start + timedelta(hours=hours)).isoformat(), slot=int(slot.total_seconds()),
                               **shape_body(gpus, shares, mig_profile, count, memory, cores, gpu_models))
    if as_json:
        return emit_json(slots)
    table([[when(s["start"]), s["free"], s["unit"], s["most_together"], yes_no(s["fits"])] for s in slots],
          [_("FROM"), _("FREE"), _("UNIT"), _("TOGETHER"), _("FITS")])


# --- reservations -----------------------------------------------------------------------------------

def _default_team(portal: Portal) -> str:
    teams = portal.get("/me/")["teams"]
    if len(teams) != 1:
        names = ", ".join(t["slug"] for t in teams) or _("none")
        raise click.UsageError(_("Say which team with --team (yours: %(teams)s).") % {"teams": names})
    return teams[0]["slug"]


def _describe(r: dict) -> str:
    queue = r.get("queue") or {}
    line = _("#%(id)s %(state)s: %(amount)s of %(pool)s for %(team)s, %(starts)s → %(ends)s") % {
        "id": r["id"], "state": state_label(r["state"]), "amount": amount(r), "pool": r["pool"], "team": r["team"],
        "starts": when(r["starts_at"]), "ends": when(r["ends_at"])}
    if r.get("gpu_models"):
        line += _(", only %(models)s") % {"models": " / ".join(r["gpu_models"])}
    if r["state"] == "pending" and queue:
        line += _("; queue position %(position)s, start by %(start_by)s, likely %(likely)s") % {
            "position": queue.get("position"), "start_by": when(queue.get("start_by")),
            "likely": when(queue.get("likely_start"))}
    if r.get("reason") and r["state"] in ("failed", "pending"):
        line += f" ({r['reason']})"
    return line


def _print_environment(environment: dict | None) -> None:
    if not environment:
        return
    # Lines for a shell to eval: the same in every language.
    for name, value in environment["variables"].items():
        click.echo(f"export {name}={value}")  # i18n: keep
    if environment.get("namespace"):
        click.echo(f"export GPUPOOL_NAMESPACE={environment['namespace']}")  # i18n: keep
    click.echo(_("# on %(nodes)s (%(where)s)") % {"nodes": ", ".join(environment["nodes"]),
                                                  "where": environment["where"]}, err=True)


def _wait(portal: Portal, reservation_id: int, timeout: float, interval: float, as_json: bool) -> None:
    """Poll until active (print the environment a job needs) or ended; progress goes to stderr."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        r = portal.get(f"/reservations/{reservation_id}/")
        seen = (r["state"], (r.get("queue") or {}).get("position"), (r.get("queue") or {}).get("start_by"))
        if seen != last:
            click.echo(_describe(r), err=True)
            last = seen
        if r["state"] == "active":
            emit_json(r) if as_json else _print_environment(r.get("environment"))
            return
        if r["state"] in ENDED:
            raise PortalError(_("Reservation #%(id)s is %(state)s: %(reason)s") % {
                "id": reservation_id, "state": state_label(r["state"]),
                "reason": r.get("reason") or _("no reason given")},
                ExitCode.ENDED, r)
        if time.monotonic() >= deadline:
            raise PortalError(_("Reservation #%(id)s is still %(state)s after %(seconds)s s.") % {
                "id": reservation_id, "state": state_label(r["state"]), "seconds": f"{timeout:g}"},
                ExitCode.TIMEOUT, r)
        time.sleep(interval)


@cli.command(help=_("""Reserve GPUs, shares or MIG slices of POOL.

Now (--until or --for), later (--start) or as soon as they fit (--for alone, waiting in the
pool's queue). With --wait, exits once it is active and prints the environment a job needs."""),
             short_help=_("Reserve GPUs, shares or MIG slices of POOL."))
@click.argument("pool", shell_complete=complete_pool)
@click.option("--team", help=_("The team to book for (default: your only team)."))
@shape_options
@click.option("--for", "length", type=parse_duration,
              help=_("How long, e.g. 4h. Without --start: as soon as it fits."))
@click.option("--until", "until", type=parse_time, help=_("The end, e.g. 2026-11-25T18:00 or +4h."))
@click.option("--start", help=_("The start: a time, +30m, or 'earliest' (the first window that fits)."))
@click.option("--not-after", type=parse_time, help=_("With --for: give up if it cannot start by then."))
@click.option("--priority-class", help=_("Run at this (lower) priority class."))
@click.option("--no-queue", is_flag=True, help=_("Refuse at once rather than wait in the pool's queue."))
@click.option("--wait", is_flag=True, help=_("Wait until it is active and print the environment a job needs."))
@click.option("--timeout", type=click.FloatRange(1), default=3600, show_default=True, help=_("--wait: seconds."))
@click.option("--interval", type=click.FloatRange(0.2), default=2.0, show_default=True,
              help=_("--wait: seconds between polls."))
@json_option
@pass_state
def reserve(state: State, pool, team, gpus, shares, mig_profile, count, memory, cores, gpu_models, length, until,
            start, not_after, priority_class, no_queue, wait, timeout, interval, as_json):
    if (length is None) == (until is None):
        raise click.UsageError(_("Give exactly one of --for and --until."))
    portal = state.portal()
    body = {"pool": pool, "team": team or _default_team(portal),
            **shape_body(gpus, shares, mig_profile, count, memory, cores, gpu_models)}
    if until is not None:
        body["ends_at"] = until.isoformat()
        if start and start != "earliest":
            body["starts_at"] = parse_time(start).isoformat()
    elif start == "earliest":
        body.update(starts_at="earliest", duration=f"{int(length.total_seconds())}s")
    elif start:
        begins = parse_time(start)
        body.update(starts_at=begins.isoformat(), ends_at=(begins + length).isoformat())
    else:
        body["duration"] = f"{int(length.total_seconds())}s"
    if not_after is not None:
        body["not_after"] = not_after.isoformat()
    if priority_class:
        body["priority_class"] = priority_class
    if no_queue:
        body["queue"] = False
    try:
        booked = portal.post("/reservations/", body)
    except PortalError as error:
        # A refused window comes with ready request bodies the portal would take instead.
        for offer in error.body.get("alternatives") or []:
            click.echo(_("Offered instead (%(kind)s): %(message)s %(request)s") % {
                "kind": offer.get("kind"), "message": offer.get("message"),
                "request": jsonlib.dumps(offer.get("request"))}, err=True)
        raise
    if wait:
        click.echo(_("Reserved #%(id)s; waiting until it is active…") % {"id": booked["id"]}, err=True)
        return _wait(portal, booked["id"], timeout, interval, as_json)
    if as_json:
        return emit_json(booked)
    click.echo(_describe(booked))


@cli.command(name="list", help=_("Your teams' reservations, newest first."))
@click.option("--state", "states", multiple=True,
              help=_("Only in this state: pending, scheduled, applying, active, releasing, released, expired or "
                     "failed (repeat for more)."))
@click.option("--team", help=_("Only this team's."))
@click.option("--pool", help=_("Only in this pool."))
@json_option
@pass_state
def list_(state: State, states, team, pool, as_json):
    portal = state.portal()
    rows = portal.every("/reservations/", team=team, pool=pool, state=list(states) or None)
    if as_json:
        return emit_json(rows)
    table([[r["id"], state_label(r["state"]), r["team"], r["pool"], amount(r), when(r["starts_at"]),
            when(r["ends_at"])] for r in rows],
          [_("ID"), _("STATE"), _("TEAM"), _("POOL"), _("HOLDS"), _("STARTS"), _("ENDS")])


@cli.command(help=_("""One reservation in full.

Its window, GPUs, queue place, history and the environment a job needs."""),
             short_help=_("One reservation in full."))
@click.argument("reservation_id", type=int)
@json_option
@pass_state
def show(state: State, reservation_id, as_json):
    r = state.portal().get(f"/reservations/{reservation_id}/")
    if as_json:
        return emit_json(r)
    click.echo(_describe(r))
    for grant in r.get("grants") or []:
        part = grant.get("mig_instance") or (
            _("%(shares)s/%(replicas)s shares") % {"shares": grant["shares"], "replicas": grant["replicas"]}
            if grant.get("shares") else _("whole GPU"))
        click.echo(f"  {grant['node']}:{grant['index']} {grant['model_name']} {grant['uuid']} ({part})")
    for event in r.get("events") or []:
        click.echo(_("  %(at)s %(from)s → %(to)s by %(actor)s: %(reason)s") % {
            "at": when(event["at"]), "from": state_label(event["from_state"]), "to": state_label(event["to_state"]),
            "actor": event["actor"] or _("the portal"), "reason": event["reason"]})
    _print_environment(r.get("environment"))


@cli.command(help=_("Move a reservation's end later, on the same GPUs."))
@click.argument("reservation_id", type=int)
@click.option("--for", "length", type=parse_duration, help=_("Add this long to the current end, e.g. 2h."))
@click.option("--until", "until", type=parse_time, help=_("The new end."))
@json_option
@pass_state
def extend(state: State, reservation_id, length, until, as_json):
    if (length is None) == (until is None):
        raise click.UsageError(_("Give exactly one of --for and --until."))
    portal = state.portal()
    if length is not None:
        current = portal.get(f"/reservations/{reservation_id}/")["ends_at"]
        until = datetime.fromisoformat(current.replace("Z", "+00:00")) + length
    r = portal.post(f"/reservations/{reservation_id}/extend/", {"ends_at": until.isoformat()})
    emit_json(r) if as_json else click.echo(_describe(r))


@cli.command(help=_("""Release, cancel or withdraw a reservation.

A running one is released now, one not started cancelled, a waiting one leaves the queue."""),
             short_help=_("Release, cancel or withdraw a reservation."))
@click.argument("reservation_id", type=int)
@json_option
@pass_state
def release(state: State, reservation_id, as_json):
    r = state.portal().post(f"/reservations/{reservation_id}/release/")
    emit_json(r) if as_json else click.echo(_describe(r))


@cli.command(help=_("""Your teams' use against their quotas.

GPU-equivalents held now and GE-hours this month, per team and pool."""),
             short_help=_("Your teams' use against their quotas."))
@click.option("--team", "teams", multiple=True, help=_("This team only (repeat for more; default: all yours)."))
@json_option
@pass_state
def usage(state: State, teams, as_json):
    portal = state.portal()
    slugs = list(teams) or [t["slug"] for t in portal.get("/me/")["teams"]]
    answers = [portal.get(f"/teams/{slug}/usage/") for slug in slugs]
    if as_json:
        return emit_json(answers)
    rows = []
    for use in answers:
        for pool in use["pools"]:
            rows.append([use["team"], pool["pool"], pool["held_now"], pool["max_ge"], pool["ge_hours_this_month"],
                         pool["ge_hours_per_month"]])
    table(rows, [_("TEAM"), _("POOL"), _("GE NOW"), _("QUOTA GE"), _("GE-H MONTH"), _("GE-H LIMIT")])


@cli.command(help=_("""Print a shell completion script.

eval "$(gpupool completion bash)" in ~/.bashrc; zsh and fish likewise."""),
             short_help=_("Print a shell completion script."))
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    from click.shell_completion import get_completion_class

    completer = get_completion_class(shell)(cli, {}, "gpupool", "_GPUPOOL_COMPLETE")
    click.echo(completer.source())


def main() -> None:
    cli(prog_name="gpupool")
