#include "data/tokenizer/bpe_tokenizer.h"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <mutex>
#include <queue>

#include "data/tokenizer/absl_key.h"
#include "data/tokenizer/byte_level.h"
#include "data/tokenizer/tokenizer_json.h"
#include "runtime/core/error.h"

namespace mt::data {
namespace {

constexpr size_t kMaxCachedPieceBytes = 256;  // longer pieces are rare; not worth caching
constexpr size_t kMaxCacheEntries = 1 << 20;  // the cache stops growing here

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Merge {
  int32_t rank;
  int32_t id;  // the merged token
};

}  // namespace

struct BpeTokenizer::Impl {
  std::vector<std::string> id_bytes;  // what decode writes for each id
  std::vector<uint8_t> id_valid;
  std::vector<uint8_t> id_added;
  std::array<int32_t, 256> byte_ids{};  // single-byte tokens; -1 when the vocab lacks one
  absl::flat_hash_map<uint64_t, Merge> merges;
  absl::flat_hash_map<std::string, int32_t> vocab_ids;  // raw bytes -> model vocab id
  absl::flat_hash_map<std::string, int32_t> added_ids;  // content -> added token id
  AddedTokenMatcher matcher;

  std::mutex cache_mutex;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache;
};

BpeTokenizer::BpeTokenizer(TokenizerSpec spec) : spec_(std::move(spec)), impl_(new Impl) {
  const std::string& where = spec_.source;
  Impl& m = *impl_;
  MT_CHECK(!spec_.vocab.empty(), where, ": the vocabulary is empty");
  int64_t size = static_cast<int64_t>(spec_.vocab.size());
  for (const AddedToken& t : spec_.added_tokens) {
    MT_CHECK(t.id >= 0, where, ": added token \"", t.content, "\" has a negative id ", t.id);
    MT_CHECK(!t.content.empty(), where, ": added token id ", t.id, " has empty content");
    size = std::max<int64_t>(size, int64_t{t.id} + 1);
  }
  m.id_bytes.assign(size, std::string());
  m.id_valid.assign(size, 0);
  m.id_added.assign(size, 0);
  m.vocab_ids.reserve(spec_.vocab.size());
  for (size_t id = 0; id < spec_.vocab.size(); ++id) {
    m.id_bytes[id] = spec_.vocab[id];
    m.id_valid[id] = 1;
    m.vocab_ids.emplace(spec_.vocab[id], static_cast<int32_t>(id));
  }
  for (const AddedToken& t : spec_.added_tokens) {
    MT_CHECK(!m.id_added[t.id] || m.id_bytes[t.id] == t.content, where, ": added token id ", t.id,
             " is given twice, as \"", m.id_bytes[t.id], "\" and \"", t.content, "\"");
    m.id_bytes[t.id] = t.content;
    m.id_valid[t.id] = 1;
    m.id_added[t.id] = 1;
    m.added_ids.emplace(t.content, t.id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m.vocab_ids.find(std::string(1, static_cast<char>(b)));
    m.byte_ids[b] = it == m.vocab_ids.end() ? -1 : it->second;
  }
  m.merges.reserve(spec_.merges.size());
  for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
    const auto [a, b] = spec_.merges[rank];
    const int32_t n = static_cast<int32_t>(spec_.vocab.size());
    MT_CHECK(a >= 0 && a < n && b >= 0 && b < n, where, ": merge ", rank, " = (", a, ", ", b,
             ") refers to an id outside the vocabulary of ", n, " tokens");
    const std::string merged = spec_.vocab[a] + spec_.vocab[b];
    auto it = m.vocab_ids.find(merged);
    MT_CHECK(it != m.vocab_ids.end(), where, ": model.merges[", rank, "] = \"",
             bytes_to_byte_level(spec_.vocab[a]), " ", bytes_to_byte_level(spec_.vocab[b]),
             "\": the merged token \"", bytes_to_byte_level(merged), "\" is not in model.vocab");
    // Like `tokenizers`, a pair listed twice keeps its last rank.
    m.merges[pair_key(a, b)] = Merge{static_cast<int32_t>(rank), it->second};
  }
  m.matcher = AddedTokenMatcher(spec_.added_tokens);
  auto resolve = [&](const std::optional<std::string>& token, const char* key) {
    std::optional<int32_t> id;
    if (!token) return id;
    id = token_to_id(*token);
    MT_CHECK(id.has_value(), where, ": ", key, " \"", *token,
             "\" (from tokenizer_config.json) is not a token of this tokenizer");
    return id;
  };
  bos_id_ = resolve(spec_.bos_token, "bos_token");
  eos_id_ = resolve(spec_.eos_token, "eos_token");
}

BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

BpeTokenizer BpeTokenizer::from_file(const std::filesystem::path& path, std::ostream& notes) {
  return BpeTokenizer(load_tokenizer_json(path, notes));
}

void BpeTokenizer::save(const std::filesystem::path& folder) const {
  save_tokenizer_json(spec_, folder);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos) {
    MT_CHECK(bos_id_, "BpeTokenizer::encode: add_bos requested but ", spec_.source,
             " has no bos_token (tokenizer_config.json beside it sets it)");
    out.push_back(*bos_id_);
  }
  encode_to(text, out);
  if (add_eos) {
    MT_CHECK(eos_id_, "BpeTokenizer::encode: add_eos requested but ", spec_.source,
             " has no eos_token (tokenizer_config.json beside it sets it)");
    out.push_back(*eos_id_);
  }
  return out;
}

