#include "data/tokenizer/bpe_trainer.h"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <fstream>
#include <queue>
#include <set>

#include "data/tokenizer/absl_key.h"
#include "data/tokenizer/byte_level.h"
#include "data/tokenizer/utf8.h"
#include "runtime/core/error.h"

namespace mt::data {
namespace {

constexpr int kByteTokens = 256;
constexpr size_t kFileChunkBytes = size_t{1} << 20;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t pair_left(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t pair_right(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

// Heap entry: the most frequent pair first, then the smaller (left, right) ids.
struct PairEntry {
  int64_t count;
  uint64_t pair;
  bool operator<(const PairEntry& o) const {
    return count != o.count ? count < o.count : pair > o.pair;
  }
};

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

}  // namespace

struct BpeTrainer::Counts {
  AddedTokenMatcher specials;
  absl::flat_hash_map<std::string, int64_t> words;
  std::vector<std::string_view> pieces;  // scratch
};

BpeTrainer::BpeTrainer(BpeTrainerOptions options)
    : options_(std::move(options)), counts_(new Counts) {
  const auto& specials = options_.special_tokens;
  MT_CHECK(options_.vocab_size >= kByteTokens + static_cast<int64_t>(specials.size()),
           "BpeTrainer: vocab_size ", options_.vocab_size, " is too small: it must hold the ",
           kByteTokens, " byte tokens and the ", specials.size(), " special tokens");
  std::set<std::string> seen;
  std::vector<AddedToken> added;
  for (const std::string& s : specials) {
    MT_CHECK(!s.empty(), "BpeTrainer: a special token is empty");
    MT_CHECK(is_valid_utf8(s), "BpeTrainer: special token \"", s, "\" is not valid UTF-8");
    MT_CHECK(seen.insert(s).second, "BpeTrainer: special token \"", s, "\" is listed twice");
    added.push_back(AddedToken{.id = static_cast<int32_t>(added.size()), .content = s});
  }
  for (const auto* token : {&options_.bos_token, &options_.eos_token}) {
    MT_CHECK(!*token || seen.count(**token), "BpeTrainer: bos/eos token \"", token->value_or(""),
             "\" is not one of the special tokens ", specials);
  }
  MT_CHECK(options_.min_frequency >= 1, "BpeTrainer: min_frequency must be >= 1, got ",
           options_.min_frequency);
  counts_->specials = AddedTokenMatcher(added);
}

BpeTrainer::~BpeTrainer() = default;

void BpeTrainer::add_text(std::string_view text) {
  Counts& c = *counts_;
  c.specials.split(
      text,
      [&](std::string_view segment) {
        c.pieces.clear();
        pretokenize(segment, options_.pretokenizer, c.pieces);
        for (std::string_view piece : c.pieces) {
          auto it = c.words.find(absl_key(piece));
          if (it != c.words.end()) {
            ++it->second;
          } else {
            c.words.emplace(std::string(piece), 1);
          }
        }
      },
      [](int32_t) {});
}

void BpeTrainer::add_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "BpeTrainer: cannot open ", path.string());
  std::string buffer;
  std::vector<char> chunk(kFileChunkBytes);
  while (true) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const std::streamsize got = in.gcount();
    buffer.append(chunk.data(), static_cast<size_t>(got));
    if (got == 0) break;
    // Cut after a newline followed by a printable ASCII character: neither regex puts "\n" and
    // such a character in one piece, so the pieces are those of the whole file (a special token
    // holding "\nX" could be cut in two; none of the usual ones does).
    size_t cut = std::string::npos;
    for (size_t i = buffer.size(); i-- > 1;) {
      if (buffer[i - 1] == '\n' && buffer[i] > ' ' && buffer[i] < 0x7F) {
        cut = i;
        break;
      }
    }
    if (cut == std::string::npos) continue;  // keep reading: no safe cut yet
    add_text(std::string_view(buffer).substr(0, cut));
    buffer.erase(0, cut);
  }
  MT_CHECK(in.eof(), "BpeTrainer: read error in ", path.string());
  add_text(buffer);
}

int64_t BpeTrainer::distinct_words() const { return static_cast<int64_t>(counts_->words.size()); }

