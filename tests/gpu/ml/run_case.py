"""Runs one case of cases.py and writes its results as JSON.

Usage: python3 run_case.py CASE OUT.json

Owns: one case's process (its environment is set before torch is imported).
Writes {"case", "status": "ok"|"skip"|"error", "results", "error", "seconds"}.
Exit status 0 for ok and skip, 1 for an error (the traceback is in "error").
"""

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases  # noqa: E402


def encode(v):
    if isinstance(v, cases.Approx):
        return v.to_json()
    if isinstance(v, dict):
        return {k: encode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    return v


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in cases.CASES:
        sys.stderr.write("usage: run_case.py CASE OUT.json; cases: %s\n" % " ".join(sorted(cases.CASES)))
        return 2
    name, out_path = sys.argv[1], sys.argv[2]
    os.environ.update(cases.CASE_ENV.get(name, {}))
    t0 = time.time()
    doc = {"case": name, "status": "ok", "results": {}, "error": ""}
    try:
        doc["results"] = encode(cases.CASES[name]())
    except cases.Skip as e:
        doc["status"], doc["error"] = "skip", str(e)
    except BaseException:  # noqa: B036 - the report must say what went wrong
        doc["status"], doc["error"] = "error", traceback.format_exc()
    doc["seconds"] = round(time.time() - t0, 2)
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    return 1 if doc["status"] == "error" else 0


if __name__ == "__main__":
    sys.exit(main())
