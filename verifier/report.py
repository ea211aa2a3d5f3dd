"""Rendering results: text for people, JSON and JUnit XML for tools, a markdown report with plots.

Only this module formats results. Text leads with the verdict, then for each anomaly kind its
first witness (the record, ``file:line``, attempt, step, rank, sample IDs), then its scope (how
many items, how many more witnesses), so the first lines of a failure say what went wrong and
where. Long lists are capped and say how many were cut.
"""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ecrl.contract.atomicio import atomic_write_text
from verifier.anomalies import KINDS, OBLIGATIONS, Anomaly, Note
from verifier.explain import explain
from verifier.result import Metrics, RunResult, VerifyResult

__all__ = ["render_text", "render_json", "render_junit", "render_markdown", "write_report",
           "render_anomaly_line", "render_progress_line"]

WITNESSES_SHOWN = 3
WARNINGS_SHOWN = 5


def _seconds(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.3g} s" if value < 100 else f"{value:,.0f} s"


def _join(run: RunResult, file: str | None) -> str | None:
    if file is None:
        return None
    if Path(file).is_absolute():  # another run's file (--same-order): from where we stand
        return os.path.relpath(file)
    return str(Path(run.path) / file)


def _at(run: RunResult, a: Anomaly) -> str:
    where = _join(run, a.file)
    parts = []
    if where is not None:
        parts.append(where if a.line is None else f"{where}:{a.line}")
    facts = [f"{name} {value}" for name, value in
             (("attempt", a.attempt), ("step", a.step), ("rank", a.rank), ("epoch", a.epoch))
             if value is not None]
    if facts:
        parts.append("(" + ", ".join(facts) + ")")
    return " ".join(parts)


def _note(run: RunResult, note: Note) -> str:
    where = _join(run, note.file)
    if where is None:
        return note.message
    return f"{where}{'' if note.line is None else f':{note.line}'}: {note.message}"


def _world_sizes(run: RunResult) -> str:
    sizes = [str(a.world_size) for a in run.lineage]
    compact = [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]
    return "→".join(compact)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' if n != 1 else ''}"


def _proved(run: RunResult) -> list[str]:
    c = run.checked
    m = run.metrics
    attempts = len(run.lineage)
    steps = (f"proved: steps 0..{c.get('target_steps', 0) - 1} committed exactly once across "
             f"{_plural(attempts, 'attempt')} ({_plural(m.restarts, 'restart')}, world size "
             f"{_world_sizes(run)})")
    epochs = c.get("epochs", 0)
    if not run.windows_checked:
        return _audited(run, steps, epochs) + _replayed(run) + _state(run) + _same_order(run)
    lines = [steps + f"; {c.get('shards', 0):,} shards equal their windows"
             + (" (sample IDs)" if run.log_ids else " (count + hash)")]
    if run.log_ids:
        lines.append(f"proved: {_plural(epochs, 'epoch')} without duplicate, missing or extra "
                     "samples")
    return lines + _replayed(run) + _state(run) + _same_order(run)


def _audited(run: RunResult, steps: str, epochs: int) -> list[str]:
    """An external sampler's PASS: what the audit proved, and that windows were not checked."""
    sampler = run.sampler or {}
    name = sampler.get("name", "an external sampler")
    coverage = sampler.get("epoch_coverage", "all")
    audited = run.checked.get("steps_audited", 0)
    lines = [steps + (f"; {_plural(audited, 'step')} with disjoint ranks and the full global "
                      "batch (sample IDs)" if run.log_ids else
                      f"; {_plural(audited, 'step')} with the full global batch (counts)")]
    if not run.log_ids:
        lines.append(f"proved: {_plural(epochs, 'complete epoch')} consumed the declared "
                     "sample set exactly once (count + multiset hash)")
    elif coverage == "all":
        lines.append(f"proved: {_plural(epochs, 'epoch')} without duplicate or extra samples, "
                     "every complete epoch consuming each declared sample")
    else:
        lines.append(f"proved: {_plural(epochs, 'epoch')} without duplicate or extra samples "
                     "(epochs may drop a remainder: epoch_coverage drop_remainder)")
    lines.append(f"windows not checked: the order came from {name}, which ECRL cannot "
                 "recompute (audit mode); compare two runs with --same-order RUN2")
    return lines


