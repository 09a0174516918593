"""``kvconform report merge``: one report out of the reports of shards and hosts.

Results are keyed by case and environment (the vLLM, torch, device, harness and what the
reference judged by: ``ENVIRONMENT_KEYS``). Within one environment, a case that two
reports hold must have the same verdict in both (a shard rerun), else the merge refuses;
shards of one selection must all be there (each report says which shard it is and which
selection: ``conformance.shards``), and their results go back in selection order, so a merge
of N shards is the unsharded report (same cases, verdicts, divergences; only timings differ).
Reports of several environments are kept apart: the merged report lists them
(``environments``) and each result names its own, which the Markdown and HTML show side by
side. Every input is validated whole against ``report.schema.json`` first; an incomplete or
truncated report, another schema, or a bad merge is one line and exit 4.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

from conformance.report_formats import SCHEMA_ID, describe_environment, load_report

ENVIRONMENT_KEYS = ("vllm", "torch", "gpu", "harness", "judged_by", "reference_vllm")
"""What makes two reports' results different observations of a case: the vLLM build, torch, the
device, kvconform's version, and what the reference judged by."""


class MergeError(ValueError):
    """A merge that cannot be made (one line, naming the report(s) and what is wrong)."""


def environment_key(report: Mapping[str, Any]) -> tuple[Any, ...]:
    env = report.get("environment") or {}
    return tuple(env.get(k) for k in ENVIRONMENT_KEYS)


def verdict_of(result: Mapping[str, Any]) -> Any:
    """What must agree when one case is in two reports of one environment: every runner's
    status and divergences (kind, field, observed, expected, expectation) and the MRv1/MRv2
    mismatches. Details, timings and replay lines may differ."""
    runners = {
        name: (r.get("status"), sorted(json.dumps([d.get("kind"), d.get("field"), d.get("observed"), d.get("expected"),
                                                  d.get("expected_by")], sort_keys=True, default=str)
                                       for d in r.get("divergences") or ()))
        for name, r in sorted((result.get("runners") or {}).items())
    }
    mismatches = sorted(json.dumps(m, sort_keys=True, default=str) for m in result.get("mrv1_mrv2_mismatches") or ())
    return runners, mismatches


