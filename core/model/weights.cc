#include "core/model/weights.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <cstring>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/util/numeric.h"
#include "kernels/bf16.h"
#include "kernels/model_ops.h"
#include "kernels/ops.h"

namespace k3 {
namespace {

kernels::Bf16Matrix AsBf16(const Matrix& w) {
  return {{static_cast<const uint16_t*>(w.data), w.rows * w.cols}, w.rows, w.cols};
}
kernels::F32Matrix AsF32(const Matrix& w) {
  return {{static_cast<const float*>(w.data), w.rows * w.cols}, w.rows, w.cols};
}

}  // namespace

void MatMulRows(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
                size_t row_begin, size_t row_end) {
  if (w.dtype == DType::kBF16) {
    kernels::Bf16MatMul(AsBf16(w), x, tokens, y, row_begin, row_end);
  } else {
    kernels::F32MatMul(AsF32(w), x, tokens, y, row_begin, row_end);
  }
}

namespace {

void ResidentMatMul(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y) {
  tbb::parallel_for(
      tbb::blocked_range<size_t>(0, w.rows, kMatMulRowsPerTask),
      [&](const tbb::blocked_range<size_t>& r) { MatMulRows(w, x, tokens, y, r.begin(), r.end()); },
      tbb::simple_partitioner());
}

// Y's columns [first, first + rows) for the product of those rows, `part` [tokens, rows].
void CopyColumns(std::span<const float> part, size_t tokens, size_t rows, size_t first,
                 size_t y_rows, std::span<float> y) {
  for (size_t t = 0; t < tokens; ++t) {
    std::copy_n(part.data() + t * rows, rows, y.data() + t * y_rows + first);
  }
}

// A piece still compressed: each block is decoded into this thread's scratch and multiplied at
// once, while its rows are in the cache, so the decoded piece never goes to memory and back.
void CompressedPieceMatMul(const Matrix& w, int64_t index, const RowPiece& piece,
                           std::span<const float> x, size_t tokens, std::span<float> y) {
  tbb::parallel_for(size_t{0}, piece.blocks(), [&](size_t b) {
    thread_local std::vector<uint16_t> rows;
    thread_local std::vector<float> part;
    const size_t first = piece.row_begin + piece.block_row_begin[b];
    const size_t n = piece.block_row_begin[b + 1] - piece.block_row_begin[b];
    rows.resize(n * w.cols);
    const std::span<uint8_t> bytes(reinterpret_cast<uint8_t*>(rows.data()), rows.size() * 2);
    if (!w.source->DecodeBlock(index, b, bytes).ok()) return;  // the source keeps the error
    const Matrix m{DType::kBF16, rows.data(), n, w.cols};
    if (tokens == 1) {
      MatMulRows(m, x, 1, y.subspan(first, n), 0, n);
      return;
    }
    part.resize(tokens * n);
    MatMulRows(m, x, tokens, part, 0, n);
    CopyColumns(part, tokens, n, first, w.rows, y);
  });
}

// Piece by piece, each as soon as it is in. A piece's rows are a matrix of their own, so its
// products land in a scratch [tokens, piece rows] and are copied to their columns of y (for one
// token the columns are contiguous and the product goes straight there).
void StreamedMatMul(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y) {
  std::vector<float> part;
  for (int64_t i = 0; i < w.pieces; ++i) {
    const int64_t index = w.first_piece + i;
    auto piece = w.source->AcquirePiece(index, PieceForm::kStoredIfCompressed);
    if (!piece.ok()) continue;  // the source keeps the error; the layer fails
    const Matrix& m = piece->rows;
    if (piece->compressed()) {
      CompressedPieceMatMul(w, index, *piece, x, tokens, y);
    } else if (tokens == 1) {
      ResidentMatMul(m, x, 1, y.subspan(piece->row_begin, m.rows));
    } else {
      part.resize(tokens * m.rows);
      ResidentMatMul(m, x, tokens, part);
      CopyColumns(part, tokens, m.rows, piece->row_begin, w.rows, y);
    }
    w.source->ReleasePiece(index);
  }
}

}  // namespace

void MatMul(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y) {
  if (w.streamed()) {
    StreamedMatMul(w, x, tokens, y);
  } else {
    ResidentMatMul(w, x, tokens, y);
  }
}

WholeMatrix::WholeMatrix(const Matrix& w) : w_(w) {
  if (!w.streamed()) {
    view_ = w;
    return;
  }
  auto piece = w.pieces == 1 ? w.source->AcquirePiece(w.first_piece, PieceForm::kDecoded)
                             : absl::InternalError("a row-by-row matrix must be one piece");
  if (piece.ok()) view_ = piece->rows;
}

WholeMatrix::~WholeMatrix() {
  if (w_.streamed() && loaded()) w_.source->ReleasePiece(w_.first_piece);
}

void RowToFloat(const Matrix& w, size_t row, std::span<float> out) {
  if (w.dtype == DType::kBF16) {
    kernels::Bf16ToF32({static_cast<const uint16_t*>(w.data) + row * w.cols, w.cols}, out);
  } else {
    std::memcpy(out.data(), static_cast<const float*>(w.data) + row * w.cols, w.cols * 4);
  }
}

float RowDot(const Matrix& w, size_t row, std::span<const float> x) {
  if (w.dtype == DType::kF32) {
    return kernels::Dot({static_cast<const float*>(w.data) + row * w.cols, w.cols}, x);
  }
  thread_local std::vector<float> buf;
  buf.resize(w.cols);
  RowToFloat(w, row, buf);
  return kernels::Dot(buf, x);
}

void RowAxpy(const Matrix& w, size_t row, float alpha, std::span<float> y) {
  if (w.dtype == DType::kF32) {
    kernels::Axpy(alpha, {static_cast<const float*>(w.data) + row * w.cols, w.cols}, y);
    return;
  }
  thread_local std::vector<float> buf;
  buf.resize(w.cols);
  RowToFloat(w, row, buf);
  kernels::Axpy(alpha, buf, y);
}

namespace {

// Floats from a tensor's stored bytes (F32, BF16 or F16).
std::vector<float> ToFloats(const TensorInfo& t, std::span<const uint8_t> raw) {
  std::vector<float> out(t.elements());
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::kF32) {
      std::memcpy(&out[i], &raw[4 * i], 4);
    } else if (t.dtype == DType::kBF16) {
      out[i] = BF16ToFloat(static_cast<uint16_t>(raw[2 * i] | (raw[2 * i + 1] << 8)));
    } else {
      out[i] = HalfToFloat(static_cast<uint16_t>(raw[2 * i] | (raw[2 * i + 1] << 8)));
    }
  }
  return out;
}

