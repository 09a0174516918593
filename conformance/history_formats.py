"""The release history (``kvconform.release-history/1``, made by ``conformance.matrix``) for people.

- Markdown: one row of counts per release, then per transition one line per divergence that
  appears, vanishes or changes (case, runner, kind, field, before and after, id). Layers that
  diverge alike are one line (``layers.*``, ``x2``); configs and replay lines are not here.
- HTML: the releases x checks table in colour (wpt.fyi's way: a column per release, a cell per
  check with its pass fraction), the transitions, and every divergence of every release with
  its config and replay line under its id (``#0.21.0-d1a2b3c4``).
The JSON holds everything; the ids (``conformance.matrix.divergence_id``) link the three.
"""

from __future__ import annotations

import html
import re
from typing import Any, Iterable, Mapping, Sequence

from conformance.release_history import CONNECTORS, divergence_id, unexpected

CHECK_TITLES = {"nixl": "NIXL", "mooncake": "Mooncake"}
"""How a connector check of ``conformance.matrix.CONNECTORS`` is titled."""

MAX_TRANSITION_LINES = 18
"""Lines of one transition shown in the Markdown (a screen); the rest are counted and are in the HTML."""

_LAYER_INDEX = re.compile(r"\b(layers?)\.\d+\b")
_NONE = "–"


# --------------------------------------------------------------------------- counts


def run_counts(run: Mapping[str, Any]) -> dict[str, int]:
    """A release run's (case, runner) outcomes as the history shows them: pass, known (an
    expectation explains every divergence), unexpected (fail), refused (vLLM refused as the
    reference predicts), unsupported (not driven or not modeled, with a reason)."""
    counts = run.get("counts") or {}
    return {"pass": counts.get("pass", 0), "known": counts.get("expected", 0), "unexpected": counts.get("fail", 0),
            "refused": counts.get("refused", 0),
            "unsupported": counts.get("unsupported", 0) + counts.get("not_modeled", 0)}


def check_counts(check: Mapping[str, Any]) -> dict[str, int]:
    """A connector check's results: pass, known (a failure a shipped expectation cites),
    unexpected (any other failure), refusal, unsupported."""
    counts = dict(check.get("counts") or {})
    known = sum(1 for f in check.get("failures", []) if f.get("status", "failure") == "failure" and f.get("known"))
    failures = counts.pop("failure", 0)
    out = {"pass": counts.pop("pass", 0), "known": known, "unexpected": failures - known,
           "refusal": counts.pop("refusal", 0), "unsupported": counts.pop("unsupported", 0) + counts.pop("skipped", 0)}
    for status, n in counts.items():  # a status this renderer does not know: shown, never dropped
        out[status] = out.get(status, 0) + n
    return out


def _counted(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in counts.items() if n) or "nothing"


def _ran(exit_code: int) -> bool:
    """Exit 0 (conforms) and 1 (divergences) judged something; 4, 5 and others did not."""
    return exit_code in (0, 1)


# --------------------------------------------------------------------------- one divergence


def _id(d: Mapping[str, Any]) -> str:
    return d.get("id") or divergence_id(d)


def value_of(d: Mapping[str, Any]) -> str:
    """What a divergence says, without the case, runner, kind and field its line already shows."""
    message = str(d.get("message", ""))
    for prefix in (f"{d.get('case')} [{d.get('runner')}] {d.get('kind')}: {d.get('field')}",
                   f"{d.get('field')} check: {d.get('case')} [{d.get('runner')}] {str(d.get('kind', '')).rpartition('_')[2]}"):
        if message.startswith(prefix):
            return message[len(prefix):].lstrip(": ").strip() or message
    return message


def verdict_of(d: Mapping[str, Any]) -> str:
    """known [expectation id], or unexpected (a connector's refusal: as the check labelled it)."""
    if d.get("known"):
        return f"known [{d['known']}]"
    if str(d.get("kind", "")).endswith("_refusal"):
        return "refusal"
    return "unexpected"


def _short(text: str, width: int = 72) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


# --------------------------------------------------------------------------- transitions


def _rank(*divergences: Mapping[str, Any]) -> int:
    """What needs a look first: an unexpected divergence (in either release), then a refusal, then a known bug."""
    verdicts = {verdict_of(d).split(" ")[0] for d in divergences}
    return min({"unexpected": 0, "refusal": 1}.get(v, 2) for v in verdicts)


