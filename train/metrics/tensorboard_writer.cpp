#include "train/metrics/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "runtime/core/error.h"

namespace mt::train {

namespace {

// Protocol-buffer encoding of the few fields an Event needs.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}
void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, uint64_t(field) << 3 | uint64_t(wire_type));
}
static_assert(std::endian::native == std::endian::little,
              "protobuf's fixed-width fields and TFRecord lengths are little-endian");

template <class T>
void put_fixed(std::string& out, T value) {  // in memory order: little-endian
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary { repeated Value value = 1 { tag = 1, simple_value = 2 (float) } }).
std::string event(double wall_time, int64_t step) {
  std::string e;
  put_tag(e, 1, 1);
  put_fixed<double>(e, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, uint64_t(step));
  return e;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

std::vector<std::pair<std::string, double>> tensorboard_scalars(const StepMetrics& m) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::vector<std::pair<std::string, double>> s = {
      {"loss", m.loss},
      {"grad_norm", m.grad_norm},
      {"lr", m.lr},
      {rate_name(m), m.tokens_per_sec},
      {rate_name(m) + "_total", m.tokens_per_sec * double(m.ranks)}};
  if (m.mfu) s.emplace_back("mfu", *m.mfu);
  if (m.mem_in_use_bytes) s.emplace_back("mem_in_use_gib", double(*m.mem_in_use_bytes) / kGiB);
  if (m.mem_peak_bytes) s.emplace_back("mem_peak_gib", double(*m.mem_peak_bytes) / kGiB);
  s.emplace_back("data_wait_fraction", m.data_wait_fraction);
  if (m.comm_exposed_fraction) s.emplace_back("comm_exposed_fraction", *m.comm_exposed_fraction);
  for (const auto& [name, value] : m.model_metrics) s.emplace_back(name, value);
  return s;
}

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  MT_CHECK(!ec, "tensorboard: cannot create the folder ", folder, ": ", ec.message());
  const double now = now_seconds();
  // Seconds, host and pid: two writers started in the same second (ranks, restarts) differ.
  path_ = (std::filesystem::path(folder) /
           ("events.out.tfevents." + std::to_string(int64_t(now)) + "." + host_name() + "." +
            std::to_string(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  MT_CHECK(file_ != nullptr, "tensorboard: cannot create ", path_, ": ", std::strerror(errno));
  std::string first = event(now, 0);
  put_bytes(first, 3, "brain.Event:2");
  write_record(first);
  std::fflush(file_);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write_record(const std::string& data) {
  char header[12];
  const uint64_t length = data.size();
  std::memcpy(header, &length, 8);
  const uint32_t length_crc = masked_crc32c(header, 8);
  std::memcpy(header + 8, &length_crc, 4);
  const uint32_t data_crc = masked_crc32c(data.data(), data.size());
  const bool ok = std::fwrite(header, 1, sizeof(header), file_) == sizeof(header) &&
                  std::fwrite(data.data(), 1, data.size(), file_) == data.size() &&
                  std::fwrite(&data_crc, 1, 4, file_) == 4;
  MT_CHECK(ok, "tensorboard: cannot write to ", path_, ": ", std::strerror(errno));
}

void TensorBoardWriter::add_scalars(int64_t step,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
  const double now = now_seconds();
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_tag(v, 2, 5);
    put_fixed<float>(v, float(value));
    std::string summary;
    put_bytes(summary, 1, v);
    std::string e = event(now, step);
    put_bytes(e, 5, summary);
    write_record(e);
  }
  MT_CHECK(std::fflush(file_) == 0, "tensorboard: cannot write to ", path_, ": ",
           std::strerror(errno));
}

}  // namespace mt::train