def load_all(paths: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """Every report, validated whole and complete, or a MergeError naming the first bad one."""
    if len(paths) < 1:
        raise MergeError("report merge needs at least one report")
    out = []
    for path in paths:
        report, problem = load_report(path)
        if report is None:
            raise MergeError(problem or f"{path}: not a valid {SCHEMA_ID} report")
        if not report.get("complete"):
            raise MergeError(f"{path}: an incomplete report (its run did not finish: "
                             f"{len(report['results'])} case(s) so far); rerun it before merging")
        if "environments" in report:
            raise MergeError(f"{path}: already a merge of several environments; merge the reports it was made from")
        out.append((path, report))
    return out


def check_shards(reports: Sequence[tuple[str, dict[str, Any]]], *,
                 environment_of: Callable[[Mapping[str, Any]], tuple[Any, ...]] = environment_key,
                 results_of: Callable[[Mapping[str, Any]], int] = lambda report: len(report["results"]),
                 describe: Callable[[tuple[Any, ...]], str] | None = None) -> None:
    """Each selection's shards are all there, once each, and agree on what they split
    (run reports by default; ``conformance.connectors.merge`` passes its own environment,
    count of cases and label)."""
    describe = describe or (lambda key: describe_environment(dict(zip(ENVIRONMENT_KEYS, key))))
    groups: dict[tuple[Any, ...], dict[int, str]] = {}
    counts: dict[tuple[Any, ...], tuple[int, int]] = {}
    for path, report in reports:
        shard = report.get("shard")
        if shard is None:
            continue
        key = (environment_of(report), shard["selection_digest"])
        have = (shard["count"], shard["selection_size"])
        if counts.setdefault(key, have) != have:
            raise MergeError(f"{path}: shard {shard['index']}/{shard['count']} of a selection of {shard['selection_size']} "
                             f"cases, but another report splits the same selection {counts[key][0]} ways "
                             f"({counts[key][1]} cases)")
        seen = groups.setdefault(key, {})
        if shard["index"] in seen:
            raise MergeError(f"{path}: shard {shard['index']}/{shard['count']} is also {seen[shard['index']]} "
                             "(the same shard twice)")
        if len(shard["positions"]) != results_of(report):
            raise MergeError(f"{path}: shard {shard['index']}/{shard['count']} lists {len(shard['positions'])} positions "
                             f"for {results_of(report)} cases (a truncated or edited report)")
        seen[shard["index"]] = path
    for key, seen in groups.items():
        count = counts[key][0]
        missing = [i for i in range(1, count + 1) if i not in seen]
        if missing:
            raise MergeError(f"selection {key[1]} ({describe(key[0])}): "
                             f"shard(s) {', '.join(f'{i}/{count}' for i in missing)} missing; have "
                             f"{', '.join(f'{i}/{count} ({seen[i]})' for i in sorted(seen))}")


def merge(paths: Sequence[str]) -> dict[str, Any]:
    """The merged ``kvconform.report/1`` document (raises MergeError)."""
    reports = load_all(paths)
    check_shards(reports)
    envs: list[tuple[Any, ...]] = []
    env_docs: list[dict[str, Any]] = []
    # Per environment: (order key, case) -> (path, result).
    by_env: list[dict[str, tuple[tuple[int, int], str, dict[str, Any]]]] = []
    for report_no, (path, report) in enumerate(reports):
        key = environment_key(report)
        if key not in envs:
            envs.append(key)
            env_docs.append(dict(report["environment"]))
            by_env.append({})
        slot = by_env[envs.index(key)]
        shard = report.get("shard")
        for i, result in enumerate(report["results"]):
            # Shards go back to their selection position; other reports follow in input order.
            order = (0, shard["positions"][i]) if shard else (1 + report_no, i)
            case = result["case"]
            if case in slot:
                _, other_path, other = slot[case]
                if verdict_of(other) != verdict_of(result):
                    raise MergeError(f"case {case!r} is in {other_path} and {path} ({describe_environment(report['environment'])}) "
                                     f"with different verdicts: {_statuses(other)} vs {_statuses(result)}")
                continue
            slot[case] = (order, path, result)
    results: list[dict[str, Any]] = []
    for index, slot in enumerate(by_env):
        for _, _, result in sorted(slot.values(), key=lambda item: item[0]):
            results.append(dict(result, environment=index) if len(envs) > 1 else result)
    docs = [report for _, report in reports]
    merged: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "complete": True,
        "environment": _merged_environment(env_docs[0], [d for d in docs if environment_key(d) == envs[0]]),
        "started": min(d["started"] for d in docs),
        # The wall time of the slowest part: shards run side by side.
        "duration_s": max(d["duration_s"] for d in docs),
        "counts": _summed([d["counts"] for d in docs]),
        "fidelity": _summed([d.get("fidelity") or {} for d in docs]),
        "schedules": _schedules([d.get("schedules") or {} for d in docs]),
        "expectations": _expectations([d["expectations"] for d in docs]),
        "results": results,
        "merged_from": list(paths),
    }
    if len(envs) > 1:
        merged["environments"] = [
            _merged_environment(env_docs[i], [d for d in docs if environment_key(d) == key]) for i, key in enumerate(envs)
        ]
    return merged


def _statuses(result: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {r.get('status')}" for name, r in sorted((result.get("runners") or {}).items()))


def _merged_environment(env: Mapping[str, Any], docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The environment of one key; the selection text drops the shard (``, shard K/N (...)``)."""
    out = dict(env)
    selections = sorted({str((d.get("environment") or {}).get("cases", "")).split(", shard ")[0] for d in docs})
    out["cases"] = "; ".join(selections)
    out.pop("vllm_log", None)  # one log per part: they stay in the parts' reports
    return out


def _summed(dicts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + int(v)
    return dict(sorted(out.items()))


def _schedules(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not parts:
        return {}
    first = parts[0]
    return {
        "per_case": first.get("per_case"),
        "seed": first.get("seed"),
        "run": _summed([p.get("run") or {} for p in parts]),
        "draft_steps": _summed([p.get("draft_steps") or {} for p in parts]),
    }


def _expectations(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts add up; an entry is unused if some part found it unused and no part used it (a part
    whose cases the entry does not scope to lists it neither way)."""
    files = sorted({str(p.get("file")) for p in parts})
    absorbed = _summed([p.get("absorbed") or {} for p in parts])
    unused = sorted({e for p in parts for e in p.get("unused") or ()} - {e for e, n in absorbed.items() if n})
    return {
        "file": files[0] if len(files) == 1 else "; ".join(files),
        "expected": sum(int(p.get("expected") or 0) for p in parts),
        "unexpected": sum(int(p.get("unexpected") or 0) for p in parts),
        "unused": unused,
        "absorbed": absorbed,
    }


__all__ = ["ENVIRONMENT_KEYS", "MergeError", "check_shards", "environment_key", "load_all", "merge", "verdict_of"]
