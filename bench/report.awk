# Renders bench.md from the files bench/run.sh writes (POSIX awk; mawk works):
#   awk -F'\t' -f report.awk meta.tsv results.tsv runs.tsv notes.txt
# meta.tsv: key, value.  results.tsv: mode, group, name, value, unit.
# runs.tsv: mode, group, rc, wall seconds.  notes.txt: free text, one note a line.
# Modes: native, tcp, unix (cuda_bench), ref (tcp_loopback_bw), server (RSS probes).

function has(k) { return (k in V) && V[k] != "" }
function num(k) { return V[k] + 0 }
function fmt(v, a) {
  a = v < 0 ? -v : v
  if (a >= 100) return sprintf("%.0f", v)
  if (a >= 10) return sprintf("%.1f", v)
  if (a >= 1) return sprintf("%.2f", v)
  return sprintf("%.3f", v)
}
function signed(v) { return (v >= 0 ? "+" : "") fmt(v) }
function cell(k) { return has(k) ? fmt(num(k)) : "n/a" }
# Ratio column: rate metrics give flyt/native rate (>1 better); time metrics give
# flyt/native time (<1 better).
function ratio(kind, m, mode, n, f) {
  if (!has("native" SUBSEP m) || !has(mode SUBSEP m)) return "n/a"
  n = num("native" SUBSEP m)
  f = num(mode SUBSEP m)
  if (kind == "thr_us") { if (f <= 0) return "n/a"; return sprintf("%.2f×", n / f) }
  if (n <= 0) return "n/a"
  return sprintf("%.2f×", f / n)
}
function delta(kind, m, mode, u) {
  if (kind == "bw") return "—"
  if (!has("native" SUBSEP m) || !has(mode SUBSEP m)) return "n/a"
  u = (kind == "lat_ms") ? " ms" : " µs"
  return signed(num(mode SUBSEP m) - num("native" SUBSEP m)) u
}
function verdict(ok) { return ok ? "**PASS**" : "**MISS**" }
function rss_kb(mode, g) {
  if (has(mode SUBSEP g SUBSEP "rss_time_kb")) return num(mode SUBSEP g SUBSEP "rss_time_kb")
  if (has(mode SUBSEP g SUBSEP "peak_rss_kb")) return num(mode SUBSEP g SUBSEP "peak_rss_kb")
  return -1
}
function mib(kb) { return kb < 0 ? "n/a" : sprintf("%.1f", kb / 1024) }

BEGIN {
  nm = 0
  # name, label, kind (thr_us: µs per op of a throughput test; lat_us/lat_ms: latency; bw: GB/s)
  M[++nm] = "launch_async_us|async empty launch, µs/launch (100k launches + 1 sync)|thr_us"
  M[++nm] = "launch_issue_us|async empty launch, CPU issue cost, µs/launch|thr_us"
  M[++nm] = "launch_sync_us|launch + synchronize, median µs|lat_us"
  M[++nm] = "launch_sync_p99_us|launch + synchronize, p99 µs|lat_us"
  M[++nm] = "memcpy_h2d_4b_us|4-byte cudaMemcpy H2D, median µs|lat_us"
  M[++nm] = "memcpy_d2h_4b_us|4-byte cudaMemcpy D2H, median µs|lat_us"
  M[++nm] = "h2d_pageable_gbps|256 MiB H2D pageable, best GB/s|bw"
  M[++nm] = "d2h_pageable_gbps|256 MiB D2H pageable, best GB/s|bw"
  M[++nm] = "h2d_pinned_gbps|256 MiB H2D pinned, best GB/s|bw"
  M[++nm] = "d2h_pinned_gbps|256 MiB D2H pinned, best GB/s|bw"
  # cuda_bench group bwasync: cudaMemcpyAsync of pinned memory.
  M[++nm] = "h2d_pinned_async_call_us|256 MiB H2D pinned cudaMemcpyAsync, µs until it returns|lat_us"
  M[++nm] = "d2h_pinned_async_call_us|256 MiB D2H pinned cudaMemcpyAsync, µs until it returns|lat_us"
  M[++nm] = "h2d_pinned_async_gbps|256 MiB H2D pinned async + stream sync, best GB/s|bw"
  M[++nm] = "d2h_pinned_async_gbps|256 MiB D2H pinned async + stream sync, best GB/s|bw"
  M[++nm] = "h2d_pinned_async_hidden_pct|H2D pinned async: % of the copy hidden behind host work|bw"
  M[++nm] = "d2h_pinned_async_hidden_pct|D2H pinned async: % of the copy hidden behind host work|bw"
  M[++nm] = "malloc_free_1m_us|cudaMalloc+cudaFree 1 MiB, median µs|lat_us"
  M[++nm] = "get_device_properties_us|cudaGetDeviceProperties, µs/call|lat_us"
  M[++nm] = "device_get_attribute_us|cudaDeviceGetAttribute, µs/call|lat_us"
  M[++nm] = "init_ms|process start → context ready (cudaFree(0)), ms|lat_ms"
  M[++nm] = "first_launch_sync_ms|first launch + sync (module load), ms|lat_ms"
  nmeta = 0; nruns = 0; nnotes = 0; ngroups = 0
}

