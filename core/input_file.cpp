#include "core/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.hpp"

namespace ptdp {
namespace {

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw ConfigError("", message, SourceLocation{path, 0, 0});
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char b[48];
  if (u == 0) std::snprintf(b, sizeof b, "%llu bytes", static_cast<unsigned long long>(bytes));
  else std::snprintf(b, sizeof b, v == static_cast<double>(static_cast<uint64_t>(v)) ? "%.0f %s" : "%.1f %s", v, units[u]);
  return b;
}

bool path_exists(const std::string& path) noexcept {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0;
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  if (path.empty()) fail("(empty path)", what + ": no file name given");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) fail(path, what + " not found");
    // A name the system cannot take is bad input, not a broken machine.
    if (err == ENAMETOOLONG || err == ELOOP) fail(path, what + ": " + std::strerror(err));
    throw EnvironmentError(path + ": cannot read " + what + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) fail(path, what + " is " + kind_of(st.st_mode) + ", expected a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    fail(path, what + " is " + format_bytes(static_cast<uint64_t>(st.st_size)) + ", above the limit of " +
                   format_bytes(max_bytes) + " for this kind of file");
  // O_NONBLOCK: a file swapped for a FIFO between stat and open must not block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    throw EnvironmentError(path + ": cannot open " + what + ": " + std::strerror(err));
  }
  struct stat fst {};
  if (::fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode)) {
    ::close(fd);
    fail(path, what + " is not a regular file");
  }
  std::string out;
  out.reserve(static_cast<size_t>(fst.st_size));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw EnvironmentError(path + ": error reading " + what + ": " + std::strerror(err));
    }
    if (n == 0) break;
    // The file may grow while it is read: the limit holds for the bytes actually read.
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      ::close(fd);
      fail(path, what + " grew above the limit of " + format_bytes(max_bytes) + " while being read");
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace ptdp
