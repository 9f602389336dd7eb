// Reads back the scalars of a TensorBoard event file (train/metrics/tensorboard_writer.h), for
// tests: checks each record's framing and both masked CRC-32Cs, and decodes the Event fields the
// writer uses. TensorBoard's own reader is the independent check (tensorboard_test.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace mt::testing {

struct ScalarEvent {
  int64_t step = 0;
  std::string tag;
  float value = 0;
};

struct EventFile {
  std::string file_version;          // the first event's ("brain.Event:2")
  std::vector<ScalarEvent> scalars;  // in file order
};

// Throws mt::Error naming the file and offset on a bad record.
EventFile read_event_file(const std::filesystem::path& path);
// The single events.out.tfevents.* file in `folder` (throws when there is none or several).
std::filesystem::path only_event_file(const std::filesystem::path& folder);

}  // namespace mt::testing
