// Thin RAII layer over the HDF5 C API, shared by the token files (data/) and checkpoints
// (checkpoint/). Header-only: a target that includes it links hdf5::hdf5.
//
// - Handle owns one hid_t and closes it with the matching H5*close function.
// - h5_check(ret, op, file) turns a negative HDF5 return code into an mt::Error naming the HDF5
//   operation and the file, e.g. "H5Dread failed on /data/x.h5 (reading tokens [0, 4096))".
// - silence_hdf5_errors() stops HDF5 from printing its own error stack to stderr: our messages
//   replace it. It is called by every function that opens or creates a file.
#pragma once

#include <hdf5.h>

#include <string>
#include <utility>

#include "runtime/core/error.h"

namespace mt::h5 {

inline void silence_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

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
    if (id_ >= 0) Close(id_);
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
