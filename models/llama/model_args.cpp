#include "models/llama/model_args.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "models/flavor_table.h"
#include "runtime/core/error.h"

namespace mt::models::llama {

int64_t ModelArgs::ffn_hidden_dim() const {
  int64_t hidden = 2 * (4 * dim) / 3;
  if (ffn_dim_multiplier) hidden = int64_t(*ffn_dim_multiplier * double(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

void ModelArgs::validate() const {
  MT_CHECK(dim > 0 && n_layers > 0 && n_heads > 0 && vocab_size > 0 && multiple_of > 0,
           "llama ModelArgs: expected positive dim, n_layers, n_heads, vocab_size and multiple_of, "
           "got dim ",
           dim, ", n_layers ", n_layers, ", n_heads ", n_heads, ", vocab_size ", vocab_size,
           ", multiple_of ", multiple_of);
  MT_CHECK(dim % n_heads == 0, "llama ModelArgs: dim ", dim, " is not divisible by n_heads ",
           n_heads);
  MT_CHECK(head_dim() % 2 == 0, "llama ModelArgs: RoPE needs an even head_dim, got dim ", dim,
           " / n_heads ", n_heads, " = ", head_dim());
  MT_CHECK(n_kv_heads >= 0 && n_heads % kv_heads() == 0, "llama ModelArgs: n_heads ", n_heads,
           " is not a multiple of n_kv_heads ", n_kv_heads);
  MT_CHECK(!ffn_dim_multiplier || *ffn_dim_multiplier > 0,
           "llama ModelArgs: expected ffn_dim_multiplier > 0, got ",
           ffn_dim_multiplier.value_or(0));
  MT_CHECK(norm_eps > 0, "llama ModelArgs: expected norm_eps > 0, got ", norm_eps);
  MT_CHECK(std::isfinite(rope_theta) && rope_theta > 0,
           "llama ModelArgs: expected rope_theta > 0, got ", rope_theta);
  MT_CHECK(max_seq_len > 0, "llama ModelArgs: expected max_seq_len > 0, got ", max_seq_len);
  MT_CHECK(max_position_embeddings > 0,
           "llama ModelArgs: expected max_position_embeddings > 0, got ", max_position_embeddings);
}

namespace {

std::string rope_scaling_text(const std::optional<runtime::RopeScaling>& r) {
  if (!r) return "none";
  std::ostringstream os;
  os << std::setprecision(17) << "llama3 (factor " << r->factor << ", low_freq_factor " << r->low_freq_factor
     << ", high_freq_factor " << r->high_freq_factor << ", original_max_position_embeddings "
     << r->original_max_position_embeddings << ")";
  return os.str();
}

}  // namespace

std::vector<std::string> architecture_differences(const ModelArgs& a, const std::string& a_name,
                                                  const ModelArgs& b, const std::string& b_name) {
  std::vector<std::string> out;
  auto compare = [&](const char* field, const auto& x, const auto& y) {
    if (x == y) return;
    std::ostringstream os;
    os << std::setprecision(17) << std::boolalpha << field << ": " << x << " in " << a_name << ", " << y << " in "
       << b_name;
    out.push_back(os.str());
  };
  compare("dim (hidden_size)", a.dim, b.dim);
  compare("n_layers (num_hidden_layers)", a.n_layers, b.n_layers);
  compare("n_heads (num_attention_heads)", a.n_heads, b.n_heads);
  compare("n_kv_heads (num_key_value_heads)", a.kv_heads(), b.kv_heads());
  compare("ffn hidden size (intermediate_size)", a.ffn_hidden_dim(), b.ffn_hidden_dim());
  compare("vocab_size", a.vocab_size, b.vocab_size);
  compare("norm_eps (rms_norm_eps)", a.norm_eps, b.norm_eps);
  compare("rope_theta", a.rope_theta, b.rope_theta);
  compare("rope_scaling", rope_scaling_text(a.rope_scaling), rope_scaling_text(b.rope_scaling));
  compare("tie_embeddings (tie_word_embeddings)", a.tie_embeddings, b.tie_embeddings);
  return out;
}

namespace {

using Flavor = models::Flavor<ModelArgs>;

ModelArgs make(int64_t dim, int64_t layers, int64_t heads, int64_t kv_heads,
               std::optional<double> ffn_mult, int64_t multiple_of, bool tied, double rope_factor) {
  ModelArgs a;
  a.dim = dim;
  a.n_layers = layers;
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.ffn_dim_multiplier = ffn_mult;
  a.multiple_of = multiple_of;
  a.tie_embeddings = tied;
  a.rope_scaling = runtime::RopeScaling{};
  a.rope_scaling->factor = rope_factor;
  return a;
}

const std::vector<Flavor>& flavors() {
  static const std::vector<Flavor> table = [] {
    ModelArgs debug = make(256, 6, 16, 0, std::nullopt, 256, false, 8.0);
    debug.vocab_size = 2000;
    return std::vector<Flavor>{
        {"debugmodel", debug},
        {"1B", make(2048, 16, 32, 8, 1.5, 256, true, 32.0)},
        {"3B", make(3072, 28, 24, 8, 1.0, 256, true, 32.0)},
        {"8B", make(4096, 32, 32, 8, 1.3, 1024, false, 8.0)},
        {"70B", make(8192, 80, 64, 8, 1.3, 4096, false, 8.0)},
        {"405B", make(16384, 126, 128, 8, 1.2, 4096, false, 8.0)},
    };
  }();
  return table;
}

}  // namespace

std::vector<std::string> flavor_names() { return flavor_names_of(flavors()); }

ModelArgs flavor_args(const std::string& flavor) { return find_flavor(flavors(), flavor, "llama"); }

ParamCounts count_parameters(const ModelArgs& a) {
  a.validate();
  ParamCounts c;
  const int64_t kv_dim = a.kv_heads() * a.head_dim();
  const int64_t attention = a.dim * a.dim * 2 + a.dim * kv_dim * 2;  // wq, wo; wk, wv
  const int64_t ffn = 3 * a.dim * a.ffn_hidden_dim();                // w1, w2, w3
  c.per_layer = attention + ffn + 2 * a.dim;                         // + two RMSNorm weights
  c.embedding = a.vocab_size * a.dim;
  c.output = a.tie_embeddings ? 0 : a.vocab_size * a.dim;
  c.total = c.embedding + a.n_layers * c.per_layer + a.dim + c.output;
  return c;
}

double flops_per_token(const ModelArgs& a, int64_t seq_len) {
  MT_CHECK(seq_len > 0, "llama flops_per_token: expected seq_len > 0, got ", seq_len);
  const ParamCounts c = count_parameters(a);
  const double n =
      double(c.total - c.embedding + a.vocab_size * a.dim * (a.tie_embeddings ? 1 : 0));
  return 6.0 * n +
         12.0 * double(a.n_layers) * double(a.n_heads) * double(a.head_dim()) * double(seq_len);
}

}  // namespace mt::models::llama
