// ucx:// in a build without UCX's headers (libucx-dev missing at configure time): every
// use fails with that reason. The real transport is ucx_transport.cc.
#include "transport/ucx_transport.h"

namespace flyt::transport {
namespace {
Status NotBuilt() {
  return Status::Error(
      "ucx:// is not available: this Flyt was built without UCX (install libucx-dev and "
      "configure again)");
}
}  // namespace

Status DialUcx(const Address&, const Liveness&, std::unique_ptr<Connection>*, bool* retryable) {
  *retryable = false;
  return NotBuilt();
}
Status ListenUcx(const Address&, std::unique_ptr<Listener>*) { return NotBuilt(); }
Status ReattachUcx(DetachedConnection&& d, std::unique_ptr<Connection>*) {
  CloseDetached(&d);
  return NotBuilt();
}

}  // namespace flyt::transport
