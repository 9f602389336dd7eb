#include "tests/testing/trainer_fixtures.h"

#include <fstream>
#include <string>

#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/bpe_trainer.h"
#include "models/llama/model_args.h"
#include "models/moe/model_args.h"

namespace mt::testing {

void save_small_tokenizer(const std::filesystem::path& corpus, const std::filesystem::path& dir) {
  std::ifstream in(corpus, std::ios::binary);
  std::string text(200000, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  data::BpeTrainer trainer({.vocab_size = 512});
  trainer.add_text(text);
  data::BpeTokenizer(trainer.train()).save(dir);
}

void shrink_llama(std::any& model_args) {
  auto& a = std::any_cast<models::llama::ModelArgs&>(model_args);
  a.dim = 64;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.multiple_of = 32;
}

void shrink_moe(std::any& model_args) {
  auto& a = std::any_cast<models::moe::ModelArgs&>(model_args);
  a.n_layers = 3;
  a.moe_inter_dim = 32;
}

}  // namespace mt::testing
