"""`gpupool`: the portal's REST API from the terminal.

Every command takes --json (the API's own JSON on stdout, nothing else) and exits with a code a script
can rely on (gpupool_cli.client.ExitCode, listed in `gpupool --help`). Progress and warnings go to
stderr, so stdout stays parseable.
"""
from __future__ import annotations

import json as jsonlib
import re
import sys
import time
from datetime import datetime, timedelta, timezone

import click

from gpupool_cli import config
from gpupool_cli.client import ExitCode, Portal, PortalError

EXIT_CODES = """\b
Exit codes: 0 done; 1 other error; 2 bad command line; 3 not signed in or token refused;
4 forbidden (not your team, read-only token); 5 not found; 6 refused by the portal's state (no room,
over quota); 7 invalid input (the message names the field and the rule); 8 portal unreachable or
failing; 9 --wait: the reservation failed or ended; 10 --wait: not active within --timeout.

\b
Shell completion (bash): eval "$(gpupool completion bash)"; zsh and fish likewise."""

MOVING = {"pending", "scheduled", "applying"}
ENDED = {"released", "expired", "failed", "releasing"}
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


# --- parsing ----------------------------------------------------------------------------------

def parse_duration(text: str) -> timedelta:
    """"4h", "90m", "1d12h", "45s" (the portal's own duration forms, ISO 8601 aside)."""
    parts = re.fullmatch(r"\s*(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?\s*", text or "")
    if not text or not parts or not any(parts.groups()):
        raise click.BadParameter(f"{text!r} is not a duration like 4h, 90m or 1d12h")
    days, hours, minutes, seconds = (int(p or 0) for p in parts.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def parse_time(text: str) -> datetime:
    """An ISO 8601 time; without a zone it is the local one. "+2h" is that long from now."""
    if text.startswith("+"):
        return datetime.now(timezone.utc) + parse_duration(text[1:])
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as error:
        raise click.BadParameter(f"{text!r} is not a time like 2026-11-24T18:30 or +2h") from error
    return moment if moment.tzinfo else moment.astimezone()


def parse_memory(text: str) -> int:
    """MiB from "20480", "20GiB", "20G" or "512MiB"."""
    parts = re.fullmatch(r"\s*(\d+)\s*(gib|gb|g|mib|mb|m)?\s*", text.lower())
    if not parts:
        raise click.BadParameter(f"{text!r} is not an amount of memory like 20GiB or 20480 (MiB)")
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
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if n == 0:
            click.echo("  ".join("-" * width for width in widths))


def emit_json(data) -> None:
    click.echo(jsonlib.dumps(data, indent=2, ensure_ascii=False))


def amount(r: dict) -> str:
    mode = r.get("mode")
    if mode in ("time_slicing", "mps"):
        return f"{r.get('shares')} shares"
    if mode == "mig":
        return f"{r.get('count') or 1} × {r.get('mig_profile')}"
    if mode == "vgpu":
        return f"{r.get('gpu_memory_mib')} MiB + {r.get('gpu_cores_pct')} % × {r.get('gpus')}"
    return f"{r.get('gpus')} GPU{'s' if r.get('gpus') != 1 else ''}"


# --- the context: the portal and --json -----------------------------------------------------------

class State:
    def __init__(self, url: str | None, token: str | None) -> None:
        saved = config.load()
        self.url = url or saved.get("url") or config.DEFAULT_URL
        self.token = token or saved.get("token")
        self.saved = saved

    def portal(self, *, signed_in: bool = True) -> Portal:
        if signed_in and not self.token:
            raise PortalError("Not signed in: run `gpupool login` (or set GPUPOOL_TOKEN).", ExitCode.NOT_SIGNED_IN)
        return Portal(self.url, self.token if signed_in else None)


pass_state = click.make_pass_decorator(State)


def json_option(command):
    return click.option("--json", "as_json", is_flag=True, help="Print the API's JSON (and nothing else) on stdout.")(
        command)


def complete_pool(ctx, param, incomplete):
    """Pool slugs, for shell completion (quietly nothing when the portal cannot be asked)."""
    try:
        state = State(None, None)
        return [p["slug"] for p in state.portal().every("/pools/") if p["slug"].startswith(incomplete)]
    except Exception:  # completion must never print a traceback into the shell
        return []


@click.group(epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--url", envvar="GPUPOOL_URL", help="The portal, e.g. https://gpus.example.com (default: the saved "
                                                  "one, else http://127.0.0.1:8000).")
@click.option("--token", envvar="GPUPOOL_TOKEN", help="An API token (default: the one `login` saved).")
@click.version_option(package_name="gpupool-cli", prog_name="gpupool")
@click.pass_context
def cli(ctx, url, token):
    """Book and watch GPUs of a GPU Pool Portal from the terminal."""
    ctx.obj = State(url, token)


# --- signing in -----------------------------------------------------------------------------------

@cli.command()
@click.option("--username", "-u", help="Your portal username (asked if not given).")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin (for scripts).")
@click.option("--name", default="gpupool CLI", show_default=True, help="What the token is for.")
@click.option("--read-only", is_flag=True, help="A token that may only read.")
@click.option("--team", "teams", multiple=True, help="Limit the token to this team (repeat for more).")
@click.option("--days", type=click.IntRange(1, 3650), default=None,
              help="The token's life in days (default: the portal's, 90 unless staff changed it).")
@json_option
@pass_state
def login(state: State, username, password_stdin, name, read_only, teams, days, as_json):
    """Sign in and keep a new API token.

    The token is kept in your config folder (mode 0600); GPUPOOL_TOKEN overrides it."""
    username = username or click.prompt("Username", err=True)
    password = sys.stdin.readline().rstrip("\n") if password_stdin else click.prompt(
        "Password", hide_input=True, err=True)
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
    click.echo(f"Signed in to {state.url} as {username}. Token {answer['prefix']}… "
               f"({answer['scope']}, expires {when(answer['expires_at'])}) kept in {where}.")


@cli.command()
@json_option
@pass_state
def logout(state: State, as_json):
    """Revoke the saved token at the portal and forget it here."""
    revoked = False
    if state.token:
        try:
            state.portal().call("DELETE", "/auth/token/", expect_json=False)
            revoked = True
        except PortalError as error:
            click.echo(f"The portal did not revoke it: {error.message}", err=True)
    forgotten = config.forget()
    if as_json:
        emit_json({"revoked": revoked, "forgotten": forgotten})
    else:
        click.echo("Signed out." if revoked or forgotten else "Not signed in.")


@cli.command()
@json_option
@pass_state
def whoami(state: State, as_json):
    """Who you are signed in as, and your teams."""
    me = state.portal().get("/me/")
    if as_json:
        return emit_json(me)
    click.echo(f"{me['username']} at {state.url}{' (staff)' if me['is_staff'] else ''}")
    for team in me["teams"]:
        click.echo(f"  {team['slug']}: {team['role']}")
    token = me.get("token")
    if token:
        limited = ", ".join(token["teams"]) or "all your teams"
        click.echo(f"Token {token['prefix']}…: {token['scope']}, {limited}, expires {when(token['expires_at'])}")


# --- pools ------------------------------------------------------------------------------------------

@cli.command()
@json_option
@pass_state
def pools(state: State, as_json):
    """The pools you can book, free GPUs now."""
    rows = state.portal().every("/pools/")
    if as_json:
        return emit_json(rows)
    table([[p["slug"], p["name"], p["sharing_mode"], p["gpus_free"], p["gpus_total"],
            "yes" if p["queueing"] else "no"] for p in rows],
          ["POOL", "NAME", "MODE", "FREE", "GPUS", "QUEUES"])


def shape_options(command):
    for option in reversed([
        click.option("--gpus", type=click.IntRange(1), help="Whole GPUs (exclusive pools; vgpu: GPUs)."),
        click.option("--shares", type=click.IntRange(1), help="Shares of one GPU (time-slicing and MPS pools)."),
        click.option("--mig", "mig_profile", help="A MIG profile, e.g. 1g.10gb (MIG pools)."),
        click.option("--count", type=click.IntRange(1), help="MIG instances of the profile (default 1)."),
        click.option("--memory", type=parse_memory_param(), help="vGPU memory per GPU, e.g. 20GiB."),
        click.option("--cores", type=click.IntRange(1, 100), help="vGPU compute per GPU, in %."),
    ]):
        command = option(command)
    return command


def parse_memory_param():
    class Memory(click.ParamType):
        name = "memory"

        def convert(self, value, param, ctx):
            return value if isinstance(value, int) else parse_memory(value)

    return Memory()


def shape_body(gpus, shares, mig_profile, count, memory, cores) -> dict:
    body = {"gpus": gpus, "shares": shares, "mig_profile": mig_profile, "count": count,
            "gpu_memory_mib": memory, "gpu_cores_pct": cores}
    return {key: value for key, value in body.items() if value is not None}


@cli.command()
@click.argument("pool", shell_complete=complete_pool)
@click.option("--hours", type=click.IntRange(1, 24 * 31), default=24, show_default=True, help="How far ahead.")
@click.option("--slot", type=parse_duration, default="1h", show_default=True, help="Slot length.")
@shape_options
@json_option
@pass_state
def availability(state: State, pool, hours, slot, gpus, shares, mig_profile, count, memory, cores, as_json):
    """What is free in POOL, slot by slot.

    Counts the shape given (default: one of the pool's unit) over the next --hours."""
    start = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    slots = state.portal().get(f"/pools/{pool}/availability/", start=start.isoformat(),
                               end=(start + timedelta(hours=hours)).isoformat(), slot=int(slot.total_seconds()),
                               **shape_body(gpus, shares, mig_profile, count, memory, cores))
    if as_json:
        return emit_json(slots)
    table([[when(s["start"]), s["free"], s["unit"], s["most_together"], "yes" if s["fits"] else "no"] for s in slots],
          ["FROM", "FREE", "UNIT", "TOGETHER", "FITS"])


# --- reservations -----------------------------------------------------------------------------------

def _default_team(portal: Portal) -> str:
    teams = portal.get("/me/")["teams"]
    if len(teams) != 1:
        names = ", ".join(t["slug"] for t in teams) or "none"
        raise click.UsageError(f"Say which team with --team (yours: {names}).")
    return teams[0]["slug"]


def _describe(r: dict) -> str:
    queue = r.get("queue") or {}
    line = f"#{r['id']} {r['state']}: {amount(r)} of {r['pool']} for {r['team']}, {when(r['starts_at'])} → {when(r['ends_at'])}"
    if r["state"] == "pending" and queue:
        line += (f"; queue position {queue.get('position')}, start by {when(queue.get('start_by'))}, "
                 f"likely {when(queue.get('likely_start'))}")
    if r.get("reason") and r["state"] in ("failed", "pending"):
        line += f" ({r['reason']})"
    return line


def _print_environment(environment: dict | None) -> None:
    if not environment:
        return
    for name, value in environment["variables"].items():
        click.echo(f"export {name}={value}")
    if environment.get("namespace"):
        click.echo(f"export GPUPOOL_NAMESPACE={environment['namespace']}")
    click.echo(f"# on {', '.join(environment['nodes'])} ({environment['where']})", err=True)


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
            raise PortalError(f"Reservation #{reservation_id} is {r['state']}: {r.get('reason') or 'no reason given'}",
                              ExitCode.ENDED, r)
        if time.monotonic() >= deadline:
            raise PortalError(f"Reservation #{reservation_id} is still {r['state']} after {timeout:g} s.",
                              ExitCode.TIMEOUT, r)
        time.sleep(interval)


@cli.command()
@click.argument("pool", shell_complete=complete_pool)
@click.option("--team", help="The team to book for (default: your only team).")
@shape_options
@click.option("--for", "length", type=parse_duration, help="How long, e.g. 4h. Without --start: as soon as it fits.")
@click.option("--until", "until", type=parse_time, help="The end, e.g. 2026-11-25T18:00 or +4h.")
@click.option("--start", help="The start: a time, +30m, or 'earliest' (the first window that fits).")
@click.option("--not-after", type=parse_time, help="With --for: give up if it cannot start by then.")
@click.option("--priority-class", help="Run at this (lower) priority class.")
@click.option("--no-queue", is_flag=True, help="Refuse at once rather than wait in the pool's queue.")
@click.option("--wait", is_flag=True, help="Wait until it is active and print the environment a job needs.")
@click.option("--timeout", type=click.FloatRange(1), default=3600, show_default=True, help="--wait: seconds.")
@click.option("--interval", type=click.FloatRange(0.2), default=2.0, show_default=True, help="--wait: poll every.")
@json_option
@pass_state
def reserve(state: State, pool, team, gpus, shares, mig_profile, count, memory, cores, length, until, start,
            not_after, priority_class, no_queue, wait, timeout, interval, as_json):
    """Reserve GPUs, shares or MIG slices of POOL.

    Now (--until or --for), later (--start) or as soon as they fit (--for alone, waiting in the
    pool's queue). With --wait, exits once it is active and prints the environment a job needs."""
    if (length is None) == (until is None):
        raise click.UsageError("Give exactly one of --for and --until.")
    portal = state.portal()
    body = {"pool": pool, "team": team or _default_team(portal),
            **shape_body(gpus, shares, mig_profile, count, memory, cores)}
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
            click.echo(f"Offered instead ({offer.get('kind')}): {offer.get('message')} "
                       f"{jsonlib.dumps(offer.get('request'))}", err=True)
        raise
    if wait:
        click.echo(f"Reserved #{booked['id']}; waiting until it is active…", err=True)
        return _wait(portal, booked["id"], timeout, interval, as_json)
    if as_json:
        return emit_json(booked)
    click.echo(_describe(booked))


@cli.command(name="list")
@click.option("--state", "states", multiple=True, help="Only in this state (repeat for more).")
@click.option("--team", help="Only this team's.")
@click.option("--pool", help="Only in this pool.")
@json_option
@pass_state
def list_(state: State, states, team, pool, as_json):
    """Your teams' reservations, newest first."""
    portal = state.portal()
    rows = portal.every("/reservations/", team=team, pool=pool, state=list(states) or None)
    if as_json:
        return emit_json(rows)
    table([[r["id"], r["state"], r["team"], r["pool"], amount(r), when(r["starts_at"]), when(r["ends_at"])]
           for r in rows], ["ID", "STATE", "TEAM", "POOL", "HOLDS", "STARTS", "ENDS"])


@cli.command()
@click.argument("reservation_id", type=int)
@json_option
@pass_state
def show(state: State, reservation_id, as_json):
    """One reservation in full.

    Its window, GPUs, queue place, history and the environment a job needs."""
    r = state.portal().get(f"/reservations/{reservation_id}/")
    if as_json:
        return emit_json(r)
    click.echo(_describe(r))
    for grant in r.get("grants") or []:
        part = grant.get("mig_instance") or (f"{grant['shares']}/{grant['replicas']} shares"
                                             if grant.get("shares") else "whole GPU")
        click.echo(f"  {grant['node']}:{grant['index']} {grant['model_name']} {grant['uuid']} ({part})")
    for event in r.get("events") or []:
        click.echo(f"  {when(event['at'])} {event['from_state'] or '·'} → {event['to_state']}"
                   f" by {event['actor'] or 'the portal'}: {event['reason']}")
    _print_environment(r.get("environment"))


@cli.command()
@click.argument("reservation_id", type=int)
@click.option("--for", "length", type=parse_duration, help="Add this long to the current end, e.g. 2h.")
@click.option("--until", "until", type=parse_time, help="The new end.")
@json_option
@pass_state
def extend(state: State, reservation_id, length, until, as_json):
    """Move a reservation's end later, on the same GPUs."""
    if (length is None) == (until is None):
        raise click.UsageError("Give exactly one of --for and --until.")
    portal = state.portal()
    if length is not None:
        current = portal.get(f"/reservations/{reservation_id}/")["ends_at"]
        until = datetime.fromisoformat(current.replace("Z", "+00:00")) + length
    r = portal.post(f"/reservations/{reservation_id}/extend/", {"ends_at": until.isoformat()})
    emit_json(r) if as_json else click.echo(_describe(r))


@cli.command()
@click.argument("reservation_id", type=int)
@json_option
@pass_state
def release(state: State, reservation_id, as_json):
    """Release, cancel or withdraw a reservation.

    A running one is released now, one not started cancelled, a waiting one leaves the queue."""
    r = state.portal().post(f"/reservations/{reservation_id}/release/")
    emit_json(r) if as_json else click.echo(_describe(r))


@cli.command()
@click.option("--team", "teams", multiple=True, help="This team only (repeat for more; default: all yours).")
@json_option
@pass_state
def usage(state: State, teams, as_json):
    """Your teams' use against their quotas.

    GPU-equivalents held now and GE-hours this month, per team and pool."""
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
    table(rows, ["TEAM", "POOL", "GE NOW", "QUOTA GE", "GE-H MONTH", "GE-H LIMIT"])


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print a shell completion script.

    eval "$(gpupool completion bash)" in ~/.bashrc; zsh and fish likewise."""
    from click.shell_completion import get_completion_class

    completer = get_completion_class(shell)(cli, {}, "gpupool", "_GPUPOOL_COMPLETE")
    click.echo(completer.source())


def main() -> None:
    cli(prog_name="gpupool")
