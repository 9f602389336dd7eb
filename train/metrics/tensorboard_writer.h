// TensorBoard scalars, written natively: an event file (`events.out.tfevents.<time>.<host>`) in
// a folder that `tensorboard --logdir` reads, with one scalar per tag and step.
//
// The file is TensorFlow's record format: each record is its length (u64, little-endian), the
// masked CRC-32C of those 8 bytes, the bytes of one serialized `tensorflow.Event` protocol buffer,
// and their masked CRC-32C. The first event names the file version ("brain.Event:2"); then each
// scalar is an Event {wall_time, step, summary {value {tag, simple_value}}}. Writes are flushed
// per call, so a crashed run keeps what it logged; a resumed run writes a new file in the same
// folder, which TensorBoard reads as one run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "train/metrics/step_metrics.h"

namespace mt::train {

// A step's metrics as TensorBoard scalars, named as in metrics.jsonl: loss, grad_norm, lr,
// tokens_per_sec (or samples_per_sec), mfu (when known), mem_in_use_gib and mem_peak_gib (when
// known), data_wait_fraction, then the model's metrics.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const StepMetrics& m);

class TensorBoardWriter {
 public:
  // Creates `folder` if needed and a new event file in it; throws mt::Error naming the path.
  explicit TensorBoardWriter(const std::string& folder);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event per (tag, value) at `step`, then a flush. Non-finite values are written as they
  // are (TensorBoard shows NaN and infinities).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// CRC-32C (Castagnoli) of `n` bytes, and TensorFlow's masking of it (for records).
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace mt::train
