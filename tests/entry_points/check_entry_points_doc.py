#!/usr/bin/env python3
"""Keeps the "Entry points" section of docs/compatibility.md true (ctest entry_points_doc).

Usage:
  check_entry_points_doc.py [--list BUILD/entry_points.tsv] [--doc docs/compatibility.md]
                            [--update]

Reads the build's classification of every reachable entry point
(BUILD/entry_points.tsv, written by src/client/gen_entry_point_list.py) and the
document's section "## Entry points": its counts table (between the
`entry-points:counts` markers) and its reason tables, whose header is
`| entry points | count | reason |`. The first column of a reason row holds
backticked names or fnmatch patterns (`cuGraphicsGL*`), comma-separated; the row's
reason covers every refused entry point they match.

Fails, naming each one, on: a refused entry point no reason covers; one covered by
two reasons; a name or pattern that covers no refused entry point (served now, or
gone); a row whose count, or a counts-table figure, is no longer true; a row still
marked "no reason yet".

--update rewrites what the build decides and leaves the reasons alone: the counts
table, each row's count; drops names and patterns that cover nothing (and rows left
empty); puts refused entry points that no reason covers into a "no reason yet" row,
which the check keeps failing on until someone writes their reason.
Owns: nothing but this check and that rewrite. Standard library only.
"""

import argparse
import fnmatch
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SECTION = "## Entry points"
COUNTS_BEGIN = "<!-- entry-points:counts begin (check_entry_points_doc.py --update writes it) -->"
COUNTS_END = "<!-- entry-points:counts end -->"
REASON_HEADER = "| entry points | count | reason |"
NO_REASON = "**no reason yet**: write one, or serve them"
ROW_RE = re.compile(r"^\| (?P<names>[^|]*?) \| (?P<count>[^|]*?) \| (?P<reason>.*) \|$")
REFRESH = ("refresh with: python3 tests/entry_points/check_entry_points_doc.py --update "
           "(after building), then write a reason for anything it reports")

# Rows of the counts table: (label, library, headers or None for all of the library). The
# rows after the first of a library split it by header and together must cover it.
GROUPS = [
    ("driver API (`libcuda.so.1`), all", "libcuda.so.1", None),
    ("&nbsp;&nbsp;cuda.h, cudaProfiler.h", "libcuda.so.1", ("cuda.h", "cudaProfiler.h")),
    ("&nbsp;&nbsp;cudaGL.h, cudaEGL.h, cudaVDPAU.h (graphics interop)", "libcuda.so.1",
     ("cudaGL.h", "cudaEGL.h", "cudaVDPAU.h")),
    ("NVML (`libnvidia-ml.so.1`)", "libnvidia-ml.so.1", None),
    ("CUPTI (`libcupti.so.13`, preloaded by `flyt run`)", "libcupti.so.13", None),
]


class DocError(Exception):
    pass


def read_list(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            library, header, symbol, status = line.rstrip("\n").split("\t")
            if status not in ("served", "refused"):
                raise DocError(f"{path}: bad status {status!r} for {symbol}")
            rows.append((library, header, symbol, status))
    if not rows:
        raise DocError(f"{path}: empty")
    return rows


def counts_table(rows):
    lines = ["| library and headers | entry points | served | refused |", "|---|---|---|---|"]
    for label, library, headers in GROUPS:
        mine = [r for r in rows if r[0] == library and (headers is None or r[1] in headers)]
        served = sum(1 for r in mine if r[3] == "served")
        lines.append(f"| {label} | {len(mine)} | {served} | {len(mine) - served} |")
    split = [(library, headers) for _, library, headers in GROUPS if headers is not None]
    wholes = {library for _, library, headers in GROUPS if headers is None}
    unlisted = [r for r in rows if r[0] not in wholes or
                (any(library == r[0] for library, _ in split) and
                 sum(1 for library, headers in split if library == r[0] and r[1] in headers) != 1)]
    if unlisted:
        raise DocError("the counts table's groups do not cover every entry point of the list "
                       f"(a new library or header: {unlisted[0][0]} {unlisted[0][1]}?): "
                       "extend GROUPS in " + __file__)
    return lines


def section_bounds(lines):
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == SECTION)
    except StopIteration:
        raise DocError(f"no '{SECTION}' section")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return start, end


def parse_reason_rows(lines, start, end):
    """[(line index, [tokens], count text, reason)] of every reason table in the section."""
    rows = []
    in_table = False
    for i in range(start, end):
        line = lines[i].rstrip()
        if line == REASON_HEADER:
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if line.startswith("|---"):
            continue
        m = ROW_RE.match(line)
        if not m:
            raise DocError(f"line {i + 1}: not a `| names | count | reason |` row: {line}")
        tokens = re.findall(r"`([^`]+)`", m.group("names"))
        if not tokens:
            raise DocError(f"line {i + 1}: no backticked name or pattern in the first column")
        rows.append((i, tokens, m.group("count").strip(), m.group("reason").strip()))
    return rows