class TrunkLoader {
 public:
  TrunkLoader(const Checkpoint& ckpt, const TrunkResidency& residency, TrunkWeights& out,
              const std::function<void(uint64_t, uint64_t)>& progress)
      : ckpt_(ckpt), residency_(residency), out_(out), progress_(progress) {
    uint64_t arena_bytes = 0;
    for (const TensorSpec& spec : TrunkTensorSpecs(ckpt.config(), ckpt.names())) {
      const TensorInfo* t = ckpt.Find(spec.name);
      if (t == nullptr) continue;  // Checkpoint::Open has refused checkpoints missing tensors
      if (IsResident(residency, spec) && !(residency.held && residency.held(*t))) {
        total_ += t->byte_size;
        if (InArena(*t)) arena_bytes += io::BufferBytesFor(t->file_offset, t->byte_size);
      } else {
        streamed_.insert(t);
      }
    }
    if (arena_bytes == 0) return;
    // Without one (no memory to map), every matrix goes to a vector as before.
    if (auto arena = io::BufferArena::Create(arena_bytes); arena.ok()) {
      out_.arena = *std::move(arena);
    }
  }

  absl::Status status() const { return status_; }
  uint64_t bytes() const { return bytes_; }

  // A matrix: BF16 and F32 kept as stored, F16 widened to F32; or the handle of a streamed one.
  Matrix Mat(const std::string& name) {
    const TensorInfo* t = ckpt_.Find(name);
    if (t != nullptr && streamed_.contains(t)) {
      if (!residency_.stream) {
        Check(absl::InternalError(absl::StrCat(name, " is streamed or held but has no source")));
        return {};
      }
      return residency_.stream(*t);
    }
    if (t != nullptr && InArena(*t)) {
      if (std::optional<Matrix> m = ArenaMat(*t)) return *m;
    }
    std::vector<uint8_t> owned;
    if (!Read(name, owned, t)) return {};
    Matrix m{t->dtype, owned.data(), static_cast<size_t>(t->shape[0]),
             static_cast<size_t>(t->elements() / t->shape[0])};
    if (t->dtype == DType::kF16) {
      std::vector<float> wide = ToFloats(*t, owned);
      owned.resize(wide.size() * 4);
      std::memcpy(owned.data(), wide.data(), owned.size());
      m.data = owned.data();
      m.dtype = DType::kF32;
    }
    out_.storage.push_back(std::move(owned));
    bytes_ += m.rows * m.cols * (m.dtype == DType::kBF16 ? 2 : 4);
    return m;
  }

  std::vector<float> Vec(const std::string& name) {
    std::vector<uint8_t> owned;
    const TensorInfo* t = nullptr;
    if (!Read(name, owned, t)) return {};
    bytes_ += t->elements() * 4;
    return ToFloats(*t, owned);
  }