def _replayed(run: RunResult) -> list[str]:
    r = run.replay
    if r is None:
        return []
    if not r.tested:
        why = ("no step was replayed" if r.replayed_steps == 0
               else f"{_plural(r.replayed_steps, 'replayed step')} without a finite loss")
        return [f"not tested: state restoration ({why}: replay consistency needs a failed "
                "attempt that ran past its successor's resume point)"]
    parts = []
    if r.exact:
        parts.append(f"{r.exact:,} bit for bit at the same world size")
    if r.tolerant:
        parts.append(f"{r.tolerant:,} within relative {r.tolerance:g}"
                     + (f", largest {r.max_rel_diff:.2g}" if r.max_rel_diff else ""))
    return [f"proved: {_plural(r.compared, 'replayed step')} recomputed after a resume with "
            f"a matching global loss ({'; '.join(parts)})"]


def _state(run: RunResult) -> list[str]:
    s = run.state
    if s is None:
        return []
    lines = []
    if s.resumes_checked:
        lines.append(f"proved: {_plural(s.resumes_checked, 'resume')} restored every saved "
                     f"object with the digest it was saved with "
                     f"({_plural(s.objects_compared, 'object')} compared)")
    if s.undigested:
        attempts = ", ".join(map(str, s.undigested))
        lines.append(f"not attested: the state loaded by {_plural(len(s.undigested), 'resume')} "
                     f"(attempt {attempts}), whose checkpoints record no state digests "
                     f"(written by {', '.join(s.undigested_strategies)}): not compared")
    return lines


def _same_order(run: RunResult) -> list[str]:
    o = run.same_order
    if o is None:
        return []
    return [f"proved: the same global window as {o.other} at each of steps 0.."
            f"{o.steps_compared - 1}" + (" (sample IDs)" if o.by_ids else " (count + hash)")]


def _unknown_lines(run: RunResult) -> list[str]:
    """Why there is no verdict; an unfinished run's account is not a failure to read."""
    account = run.unfinished.message if run.unfinished is not None else None
    return [reason if reason == account else f"cannot verify: {reason}"
            for reason in run.unknown]


def _per_failure(m: Metrics) -> str:
    """`` (per failure: 0, 1, 1; endings 2 jit, 1 hung)`` when attempts were resumed."""
    if not m.replayed_per_failure:
        return ""
    endings = ", ".join(f"{n} {status}" for status, n in sorted(m.endings.items()))
    return (f" (per failure: {', '.join(map(str, m.replayed_per_failure))}; endings "
            f"{endings})")


def _metrics_line(run: RunResult) -> str:
    m = run.metrics
    goodput = f"{m.goodput:.3g} steps/s" if m.goodput else "?"
    tentative = (f"; {m.tentative_steps:,} tentative step{'s' if m.tentative_steps != 1 else ''}"
                 if m.tentative_steps else "")
    return (f"metrics: {m.committed_steps:,} committed steps in {_seconds(m.wall_s)} (goodput "
            f"{goodput}); {m.replayed_steps:,} replayed steps{_per_failure(m)}{tentative}; "
            f"{m.checkpoints} "
            "checkpoints, "
            f"stall {_seconds(m.stall_s)} (snapshot {_seconds(m.snapshot_s)}, write "
            f"{_seconds(m.write_s)})"
            + (f"; loss vs reference: max |Δ| {m.loss_max_abs_diff:.3g}, mean "
               f"{m.loss_mean_abs_diff:.3g} over {m.loss_steps_compared} steps"
               if m.loss_max_abs_diff is not None and m.loss_mean_abs_diff is not None else ""))


