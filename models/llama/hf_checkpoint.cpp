// Llama <-> Hugging Face conversion (see hf_checkpoint.h).
#include "models/llama/hf_checkpoint.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"

namespace mt::models::llama {

using runtime::Tensor;
using Json = nlohmann::json;

namespace {

struct NamePair {
  std::string ours, hf;
  int rope_heads = 0;  // > 0: rows permuted for rotate_half with this many heads
};

std::vector<NamePair> name_pairs(const ModelArgs& a) {
  std::vector<NamePair> p = {{"tok_embeddings.weight", "model.embed_tokens.weight"},
                             {"norm.weight", "model.norm.weight"}};
  if (!a.tie_embeddings) p.push_back({"output.weight", "lm_head.weight"});
  for (int64_t l = 0; l < a.n_layers; ++l) {
    const std::string o = "layers." + std::to_string(l) + ".";
    const std::string h = "model.layers." + std::to_string(l) + ".";
    p.push_back({o + "attention.wq.weight", h + "self_attn.q_proj.weight", int(a.n_heads)});
    p.push_back({o + "attention.wk.weight", h + "self_attn.k_proj.weight", int(a.kv_heads())});
    p.push_back({o + "attention.wv.weight", h + "self_attn.v_proj.weight"});
    p.push_back({o + "attention.wo.weight", h + "self_attn.o_proj.weight"});
    p.push_back({o + "feed_forward.w1.weight", h + "mlp.gate_proj.weight"});
    p.push_back({o + "feed_forward.w3.weight", h + "mlp.up_proj.weight"});
    p.push_back({o + "feed_forward.w2.weight", h + "mlp.down_proj.weight"});
    p.push_back({o + "attention_norm.weight", h + "input_layernorm.weight"});
    p.push_back({o + "ffn_norm.weight", h + "post_attention_layernorm.weight"});
  }
  return p;
}

runtime::Shape expected_shape(const std::string& ours, const ModelArgs& a) {
  const int64_t d = a.dim, hd = a.head_dim(), kv = a.kv_heads() * hd, f = a.ffn_hidden_dim();
  auto ends = [&](const char* s) { return ours.ends_with(s); };
  if (ours == "tok_embeddings.weight" || ours == "output.weight") return {a.vocab_size, d};
  if (ends("norm.weight")) return {d};
  if (ends("wq.weight")) return {a.n_heads * hd, d};
  if (ends("wk.weight") || ends("wv.weight")) return {kv, d};
  if (ends("wo.weight")) return {d, a.n_heads * hd};
  if (ends("w1.weight") || ends("w3.weight")) return {f, d};
  return {d, f};  // w2
}

// Interleaved pairs -> halves per head (to_hf), or back.
Tensor permute_rope(const Tensor& w, int64_t heads, bool to_halves) {
  const int64_t rows = w.size(0), cols = w.size(1), half = rows / heads / 2;
  if (to_halves) return w.reshape({heads, half, 2, cols}).transpose(1, 2).reshape({rows, cols});
  return w.reshape({heads, 2, half, cols}).transpose(1, 2).reshape({rows, cols});
}

Weights convert(const Weights& in, const ModelArgs& a, bool to_hf_names) {
  Weights out;
  for (const NamePair& p : name_pairs(a)) {
    const std::string& from = to_hf_names ? p.ours : p.hf;
    const std::string& to = to_hf_names ? p.hf : p.ours;
    auto it = in.find(from);
    MT_CHECK(it != in.end(), "llama weights: tensor ", from, " is missing");
    const runtime::Shape want = expected_shape(p.ours, a);
    MT_CHECK(it->second.shape() == want, "llama weights: tensor ", from, " has shape ",
             it->second.shape(), ", the model's args give ", want);
    out[to] = p.rope_heads > 0 ? permute_rope(it->second, p.rope_heads, to_hf_names).contiguous()
                               : it->second;
  }
  for (const auto& [name, t] : in) {
    bool known = false;
    for (const NamePair& p : name_pairs(a)) known = known || (to_hf_names ? p.ours : p.hf) == name;
    MT_CHECK(known || (!to_hf_names && name == "lm_head.weight" && a.tie_embeddings),
             "llama weights: unexpected tensor ", name, " (not part of a ", a.n_layers,
             "-layer Llama)");
  }
  return out;
}

template <class T>
T get(const Json& j, const char* key, const std::string& where) {
  MT_CHECK(j.contains(key) && !j[key].is_null(), where, ": missing key \"", key, "\"");
  try {
    return j[key].get<T>();
  } catch (const std::exception& e) {
    MT_FAIL(where, ": key \"", key, "\" has the wrong type: ", e.what());
  }
}

}  // namespace

Weights to_hf(const Weights& ours, const ModelArgs& args) { return convert(ours, args, true); }
Weights from_hf(const Weights& hf, const ModelArgs& args) { return convert(hf, args, false); }

std::string hf_config_json(const ModelArgs& a, const std::string& torch_dtype) {
  Json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", a.dim},
            {"intermediate_size", a.ffn_hidden_dim()},
            {"num_attention_heads", a.n_heads},
            {"num_key_value_heads", a.kv_heads()},
            {"num_hidden_layers", a.n_layers},
            {"head_dim", a.head_dim()},
            {"hidden_act", "silu"},
            {"rms_norm_eps", a.norm_eps},
            {"rope_theta", a.rope_theta},
            {"vocab_size", a.vocab_size},
            {"max_position_embeddings", a.max_position_embeddings},
            {"tie_word_embeddings", a.tie_embeddings},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"torch_dtype", torch_dtype}};
  if (a.rope_scaling) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", a.rope_scaling->factor},
        {"low_freq_factor", a.rope_scaling->low_freq_factor},
        {"high_freq_factor", a.rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", a.rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j.dump(2) + "\n";
}

