"""The time ledger printed at the end of scripts/test.sh (and so of CI's .ci/run).

Usage: ``python scripts/ledger.py LEDGER_DIR [docs/ci.md]``. ``LEDGER_DIR`` holds
``phases.tsv`` (one ``phase<TAB>seconds`` line per phase, as test.sh timed it) and the
pytest runs' JUnit XML files (``junit-*.xml``). Prints one table: each phase's wall time,
the total, and the 15 slowest tests of every pytest run together; then a line for each
phase more than 25 % slower than the figure docs/ci.md records for it. Standard library
only, so that it runs whatever failed before it.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SLOWEST = 15
GROWTH = 0.25
# docs/ci.md's ledger table: "| phase | seconds |" rows between these two markers.
BEGIN, END = "<!-- ledger:begin -->", "<!-- ledger:end -->"


def phases(ledger: Path) -> list[tuple[str, float]]:
    out = []
    path = ledger / "phases.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            name, _, secs = line.rpartition("\t")
            if name:
                out.append((name, float(secs)))
    return out


def slowest(ledger: Path) -> list[tuple[float, str]]:
    cases: list[tuple[float, str]] = []
    for xml in sorted(ledger.glob("junit-*.xml")):
        run = xml.stem.removeprefix("junit-")
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0), f"[{run}] {name}"))
    cases.sort(reverse=True)
    return cases[:SLOWEST]


def recorded(doc: Path) -> dict[str, float]:
    """The figures docs/ci.md records, by phase."""
    if not doc.exists():
        return {}
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        return {}
    table = text.split(BEGIN, 1)[1].split(END, 1)[0]
    out = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"[0-9]+(\.[0-9]+)?", cells[1]):
            out[cells[0]] = float(cells[1])
    return out


def minutes(s: float) -> str:
    return f"{int(s // 60)}:{int(s % 60):02d}"


def main(argv: list[str]) -> int:
    ledger = Path(argv[1])
    doc = Path(argv[2]) if len(argv) > 2 else Path("docs/ci.md")
    rows = phases(ledger)
    known = recorded(doc)
    width = max([len(n) for n, _ in rows] + [24])
    lines = ["", "== time ledger", f"{'phase':<{width}}  {'wall':>7}  {'recorded':>8}"]
    for name, secs in rows:
        was = known.get(name.strip())
        lines.append(f"{name:<{width}}  {minutes(secs):>7}  {minutes(was) if was else '-':>8}")
    lines.append(f"{'(cpu)':<{width}}  {cpu_model()}")
    lines.append("")
    lines.append(f"the {SLOWEST} slowest tests")
    for secs, name in slowest(ledger):
        lines.append(f"{secs:8.1f} s  {name}")
    grown = [
        f"{name.strip()} took {minutes(secs)}, {100 * (secs / was - 1):.0f} % more than the "
        f"{minutes(was)} docs/ci.md records"
        for name, secs in rows
        if (was := known.get(name.strip())) and secs > was * (1 + GROWTH) and secs - was > 10
    ]
    if grown:
        lines.append("")
        lines.extend(f"grew: {g}" for g in grown)
    print("\n".join(lines))
    return 0


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