def _run_text(run: RunResult) -> list[str]:
    out = [f"{run.verdict}  {run.path}"]
    out += [f"  {line}" for line in _unknown_lines(run)]
    by_kind: dict[str, list[Anomaly]] = {}
    for a in run.anomalies:
        by_kind.setdefault(a.kind, []).append(a)
    for kind, witnesses in by_kind.items():
        total = run.anomaly_counts.get(kind, len(witnesses))
        out.append(f"  ✗ {kind}: {KINDS[kind].summary} ({total:,} "
                   f"item{'s' if total != 1 else ''})")
        for a in witnesses[:WITNESSES_SHOWN]:
            out.append(f"      {explain(a)}")
            where = _at(run, a)
            if where:
                out.append(f"        at {where}")
            for r in a.related[:2]:
                rel = _join(run, r.file)
                if rel is not None:
                    out.append(f"        and {rel}" + (f":{r.line}" if r.line else ""))
        cut = len(witnesses) - WITNESSES_SHOWN
        if cut > 0:
            out.append(f"      … {cut} more witness{'es' if cut != 1 else ''} in --format "
                       f"json ({total:,} items in all)")
    if run.verdict == "PASS":
        out += ["  " + line for line in _proved(run)]
    if run.lineage:
        out.append("  " + _metrics_line(run))
    if run.warnings:
        out.append(f"  warnings ({len(run.warnings)}):")
        out += [f"    {_note(run, w)}" for w in run.warnings[:WARNINGS_SHOWN]]
        if len(run.warnings) > WARNINGS_SHOWN:
            out.append(f"    … {len(run.warnings) - WARNINGS_SHOWN} more (--format json)")
    return out


def render_anomaly_line(run: RunResult, a: Anomaly) -> str:
    """One anomaly on one line (``--follow`` prints each as soon as it is proved)."""
    where = _at(run, a)
    return f"{a.kind}: {explain(a)}" + (f" at {where}" if where else "")


def render_progress_line(run: RunResult, *, status: str | None, anomalies: int) -> str:
    """What following a run has proved so far, on one line."""
    records = run.checked.get("records", 0)
    if run.unfinished is None:
        proved = f"steps 0..{run.metrics.committed_steps - 1} committed"
    elif run.unfinished.committed_steps:
        proved = (f"steps 0..{run.unfinished.committed_steps - 1} of "
                  f"{run.unfinished.target_steps} proved (to the last durable checkpoint)")
    else:
        proved = f"no step of {run.unfinished.target_steps} durable yet"
    last = (f", attempt {run.unfinished.attempt} at step {run.unfinished.last_step}"
            if run.unfinished is not None and run.unfinished.last_step is not None else "")
    return (f"{status or 'not started'}{last}: {records:,} records read, {proved}; "
            f"{anomalies} anomal{'y' if anomalies == 1 else 'ies'}; verdict so far "
            f"{run.verdict}")


def render_text(result: VerifyResult | RunResult) -> str:
    """The report for people: verdict, witnesses first, then scope, metrics and warnings."""
    if isinstance(result, RunResult):
        return "\n".join(_run_text(result))
    out: list[str] = []
    for reason in result.unknown:
        out.append(f"UNKNOWN  {reason}")
    for run in result.runs:
        out += _run_text(run)
    if len(result.runs) > 1:
        counts = {v: sum(r.verdict == v for r in result.runs) for v in ("PASS", "FAIL",
                                                                        "UNKNOWN")}
        out.append(f"{result.verdict}: {len(result.runs)} runs — "
                   + ", ".join(f"{n} {v}" for v, n in counts.items() if n))
    return "\n".join(out)


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _anomaly_data(a: Anomaly) -> dict[str, Any]:
    """A witness for tools: its data with the explainer's message after its obligation."""
    data = a.as_dict()
    return {"kind": data.pop("kind"), "obligation": data.pop("obligation"),
            "message": explain(a), **data}


