// Test helper for the tests that serve a real Session against the sim backend
// (graph_frames_test, session_rma_test, session_staged_copy_test): the process's one
// ServerState, with a sim driver of `memory_bytes` of device memory and a tenant board
// whose first slot the session uses. Made at the first call; later calls return it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "server/session.h"
#include "server/tenant_board.h"

namespace flyt::server {

inline ServerState* SimServerState(uint64_t memory_bytes) {
  static ServerState* state = [memory_bytes] {
    auto* s = new ServerState();
    SimOptions sim;
    sim.memory_bytes = memory_bytes;
    EXPECT_TRUE(LoadSimDriver(sim, &s->api).ok());
    EXPECT_TRUE(DescribeDevices(s).ok());
    static std::unique_ptr<TenantBoard> board;
    if (TenantBoard::Create(&board).ok()) {
      s->board = board.get();
      s->slot = &board->layout().slots[0];
      s->share.UseCounters(&board->layout().memory_used, &board->layout().memory_quota,
                           board->layout().memory_used_dev);
    }
    return s;
  }();
  return state;
}

}  // namespace flyt::server