def transition_rows(t: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per change of a transition, layers that change alike folded into one
    (``layers.*`` with their count): sign (+ appeared, - vanished, ~ changed), case, runner,
    kind, field, before, after, and the ids folded in; unexpected ones first."""
    changes: list[tuple[str, Mapping[str, Any], str, str, int]] = []
    for d in t.get("appeared", []):
        changes.append(("+", d, _NONE, f"{verdict_of(d)}: {value_of(d)}", _rank(d)))
    for d in t.get("vanished", []):
        changes.append(("-", d, f"{verdict_of(d)}: {value_of(d)}", _NONE, _rank(d)))
    for c in t.get("changed", []):
        changes.append(("~", c["after"], f"{verdict_of(c['before'])}: {value_of(c['before'])}",
                        f"{verdict_of(c['after'])}: {value_of(c['after'])}", _rank(c["before"], c["after"])))
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for sign, d, before, after, rank in changes:
        field = _LAYER_INDEX.sub(r"\1.*", str(d["field"]))
        key = (sign, d["case"], d["runner"], d["kind"], field, _LAYER_INDEX.sub(r"\1.*", before),
               _LAYER_INDEX.sub(r"\1.*", after))
        row = rows.setdefault(key, {"sign": sign, "case": d["case"], "runner": d["runner"], "kind": d["kind"],
                                    "field": field, "before": key[5], "after": key[6], "ids": [], "rank": rank})
        row["ids"].append(_id(d))
    return sorted(rows.values(), key=lambda row: row["rank"])


def _transition_title(t: Mapping[str, Any]) -> str:
    n = {label: len(t.get(label, [])) for label in ("appeared", "vanished", "changed")}
    return f"{t['from']} → {t['to']}: " + ", ".join(f"{v} {k}" for k, v in n.items())


# --------------------------------------------------------------------------- Markdown


def _schedules(run: Mapping[str, Any]) -> str:
    sched = run.get("schedules") or {}
    return " / ".join(str(sched.get(r, 0)) for r in ("mrv1", "mrv2")) if sched else _NONE


def _check_cell(check: Mapping[str, Any], footnote: int | None) -> str:
    if not _ran(check["exit"]):
        return f"exit {check['exit']} [{footnote}]" if footnote else f"exit {check['exit']}"
    counts = check_counts(check)
    cell = _counted(counts)
    return f"**{cell}**" if counts["unexpected"] else cell


def _not_run(history: Mapping[str, Any]) -> tuple[list[tuple[str, str, str]], dict[tuple[str, str], int]]:
    """Why a run or check judged nothing, releases with the same reason together: the notes
    (check, releases, reason) and each (release, check)'s note number."""
    reasons: dict[tuple[str, str], list[str]] = {}
    for r in history["releases"]:
        steps = [("run", r["run"])] + list(r.get("checks", {}).items())
        for name, step in steps:
            if not _ran(step["exit"]):
                line = str(step.get("line", "")).replace(f"vLLM {r['version']}", "this release")
                reasons.setdefault((name, line), []).append(r["version"])
    notes, number = [], {}
    for i, ((name, line), versions) in enumerate(reasons.items(), start=1):
        span = versions[0] if len(versions) == 1 else f"{versions[0]} to {versions[-1]}" if len(versions) > 2 else " and ".join(versions)
        notes.append((name, span, line))
        for v in versions:
            number[(v, name)] = i
    return notes, number


def summary_table(history: Mapping[str, Any]) -> str:
    """The releases' rows of counts, and why a run or check judged nothing (one note per reason)."""
    notes, number = _not_run(history)
    names = [n for n in CONNECTORS]
    lines = ["| release | run | cases | schedules MRv1 / MRv2 | pass | known | unexpected | refused | unsupported | "
             "divergences known / unexpected | " + " | ".join(f"{CHECK_TITLES.get(n, n)} check" for n in names) + " |",
             "|---" * (10 + len(names)) + "|"]
    for r in history["releases"]:
        run = r["run"]
        c = run_counts(run)
        ran = _ran(run["exit"])
        bad = len(unexpected(run))
        exit_cell = f"exit {run['exit']}" + ("" if ran else f" [{number[(r['version'], 'run')]}]")
        cells = [r["version"], exit_cell, str(run.get("cases", _NONE)), _schedules(run) if ran else _NONE,
                 *(str(c[k]) if ran else _NONE for k in ("pass", "known")),
                 (f"**{c['unexpected']}**" if c["unexpected"] else "0") if ran else _NONE,
                 *(str(c[k]) if ran else _NONE for k in ("refused", "unsupported")),
                 f"{len(run.get('divergences', [])) - bad} / " + (f"**{bad}**" if bad else "0"),
                 *(_check_cell(r["checks"][n], number.get((r["version"], n))) if n in r.get("checks", {}) else _NONE
                   for n in names)]
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "Judged nothing:"]
        lines += [f"{i}. {name} on {span}: {_md(_short(line, 200))}" for i, (name, span, line) in enumerate(notes, start=1)]
    return "\n".join(lines)