def _data(result: VerifyResult) -> dict[str, Any]:
    """``result.as_dict()`` with each anomaly's message (the one thing the data leaves out)."""
    data = result.as_dict()
    for run, out in zip(result.runs, data["runs"], strict=True):
        out["anomalies"] = [_anomaly_data(a) for a in run.anomalies]
    return data


def render_json(result: VerifyResult) -> str:
    """``{"verdict", "runs": [{"path", "verdict", "anomalies", "warnings", "metrics", …}]}``."""
    return json.dumps(_clean(_data(result)), indent=2)


def _junit_skip(run: RunResult, obligation: str) -> str | None:
    """Why an obligation was not checked for this run (None: it was)."""
    if obligation == "epochs" and not run.log_ids and run.windows_checked:
        return ("hash-only logs: exactly-once per epoch follows from the per-step window hashes "
                "(obligations steps and shards)")
    if obligation == "shards" and not run.windows_checked:
        return "windows not checked: an external sampler fed the run (audit mode)"
    if obligation == "batch" and run.windows_checked:
        return "ECRL's sampler: every shard is checked against its window (obligation shards)"
    if obligation == "replay" and (run.replay is None or not run.replay.tested):
        return "not tested: no step was replayed with a finite loss on both sides"
    if obligation == "order" and run.same_order is None:
        return "not asked: compare two runs with --same-order RUN2"
    if obligation == "state" and (run.state is None or not run.state.resumes_checked):
        return "no resume with state digests (checkpoint events without digests, or no resume)"
    return None


def render_junit(result: VerifyResult) -> str:
    """JUnit XML: a test suite per run, a test case per proof obligation."""
    suites = ET.Element("testsuites", name="ecrl-verify")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for reason in result.unknown:
        suite = ET.SubElement(suites, "testsuite", name=result.path)
        case = ET.SubElement(suite, "testcase", classname="ecrl-verify", name="runs found")
        ET.SubElement(case, "error", message=reason).text = reason
        suite.set("tests", "1")
        suite.set("errors", "1")
        totals["tests"] += 1
        totals["errors"] += 1
    for run in result.runs:
        suite = ET.SubElement(suites, "testsuite", name=run.path)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        classname = "ecrl-verify." + Path(run.path).name.replace(".", "_")

        case = ET.SubElement(suite, "testcase", classname=classname,
                             name="readable: the logs support a verdict")
        counts["tests"] += 1
        # An unfinished run whose committed prefix was checked: the obligations hold or fail
        # over that prefix, and "finished" carries the reason there is no verdict.
        account = run.unfinished.message if run.unfinished is not None else None
        unreadable = [r for r in run.unknown if r != account]
        if unreadable:
            text = "\n".join(unreadable)
            ET.SubElement(case, "error", message=unreadable[0]).text = text
            counts["errors"] += 1
        if run.unfinished is not None:
            case = ET.SubElement(suite, "testcase", classname=classname,
                                 name="finished: the run reached its target")
            counts["tests"] += 1
            message = run.unfinished.message
            if message in run.unknown:
                ET.SubElement(case, "error", message=message).text = message
                counts["errors"] += 1
            elif run.unfinished.committed_steps < run.unfinished.target_steps:
                ET.SubElement(case, "skipped", message=message)
                counts["skipped"] += 1
        for name, statement in OBLIGATIONS.items():
            case = ET.SubElement(suite, "testcase", classname=classname,
                                 name=f"{name}: {statement}")
            counts["tests"] += 1
            kinds = [k for k, v in KINDS.items() if v.obligation == name]
            found = [a for a in run.anomalies if a.kind in kinds]
            if found:
                total = sum(run.anomaly_counts.get(k, 0) for k in kinds)
                body = "\n".join(f"{a.kind}: {explain(a)} [{_at(run, a)}]" for a in found)
                ET.SubElement(case, "failure", message=f"{total} anomalies: {explain(found[0])}",
                              type=found[0].kind).text = body
                counts["failures"] += 1
            elif unreadable:
                ET.SubElement(case, "skipped", message="not checked: the logs cannot support "
                                                       "a verdict")
                counts["skipped"] += 1
            elif (skip := _junit_skip(run, name)) is not None:
                ET.SubElement(case, "skipped", message=skip)
                counts["skipped"] += 1
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        suites.set(key, str(value))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode")


