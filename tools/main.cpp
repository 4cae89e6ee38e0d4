// ossrt: inference engine and OpenAI-compatible server for gpt-oss-20b / gpt-oss-120b.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "command.h"
#include "core/error.h"

namespace ossrt::tools {
std::vector<CommandSetup>& command_registry() {
  static std::vector<CommandSetup> registry;
  return registry;
}
}  // namespace ossrt::tools

int main(int argc, char** argv) {
  CLI::App app{"ossrt: inference engine and OpenAI-compatible server for gpt-oss"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ossrt 0.1.0");
  // Logs go to stderr: stdout carries the commands' results (`--format json`, .npy paths, ids),
  // which scripts parse.
  spdlog::set_default_logger(spdlog::stderr_color_mt("ossrt"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  for (auto& setup : ossrt::tools::command_registry()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ossrt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
