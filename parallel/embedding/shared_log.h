// SharedLog: an ostream that several threads may write at once (each write appended whole under
// a lock), whose text its owner reads or takes. The embedding stream's connection thread logs
// into one, and the trainer moves what it holds into its own log on the training thread, so the
// trainer's log stream is only ever written by one thread.
#pragma once

#include <mutex>
#include <ostream>
#include <streambuf>
#include <string>
#include <utility>

namespace mt::parallel {

class SharedLog : public std::ostream {
 public:
  SharedLog() : std::ostream(&buf_) {}
  SharedLog(const SharedLog&) = delete;
  SharedLog& operator=(const SharedLog&) = delete;

  std::string text() const {
    std::lock_guard<std::mutex> lock(buf_.mu);
    return buf_.text;
  }
  // The text written so far, which the log then forgets.
  std::string take() {
    std::lock_guard<std::mutex> lock(buf_.mu);
    return std::exchange(buf_.text, std::string());
  }
  // How many times `what` occurs in the text.
  int count(const std::string& what) const {
    const std::string t = text();
    int n = 0;
    for (size_t p = t.find(what); p != std::string::npos; p = t.find(what, p + 1)) ++n;
    return n;
  }

 private:
  struct Buf : std::streambuf {
    mutable std::mutex mu;
    std::string text;
    int_type overflow(int_type c) override {
      if (c != traits_type::eof()) {
        std::lock_guard<std::mutex> lock(mu);
        text.push_back(char(c));
      }
      return c;
    }
    std::streamsize xsputn(const char* s, std::streamsize n) override {
      std::lock_guard<std::mutex> lock(mu);
      text.append(s, size_t(n));
      return n;
    }
  } buf_;
};

}  // namespace mt::parallel