# --- the markdown report ----------------------------------------------------------------------


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(result: VerifyResult, *, plots: dict[str, list[str]] | None = None,
                    self_tests: Mapping[str, dict[str, Any]] | None = None) -> str:
    """The report of ``--report DIR`` (plots and mutation self-tests are passed in)."""
    out = [f"# ecrl-verify report: {result.verdict}", ""]
    for reason in result.unknown:
        out += [f"- cannot verify: {reason}", ""]
    for run in result.runs:
        out += [f"## {run.path}: {run.verdict}", ""]
        out += [f"- {_md_escape(line)}" for line in _unknown_lines(run)]
        if run.verdict == "PASS":
            out += [f"- {line}" for line in _proved(run)]
        out.append("")
        if run.anomalies:
            out += ["### Anomalies (first witness of each kind, then scope)", "",
                    "| kind | count | witness | where |", "|---|---:|---|---|"]
            seen: set[str] = set()
            for a in run.anomalies:
                if a.kind in seen:
                    continue
                seen.add(a.kind)
                out.append(f"| `{a.kind}` | {run.anomaly_counts.get(a.kind, 1):,} | "
                           f"{_md_escape(explain(a))} | {_md_escape(_at(run, a))} |")
            out.append("")
        if run.lineage:
            out += ["### Lineage", "",
                    "| attempt | world size | resumed from | logged steps | committed | replayed "
                    "| tentative | status |", "|---:|---:|---:|---|---|---:|---:|---|"]
            for s in run.lineage:
                logged = f"{s.first_step}..{s.last_step}" if s.first_step is not None else "—"
                committed = f"{s.committed[0]}..{s.committed[1]}" if s.committed else "—"
                resumed = "fresh" if s.resumed_from_step is None else str(s.resumed_from_step)
                out.append(f"| {s.attempt} | {s.world_size} | {resumed} | {logged} | "
                           f"{committed} | {s.replayed_steps} | {s.tentative_steps} | "
                           f"{s.status} |")
            m = run.metrics
            out += ["", "### Goodput and checkpoint time", "", "| metric | value |", "|---|---:|"]
            for name, value in m.as_dict().items():
                if value is None:
                    continue
                if isinstance(value, (list, dict)):
                    items = value.items() if isinstance(value, dict) else enumerate(value)
                    shown = ", ".join(f"{v} {k}" if isinstance(value, dict) else str(v)
                                      for k, v in items) or "none"
                else:
                    shown = f"{value:,.4g}" if isinstance(value, float) else f"{value:,}"
                unit = " s" if name.endswith("_s") else " steps/s" if name == "goodput" else ""
                out.append(f"| {name} | {shown}{unit} |")
            out.append("")
        for image in (plots or {}).get(run.path, []):
            out += [f"![{Path(image).stem}]({image})", ""]
        test = (self_tests or {}).get(run.path)
        if test is not None:
            out += ["### Mutation self-test", ""]
            if "skipped_reason" in test:
                out += [f"Not run: {test['skipped_reason']}.", ""]
            else:
                rate = test["kill_rate"]
                out += [
                    f"The mutation catalogue was applied to copies of this run: the verifier "
                    f"caught **{test['killed']} of {test['harmful']}** harmful mutations (kill "
                    f"rate {rate:.0%}) and passed {test['benign'] - test['false_alarms']} of "
                    f"{test['benign']} benign ones ({test['false_alarms']} false alarms)."
                    if rate is not None else "No harmful mutation applied to this run.", "",
                    "| mutation | where | expected | verifier | ok |", "|---|---|---|---|---|"]
                for t in test["trials"]:
                    expected = t["expected"] + (f" ({', '.join(t['expected_kinds'])})"
                                                if t["expected_kinds"] else "")
                    got = t["verdict"] + (f" ({', '.join(t['kinds'])})" if t["kinds"] else "")
                    out.append(f"| {t['mutation']} | {_md_escape(t['where'])} | {expected} | "
                               f"{got} | {'yes' if t['ok'] else '**no**'} |")
                out.append("")
        if run.warnings:
            out += ["### Warnings", ""] + [f"- {_md_escape(str(w))}" for w in run.warnings] + [""]
    return "\n".join(out)


