#!/usr/bin/env python3
# Build-time generator of the client library's driver-API symbol table.
#
# Owns: reading NVIDIA's typedef headers (cudaTypedefs.h, ...) and API headers (cuda.h, ...)
# and writing, into the build directory, driver_api_table.inc (X-macro list of every
# (base name, ABI version, per-thread flag) -> exported symbol), driver_stubs.cc (a weak
# "not supported" stub per symbol) and driver_api_pointers.cc (the sorted lookup table
# behind cuGetProcAddress). Must not touch anything outside --out-dir, must not need
# anything beyond the Python standard library, and must not emit a symbol that the API
# headers do not declare as `CUresult CUDAAPI <symbol>(` (it fails the build instead).
#
# Naming rule (checked against the headers on every run):
#   * PFN_<base>_v<ver> typedefs list the ABI versions of <base>; the k-th one (sorted by
#     version) is exported as <base> for k = 1 and as <base>_v<k> otherwise.
#   * PFN_<base>_v<ver>_ptds / _ptsz list the per-thread-default-stream variants; such a
#     variant is the default-stream symbol in force at <ver> plus "_ptds" / "_ptsz"
#     (e.g. cuMemcpyHtoD ptds@7000 -> cuMemcpyHtoD_v2 + _ptds).
#   * The headers' `#define <base> <symbol>` / `__CUDA_API_PTDS(...)` / `__CUDA_API_PTSZ(...)`
#     macros name the newest ABI; where they disagree with the rule the rule wins and the
#     difference is listed in the report (cuGraphInstantiate is #defined to
#     cuGraphInstantiateWithFlags, a different entry point; the driver keeps resolving
#     "cuGraphInstantiate" to cuGraphInstantiate_v2).
#
# Usage:
#   gen_driver_api.py --out-dir DIR --api cudaTypedefs.h cuda.h [--api T.h H.h ...]
#                     [--report FILE] [--verbose]
#   gen_driver_api.py --out-dir DIR --check-exports libcuda.so.1 [--nm nm]
#     (after linking: fails unless every table symbol is exported)
#   --trace API_I PUBLIC_I CBID_H META_H: also writes gen_driver_trace.py's wrappers of the
#     symbols that API_I (cuda.h and cudaProfiler.h preprocessed with
#     __CUDA_API_VERSION_INTERNAL; PUBLIC_I: without it) declares; their stubs are then the hidden weak flyt_impl_<symbol>, an alias of
#     flyt_stub_<symbol> (gen_entry_point_list.py tells a refused one by that alias).

import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_driver_trace  # noqa: E402  the traced wrappers (--trace)

# Macros considered defined when reading the headers the way libcuda itself is compiled.
# __CUDA_API_VERSION_INTERNAL exposes the legacy ABIs (PFN_..._v2000 typedefs and the
# declarations of cuMemAlloc, cuMemcpyHtoD, ... with their original signatures).
INTERNAL_DEFINES = {"__CUDA_API_VERSION_INTERNAL": "1", "__LP64__": "1", "__GNUC__": "12",
                    "__linux__": "1", "__x86_64__": "1"}
# Public configurations: an ordinary user, and one built with --default-stream per-thread.
PUBLIC_DEFINES = {"__LP64__": "1", "__GNUC__": "12", "__linux__": "1", "__x86_64__": "1"}
PUBLIC_PTDS_DEFINES = dict(PUBLIC_DEFINES, CUDA_API_PER_THREAD_DEFAULT_STREAM="1")

# Typedefs that name no real entry point. Each was checked against driver 580.159.04 (CUDA
# 13.0): neither exported by libcuda.so.1 nor resolvable through cuGetProcAddress.
EXCLUDED = {
    "cuEventCreateFromEGLSync": "declared in cudaEGL.h, but the Linux driver neither exports "
                                "nor resolves it",
}

PFN_RE = re.compile(r"\btypedef\s+CUresult\s*\(\s*CUDAAPI\s*\*\s*PFN_([A-Za-z0-9_]+?)_v(\d+)"
                    r"(?:_(ptds|ptsz))?\s*\)")