  // Norm weight times projection (AttnRes keys, MODEL.md 2.2).
  std::vector<float> Fold(const std::string& norm, const std::string& proj) {
    std::vector<float> g = Vec(norm), w = Vec(proj);
    for (size_t i = 0; i < g.size() && i < w.size(); ++i) g[i] *= w[i];
    return g;
  }

 private:
  // The large matrices kept as stored go to the arena, read with O_DIRECT: zeroing a vector
  // page by page and copying into it from the page cache made a cold start with a 2.3 GB
  // layer resident take 18 s (4 s this way, docs/PERFORMANCE.md); the arena is mapped with huge
  // pages and nothing is copied. A tensor at an odd offset (safetensors allows it) keeps the
  // aligned copy of a vector.
  static bool InArena(const TensorInfo& t) {
    return t.shape.size() == 2 && t.dtype != DType::kF16 && t.byte_size >= kArenaMinBytes &&
           t.file_offset % 8 == 0;
  }
  static constexpr uint64_t kArenaMinBytes = 1 << 20;

  // nullopt when there is no room (the arena could not be mapped, or a matrix is asked for
  // twice): the caller then reads it into a vector.
  std::optional<Matrix> ArenaMat(const TensorInfo& t) {
    if (out_.arena == nullptr) return std::nullopt;
    const uint64_t need = io::BufferBytesFor(t.file_offset, t.byte_size);
    std::span<uint8_t> slot = out_.arena->Slice(arena_used_, need);
    if (slot.empty()) return std::nullopt;
    arena_used_ += need;
    auto bytes = ckpt_.ReadTensorDirect(t, slot);
    if (!bytes.ok()) {
      Check(bytes.status());
      return Matrix{};
    }
    if (progress_) progress_(done_ += t.byte_size, total_);
    bytes_ += t.byte_size;
    return Matrix{t.dtype, bytes->data(), static_cast<size_t>(t.shape[0]),
                  static_cast<size_t>(t.elements() / t.shape[0])};
  }

  bool Read(const std::string& name, std::vector<uint8_t>& owned, const TensorInfo*& t) {
    t = ckpt_.Find(name);
    if (t == nullptr) {
      Check(absl::NotFoundError(absl::StrCat("tensor ", name, " is missing")));
      return false;
    }
    owned.resize(t->byte_size);
    if (absl::Status s = ckpt_.ReadTensor(*t, owned); !s.ok()) {
      Check(s);
      t = nullptr;
      return false;
    }
    if (progress_) progress_(done_ += t->byte_size, total_);
    return true;
  }
  void Check(const absl::Status& s) {
    if (status_.ok() && !s.ok()) status_ = s;
  }

  const Checkpoint& ckpt_;
  const TrunkResidency& residency_;
  TrunkWeights& out_;
  uint64_t arena_used_ = 0;
  const std::function<void(uint64_t, uint64_t)> progress_;
  absl::flat_hash_set<const TensorInfo*> streamed_;
  absl::Status status_;
  uint64_t total_ = 0;
  uint64_t done_ = 0;
  uint64_t bytes_ = 0;
};

namespace tn = tensor_name;

void LoadAttention(const ModelConfig& c, int64_t l, const TensorNames& n, TrunkLoader& ld,
                   LayerWeights& lw) {
  auto name = [&](std::string_view suffix) { return n.Layer(l, suffix); };
  if (c.attention_kind(l) == AttentionKind::kKda) {
    KdaWeights& k = lw.kda;
    k.q = ld.Mat(name(tn::kKdaQ));
    k.k = ld.Mat(name(tn::kKdaK));
    k.v = ld.Mat(name(tn::kKdaV));
    k.f_a = ld.Mat(name(tn::kKdaFA));
    k.f_b = ld.Mat(name(tn::kKdaFB));
    k.b = ld.Mat(name(tn::kKdaB));
    k.g = ld.Mat(name(tn::kAttnGate));
    k.o = ld.Mat(name(tn::kAttnOut));
    k.q_conv = ld.Vec(name(tn::kKdaQConv));
    k.k_conv = ld.Vec(name(tn::kKdaKConv));
    k.v_conv = ld.Vec(name(tn::kKdaVConv));
    k.a_log = ld.Vec(name(tn::kKdaALog));
    k.a_log.resize(c.kda_num_heads);  // the release ships head_dim entries; one per head is used
    k.dt_bias = ld.Vec(name(tn::kKdaDtBias));
    k.o_norm = ld.Vec(name(tn::kKdaONorm));
  } else {
    MlaWeights& m = lw.mla;
    m.q_a = ld.Mat(name(tn::kMlaQA));
    m.q_b = ld.Mat(name(tn::kMlaQB));
    m.kv_a = ld.Mat(name(tn::kMlaKvA));
    m.kv_b = ld.Mat(name(tn::kMlaKvB));
    if (c.mla_use_output_gate) m.g = ld.Mat(name(tn::kAttnGate));
    m.o = ld.Mat(name(tn::kAttnOut));
    m.q_a_norm = ld.Vec(name(tn::kMlaQANorm));
    m.kv_a_norm = ld.Vec(name(tn::kMlaKvANorm));
  }
}

