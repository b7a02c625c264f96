#include "exec/runtime/agree.hpp"

#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace ptdp::exec {

using json = nlohmann::json;

void agree(Communicator& world, const std::function<void()>& f) {
  json err;
  try {
    f();
  } catch (const CommunicationError&) {
    throw;
  } catch (const ConfigError& e) {
    err = {{"kind", 1}, {"key", e.key_path()}, {"message", e.message()}, {"file", e.where().file},
           {"line", e.where().line}, {"column", e.where().column}};
  } catch (const EnvironmentError& e) {
    err = {{"kind", 2}, {"message", e.what()}};
  } catch (const InternalError& e) {
    err = {{"kind", 3}, {"message", e.what()}};
  } catch (const std::exception& e) {
    err = {{"kind", 4}, {"message", e.what()}};
  }
  double first = err.is_null() ? world.size() : world.rank();
  world.all_reduce(&first, 1, ReduceOp::Min);
  if (first >= world.size()) return;
  const int root = static_cast<int>(first);
  std::string text = world.rank() == root ? err.dump() : std::string();
  uint64_t len = text.size();
  world.broadcast(&len, sizeof len, root);
  text.resize(len);
  world.broadcast(text.data(), len, root);
  const json j = json::parse(text);
  const std::string msg = j.at("message").get<std::string>();
  switch (j.at("kind").get<int>()) {
    case 1:
      throw ConfigError(j.at("key").get<std::string>(), msg,
                        SourceLocation{j.at("file").get<std::string>(), j.at("line").get<int>(), j.at("column").get<int>()});
    case 2: throw EnvironmentError(msg);
    case 3: throw InternalError(msg);
    default: throw std::runtime_error(msg);
  }
}

}  // namespace ptdp::exec