FILENAME ~ /meta\.tsv$/ { MK[++nmeta] = $1; MV[nmeta] = $2; next }
FILENAME ~ /results\.tsv$/ {
  if (NF < 4) next
  V[$1 SUBSEP $3] = $4                # last value of a name per mode
  V[$1 SUBSEP $2 SUBSEP $3] = $4      # per mode and group
  if ($1 == "native" || $1 == "tcp" || $1 == "unix") {
    if (!($2 in GSEEN)) { GSEEN[$2] = 1; G[++ngroups] = $2 }
  }
  if ($1 != "server") RAWL[++nraw] = $1 "/" $2 "  " $3 " = " $4 " " $5
  next
}
FILENAME ~ /runs\.tsv$/ { R[++nruns] = $0; next }
FILENAME ~ /notes\.txt$/ { if ($0 != "") NOTE[++nnotes] = $0; next }

END {
  print "# Flyt benchmark: native vs flyt (TCP loopback, Unix socket)"
  print ""
  for (i = 1; i <= nmeta; i++) printf "- %s: %s\n", MK[i], MV[i]
  print ""

  print "## Results"
  print ""
  print "Ratio columns: for rate metrics (GB/s, and launch throughput given as µs/launch) the"
  print "ratio is flyt rate / native rate, so > 1 is better; for latency metrics it is flyt time /"
  print "native time, so < 1 is better, and Δ gives the difference."
  print ""
  print "| metric | native | tcp | unix | tcp vs native | unix vs native | Δ tcp | Δ unix |"
  print "|---|---:|---:|---:|---:|---:|---:|---:|"
  for (i = 1; i <= nm; i++) {
    split(M[i], f, "|")
    m = f[1]; kind = f[3]
    printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", f[2], cell("native" SUBSEP m),
      cell("tcp" SUBSEP m), cell("unix" SUBSEP m), ratio(kind, m, "tcp"),
      ratio(kind, m, "unix"), delta(kind, m, "tcp"), delta(kind, m, "unix")
  }
  print ""

  print "## Targets"
  print ""
  print "| target | transport | measured | bound | result |"
  print "|---|---|---|---|---|"
  m = "launch_async_us"
  for (t = 1; t <= 2; t++) {
    mode = t == 1 ? "tcp" : "unix"
    if (has("native" SUBSEP m) && has(mode SUBSEP m) && num(mode SUBSEP m) > 0) {
      r = num("native" SUBSEP m) / num(mode SUBSEP m)
      printf "| async launch throughput ≥ 0.8× native | %s | %.2f× (%s vs %s µs/launch) | ≥ 0.80× | %s |\n",
        mode, r, fmt(num(mode SUBSEP m)), fmt(num("native" SUBSEP m)), verdict(r >= 0.8)
    } else printf "| async launch throughput ≥ 0.8× native | %s | n/a | ≥ 0.80× | n/a |\n", mode
  }
  m = "device_get_attribute_us"
  for (t = 1; t <= 2; t++) {
    mode = t == 1 ? "tcp" : "unix"
    if (has(mode SUBSEP m))
      printf "| device queries (cudaDeviceGetAttribute) ≤ 0.2 µs | %s | %s µs (native %s) | ≤ 0.2 µs | %s |\n",
        mode, fmt(num(mode SUBSEP m)), cell("native" SUBSEP m), verdict(num(mode SUBSEP m) <= 0.2)
    else printf "| device queries (cudaDeviceGetAttribute) ≤ 0.2 µs | %s | n/a | ≤ 0.2 µs | n/a |\n", mode
  }
  m = "launch_sync_us"
  for (t = 1; t <= 2; t++) {
    mode = t == 1 ? "tcp" : "unix"
    label = t == 1 ? "launch+sync ≤ native + 30 µs" : "launch+sync ≤ native + 30 µs (same bound, info)"
    if (has("native" SUBSEP m) && has(mode SUBSEP m)) {
      n = num("native" SUBSEP m); v = num(mode SUBSEP m)
      printf "| %s | %s | %s µs (native %s, %s) | ≤ %s µs | %s |\n", label, mode, fmt(v), fmt(n),
        signed(v - n), fmt(n + 30), verdict(v <= n + 30)
    } else printf "| %s | %s | n/a | native + 30 µs | n/a |\n", label, mode
  }
  for (t = 1; t <= 2; t++) {
    mode = t == 1 ? "tcp" : "unix"
    refm = t == 1 ? "tcp_loopback_gbps" : "unix_socket_gbps"
    refl = t == 1 ? "loopback TCP" : "Unix socket"
    for (c = 1; c <= 4; c++) {
      m = c == 1 ? "h2d_pageable_gbps" : c == 2 ? "d2h_pageable_gbps" : c == 3 ? "h2d_pinned_gbps" : "d2h_pinned_gbps"
      split(m, p, "_")
      label = "256 MiB " toupper(p[1]) " " p[2] " ≥ 0.8× " refl
      if (has(mode SUBSEP m) && has("ref" SUBSEP refm)) {
        b = 0.8 * num("ref" SUBSEP refm); v = num(mode SUBSEP m)
        printf "| %s | %s | %s GB/s (%.2f× of %s GB/s; native %s) | ≥ %s GB/s | %s |\n", label, mode,
          fmt(v), v / num("ref" SUBSEP refm), fmt(num("ref" SUBSEP refm)), cell("native" SUBSEP m),
          fmt(b), verdict(v >= b)
      } else printf "| %s | %s | n/a | 0.8× %s | n/a |\n", label, mode, refl
    }
  }
  print ""

  print "## Plain socket reference (tcp_loopback_bw, same host)"
  print ""
  print "| what | value |"
  print "|---|---:|"
  printf "| loopback TCP, 256 MiB, best of 3 | %s GB/s |\n", cell("ref" SUBSEP "tcp_loopback_gbps")
  printf "| Unix socket, 256 MiB, best of 3 | %s GB/s |\n", cell("ref" SUBSEP "unix_socket_gbps")
  printf "| loopback TCP 1-byte round trip, median | %s µs |\n", cell("ref" SUBSEP "tcp_loopback_rtt_us")
  printf "| Unix socket 1-byte round trip, median | %s µs |\n", cell("ref" SUBSEP "unix_socket_rtt_us")
  printf "| one-core memcpy, 256 MiB | %s GB/s |\n", cell("ref" SUBSEP "memcpy_gbps")
  print ""

  print "## Memory"
  print ""
  print "Client: peak RSS of the benchmark process per invocation (MiB); the `init` row (context"
  print "plus one kernel) is the client library's footprint, Δ = added by Flyt's libcuda.so.1"
  print "relative to NVIDIA's."
  print ""
  print "| cuda_bench group | native MiB | tcp MiB | unix MiB | Δ tcp MiB | Δ unix MiB |"
  print "|---|---:|---:|---:|---:|---:|"
  for (i = 1; i <= ngroups; i++) {
    g = G[i]
    a = rss_kb("native", g); bt = rss_kb("tcp", g); bu = rss_kb("unix", g)
    printf "| %s | %s | %s | %s | %s | %s |\n", g, mib(a), mib(bt), mib(bu),
      (a < 0 || bt < 0) ? "n/a" : signed((bt - a) / 1024), (a < 0 || bu < 0) ? "n/a" : signed((bu - a) / 1024)
  }
  print ""
  print "Server (flyt-server VmRSS, MiB):"
  print ""
  print "| when | MiB |"
  print "|---|---:|"
  printf "| started, no session | %s |\n", has("server" SUBSEP "rss_start_kb") ? mib(num("server" SUBSEP "rss_start_kb")) : "n/a"
  printf "| after all runs, no session | %s |\n", has("server" SUBSEP "rss_after_runs_kb") ? mib(num("server" SUBSEP "rss_after_runs_kb")) : "n/a"
  k = has("server" SUBSEP "idle_sessions") ? num("server" SUBSEP "idle_sessions") : 0
  printf "| holding %d idle sessions | %s |\n", k, has("server" SUBSEP "rss_idle_held_kb") ? mib(num("server" SUBSEP "rss_idle_held_kb")) : "n/a"
  printf "| after those closed | %s |\n", has("server" SUBSEP "rss_after_idle_kb") ? mib(num("server" SUBSEP "rss_after_idle_kb")) : "n/a"
  printf "| peak (VmHWM) | %s |\n", has("server" SUBSEP "hwm_kb") ? mib(num("server" SUBSEP "hwm_kb")) : "n/a"
  if (k > 0 && has("server" SUBSEP "rss_idle_held_kb") && has("server" SUBSEP "rss_before_idle_kb"))
    printf "| **per idle session** ((held − before) / %d) | **%s** |\n", k,
      fmt((num("server" SUBSEP "rss_idle_held_kb") - num("server" SUBSEP "rss_before_idle_kb")) / k / 1024)
  else print "| **per idle session** | n/a |"
  print ""

  print "## Runs"
  print ""
  print "| mode | what | exit | wall s |"
  print "|---|---|---:|---:|"
  for (i = 1; i <= nruns; i++) {
    split(R[i], f, "\t")
    st = f[3]
    if (st == "124" || st == "137") st = st " (timeout)"
    else if (st != "0" && st ~ /^[0-9]+$/) st = st " (failed)"
    printf "| %s | %s | %s | %s |\n", f[1], f[2], st, f[4]
  }
  print ""
  if (nnotes > 0) {
    print "## Notes"
    print ""
    for (i = 1; i <= nnotes; i++) print "- " NOTE[i]
    print ""
  }
  print "<details><summary>All RESULT lines</summary>"
  print ""
  print "```"
  for (i = 1; i <= nraw; i++) print RAWL[i]
  print "```"
  print "</details>"
}