def to_markdown(history: Mapping[str, Any], *, html_link: str | None = None) -> str:
    """A page a person reads: the table, then each transition in a screen (no configs or replay
    lines: ids name them; ``html_link``, the HTML page's path from the Markdown, makes each id a link)."""
    releases = history["releases"]
    lines = ["# kvconform release history", "",
             "Each release in its own venv (`scripts/release_env.sh`), judged by the reference for that release. "
             "Counts are (case, runner) outcomes; *known*: a shipped expectation (`conformance/expectations.toml`) "
             "cites the upstream bug, *unexpected* otherwise. Configs and replay lines are in the JSON and HTML, "
             "by divergence id.", ""]
    if history.get("expectations") == "none":
        lines += ["Judged without the shipped expectations (`--no-expectations`): known upstream bugs count as unexpected.", ""]
    lines += [summary_table(history)]
    for t in history["transitions"]:
        rows = transition_rows(t)
        lines += ["", f"## {_transition_title(t)}", ""]
        if not rows:
            lines.append("No divergence appeared, vanished or changed.")
            continue
        lines += ["| | case | runner | kind | field | before | after | id |", "|---|---|---|---|---|---|---|---|"]
        after_release = t["to"]
        for row in rows[:MAX_TRANSITION_LINES]:
            target = after_release if row["sign"] != "-" else t["from"]
            ident = row["ids"][0]
            shown = f"[{ident}]({html_link}#{target}-{ident})" if html_link else f"`{ident}`"
            folded = f" ×{len(row['ids'])}" if len(row["ids"]) > 1 else ""
            lines.append(f"| {row['sign']} | {_md(row['case'])} | {row['runner']} | {row['kind']} | "
                         f"{_md(_short(row['field'], 56))}{folded} | {_md(_short(row['before']))} | "
                         f"{_md(_short(row['after']))} | {shown} |")
        if len(rows) > MAX_TRANSITION_LINES:
            rest = rows[MAX_TRANSITION_LINES:]
            kinds = _counted({k: sum(1 for r in rest if r["kind"] == k) for k in dict.fromkeys(r["kind"] for r in rest)})
            lines.append(f"\n… and {len(rest)} more line(s) ({kinds}): the HTML and JSON list them.")
    known_by_release = []
    for r in releases:
        ids: dict[str, int] = {}
        for d in list(r["run"].get("divergences", [])) + [f for c in r.get("checks", {}).values() for f in c.get("failures", [])]:
            if d.get("known"):
                ids[d["known"]] = ids.get(d["known"], 0) + 1
        if ids:
            known_by_release.append(f"- {r['version']}: " + ", ".join(f"`{k}` ×{n}" for k, n in sorted(ids.items())))
    if known_by_release:
        lines += ["", "## Known upstream bugs, per release", ""] + known_by_release
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- HTML

_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}th{background:#f6f6f6}"
    "td.c{text-align:center;white-space:nowrap}.pass{background:#c8ecc3}.known{background:#e6f2b5}"
    ".some{background:#fbe3a1}.bad{background:#f5b7b1}.none{background:#eee;color:#777}code{font-size:90%}"
    "tr.add td:first-child{color:#a00}tr.del td:first-child{color:#070}details{margin:.3em 0}"
)


def _cell(passed: int, total: int, known: int, unexpected_n: int, ran: bool, title: str) -> str:
    """One coloured cell: its pass fraction (passes and known bugs over all results)."""
    e = html.escape
    if not ran:
        return f'<td class="c none" title="{e(title)}">not run</td>'
    if unexpected_n:
        css = "bad"
    elif total and passed == total:
        css = "pass"
    elif total and passed + known == total:
        css = "known"
    else:
        css = "some"
    text = f"{passed + known} / {total}" + (f" ({known} known)" if known else "")
    return f'<td class="c {css}" title="{e(title)}">{e(text)}</td>'