DECL_RE = re.compile(r"\bCUresult\s+CUDAAPI\s+([A-Za-z_][A-Za-z0-9_]*)\s*(?:\(|$)")
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class GenError(Exception):
    pass


def strip_comments(text):
    """Removes /* */ and // comments, keeping line breaks so line numbers stay right."""
    out = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "*":
            end = text.find("*/", i + 2)
            if end < 0:
                end = n - 2
            out.append("\n" * text.count("\n", i, end + 2))
            i = end + 2
        elif c == "/" and i + 1 < n and text[i + 1] == "/":
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c == '"':
            end = i + 1
            while end < n and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(text[i:end + 1])
            i = end + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def logical_lines(text):
    """Joins backslash-continued lines; yields (line_number, line)."""
    lines = strip_comments(text).split("\n")
    i = 0
    while i < len(lines):
        start = i
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i]
        yield start + 1, line
        i += 1


class MiniPreprocessor:
    """Just enough of the C preprocessor for NVIDIA's API headers: conditionals over
    defined()/!/&&/||/comparisons, object-like and one-parameter function-like macros
    (with ##), #undef. #include is ignored: each header is read on its own."""

    def __init__(self, defines):
        self.objects = dict(defines)  # name -> replacement text
        self.functions = {}  # name -> (param, body)

    def _eval_condition(self, expr, where):
        tokens = re.findall(r"defined\s*\(\s*\w+\s*\)|defined\s+\w+|\d+[uUlL]*|\w+|&&|\|\||"
                            r"[!<>=]=|[()<>!]", expr)
        py = []
        for tok in tokens:
            if tok.startswith("defined"):
                name = re.sub(r"defined\s*\(?\s*(\w+)\s*\)?", r"\1", tok)
                py.append("True" if (name in self.objects or name in self.functions)
                          else "False")
            elif tok == "&&":
                py.append(" and ")
            elif tok == "||":
                py.append(" or ")
            elif tok == "!":
                py.append(" not ")
            elif re.fullmatch(r"\d+[uUlL]*", tok):
                py.append(tok.rstrip("uUlL"))
            elif IDENT_RE.fullmatch(tok):
                value = self.objects.get(tok, "0").strip() or "0"
                if not re.fullmatch(r"\d+[uUlL]*", value):
                    value = "0"
                py.append(value.rstrip("uUlL"))
            else:
                py.append(tok)
        try:
            return bool(eval("".join(py), {"__builtins__": {}}, {}))  # noqa: S307 own tokens
        except Exception as exc:  # pragma: no cover - malformed header
            raise GenError(f"{where}: cannot evaluate #if {expr!r}: {exc}")

    def expand(self, name, disabled=frozenset()):
        """Fully expands identifier `name` (C rules: a macro is not re-expanded inside its
        own expansion). Returns the resulting identifier, or None if the result is not a
        single identifier."""
        if name in disabled:
            return name
        if name in self.objects:
            body = self.objects[name].strip()
            return self._expand_text(body, disabled | {name})
        return name

    def _expand_text(self, text, disabled):
        m = re.fullmatch(r"(\w+)\s*\(\s*(\w+)\s*\)", text)
        if m and m.group(1) in self.functions and m.group(1) not in disabled:
            param, body = self.functions[m.group(1)]
            arg = m.group(2)
            # Arguments next to ## are not macro-expanded; others are.
            pasted = re.search(r"##\s*" + re.escape(param) + r"\b|\b" + re.escape(param) +
                               r"\s*##", body)
            if not pasted:
                arg = self.expand(arg, disabled) or arg
            result = re.sub(r"\b" + re.escape(param) + r"\b", arg, body)
            result = re.sub(r"\s*##\s*", "", result).strip()
            return self._expand_text(result, disabled | {m.group(1)})
        if IDENT_RE.fullmatch(text):
            return self.expand(text, disabled)
        return None

    def run(self, path, on_line):
        """Feeds every active logical line (directives excluded) to on_line(lineno, line)."""
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        stack = []  # (this_branch_active, some_branch_taken, parent_active)
        active = True
        for lineno, line in logical_lines(text):
            where = f"{path}:{lineno}"
            m = re.match(r"\s*#\s*(\w+)\s*(.*)$", line)
            if not m:
                if active:
                    on_line(lineno, line)
                continue
            directive, rest = m.group(1), m.group(2).strip()
            if directive in ("if", "ifdef", "ifndef"):
                if directive == "ifdef":
                    cond = rest.split()[0] in self.objects or rest.split()[0] in self.functions
                elif directive == "ifndef":
                    cond = not (rest.split()[0] in self.objects or
                                rest.split()[0] in self.functions)
                else:
                    cond = self._eval_condition(rest, where) if active else False
                stack.append([active and cond, cond, active])
                active = active and cond
            elif directive == "elif":
                if not stack:
                    raise GenError(f"{where}: #elif without #if")
                top = stack[-1]
                cond = (not top[1]) and top[2] and self._eval_condition(rest, where)
                top[0] = cond
                top[1] = top[1] or cond
                active = cond
            elif directive == "else":
                if not stack:
                    raise GenError(f"{where}: #else without #if")
                top = stack[-1]
                top[0] = top[2] and not top[1]
                top[1] = True
                active = top[0]
            elif directive == "endif":
                if not stack:
                    raise GenError(f"{where}: #endif without #if")
                active = stack.pop()[2]
            elif not active:
                continue
            elif directive == "define":
                fm = re.match(r"(\w+)\(\s*(\w+)\s*\)\s*(.*)$", rest)
                if fm:
                    self.functions[fm.group(1)] = (fm.group(2), fm.group(3))
                    self.objects.pop(fm.group(1), None)
                else:
                    om = re.match(r"(\w+)\s*(.*)$", rest)
                    if om:
                        self.objects[om.group(1)] = om.group(2)
                        self.functions.pop(om.group(1), None)
            elif directive == "undef":
                name = rest.split()[0]
                self.objects.pop(name, None)
                self.functions.pop(name, None)
        if stack:
            raise GenError(f"{path}: unterminated #if")


