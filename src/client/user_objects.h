// CUDA user objects (cuUserObjectCreate and the graph references to them), kept
// entirely in the client library: the object, its destructor and the data it is
// called with are the application's, in this process.
//
// Owns: each user object's reference count; the references graphs and executable
// graphs hold (taken by cuGraphRetainUserObject, copied by cuGraphClone, a child
// graph node and instantiation, given back when the graph or executable graph is
// destroyed); the destructor thread, which runs a destructor once the last
// reference is gone and, for an executable graph's references, once the work of
// its launches is done (an event recorded behind them when it is destroyed), as
// the driver runs them on a thread of its own.
// Must not: call a destructor on the application's thread, or hold its lock while
// calling into the server or a destructor; write to stdout.
#pragma once

#include <cuda.h>

namespace flyt::client::user_objects {

// True once the process made a user object (one relaxed load): the hooks below
// cost nothing before.
bool Any();

// The graph and executable graph events the references follow.
void GraphCloned(CUgraph from, CUgraph clone);
void ChildGraphAdded(CUgraph parent, CUgraph child);  // the parent keeps a copy of the child
void GraphDestroyed(CUgraph graph);
void Instantiated(CUgraph graph, CUgraphExec exec);
void Launched(CUgraphExec exec, CUstream stream, bool per_thread);
// Before the executable graph is destroyed: its references go once its launches are done.
void ExecDestroying(CUgraphExec exec);

}  // namespace flyt::client::user_objects
