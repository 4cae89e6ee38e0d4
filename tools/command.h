#pragma once
// The `ossrt` command line: each subcommand lives in its own cmd_<name>.cpp and registers itself
// with OSSRT_REGISTER_COMMAND, so adding a command never edits main.cpp.
#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace ossrt::tools {

// A setup function adds one subcommand (with its options and callback) to the app.
using CommandSetup = std::function<void(CLI::App& app)>;

std::vector<CommandSetup>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSetup setup) { command_registry().push_back(std::move(setup)); }
};

}  // namespace ossrt::tools

#define OSSRT_CONCAT_INNER(a, b) a##b
#define OSSRT_CONCAT(a, b) OSSRT_CONCAT_INNER(a, b)
// __COUNTER__, not __LINE__: in a unity build several cmd_*.cpp share one translation unit.
#define OSSRT_REGISTER_COMMAND(setup_fn) \
  static ::ossrt::tools::CommandRegistrar OSSRT_CONCAT(ossrt_command_registrar_, __COUNTER__)(setup_fn)