def read_typedefs(path):
    """Returns {base: {"default": set(versions), "ptds": set(), "ptsz": set()}} from the
    PFN typedefs that libcuda's own build sees (legacy ABIs included, Windows-only out)."""
    apis = {}
    pp = MiniPreprocessor(INTERNAL_DEFINES)

    def on_line(lineno, line):
        for m in PFN_RE.finditer(line):
            base, version, kind = m.group(1), int(m.group(2)), m.group(3) or "default"
            entry = apis.setdefault(base, {"default": set(), "ptds": set(), "ptsz": set()})
            entry[kind].add(version)

    pp.run(path, on_line)
    if not apis:
        raise GenError(f"{path}: no PFN_<name>_v<version> typedefs found")
    return apis


def read_declarations(path):
    """Returns (declared, macros): every function name that one of the three header
    configurations declares as `CUresult CUDAAPI <name>(` after macro expansion, and for
    each #define of a bare API name, its expansion without and with per-thread default
    stream: {base: (legacy_symbol, per_thread_symbol)}."""
    declared = set()
    configs = [("internal", INTERNAL_DEFINES), ("public", PUBLIC_DEFINES),
               ("public-ptds", PUBLIC_PTDS_DEFINES)]
    final = {}
    for label, defines in configs:
        pp = MiniPreprocessor(defines)

        pending = [False]  # the previous line ended in "CUresult CUDAAPI"

        def on_line(lineno, line, pp=pp, pending=pending):
            if pending[0] and line.strip():
                pending[0] = False
                m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(", line)
                if m:
                    declared.add(pp.expand(m.group(1)) or m.group(1))
            for m in DECL_RE.finditer(line):
                name = pp.expand(m.group(1))
                if name:
                    declared.add(name)
            if re.search(r"\bCUresult\s+CUDAAPI\s*$", line):
                pending[0] = True

        pp.run(path, on_line)
        final[label] = pp
    macros = {}
    public, ptds = final["public"], final["public-ptds"]
    for name in set(public.objects) | set(ptds.objects):
        if not name.startswith("cu"):
            continue
        legacy = public.expand(name) if name in public.objects else None
        per_thread = ptds.expand(name) if name in ptds.objects else None
        if (legacy and legacy != name) or (per_thread and per_thread != name):
            macros[name] = (legacy, per_thread)
    return declared, macros


def build_table(apis, declared, macros, notes):
    """Returns sorted [(base, version, per_thread, symbol)]. Raises GenError when a symbol
    the rule produces is not declared by the headers."""
    entries = []
    undeclared = []
    for base in sorted(apis):
        if base in EXCLUDED:
            notes.append(f"{base}: left out ({EXCLUDED[base]})")
            continue
        info = apis[base]
        defaults = sorted(info["default"])
        default_symbol = {}
        for k, version in enumerate(defaults, start=1):
            symbol = base if k == 1 else f"{base}_v{k}"
            default_symbol[version] = symbol
            entries.append((base, version, 0, symbol))
        for kind in ("ptds", "ptsz"):
            for version in sorted(info[kind]):
                in_force = [v for v in defaults if v <= version]
                if not in_force:
                    raise GenError(f"{base}: {kind} ABI @{version} has no default-stream ABI at "
                                   f"or before it; the naming rule does not cover it")
                entries.append((base, version, 1,
                                f"{default_symbol[in_force[-1]]}_{kind}"))
        if info["ptds"] and info["ptsz"]:
            notes.append(f"{base}: has both _ptds and _ptsz typedefs")
        # Cross-check with the header's "#define <base> <newest symbol>" macro.
        if base in macros:
            legacy, per_thread = macros[base]
            newest = default_symbol[defaults[-1]] if defaults else None
            if legacy and legacy != newest:
                notes.append(f"{base}: cuda.h #defines it to {legacy}, the naming rule gives "
                             f"{newest} @{defaults[-1]}; kept the rule ({legacy} is a "
                             f"separate entry point)")
            pt_entries = [e for e in entries if e[0] == base and e[2] == 1]
            if per_thread and per_thread != legacy:
                newest_pt = pt_entries[-1][3] if pt_entries else None
                if per_thread not in declared:
                    notes.append(f"{base}: per-thread builds #define it to {per_thread}, a "
                                 f"header-only inline wrapper, not an exported ABI; ignored")
                elif per_thread != newest_pt:
                    older = any(e[3] == per_thread for e in pt_entries)
                    notes.append(f"{base}: per-thread builds #define it to {per_thread}, the "
                                 f"newest per-thread ABI is {newest_pt}; kept the rule" +
                                 (f" ({per_thread} is the older per-thread ABI, as the "
                                  f"unsuffixed public name stays on ABI 1)" if older else ""))
    for base, version, per_thread, symbol in entries:
        if symbol not in declared:
            undeclared.append(f"{base}@{version}{' (per-thread)' if per_thread else ''} -> "
                              f"{symbol}")
    if undeclared:
        raise GenError("symbols produced by the naming rule but not declared as "
                       "`CUresult CUDAAPI <symbol>(` in the API headers:\n  " +
                       "\n  ".join(undeclared))
    symbols = [e[3] for e in entries]
    dups = sorted({s for s in symbols if symbols.count(s) > 1})
    if dups:
        raise GenError("one symbol maps to several (name, version, per-thread) entries: " +
                       ", ".join(dups))
    # Sorted by byte-wise base name (what strcmp sees), then per-thread flag, then version.
    entries.sort(key=lambda e: (e[0].encode(), e[2], e[1]))
    return entries


def write_file(path, text):
    """Always rewrites (the build tool compares output and input times), atomically."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


GENERATED = "// Generated by src/client/gen_driver_api.py from {sources}. Do not edit.\n"


def emit_table_inc(entries, sources):
    lines = [GENERATED.format(sources=sources),
             "// One line per (base name, ABI version, per-thread flag) -> exported symbol, sorted",
             "// by base name (bytewise), per-thread flag, version. Define",
             "// FLYT_DRIVER_API(base, version, per_thread, symbol) before including.",
             f"// {len(entries)} entries, {len({e[0] for e in entries})} base names.",
             "#ifndef FLYT_DRIVER_API",
             "#error \"define FLYT_DRIVER_API(base, version, per_thread, symbol) first\"",
             "#endif"]
    for base, version, per_thread, symbol in entries:
        lines.append(f"FLYT_DRIVER_API({base}, {version}, {per_thread}, {symbol})")
    return "\n".join(lines) + "\n"


def emit_stubs(entries, sources, traced=()):
    symbols = sorted({e[3] for e in entries})
    lines = [GENERATED.format(sources=sources),
             "// Weak default-visible stubs: one per exported driver symbol. A real implementation",
             "// (a strong definition elsewhere in the library) replaces its stub at link time.",
             "// This file must not include cuda.h: the stubs' signature is deliberately int(void).",
             "",
             "#define FLYT_PROC_ADDRESS_TABLE_ONLY  // no cuda.h here",
             "#include \"client/proc_address.h\"",
             "",
             "#define FLYT_STUB(sym)                                                      \\",
             "  extern \"C\" __attribute__((weak, visibility(\"default\"))) int sym(void) { \\",
             "    return ::flyt::client::ReportUnsupported(#sym);                        \\",
             "  }",
             "// A traced symbol's stub is its implementation (gen_driver_trace.py): hidden and",
             "// weak, an alias of flyt_stub_<sym>, which only a stub that won the link shares.",
             "#define FLYT_IMPL_STUB(sym)                                                       \\",
             "  extern \"C\" __attribute__((visibility(\"hidden\"))) int flyt_stub_##sym(void) {     \\",
             "    return ::flyt::client::ReportUnsupported(#sym);                              \\",
             "  }                                                                              \\",
             "  extern \"C\" __attribute__((weak, visibility(\"hidden\"), alias(\"flyt_stub_\" #sym))) \\",
             "  int flyt_impl_##sym(void);",
             ""]
    for symbol in symbols:
        lines.append(f"FLYT_IMPL_STUB({symbol})" if symbol in traced else f"FLYT_STUB({symbol})")
    lines += ["", "#undef FLYT_STUB", "#undef FLYT_IMPL_STUB"]
    return "\n".join(lines) + "\n"


def emit_pointers(entries, sources):
    symbols = sorted({e[3] for e in entries})
    lines = [GENERATED.format(sources=sources),
             "// The lookup table behind cuGetProcAddress: every (base name, ABI version,",
             "// per-thread) entry with its exported symbol's address, sorted by base name",
             "// (strcmp order), then per_thread, then version. Must not include cuda.h.",
             "",
             "#include <cstddef>",
             "",
             "#define FLYT_PROC_ADDRESS_TABLE_ONLY  // no cuda.h here",
             "#include \"client/proc_address.h\"",
             "",
             "extern \"C\" {"]
    for symbol in symbols:
        lines.append(f"int {symbol}(void);")
    lines += ["}  // extern \"C\"", "",
              "namespace flyt::client {", "",
              "extern const DriverProcEntry kDriverProcTable[] = {"]
    for base, version, per_thread, symbol in entries:
        lines.append(f"    {{\"{base}\", {version}, {per_thread}, \"{symbol}\", "
                     f"reinterpret_cast<void*>(&{symbol})}},")
    lines += ["};", "",
              "extern const std::size_t kDriverProcTableSize = "
              "sizeof(kDriverProcTable) / sizeof(kDriverProcTable[0]);",
              "", "}  // namespace flyt::client"]
    return "\n".join(lines) + "\n"


def check_exports(library, table_inc, nm):
    """Fails unless `library` exports (defined, dynamic) every symbol of the table: catches a
    real entry point compiled hidden, which takes its stub's export with it."""
    wanted = set()
    with open(table_inc, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"FLYT_DRIVER_API\(\w+, \d+, [01], (\w+)\)", line)
            if m:
                wanted.add(m.group(1))
    if not wanted:
        raise GenError(f"{table_inc}: no entries")
    out = subprocess.run([nm, "-D", "--defined-only", library], check=True,
                         capture_output=True, text=True).stdout
    exported = {parts[-1] for parts in (l.split() for l in out.splitlines()) if parts}
    missing = sorted(wanted - exported)
    if missing:
        raise GenError(f"{library} does not export {len(missing)} driver entry points (a real "
                       f"implementation compiled with hidden visibility?): " + " ".join(missing))
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--api", nargs=2, action="append",
                        metavar=("TYPEDEFS_H", "API_H"),
                        help="a typedef header and the API header it describes")
    parser.add_argument("--report", help="write counts and rule exceptions here")
    parser.add_argument("--verbose", action="store_true", help="print the report to stderr")
    parser.add_argument("--check-exports", metavar="LIBRARY",
                        help="instead of generating, check that LIBRARY exports every symbol "
                             "of OUT_DIR/driver_api_table.inc")
    parser.add_argument("--nm", default="nm", help="nm to use with --check-exports")
    parser.add_argument("--trace", nargs=4, metavar=("API_I", "PUBLIC_I", "CBID_H", "META_H"),
                        help="also write the traced wrappers (gen_driver_trace.py)")
    args = parser.parse_args(argv)
    if args.check_exports:
        return check_exports(args.check_exports,
                             os.path.join(args.out_dir, "driver_api_table.inc"), args.nm)
    if not args.api:
        parser.error("--api is required")

    all_entries = []
    notes = []
    sources = []
    for typedefs_h, api_h in args.api:
        apis = read_typedefs(typedefs_h)
        declared, macros = read_declarations(api_h)
        entries = build_table(apis, declared, macros, notes)
        all_entries.extend(entries)
        sources += [os.path.basename(typedefs_h), os.path.basename(api_h)]
    bases = [e[0] for e in all_entries]
    seen = set()
    for base, version, per_thread, _ in all_entries:
        if (base, version, per_thread) in seen:
            raise GenError(f"{base}@{version} per_thread={per_thread} defined twice")
        seen.add((base, version, per_thread))
    all_entries.sort(key=lambda e: (e[0].encode(), e[2], e[1]))
    source_list = ", ".join(sources)

    os.makedirs(args.out_dir, exist_ok=True)
    traced = {}
    if args.trace:
        traced = gen_driver_trace.generate(args.out_dir, {e[3] for e in all_entries},
                                           *args.trace)
    write_file(os.path.join(args.out_dir, "driver_api_table.inc"),
                     emit_table_inc(all_entries, source_list))
    write_file(os.path.join(args.out_dir, "driver_stubs.cc"),
                     emit_stubs(all_entries, source_list, traced))
    write_file(os.path.join(args.out_dir, "driver_api_pointers.cc"),
                     emit_pointers(all_entries, source_list))

    report = [f"sources: {source_list}",
              f"base names: {len(set(bases))}",
              f"entries: {len(all_entries)} "
              f"({sum(1 for e in all_entries if e[2] == 0)} default-stream, "
              f"{sum(1 for e in all_entries if e[2] == 1)} per-thread)",
              f"symbols: {len({e[3] for e in all_entries})}",
              f"traced (CUPTI driver API domain): {len(traced)}",
              "rule exceptions and notes:"] + [f"  {n}" for n in notes]
    if args.report:
        write_file(args.report, "\n".join(report) + "\n")
    if args.verbose:
        print("\n".join(report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (GenError, gen_driver_trace.TraceError, OSError, subprocess.CalledProcessError) as exc:
        print(f"gen_driver_api.py: error: {exc}", file=sys.stderr)
        sys.exit(1)
