#!/usr/bin/env bash
# Builds the logging driver shim (driver_probe_shim.c) on the GPU machine, against the
# driver found there: OUTDIR/libcuda.so.1. Run a program with
#   LD_LIBRARY_PATH=OUTDIR PROBE_LOG=/path/log [PROBE_WATCH=1] program
# Usage: tests/gpu/probe/probe_build.sh OUTDIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$1
mkdir -p "$OUT"
REAL=${PROBE_REAL:-$(ldconfig -p | awk '/libcuda\.so\.1 .*x86-64/{print $NF; exit}')}
REAL=$(readlink -f "$REAL")
[[ -f $REAL ]] || { echo "no libcuda.so.1 found" >&2; exit 1; }
nm -D --defined-only "$REAL" | awk '$2=="T"{print $3}' | sed 's/@.*//' | sort -u |
  grep -vx -e cuGetProcAddress -e cuGetProcAddress_v2 -e cuGetExportTable >"$OUT/symbols.txt"
{
  while read -r s; do
    echo "HIDDEN void* fwd_$s;"
    echo "__asm__(\".text\\n.globl $s\\n.type $s,@function\\n$s:\\njmp *fwd_$s(%rip)\\n\");"
  done <"$OUT/symbols.txt"
  echo "static void probe_forward_init(void) {"
  while read -r s; do echo "  fwd_$s = dlsym(real_driver, \"$s\");"; done <"$OUT/symbols.txt"
  echo "}"
} >"$OUT/probe_forward.inc"
{
  for n in $(seq 0 255); do
    cat <<T
__asm__(".text\\n.type probe_tramp_$n,@function\\nprobe_tramp_$n:\\n"
        "push %rax\\npush %rdi\\npush %rsi\\npush %rdx\\npush %rcx\\npush %r8\\npush %r9\\n"
        "sub \$128,%rsp\\nmovdqu %xmm0,0(%rsp)\\nmovdqu %xmm1,16(%rsp)\\nmovdqu %xmm2,32(%rsp)\\n"
        "movdqu %xmm3,48(%rsp)\\nmovdqu %xmm4,64(%rsp)\\nmovdqu %xmm5,80(%rsp)\\n"
        "movdqu %xmm6,96(%rsp)\\nmovdqu %xmm7,112(%rsp)\\n"
        "mov \$$n,%edi\\nlea 128(%rsp),%rsi\\ncall probe_log_slot\\n"
        "movdqu 0(%rsp),%xmm0\\nmovdqu 16(%rsp),%xmm1\\nmovdqu 32(%rsp),%xmm2\\n"
        "movdqu 48(%rsp),%xmm3\\nmovdqu 64(%rsp),%xmm4\\nmovdqu 80(%rsp),%xmm5\\n"
        "movdqu 96(%rsp),%xmm6\\nmovdqu 112(%rsp),%xmm7\\nadd \$128,%rsp\\n"
        "pop %r9\\npop %r8\\npop %rcx\\npop %rdx\\npop %rsi\\npop %rdi\\npop %rax\\n"
        "jmp *probe_real_slot+8*$n(%rip)\\n");
void probe_tramp_$n(void);
T
  done
  echo "static void (*const tramps[256])(void) = {"
  for n in $(seq 0 255); do echo "  probe_tramp_$n,"; done
  echo "};"
} >"$OUT/probe_tramps.inc"
gcc -O1 -shared -fPIC -Wall -o "$OUT/libcuda.so.1" -I"$OUT" -DPROBE_REAL_DRIVER="\"$REAL\"" \
  "$HERE/driver_probe_shim.c" -ldl
echo "shim for $REAL: $(wc -l <"$OUT/symbols.txt") forwarded symbols"
