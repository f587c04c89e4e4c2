#!/usr/bin/env python3
"""Keeps docs/compatibility.md true as the code changes (run by CI, no GPU needed).

Usage: python3 tests/gpu/ml/check_compat_doc.py REPO_ROOT

Fails when a case of tests/gpu/ml/cases.py is not named in the document's
tables, when the document names a case (`name` in a table row's proof column)
that no longer exists, or when it names an e2e test (`ctest -R e2e.NAME`) or a
tests/gpu program that does not exist.
Owns: nothing but this check; it imports cases.py without torch.
"""

import os
import re
import sys


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "..")
    sys.path.insert(0, os.path.join(root, "tests", "gpu", "ml"))
    import cases

    doc = open(os.path.join(root, "docs", "compatibility.md")).read()
    rows = [line for line in doc.splitlines() if line.startswith("|") and not line.startswith("|---")]
    proof = "\n".join(line.rsplit("|", 2)[-2] for line in rows if line.count("|") >= 3)
    errors = []
    for name in sorted(cases.CASES):
        if f"`{name}`" not in proof:
            errors.append(f"case {name} (tests/gpu/ml/cases.py) has no row in docs/compatibility.md")
    e2e_src = open(os.path.join(root, "tests", "e2e", "run_e2e.py")).read()
    gpu_programs = set()
    prog_dir = os.path.join(root, "tests", "gpu", "programs")
    for entry in os.listdir(prog_dir):
        gpu_programs.add(entry[:-3] if entry.endswith(".cu") else entry)
    for m in re.finditer(r"case `(\w+)`|^\| [^|]+ \| [^|]+ \| `(\w+)` \|$", doc, re.M):
        name = m.group(1) or m.group(2)
        if name not in cases.CASES:
            errors.append(f"docs/compatibility.md names case {name}, which cases.py does not have")
    for m in re.finditer(r"ctest -R e2e\.(\w+)", doc):
        if f"def test_{m.group(1)}(" not in e2e_src:
            errors.append(f"docs/compatibility.md names e2e.{m.group(1)}, which run_e2e.py does not have")
    for m in re.finditer(r"tests/gpu `(\w+)`", doc):
        if m.group(1) not in gpu_programs:
            errors.append(f"docs/compatibility.md names tests/gpu program {m.group(1)}, which does not exist")
    for e in errors:
        print(e)
    print(f"check_compat_doc: {len(cases.CASES)} cases, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
