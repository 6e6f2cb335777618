// The trunk's weights in memory (everything but routed experts), as views the kernels take.
// BF16 matrices stay BF16; F16 ones are widened to F32 once at load (exactly); small vectors
// are held as fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "io/aligned_buffer.h"
#include "kernels/ops.h"

namespace k3 {

using kernels::kMatMulRowsPerTask;

class PieceSource;

// A row-major matrix [rows, cols] of BF16 or F32 values: resident (`data`), or streamed, its
// rows arriving as pieces [first_piece, first_piece + pieces) of `source` (the trunk streamer
// reads them into a ring of slots in the order the forward pass multiplies them).
struct Matrix {
  DType dtype = DType::kBF16;
  const void* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
  PieceSource* source = nullptr;
  int64_t first_piece = 0;
  int64_t pieces = 0;

  bool present() const { return data != nullptr || source != nullptr; }
  bool streamed() const { return source != nullptr; }
};

// Consecutive rows of a streamed matrix, resident while held: decoded, or still in the blocks
// of a compressed pack when the product asked for that (PieceForm::kStoredIfCompressed), in
// which case `rows.data` is null and the product decodes block by block
// (PieceSource::DecodeBlock), each multiplied while it is in the cache.
struct RowPiece {
  Matrix rows;  // resident: rows [row_begin, row_begin + rows.rows) of the whole matrix
  size_t row_begin = 0;
  // A compressed piece: block b holds its rows [block_row_begin[b], block_row_begin[b + 1]).
  std::span<const size_t> block_row_begin = {};
  bool compressed() const { return rows.data == nullptr; }
  size_t blocks() const { return block_row_begin.empty() ? 0 : block_row_begin.size() - 1; }
};

enum class PieceForm {
  kDecoded,             // rows in memory (a row-by-row user, WholeMatrix)
  kStoredIfCompressed,  // a compressed piece not decoded yet comes as its blocks (a product)
};

class PieceSource {
 public:
  virtual ~PieceSource() = default;
  // Blocks until piece `index` is in memory; valid until ReleasePiece(index). Any thread. A
  // failure is also kept for TakeError, so that code without a status to return (a product in
  // the middle of a layer) may skip the rows and let the layer fail as a whole.
  virtual absl::StatusOr<RowPiece> AcquirePiece(int64_t index, PieceForm form) = 0;
  // Of a compressed piece held: checks block `block` and decodes its rows into `out` (BF16).
  // Any thread, several blocks at once; a failure is kept for TakeError too.
  virtual absl::Status DecodeBlock(int64_t index, size_t block, std::span<uint8_t> out) = 0;
  virtual void ReleasePiece(int64_t index) = 0;
  // The first error since the last call (OK if none).
  virtual absl::Status TakeError() = 0;
};

// A resident view of a whole matrix for row-by-row use (MLA's kv_b): a resident matrix as it
// is, a streamed one (which the plan keeps to a single piece) held while the view lives.
class WholeMatrix {
 public:
  explicit WholeMatrix(const Matrix& w);
  ~WholeMatrix();
  WholeMatrix(const WholeMatrix&) = delete;
  WholeMatrix& operator=(const WholeMatrix&) = delete;
  // False when the piece failed to load (the source keeps the error).
  bool loaded() const { return view_.data != nullptr; }
  const Matrix& get() const { return view_; }

 private:
  const Matrix& w_;
  Matrix view_;
};

// Y[t, r] = sum_k W[r, k] X[t, k] for rows [row_begin, row_end) of every token; single-threaded.
void MatMulRows(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
                size_t row_begin, size_t row_end);
// The whole product, rows split across threads in fixed blocks (a row's arithmetic never
// depends on the split, so neither does the result). A streamed matrix is multiplied piece by
// piece as the pieces arrive; the rows of a piece that failed to load are left as they were
// (the source keeps the error and the layer fails).
void MatMul(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y);
// Resident matrices only (WholeMatrix gives a resident view of a streamed one).
// Dot product of row `row` with x; y += alpha * row.
float RowDot(const Matrix& w, size_t row, std::span<const float> x);
void RowAxpy(const Matrix& w, size_t row, float alpha, std::span<float> y);
// Row `row` widened to fp32.
void RowToFloat(const Matrix& w, size_t row, std::span<float> out);

struct KdaWeights {
  Matrix q, k, v, f_a, f_b, b, g, o;
  std::vector<float> q_conv, k_conv, v_conv;  // [channels, kernel]
  std::vector<float> a_log, dt_bias, o_norm;
};

struct MlaWeights {
  Matrix q_a, q_b, kv_a, kv_b, g, o;
  std::vector<float> q_a_norm, kv_a_norm;
};

struct DenseFfnWeights {
  Matrix gate, up, down;
};

struct MoeWeights {
  Matrix router, latent_down, latent_up, shared_gate, shared_up, shared_down;
  std::vector<float> router_bias, latent_norm;
};

struct LayerWeights {
  std::vector<float> input_norm, post_norm;
  // AttnRes: norm weight times projection, folded once (MODEL.md 2.2).
  std::vector<float> attn_res_fold, mlp_res_fold;
  KdaWeights kda;         // KDA layers
  MlaWeights mla;         // MLA layers
  DenseFfnWeights dense;  // the first_k_dense_replace layers
  MoeWeights moe;         // the others
};

struct TrunkWeights {
  // The embedding may be absent (its rows are then read on demand: LayerSource::Embed).
  Matrix embed, lm_head;
  std::vector<float> final_norm, output_res_fold;
  // Every layer. Its vectors (norms, AttnRes folds, convolutions, gates' small parameters) are
  // always resident, a few hundred KB a layer; its matrices are resident or streamed.
  std::vector<LayerWeights> layers;
  // Owns the bytes the resident matrices point into: the large ones in one arena (huge pages,
  // read past the page cache), the small and the widened ones in vectors.
  std::unique_ptr<io::BufferArena> arena;
  std::vector<std::vector<uint8_t>> storage;
  uint64_t bytes = 0;  // resident bytes
};

// Which trunk matrices stay in memory (the memory plan decides); the others are streamed.
struct TrunkResidency {
  std::vector<bool> layers;  // per layer: its matrices resident (empty: every layer)
  bool routers = true;       // every router resident; otherwise a router goes with its layer
  bool lm_head = true;
  bool embedding = true;  // false: rows read on demand
  // The handle of a streamed matrix (the trunk streamer's pieces), or of a resident one held
  // compressed; required when anything is.
  std::function<Matrix(const TensorInfo&)> stream;
  // Resident matrices held compressed (their handles come from `stream`); none when empty.
  std::function<bool(const TensorInfo&)> held;
};

// Whether the tensor of `spec` is held in memory under `residency` (vectors always are).
bool IsResident(const TrunkResidency& residency, const TensorSpec& spec);

// Reads every resident tensor and makes handles for the streamed ones. `progress(done, total)`
// reports bytes read.
absl::StatusOr<std::unique_ptr<TrunkWeights>> LoadTrunkWeights(
    const Checkpoint& ckpt, const std::function<void(uint64_t, uint64_t)>& progress = {},
    const TrunkResidency& residency = {});

}  // namespace k3