void BpeTokenizer::encode_to(std::string_view text, std::vector<int32_t>& out) const {
  impl_->matcher.split(
      text, [&](std::string_view segment) { encode_text(segment, out); },
      [&](int32_t id) { out.push_back(id); });
}

std::vector<int32_t> BpeTokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (!text.empty()) encode_text(text, out);
  return out;
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::string prefixed;
  if (spec_.add_prefix_space && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  std::vector<std::string_view> pieces;
  pretokenize(text, spec_.pretokenizer, pieces);
  for (std::string_view piece : pieces) encode_piece(piece, out);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  Impl& m = *impl_;
  if (piece.size() == 1) {
    bpe(piece, out);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(m.cache_mutex);
    auto it = m.cache.find(absl_key(piece));
    if (it != m.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  bpe(piece, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(m.cache_mutex);
    if (m.cache.size() < kMaxCacheEntries) {
      m.cache.try_emplace(std::string(piece), out.begin() + start, out.end());
    }
  }
}

void BpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const Impl& m = *impl_;
  if (spec_.ignore_merges && piece.size() > 1) {
    auto it = m.vocab_ids.find(absl_key(piece));
    if (it != m.vocab_ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    const auto byte = static_cast<uint8_t>(piece[i]);
    const int32_t id = m.byte_ids[byte];
    if (id < 0) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", byte);
      MT_FAIL(spec_.source, ": byte ", hex,
              " has no single-byte token in model.vocab, so it cannot be encoded");
    }
    symbols[i] = {id, i - 1, i + 1 < n ? i + 1 : -1};
  }
  // Min-heap of candidate merges by (rank, position): the leftmost lowest-rank pair goes first.
  using Candidate = std::pair<int32_t, int32_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = m.merges.find(pair_key(symbols[pos].id, symbols[next].id));
    if (it != m.merges.end()) heap.emplace(it->second.rank, pos);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [rank, pos] = heap.top();
    heap.pop();
    Symbol& left = symbols[pos];
    if (left.id < 0 || left.next < 0) continue;  // merged away, or now last
    auto it = m.merges.find(pair_key(left.id, symbols[left.next].id));
    if (it == m.merges.end() || it->second.rank != rank) continue;  // the pair changed
    Symbol& right = symbols[left.next];
    left.id = it->second.id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = pos;
    right.id = -1;
    if (left.prev >= 0) push(left.prev);
    push(pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

int32_t BpeTokenizer::check_id(int32_t id) const {
  MT_CHECK(id >= 0 && id < vocab_size() && impl_->id_valid[id], "BpeTokenizer: unknown token id ",
           id, " (", spec_.source, " has ", vocab_size(), " ids)");
  return id;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  size_t bytes = 0;
  for (int32_t id : ids) bytes += impl_->id_bytes[check_id(id)].size();
  out.reserve(bytes);
  for (int32_t id : ids) out += impl_->id_bytes[id];
  return out;
}

std::string BpeTokenizer::decode_model_output(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    const bool known = id >= 0 && id < vocab_size() && impl_->id_valid[size_t(id)];
    out += known ? impl_->id_bytes[size_t(id)] : "<|id " + std::to_string(id) + "|>";
  }
  return out;
}

int32_t BpeTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_bytes.size()); }

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(absl_key(token)); it != impl_->added_ids.end())
    return it->second;
  const std::optional<std::string> bytes = byte_level_to_bytes(token);
  if (!bytes) return std::nullopt;
  auto it = impl_->vocab_ids.find(*bytes);
  if (it == impl_->vocab_ids.end()) return std::nullopt;
  return it->second;
}

std::string BpeTokenizer::id_to_token(int32_t id) const {
  check_id(id);
  if (impl_->id_added[id]) return impl_->id_bytes[id];
  return bytes_to_byte_level(impl_->id_bytes[id]);
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  return impl_->id_bytes[check_id(id)];
}

std::string BpeTokenizer::fingerprint() const {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, 64-bit
  auto mix = [&](std::string_view s) {
    for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  };
  auto mix_int = [&](int64_t v) { mix(std::to_string(v) + ";"); };
  mix(pretokenizer_name(spec_.pretokenizer));
  mix_int(spec_.add_prefix_space);
  mix_int(spec_.ignore_merges);
  mix_int(static_cast<int64_t>(spec_.vocab.size()));
  for (const std::string& t : spec_.vocab) mix_int(static_cast<int64_t>(t.size())), mix(t);
  for (const auto& [a, b] : spec_.merges) mix_int(a), mix_int(b);
  for (const AddedToken& t : spec_.added_tokens) {
    mix_int(t.id), mix_int(static_cast<int64_t>(t.content.size())), mix(t.content);
    mix_int(t.single_word * 4 + t.lstrip * 2 + t.rstrip);
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace mt::data