def _plots(run: RunResult, directory: Path, stem: str) -> list[str]:
    series = run.series
    if series is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    made: list[str] = []
    restarts = [a.committed[0] for a in run.lineage[1:] if a.committed]
    if series.loss is not None and np.isfinite(series.loss).any():
        fig, ax = plt.subplots(figsize=(7, 3.5))
        steps = np.arange(series.loss.size)
        ax.plot(steps, series.loss, lw=1, label="committed lineage")
        if series.reference_loss is not None:
            ax.plot(np.arange(series.reference_loss.size), series.reference_loss, lw=1,
                    ls="--", label="reference")
        for s in restarts:
            ax.axvline(s, color="grey", lw=0.6, ls=":")
        ax.set_xlabel("global step")
        ax.set_ylabel("mean loss over ranks")
        ax.set_title("Loss (dotted: resume points)")
        ax.legend()
        made.append(_save(fig, directory / f"{stem}loss.png"))
    if series.timeline and series.start_time is not None:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for attempt, times, steps in series.timeline:
            ax.plot(times - series.start_time, steps, lw=1.2, label=f"attempt {attempt}")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("global step")
        m = run.metrics
        title = "Progress"
        if m.goodput:
            title += f": goodput {m.goodput:.3g} committed steps/s"
        ax.set_title(title)
        ax.legend()
        made.append(_save(fig, directory / f"{stem}progress.png"))
    if series.checkpoints:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        idx = np.arange(len(series.checkpoints))
        ax.bar(idx, [c.stall_s for c in series.checkpoints], label="stall")
        ax.plot(idx, [c.write_s for c in series.checkpoints], "o", ms=3, label="write")
        ax.set_xticks(idx[:: max(1, len(idx) // 12)])
        ax.set_xticklabels([str(c.step) for c in series.checkpoints][:: max(1, len(idx) // 12)])
        ax.set_xlabel("checkpoint (global step)")
        ax.set_ylabel("seconds")
        ax.set_title("Training stall per checkpoint")
        ax.legend()
        made.append(_save(fig, directory / f"{stem}stall.png"))
    return made


def _save(fig: Any, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def write_report(result: VerifyResult, directory: str | Path, *,
                 self_tests: Mapping[str, dict[str, Any]] | None = None) -> list[Path]:
    """Write ``report.md``, ``report.json`` and PNG plots into ``directory``; return the files.

    Runs need their series (``verify(..., series=True)``) for the plots. ``self_tests`` (run
    path -> :func:`verifier.selftest.self_test_runs`' entry, ``--self-test``) are stated in the
    report when given; the report never runs them itself.
    """
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    plots: dict[str, list[str]] = {}
    tests = dict(self_tests or {})
    for i, run in enumerate(result.runs):
        stem = "" if len(result.runs) == 1 else f"run{i}-"
        plots[run.path] = _plots(run, target, stem)
    data = _data(result)
    for run in data["runs"]:
        run["mutation_self_test"] = tests.get(run["path"])
        run["plots"] = plots.get(run["path"], [])
    written = [target / name for names in plots.values() for name in names]
    atomic_write_text(target / "report.json", json.dumps(_clean(data), indent=2) + "\n")
    atomic_write_text(target / "report.md",
                      render_markdown(result, plots=plots, self_tests=tests) + "\n")
    # Atomic writes go through a private (0600) temporary file; a report is meant to be shared.
    for name in ("report.json", "report.md"):
        (target / name).chmod(0o644)
    return [target / "report.md", target / "report.json", *written]
