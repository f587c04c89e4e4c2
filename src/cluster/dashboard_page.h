// The cluster manager's web dashboard: one self-contained page (HTML, CSS and
// JavaScript, no external assets: clusters often have no internet) that polls
// /api/cluster and draws nodes, GPUs with their promised and used SMs and
// memory, tenants and recent events.
//
// Owns: the page's text. Must not know the cluster's state: it reads the JSON
// that ClusterManager::DashboardJson renders.
#pragma once

namespace flyt::cluster {

extern const char kDashboardPage[];

}  // namespace flyt::cluster