def analyse(rows, reason_rows):
    refused = sorted(r[2] for r in rows if r[3] == "refused")
    cover = {name: [] for name in refused}  # name -> [line index]
    token_hits = {}  # (line index, token) -> [names]
    for i, tokens, _, _ in reason_rows:
        for tok in tokens:
            hits = [n for n in refused if fnmatch.fnmatchcase(n, tok)]
            token_hits[(i, tok)] = hits
            for n in hits:
                if i not in cover[n]:
                    cover[n].append(i)
    return refused, cover, token_hits


def row_count(i, tokens, token_hits):
    return len({n for tok in tokens for n in token_hits[(i, tok)]})


def check(rows, lines):
    errors = []
    start, end = section_bounds(lines)
    want = counts_table(rows)
    try:
        b = lines.index(COUNTS_BEGIN, start, end)
        e = lines.index(COUNTS_END, b, end)
        if lines[b + 1:e] != want:
            errors.append("the counts table is no longer true; the build says:\n    " +
                          "\n    ".join(want))
    except ValueError:
        errors.append("the counts table's markers are missing from the section")
    reason_rows = parse_reason_rows(lines, start, end)
    refused, cover, token_hits = analyse(rows, reason_rows)
    served = {r[2] for r in rows if r[3] == "served"}
    uncovered = [n for n in refused if not cover[n]]
    if uncovered:
        errors.append(f"{len(uncovered)} refused entry point(s) without a documented reason: " +
                      " ".join(uncovered))
    twice = [f"{n} (lines {', '.join(str(i + 1) for i in cover[n])})"
             for n in refused if len(cover[n]) > 1]
    if twice:
        errors.append("covered by more than one reason: " + "; ".join(twice))
    for i, tokens, count, reason in reason_rows:
        idle = [t for t in tokens if not token_hits[(i, t)]]
        for t in idle:
            why = " (served now)" if t in served else ""
            errors.append(f"line {i + 1}: `{t}` covers no refused entry point{why}")
        n = row_count(i, tokens, token_hits)
        if count != str(n):
            errors.append(f"line {i + 1}: count says {count}, the row covers {n}")
        if reason.startswith("**no reason yet**"):
            errors.append(f"line {i + 1}: still marked 'no reason yet': " + ", ".join(tokens))
    return errors


def update(rows, lines):
    start, end = section_bounds(lines)
    out = list(lines)
    try:
        b = out.index(COUNTS_BEGIN, start, end)
        e = out.index(COUNTS_END, b, end)
    except ValueError:
        raise DocError("the counts table's markers are missing from the section; add the "
                       f"two lines\n  {COUNTS_BEGIN}\n  {COUNTS_END}\nunder '{SECTION}'")
    out[b + 1:e] = counts_table(rows)
    start, end = section_bounds(out)
    reason_rows = parse_reason_rows(out, start, end)
    refused, cover, token_hits = analyse(rows, reason_rows)
    drop = set()
    for i, tokens, _, reason in reason_rows:
        kept = [t for t in tokens if token_hits[(i, t)]]
        for t in tokens:
            if not token_hits[(i, t)]:
                print(f"dropped `{t}` (line {i + 1}): it covers no refused entry point",
                      file=sys.stderr)
        if not kept:
            drop.add(i)
            continue
        names = ", ".join(f"`{t}`" for t in kept)
        out[i] = f"| {names} | {row_count(i, kept, token_hits)} | {reason} |"
    uncovered = [n for n in refused if not cover[n]]
    placeholder = [i for i, _, _, reason in reason_rows if reason.startswith("**no reason yet**")]
    if uncovered:
        if placeholder:
            i = placeholder[0]
            drop.discard(i)
            kept = [t for t in next(r[1] for r in reason_rows if r[0] == i)
                    if token_hits[(i, t)]]
            names = sorted(set(kept) | set(uncovered))
        else:
            # A table of its own at the end of the section.
            i = end
            while out[i - 1].strip() == "":
                i -= 1
            out[i:i] = ["", "### Refused without a reason yet", "", REASON_HEADER,
                        "|---|---|---|", ""]
            i += 5
            names = uncovered
        count = len({n for n in refused for t in names if fnmatch.fnmatchcase(n, t)})
        out[i] = f"| {', '.join(f'`{t}`' for t in names)} | {count} | {NO_REASON} |"
        print(f"{len(uncovered)} refused entry point(s) need a reason (now in the row "
              f"marked 'no reason yet'): " + " ".join(uncovered), file=sys.stderr)
    out = [l for j, l in enumerate(out) if j not in drop]
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", default=os.path.join(ROOT, "build", "entry_points.tsv"))
    parser.add_argument("--doc", default=os.path.join(ROOT, "docs", "compatibility.md"))
    parser.add_argument("--update", action="store_true",
                        help="rewrite counts and name lists in the document")
    args = parser.parse_args(argv)
    rows = read_list(args.list)
    with open(args.doc, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if args.update:
        new = update(rows, lines)
        if new != lines:
            with open(args.doc, "w", encoding="utf-8") as f:
                f.write("\n".join(new))
            print(f"updated {args.doc}", file=sys.stderr)
        lines = new
    errors = check(rows, lines)
    if errors:
        print(f"{args.doc}: the 'Entry points' section does not match the build "
              f"({args.list}):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        print(REFRESH, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (DocError, OSError) as exc:
        print(f"check_entry_points_doc.py: error: {exc}", file=sys.stderr)
        sys.exit(1)
