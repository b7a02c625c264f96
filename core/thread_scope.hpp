#pragma once

namespace ptdp {

/// A pointer installed for the calling thread while a scope lives, the outer one restored when it
/// ends: how a sweep hands its per-family memos (layer prices, op lists, activation bytes) down to
/// the pricing code without threading them through every call. current() is nullptr outside any.
template <class T>
class ThreadScope {
 public:
  explicit ThreadScope(T* value) : previous_(current_) { current_ = value; }
  ~ThreadScope() { current_ = previous_; }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;
  static T* current() { return current_; }

 private:
  static inline thread_local T* current_ = nullptr;
  T* previous_;
};

}  // namespace ptdp
