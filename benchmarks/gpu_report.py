"""Collects what ``gpu_check.sh`` wrote into ``OUTDIR/gpu_report.json`` and prints a short table.

    python3 benchmarks/gpu_report.py OUTDIR BENCH_SCRIPT...

Reads ``OUTDIR/steps.tsv`` (one line per step: name, status, seconds, detail), ``OUTDIR/pytest_gpu.xml``
when the tests ran, and ``OUTDIR/<script>.json`` of every benchmark script. Exits 1 when a step failed.
Imports no torch, so it is quick and also works where torch is broken.
"""

from __future__ import annotations

import json
import platform
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def _steps(outdir: Path) -> list[dict[str, Any]]:
    steps = []
    path = outdir / "steps.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            name, status, seconds, detail = (line.split("\t") + ["", "", ""])[:4]
            steps.append(dict(name=name, status=status, seconds=int(seconds or 0), detail=detail))
    return steps


def _tests(outdir: Path) -> dict[str, Any] | None:
    path = outdir / "pytest_gpu.xml"
    if not path.exists():
        return None
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return dict(counts, failed=failed[:50])


def _benchmarks(outdir: Path, scripts: list[str]) -> dict[str, Any]:
    out = {}
    for script in scripts:
        name = Path(script).stem
        path = outdir / f"{name}.json"
        try:
            out[name] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            out[name] = dict(skipped=None, rows=[], errors=[f"no readable {path.name}: {exc}"])
    return out


def _fmt(value: Any, width: int) -> str:
    text = "-" if value is None else str(value)
    return text[:width].ljust(width)


def _training_line(name: str, t: dict[str, Any]) -> str:
    """The measured training steps in one line: speed-up measured and predicted, the worst rank's busy error."""
    return (
        f"  {name}: balanced over random padded {t['speedup']:.2f}x measured, {t['speedup_predicted']:.2f}x "
        f"predicted by the calibrated model; busy time per rank predicted within {t['busy_error_max']:.1%}"
    )


def _table(report: dict[str, Any]) -> str:
    lines = ["", "== gpu_check summary =="]
    for step in report["steps"]:
        lines.append(f"  {step['name']:<22} {step['status']:<8} {step['seconds']:>4} s  {step['detail'][:70]}")
    tests = report["tests"]
    if tests:
        lines.append(
            f"  gpu tests: {tests['tests']} run, {tests['failures']} failed, {tests['errors']} errors, "
            f"{tests['skipped']} skipped"
        )
    header = f"  {'op':<16} {'case':<12} {'provider':<34} {'ms':>8} {'GB/s':>7} {'vs copy':>8} {'vs base':>8}"
    rows_printed = False
    for name, bench in report["benchmarks"].items():
        if bench.get("skipped"):
            lines.append(f"  {name}: skipped ({bench['skipped']})")
            continue
        for error in bench.get("errors", []):
            lines.append(f"  {name}: ERROR {error[:110]}")
        if bench.get("training"):
            lines.append(_training_line(name, bench["training"]))
        if bench.get("rows") and not rows_printed:
            lines.append(header)
            rows_printed = True
        for row in bench.get("rows", []):
            base = None if row.get("vs_baseline") is None else f"{row['vs_baseline']:.2f}x"
            lines.append(
                f"  {_fmt(row['op'], 16)} {_fmt(row['case'], 12)} {_fmt(row['provider'], 34)} "
                f"{row['ms']:>8.4f} {row['gbps']:>7.0f} {row['vs_copy']:>8.3f} {_fmt(base, 8):>8}"
            )
    lines.append(f"  overall: {report['status']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 1:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[0])
    steps = _steps(outdir)
    benchmarks = _benchmarks(outdir, argv[1:])
    failed = [s["name"] for s in steps if s["status"] == "failed"]
    failed += [n for n, b in benchmarks.items() if b.get("errors")]
    report = dict(
        status="failed: " + ", ".join(sorted(set(failed))) if failed else "ok",
        steps=steps,
        tests=_tests(outdir),
        benchmarks=benchmarks,
        environment=next(
            (b["environment"] for b in benchmarks.values() if b.get("environment")),
            dict(python=platform.python_version(), device=None),
        ),
    )
    (outdir / "gpu_report.json").write_text(json.dumps(report, indent=1))
    print(_table(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