void LoadRouter(const ModelConfig& c, int64_t l, const TensorNames& n, TrunkLoader& ld,
                MoeWeights& m) {
  if (c.is_dense(l)) return;
  m.router = ld.Mat(n.Layer(l, tn::kRouter));
  m.router_bias = ld.Vec(n.Layer(l, tn::kRouterBias));
}

void LoadFfn(const ModelConfig& c, int64_t l, const TensorNames& n, TrunkLoader& ld,
             LayerWeights& lw) {
  if (c.is_dense(l)) {
    lw.dense.gate = ld.Mat(n.Layer(l, tn::kDenseGate));
    lw.dense.up = ld.Mat(n.Layer(l, tn::kDenseUp));
    lw.dense.down = ld.Mat(n.Layer(l, tn::kDenseDown));
    return;
  }
  MoeWeights& m = lw.moe;
  m.latent_down = ld.Mat(n.Layer(l, tn::kLatentDown));
  m.latent_norm = ld.Vec(n.Layer(l, tn::kLatentNorm));
  m.latent_up = ld.Mat(n.Layer(l, tn::kLatentUp));
  if (c.num_shared_experts > 0) {
    m.shared_gate = ld.Mat(n.Layer(l, tn::kSharedGate));
    m.shared_up = ld.Mat(n.Layer(l, tn::kSharedUp));
    m.shared_down = ld.Mat(n.Layer(l, tn::kSharedDown));
  }
}

// Everything of layer l but its router.
void LoadLayer(const ModelConfig& c, int64_t l, const TensorNames& n, TrunkLoader& ld,
               LayerWeights& lw) {
  lw.input_norm = ld.Vec(n.Layer(l, tn::kInputNorm));
  lw.post_norm = ld.Vec(n.Layer(l, tn::kPostAttentionNorm));
  lw.attn_res_fold = ld.Fold(n.Layer(l, tn::kAttnResNorm), n.Layer(l, tn::kAttnResProj));
  lw.mlp_res_fold = ld.Fold(n.Layer(l, tn::kMlpResNorm), n.Layer(l, tn::kMlpResProj));
  LoadAttention(c, l, n, ld, lw);
  LoadFfn(c, l, n, ld, lw);
}

}  // namespace

bool IsResident(const TrunkResidency& r, const TensorSpec& spec) {
  if (spec.role == TensorRole::kVector) return true;
  switch (spec.group) {
    case TensorGroup::kEmbedding:
      return r.embedding;
    case TensorGroup::kLmHead:
      return r.lm_head;
    case TensorGroup::kRouter:
      if (r.routers) return true;
      break;
    default:
      break;
  }
  return spec.layer < 0 || r.layers.empty() || r.layers[spec.layer];
}

absl::StatusOr<std::unique_ptr<TrunkWeights>> LoadTrunkWeights(
    const Checkpoint& ckpt, const std::function<void(uint64_t, uint64_t)>& progress,
    const TrunkResidency& residency) {
  const ModelConfig& c = ckpt.config();
  const TensorNames& n = ckpt.names();
  auto out = std::make_unique<TrunkWeights>();
  TrunkLoader ld(ckpt, residency, *out, progress);
  const std::string embed = n.Global(tn::kEmbedding);
  if (residency.embedding) {
    out->embed = ld.Mat(embed);
  } else if (const TensorInfo* t = ckpt.Find(embed); t != nullptr) {
    // Only the shape: rows are read on demand.
    out->embed = {t->dtype, nullptr, static_cast<size_t>(t->shape[0]),
                  static_cast<size_t>(t->elements() / t->shape[0])};
  }
  out->lm_head = ld.Mat(n.Global(tn::kLmHead));
  out->final_norm = ld.Vec(n.Global(tn::kFinalNorm));
  out->output_res_fold = ld.Fold(n.Global(tn::kOutputResNorm), n.Global(tn::kOutputResProj));
  out->layers.resize(c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LoadRouter(c, l, n, ld, out->layers[l].moe);
    LoadLayer(c, l, n, ld, out->layers[l]);
  }
  if (!ld.status().ok()) return ld.status();
  out->bytes = ld.bytes();
  return out;
}

}  // namespace k3
