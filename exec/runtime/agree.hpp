// Collective error agreement for the executor's setup steps.
#pragma once

#include <functional>

#include "exec/runtime/communicator.hpp"

namespace ptdp::exec {

// Runs `f` on every rank. When any rank throws, every rank throws the error of the lowest
// failing rank, so all of them stop together with one message (rank 0 prints it).
// A CommunicationError passes through untouched: peers may be gone.
void agree(Communicator& world, const std::function<void()>& f);

}  // namespace ptdp::exec
