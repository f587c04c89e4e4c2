// sampler: a CPU-time sampling profiler to LD_PRELOAD where no perf or gdb is
// installed (the GPU machine). Every 2 ms of the process's CPU time (SIGPROF)
// it records the interrupted thread's call stack; at exit it writes, to
// $SAMPLER_OUT.<pid>, the libraries and functions (nearest exported symbol) where
// the samples fell, self and inclusive, most frequent first.
//
// Build: cc -O2 -shared -fPIC -o libsampler.so tests/gpu/sampler.c -ldl
// Use:   SAMPLER_OUT=/tmp/prof.txt LD_PRELOAD=./libsampler.so program ...
// Owns only its own signal handler and buffer; the program's SIGPROF use, if
// any, is replaced for the run.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

enum { kDepth = 24, kMaxSamples = 200000 };
static void* g_stacks[kMaxSamples][kDepth];
static int g_depths[kMaxSamples];
static volatile int g_count;

static void OnProf(int sig, siginfo_t* info, void* uc) {
  (void)sig, (void)info, (void)uc;
  int i = __atomic_fetch_add(&g_count, 1, __ATOMIC_RELAXED);
  if (i >= kMaxSamples) return;
  g_depths[i] = backtrace(g_stacks[i], kDepth);
}

struct Row {
  char name[256];
  int self, total;
};
static struct Row g_rows[8192];
static int g_nrows;

static struct Row* RowOf(const char* name) {
  for (int i = 0; i < g_nrows; ++i)
    if (strcmp(g_rows[i].name, name) == 0) return &g_rows[i];
  if (g_nrows == (int)(sizeof g_rows / sizeof g_rows[0])) return NULL;
  struct Row* r = &g_rows[g_nrows++];
  snprintf(r->name, sizeof r->name, "%s", name);
  return r;
}

static void Describe(void* pc, char* out, size_t n) {
  Dl_info di;
  if (dladdr(pc, &di) == 0 || di.dli_fname == NULL) {
    snprintf(out, n, "?");
    return;
  }
  const char* lib = strrchr(di.dli_fname, '/');
  lib = lib ? lib + 1 : di.dli_fname;
  snprintf(out, n, "%s:%s", lib, di.dli_sname ? di.dli_sname : "?");
}

static int ByTotal(const void* a, const void* b) {
  return ((const struct Row*)b)->total - ((const struct Row*)a)->total;
}

__attribute__((destructor)) static void Report(void) {
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, NULL);
  const char* path = getenv("SAMPLER_OUT");
  char file[4096];
  if (path == NULL) return;
  snprintf(file, sizeof file, "%s.%d", path, (int)getpid());  // one report per process
  FILE* f = fopen(file, "w");
  if (f == NULL) return;
  int n = g_count < kMaxSamples ? g_count : kMaxSamples;
  for (int i = 0; i < n; ++i) {
    char seen[kDepth][256];
    int nseen = 0;
    for (int d = 2; d < g_depths[i]; ++d) {  // 0-1: the handler and the signal frame
      char name[256];
      Describe(g_stacks[i][d], name, sizeof name);
      int dup = 0;
      for (int k = 0; k < nseen; ++k) dup |= strcmp(seen[k], name) == 0;
      if (dup) continue;
      snprintf(seen[nseen++], sizeof seen[0], "%s", name);
      struct Row* r = RowOf(name);
      if (r == NULL) continue;
      r->total++;
      if (d == 2) r->self++;
    }
  }
  qsort(g_rows, g_nrows, sizeof g_rows[0], ByTotal);
  fprintf(f, "%d samples of 2 ms CPU; rows: inclusive, self, library:function\n", n);
  for (int i = 0; i < g_nrows && i < 60; ++i)
    fprintf(f, "%6d %6d %s\n", g_rows[i].total, g_rows[i].self, g_rows[i].name);
  fclose(f);
}

__attribute__((constructor)) static void Start(void) {
  if (getenv("SAMPLER_OUT") == NULL) return;
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder outside the signal handler
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = OnProf;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, NULL);
  struct itimerval every = {{0, 2000}, {0, 2000}};
  setitimer(ITIMER_PROF, &every, NULL);
}
