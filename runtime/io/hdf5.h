// Thin RAII layer over the HDF5 C API, shared by the token files (data/) and checkpoints
// (checkpoint/). Header-only: a target that includes it links hdf5::hdf5.
//
// - Handle owns one hid_t and closes it with the matching H5*close function.
// - h5_check(ret, op, file) turns a negative HDF5 return code into an mt::Error naming the HDF5
//   operation and the file, e.g. "H5Dread failed on /data/x.h5 (reading tokens [0, 4096))".
// - silence_hdf5_errors() stops HDF5 from printing its own error stack to stderr: our messages
//   replace it (and keeps HDF5's exit handler, which crashes on a file a full disk broke, away). It is called by every function that opens or creates a file, and by Lock (in a
//   thread-safe HDF5 build the setting is per thread, so a background thread needs it too).
// - hdf5_mutex() / Lock: one process-wide lock held around every HDF5 call minititan makes, so
//   checkpoint saves on a background thread and the data loader's token-file reads never enter
//   the library at the same time. A serial HDF5 built without --enable-threadsafe (many custom
//   and conda builds) must not be entered from two threads at once; Debian's libhdf5 1.10.8 is a
//   thread-safe build (H5is_library_threadsafe says so) and already serialises each call, so
//   there the lock costs nothing more, and it also keeps multi-call sequences (select, then read)
//   together. It is recursive: a function holding it may call another that takes it, and
//   Handle's destructor takes it to close its id. Keep long work that is not HDF5 (checksums,
//   copies) outside it, and split very large reads and writes so other threads get a turn.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <string>
#include <utility>

#include "runtime/core/error.h"

namespace mt::h5 {

// HDF5 closes the files still open at exit in its atexit handler (H5_term_library); a file whose
// write failed (a full disk) is left in a state where that close crashes (HDF5 1.10: exit 139
// after the error was reported). minititan closes every file it opens (Handle), so the handler
// is not registered: H5dont_atexit before the library's first call, which silence_hdf5_errors
// is (every file open or create starts with it).
inline void skip_hdf5_exit_handler() {
  static const bool once = (H5dont_atexit(), true);
  (void)once;
}

inline void silence_hdf5_errors() {
  skip_hdf5_exit_handler();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

// Inline with a function-local static: one mutex per process even across the shared libraries
// that include this header (the symbol is unique under the default visibility).
inline std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

// Holds hdf5_mutex() for its scope and silences HDF5's error printing for this thread.
class Lock {
 public:
  Lock() : guard_(hdf5_mutex()) { silence_hdf5_errors(); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  std::lock_guard<std::recursive_mutex> guard_;
};

template <class T>
T check(T ret, const char* op, const std::string& file, const std::string& what = "") {
  if (ret < 0) {
    if (what.empty()) MT_FAIL(op, " failed on ", file);
    MT_FAIL(op, " failed on ", file, " (", what, ")");
  }
  return ret;
}

// Owns an hid_t; Close is the H5*close function of its kind.
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  // Checks the id (negative = the HDF5 call failed) and takes ownership.
  Handle(hid_t id, const char* op, const std::string& file, const std::string& what = "")
      : id_(check(id, op, file, what)) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0) {
      std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
      Close(id_);
    }
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Dataset = Handle<H5Dclose>;
using Dataspace = Handle<H5Sclose>;
using Attribute = Handle<H5Aclose>;
using Datatype = Handle<H5Tclose>;
using PropList = Handle<H5Pclose>;

}  // namespace mt::h5
