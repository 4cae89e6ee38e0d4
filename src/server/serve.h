#pragma once
// `ossrt serve`: starts the HTTP listener at once (so /health answers 503 while loading), loads
// the model in a background thread, serves until SIGTERM/SIGINT, then drains: readiness -> 503,
// new work refused, in-flight requests get up to drain_timeout_s, the rest are aborted with an
// error event, and the process exits.
#include <functional>
#include <memory>

#include "server/served_model.h"
#include "server/server_context.h"

namespace ossrt::server {

// Returns the process exit code.
int run_server(const ServerConfig& config, const ServedModelOptions& model);

}  // namespace ossrt::server