ModelArgs args_from_hf_config(const std::filesystem::path& path) {
  const std::string where = "config " + path.string();
  std::ifstream in(path);
  MT_CHECK(bool(in), where, ": cannot be opened");
  return args_from_hf_config_text(std::string(std::istreambuf_iterator<char>(in), {}), where);
}

ModelArgs args_from_hf_config_text(const std::string& text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception& e) {
    MT_FAIL(where, ": not valid JSON: ", e.what());
  }
  MT_CHECK(get<std::string>(j, "model_type", where) == "llama", where,
           ": model_type is not \"llama\"");
  // What minititan's Llama cannot represent is refused rather than imported wrongly.
  MT_CHECK(j.value("hidden_act", "silu") == "silu", where, ": hidden_act ", j["hidden_act"].dump(),
           " is not supported (silu only)");
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    MT_CHECK(!j.value(bias, false), where, ": ", bias, " is true; minititan's Llama has no biases");
  }
  ModelArgs a;
  a.dim = get<int64_t>(j, "hidden_size", where);
  a.n_layers = get<int64_t>(j, "num_hidden_layers", where);
  a.n_heads = get<int64_t>(j, "num_attention_heads", where);
  a.n_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                     ? get<int64_t>(j, "num_key_value_heads", where)
                     : a.n_heads;
  a.vocab_size = get<int64_t>(j, "vocab_size", where);
  a.norm_eps = get<double>(j, "rms_norm_eps", where);
  a.max_position_embeddings = get<int64_t>(j, "max_position_embeddings", where);
  a.max_seq_len = a.max_position_embeddings;
  a.tie_embeddings = j.value("tie_word_embeddings", false);
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    MT_CHECK(get<int64_t>(j, "head_dim", where) * a.n_heads == a.dim, where,
             ": head_dim x num_attention_heads must equal hidden_size (minititan's Llama)");
  }
  // The FFN size as given: multiple_of = intermediate_size makes ffn_hidden_dim() round to it.
  const int64_t ffn = get<int64_t>(j, "intermediate_size", where);
  const int64_t base = 2 * 4 * a.dim / 3;
  a.multiple_of = ffn;
  a.ffn_dim_multiplier = double(ffn) / double(base);
  // RoPE: transformers >= 5 saves rope_parameters {rope_type, rope_theta, scaling fields}; earlier
  // versions rope_theta beside rope_scaling (null, or {rope_type or type, fields}). Absent:
  // LlamaConfig's defaults, theta 10000 without scaling. Scaling: llama3 only.
  const bool v5 = j.contains("rope_parameters") && !j["rope_parameters"].is_null();
  const std::string rwhere = where + (v5 ? ", rope_parameters" : ", rope_scaling");
  const Json rope = v5 ? j["rope_parameters"] : j.value("rope_scaling", Json(nullptr));
  MT_CHECK(rope.is_null() || rope.is_object(), rwhere, ": expected an object, found ", rope.dump());
  if (v5) {
    a.rope_theta = get<double>(rope, "rope_theta", rwhere);
  } else {
    a.rope_theta = j.contains("rope_theta") ? get<double>(j, "rope_theta", where) : 10000.0;
  }
  a.rope_scaling = std::nullopt;
  const std::string type =
      rope.is_null() ? "default" : rope.value("rope_type", rope.value("type", "default"));
  if (type != "default") {
    MT_CHECK(type == "llama3", rwhere, ": rope_type \"", type,
             "\" is not supported (default or llama3)");
    runtime::RopeScaling r;
    r.factor = get<double>(rope, "factor", rwhere);
    r.low_freq_factor = get<double>(rope, "low_freq_factor", rwhere);
    r.high_freq_factor = get<double>(rope, "high_freq_factor", rwhere);
    r.original_max_position_embeddings =
        get<int64_t>(rope, "original_max_position_embeddings", rwhere);
    a.rope_scaling = r;
  }
  a.validate();
  MT_CHECK(a.ffn_hidden_dim() == ffn, where, ": intermediate_size ", ffn,
           " cannot be represented (got ", a.ffn_hidden_dim(), ")");
  return a;
}

}  // namespace mt::models::llama