TokenizerSpec BpeTrainer::train() const {
  const int32_t model_vocab =
      options_.vocab_size - static_cast<int32_t>(options_.special_tokens.size());

  // Byte tokens in GPT-2's order.
  std::vector<std::string> tokens;
  absl::flat_hash_map<std::string, int32_t> token_ids;
  std::array<int32_t, 256> byte_id{};
  for (int i = 0; i < kByteTokens; ++i) {
    const uint8_t b = byte_level_order()[i];
    tokens.emplace_back(1, static_cast<char>(b));
    token_ids.emplace(tokens.back(), i);
    byte_id[b] = i;
  }

  // Words in a fixed order (sorted), as byte-token sequences.
  std::vector<std::pair<std::string_view, int64_t>> sorted;
  sorted.reserve(counts_->words.size());
  for (const auto& [w, n] : counts_->words) sorted.emplace_back(w, n);
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [w, n] : sorted) {
    Word word{{}, n};
    word.symbols.reserve(w.size());
    for (char c : w) word.symbols.push_back(byte_id[static_cast<uint8_t>(c)]);
    words.push_back(std::move(word));
  }

  absl::flat_hash_map<uint64_t, int64_t> pair_counts;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> pair_words;  // may list stale words
  auto note_word = [&](uint64_t pair, int32_t w) {
    std::vector<int32_t>& list = pair_words[pair];
    if (list.empty() || list.back() != w) list.push_back(w);
  };
  for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) {
    const auto& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      pair_counts[k] += words[w].count;
      note_word(k, w);
    }
  }
  std::priority_queue<PairEntry> heap;
  for (const auto& [k, n] : pair_counts) heap.push({n, k});

  std::vector<std::pair<int32_t, int32_t>> merges;
  absl::flat_hash_map<uint64_t, int32_t> merged;  // pair -> its token, for pairs merged already
  std::vector<int32_t> last_visit(words.size(), -1);
  const int32_t planned = std::max(0, model_vocab - kByteTokens);
  const int32_t report_every = std::max(1, planned / 100);
  int32_t step = 0;
  absl::flat_hash_map<uint64_t, int64_t> delta;
  std::vector<int32_t> rebuilt;
  while (static_cast<int32_t>(tokens.size()) < model_vocab && !heap.empty()) {
    const PairEntry top = heap.top();
    heap.pop();
    auto count_it = pair_counts.find(top.pair);
    const int64_t current = count_it == pair_counts.end() ? 0 : count_it->second;
    if (current != top.count) {
      // Counts of existing pairs only fall, except when a reused token id creates them anew (then
      // a fresher entry with the higher count was pushed): re-queue only the fallen ones.
      if (current > 0 && current < top.count) heap.push({current, top.pair});
      continue;
    }
    if (current < options_.min_frequency) break;
    const int32_t a = pair_left(top.pair);
    const int32_t b = pair_right(top.pair);
    int32_t new_id;
    if (auto it = merged.find(top.pair); it != merged.end()) {
      new_id = it->second;  // seen again after a reused id recreated it: merge, record nothing
    } else {
      std::string bytes = tokens[a] + tokens[b];
      auto [tok_it, inserted] = token_ids.emplace(bytes, static_cast<int32_t>(tokens.size()));
      new_id = tok_it->second;
      if (inserted) tokens.push_back(std::move(bytes));
      merges.emplace_back(a, b);
      merged.emplace(top.pair, new_id);
      if (options_.on_progress && static_cast<int32_t>(merges.size()) % report_every == 0) {
        options_.on_progress(static_cast<int32_t>(tokens.size()) - kByteTokens, planned);
      }
    }

    // Apply the merge to every word holding the pair, collecting the pair count changes.
    delta.clear();
    std::vector<int32_t> holders = std::move(pair_words[top.pair]);
    pair_words.erase(top.pair);
    for (int32_t w : holders) {
      if (last_visit[w] == step) continue;
      last_visit[w] = step;
      std::vector<int32_t>& s = words[w].symbols;
      const int64_t n = words[w].count;
      rebuilt.clear();
      bool changed = false;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          rebuilt.push_back(new_id), i += 2, changed = true;
        } else {
          rebuilt.push_back(s[i]), i += 1;
        }
      }
      if (!changed) continue;  // a stale listing
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= n;
      for (size_t i = 0; i + 1 < rebuilt.size(); ++i) {
        const uint64_t k = pair_key(rebuilt[i], rebuilt[i + 1]);
        delta[k] += n;
        if (rebuilt[i] == new_id || rebuilt[i + 1] == new_id) note_word(k, w);
      }
      s.swap(rebuilt);
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_counts[k];
      c += d;
      if (d > 0) heap.push({c, k});
      if (c == 0) pair_counts.erase(k);
    }
    ++step;
  }
  if (options_.on_progress) {
    options_.on_progress(static_cast<int32_t>(tokens.size()) - kByteTokens, planned);
  }

  TokenizerSpec spec;
  spec.source = "<BpeTrainer>";
  spec.pretokenizer = options_.pretokenizer;
  spec.vocab = std::move(tokens);
  spec.merges = std::move(merges);
  for (const std::string& s : options_.special_tokens) {
    spec.added_tokens.push_back(AddedToken{
        .id = static_cast<int32_t>(spec.vocab.size() + spec.added_tokens.size()), .content = s});
  }
  spec.bos_token = options_.bos_token;
  spec.eos_token = options_.eos_token;
  return spec;
}

}  // namespace mt::data
