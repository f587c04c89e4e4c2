#!/usr/bin/env python3
"""Tests of check_entry_points_doc.py on a small made-up list and document (ctest
entry_points_doc_selftest): each way the document can be wrong is reported by name, and
--update rewrites what the build decides while keeping the reasons.
Owns: nothing but these tests. Standard library only.
"""

import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_entry_points_doc as doc_check  # noqa: E402

LIST = """# library\theader\tsymbol\tstatus
libcuda.so.1\tcuda.h\tcuMemAlloc_v2\tserved
libcuda.so.1\tcuda.h\tcuMemAlloc\trefused
libcuda.so.1\tcuda.h\tcuMemAllocManaged\trefused
libcuda.so.1\tcuda.h\tcuMemAdvise\trefused
libcuda.so.1\tcudaGL.h\tcuGLInit\trefused
libnvidia-ml.so.1\tnvml\tnvmlInit_v2\tserved
libnvidia-ml.so.1\tnvml\tnvmlUnitGetCount\trefused
libcupti.so.13\tcupti\tcuptiActivityEnable\tserved
libcupti.so.13\tcupti\tcuptiEventGroupCreate\trefused
"""

COUNTS = [
    "| library and headers | entry points | served | refused |",
    "|---|---|---|---|",
    "| driver API (`libcuda.so.1`), all | 5 | 1 | 4 |",
    "| &nbsp;&nbsp;cuda.h, cudaProfiler.h | 4 | 1 | 3 |",
    "| &nbsp;&nbsp;cudaGL.h, cudaEGL.h, cudaVDPAU.h (graphics interop) | 1 | 0 | 1 |",
    "| NVML (`libnvidia-ml.so.1`) | 2 | 1 | 1 |",
    "| CUPTI (`libcupti.so.13`, preloaded by `flyt run`) | 2 | 1 | 1 |",
]


def document(rows, counts=None):
    return "\n".join(["# Title", "", "## Entry points", "", doc_check.COUNTS_BEGIN] +
                     (COUNTS if counts is None else counts) +
                     [doc_check.COUNTS_END, "", "### Driver", "", doc_check.REASON_HEADER,
                      "|---|---|---|"] + rows + ["", "## Next section", "text", ""])


GOOD_ROWS = [
    "| `cuMemAlloc` | 1 | ABI before 3.2 |",
    "| `cuMemAllocManaged`, `cuMemAdvise*` | 2 | managed memory |",
    "| `cuGL*` | 1 | graphics |",
    "| `nvmlUnit*` | 1 | S-class units |",
    "| `cuptiEvent*` | 1 | legacy event API |",
]


class CheckTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.list = os.path.join(self.dir.name, "entry_points.tsv")
        self.doc = os.path.join(self.dir.name, "doc.md")
        with open(self.list, "w", encoding="utf-8") as f:
            f.write(LIST)

    def tearDown(self):
        self.dir.cleanup()

    def run_check(self, text, *flags):
        with open(self.doc, "w", encoding="utf-8") as f:
            f.write(text)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = doc_check.main(["--list", self.list, "--doc", self.doc, *flags])
        with open(self.doc, encoding="utf-8") as f:
            return rc, err.getvalue(), f.read()

    def test_true_document_passes(self):
        rc, err, _ = self.run_check(document(GOOD_ROWS))
        self.assertEqual(rc, 0, err)

    def test_refused_without_reason_is_named(self):
        rc, err, _ = self.run_check(document([r for r in GOOD_ROWS if "cuGL" not in r]))
        self.assertEqual(rc, 1)
        self.assertIn("without a documented reason: cuGLInit", err)

    def test_two_reasons_for_one_name(self):
        rc, err, _ = self.run_check(document(GOOD_ROWS + ["| `cuGLIn*` | 1 | again |"]))
        self.assertEqual(rc, 1)
        self.assertIn("covered by more than one reason: cuGLInit", err)

    def test_name_that_covers_nothing_is_named(self):
        rows = GOOD_ROWS[:1] + ["| `cuMemAlloc_v2` | 1 | served now |"] + GOOD_ROWS[1:]
        rc, err, _ = self.run_check(document(rows))
        self.assertEqual(rc, 1)
        self.assertIn("`cuMemAlloc_v2` covers no refused entry point (served now)", err)

    def test_wrong_counts_are_reported(self):
        rows = ["| `cuMemAlloc` | 2 | ABI before 3.2 |"] + GOOD_ROWS[1:]
        counts = COUNTS[:2] + ["| driver API (`libcuda.so.1`), all | 5 | 2 | 3 |"] + COUNTS[3:]
        rc, err, _ = self.run_check(document(rows, counts))
        self.assertEqual(rc, 1)
        self.assertIn("count says 2, the row covers 1", err)
        self.assertIn("the counts table is no longer true", err)

    def test_update_keeps_reasons_and_parks_new_names(self):
        rows = ["| `cuMemAlloc`, `cuMemAlloc_v2` | 7 | ABI before 3.2 |",
                "| `cuMulticast*` | 3 | gone |"] + GOOD_ROWS[1:3] + GOOD_ROWS[4:]
        rc, err, text = self.run_check(document(rows, counts=[]), "--update")
        self.assertEqual(rc, 1)  # nvmlUnitGetCount has no reason yet
        self.assertIn("| `cuMemAlloc` | 1 | ABI before 3.2 |", text)
        self.assertNotIn("cuMulticast", text)
        self.assertIn("| `nvmlUnitGetCount` | 1 | " + doc_check.NO_REASON + " |", text)
        self.assertIn("\n".join(COUNTS), text)
        self.assertIn("still marked 'no reason yet'", err)
        self.assertTrue(text.index("nvmlUnitGetCount") < text.index("## Next section"))
        # Writing the reason makes it pass.
        rc, err, _ = self.run_check(text.replace(doc_check.NO_REASON, "S-class units"))
        self.assertEqual(rc, 0, err)


if __name__ == "__main__":
    unittest.main()
