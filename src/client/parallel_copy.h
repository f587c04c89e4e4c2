// A memcpy that a few helper threads share, for bulk copies that one core's memory
// bandwidth bounds (client/staged_copy.cc copies each staged chunk out with it).
//
// Owns: the helper threads (made at the first copy that wants them, never joined; they
// block every signal so that the app's handlers never run on them) and the hand-off of
// one copy at a time. The caller copies too and claims pieces the same way, so a helper
// that is slow to wake (or not scheduled) only means the caller does more pieces itself:
// a copy never waits for a helper that has not started a piece.
// Must not touch: anything of the connection; no CUDA. In a child after fork() the
// parent's helpers do not exist: the copy is done by the caller alone.
#pragma once

#include <cstddef>

namespace flyt::client {

// Copies n bytes with up to `threads` threads (the caller included; 1 = plain memcpy).
// Small copies are done by the caller alone. Thread-safe (concurrent calls serialise
// their use of the helpers; a call that finds them busy copies alone).
void ParallelCopy(void* dst, const void* src, size_t n, unsigned threads);

}  // namespace flyt::client
