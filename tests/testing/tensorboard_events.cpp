#include "tests/testing/tensorboard_events.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "runtime/core/error.h"
#include "train/metrics/tensorboard_writer.h"

namespace mt::testing {

namespace {

// A protocol-buffer message's fields, as far as the writer uses them.
struct Reader {
  const std::string& bytes;
  size_t at = 0;
  bool done() const { return at >= bytes.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      MT_CHECK(at < bytes.size(), "tensorboard event: truncated varint");
      const uint8_t b = uint8_t(bytes[at++]);
      v |= uint64_t(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    MT_FAIL("tensorboard event: varint too long");
  }
  std::string take(size_t n) {
    MT_CHECK(at + n <= bytes.size(), "tensorboard event: truncated field");
    std::string s = bytes.substr(at, n);
    at += n;
    return s;
  }
};

template <class T>
T fixed(const std::string& bytes) {
  T v;
  std::memcpy(&v, bytes.data(), sizeof(T));
  return v;
}

// Calls fn(field, wire_type, payload) for each field; varints come as their 8 bytes.
template <class Fn>
void for_each_field(const std::string& message, Fn&& fn) {
  Reader r{message};
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int field = int(key >> 3), wire = int(key & 7);
    std::string payload;
    if (wire == 0) {
      const uint64_t v = r.varint();
      payload.assign(reinterpret_cast<const char*>(&v), 8);
    } else if (wire == 1) {
      payload = r.take(8);
    } else if (wire == 5) {
      payload = r.take(4);
    } else {
      MT_CHECK(wire == 2, "tensorboard event: unexpected wire type ", wire);
      payload = r.take(size_t(r.varint()));
    }
    fn(field, wire, payload);
  }
}

}  // namespace

EventFile read_event_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "cannot open ", path.string());
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EventFile file;
  size_t at = 0;
  bool first = true;
  while (at < data.size()) {
    MT_CHECK(at + 12 <= data.size(), path.string(), ": truncated record header at ", at);
    const uint64_t length = fixed<uint64_t>(data.substr(at, 8));
    MT_CHECK(fixed<uint32_t>(data.substr(at + 8, 4)) == train::masked_crc32c(data.data() + at, 8),
             path.string(), ": bad length CRC at ", at);
    MT_CHECK(at + 12 + length + 4 <= data.size(), path.string(), ": truncated record at ", at);
    const std::string event = data.substr(at + 12, length);
    MT_CHECK(fixed<uint32_t>(data.substr(at + 12 + length, 4)) ==
                 train::masked_crc32c(event.data(), event.size()),
             path.string(), ": bad data CRC at ", at);
    at += 12 + length + 4;
    int64_t step = 0;
    std::vector<ScalarEvent> values;
    for_each_field(event, [&](int field, int, const std::string& payload) {
      if (field == 2) step = fixed<int64_t>(payload);
      if (field == 3 && first) file.file_version = payload;
      if (field != 5) return;
      for_each_field(payload, [&](int, int, const std::string& value) {  // Summary.value
        ScalarEvent s;
        for_each_field(value, [&](int f, int, const std::string& v) {
          if (f == 1) s.tag = v;
          if (f == 2) s.value = fixed<float>(v);
        });
        values.push_back(s);
      });
    });
    for (ScalarEvent& s : values) {
      s.step = step;
      file.scalars.push_back(s);
    }
    first = false;
  }
  return file;
}

std::filesystem::path only_event_file(const std::filesystem::path& folder) {
  std::vector<std::filesystem::path> found;
  for (const auto& e : std::filesystem::directory_iterator(folder)) {
    if (e.path().filename().string().starts_with("events.out.tfevents.")) found.push_back(e.path());
  }
  MT_CHECK(found.size() == 1, folder.string(), " holds ", found.size(), " event files");
  return found[0];
}

}  // namespace mt::testing