def _check_rows(history: Mapping[str, Any]) -> Iterable[tuple[str, list[str]]]:
    releases = history["releases"]
    run_cells, sched_cells, div_cells = [], [], []
    for r in releases:
        run = r["run"]
        c = run_counts(run)
        total = sum(c.values())
        ran = _ran(run["exit"])
        # Red for an unexpected divergence too: a MRv1/MRv2 mismatch fails the run, not a runner.
        run_cells.append(_cell(c["pass"] + c["refused"], total, c["known"], c["unexpected"] + len(unexpected(run)), ran,
                               run.get("line", "") if not ran else _counted(c)))
        sched = run.get("schedules") or {}
        sched_cells.append(f'<td class="c {"pass" if sched else "none"}">{html.escape(_schedules(run)) if sched else "none"}</td>')
        bad = len(unexpected(run))
        known = len(run.get("divergences", [])) - bad
        div_cells.append(f'<td class="c {"bad" if bad else "known" if known else "pass" if ran else "none"}">'
                         f"{known} known / {bad} unexpected</td>" if ran else '<td class="c none">–</td>')
    yield "run: (case, runner) outcomes", run_cells
    yield "request schedules MRv1 / MRv2", sched_cells
    yield "divergences", div_cells
    for name in CONNECTORS:
        cells = []
        for r in releases:
            check = r.get("checks", {}).get(name)
            if check is None:
                cells.append('<td class="c none">–</td>')
                continue
            c = check_counts(check)
            cells.append(_cell(c["pass"] + c["refusal"], sum(c.values()), c["known"], c["unexpected"], _ran(check["exit"]),
                               check.get("line", "") if not _ran(check["exit"]) else _counted(c)))
        yield f"{CHECK_TITLES.get(name, name)} check", cells


def _entry(version: str, d: Mapping[str, Any]) -> str:
    e = html.escape
    ident = _id(d)
    return (f'<li id="{e(version)}-{e(ident)}"><code>{e(ident)}</code> {e(verdict_of(d))}: <code>{e(d["message"])}</code>'
            f'<details><summary>replay (config inside)</summary><code>{e(d.get("replay", ""))}</code></details></li>')


def to_html(history: Mapping[str, Any]) -> str:
    """One standalone page: the releases x checks table, the transitions, every divergence."""
    e = html.escape
    releases: Sequence[Mapping[str, Any]] = history["releases"]
    head = "".join(f"<th>{e(r['version'])}</th>" for r in releases)
    body = "".join(f"<tr><th>{e(title)}</th>{''.join(cells)}</tr>" for title, cells in _check_rows(history))
    parts = ["<!doctype html><html lang=en><meta charset=utf-8><title>kvconform release history</title>",
             f"<style>{_CSS}</style>", "<h1>kvconform release history</h1>",
             "<p>Each release in its own venv, judged by the reference for that release. A cell: passes (and known "
             "upstream bugs) over all results; green all pass, yellow-green known bugs only, red an unexpected "
             "divergence, grey judged nothing (hover for why).</p>",
             f"<table><tr><th>check</th>{head}</tr>{body}</table>"]
    if history.get("expectations") == "none":
        parts.insert(3, "<p><b>Judged without the shipped expectations</b>: known upstream bugs count as unexpected.</p>")
    for t in history["transitions"]:
        rows = transition_rows(t)
        parts.append(f"<h2>{e(_transition_title(t))}</h2>")
        if not rows:
            parts.append("<p>No divergence appeared, vanished or changed.</p>")
            continue
        out = ["<table><tr><th></th><th>case</th><th>runner</th><th>kind</th><th>field</th><th>before</th><th>after</th><th>id</th></tr>"]
        for row in rows:
            target = t["to"] if row["sign"] != "-" else t["from"]
            links = " ".join(f'<a href="#{e(target)}-{e(i)}">{e(i)}</a>' for i in row["ids"])
            css = {"+": "add", "-": "del"}.get(row["sign"], "")
            out.append(f'<tr class="{css}"><td>{e(row["sign"])}</td><td><code>{e(row["case"])}</code></td><td>{e(row["runner"])}</td>'
                       f"<td>{e(row['kind'])}</td><td><code>{e(row['field'])}</code></td><td>{e(row['before'])}</td>"
                       f"<td>{e(row['after'])}</td><td>{links}</td></tr>")
        parts.append("".join(out) + "</table>")
    for r in releases:
        version = r["version"]
        found = [_entry(version, d) for d in r["run"].get("divergences", [])]
        found += [_entry(version, f | {"message": f"{name} check: {f['case']} [{f['runner']}] {f.get('status', 'failure')}: {f['detail']}"})
                  for name, c in r.get("checks", {}).items() for f in c.get("failures", [])]
        steps = [f"<li>run: exit {r['run']['exit']}: {e(r['run'].get('line', ''))}</li>"]
        steps += [f"<li>{e(CHECK_TITLES.get(n, n))} check: exit {c['exit']}: {e(c.get('line', ''))}"
                  f"<br>replay: <code>{e(c.get('replay', ''))}</code></li>" for n, c in r.get("checks", {}).items()]
        parts.append(f'<h2 id="{e(version)}">vLLM {e(version)}</h2><ul>{"".join(steps)}</ul>'
                     + (f"<ul>{''.join(found)}</ul>" if found else "<p>No divergence.</p>"))
    return "\n".join(parts) + "\n</html>\n"


__all__ = ["MAX_TRANSITION_LINES", "check_counts", "run_counts", "summary_table", "to_html", "to_markdown",
           "transition_rows", "value_of", "verdict_of"]
