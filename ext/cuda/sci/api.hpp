// Host-side interface of the CUDA kernels. Plain C++ (no CUDA headers) so that the nanobind
// module compiles with the host compiler; every pointer is a device pointer owned by the caller
// (PyTorch's caching allocator), every call is asynchronous on `stream` unless it says otherwise.
#pragma once
#include <cstddef>
#include <cstdint>

namespace csk::gpu {

using u64 = std::uint64_t;
using i64 = std::int64_t;

// The Hamiltonian as the kernels see it: spatial integrals and the double-excitation table of
// the CPU backend (pairs i<j, targets a | b << 16 sorted by decreasing |<ab||ij>|), plus `cut`:
// per pair, how many leading table entries lie above the screening threshold in use.
struct Tables {
  int norb = 0;
  int nwords = 0;
  const double* h1 = nullptr;
  const double* eri = nullptr;
  double e_core = 0.0;
  const i64* offsets = nullptr;
  const std::int32_t* targets = nullptr;
  const double* values = nullptr;
  const std::int32_t* cut = nullptr;
};

// |C(x)| for each of n sources (n_elec electrons each), written to counts.
void coupled_counts(const Tables& T, const u64* configs, i64 n, int n_elec, double eps, i64* counts,
                    void* stream);
// Writes C(x) for each source into [offsets[s], offsets[s] + counts[s]) of out_configs (rows of
// nwords) and out_values. Within a source: singles (occupied i, then spatial target), then
// doubles (occupied pairs in CPU order, table order): the CPU table walk's order.
void coupled_write(const Tables& T, const u64* configs, i64 n, int n_elec, double eps,
                   const i64* offsets, u64* out_configs, double* out_values, void* stream);
// <x|H|x>, E_core included.
void diagonal(const Tables& T, const u64* configs, i64 n, double* out, void* stream);

// Workspace bytes for sort_unique on n keys of `words` words.
std::size_t sort_unique_workspace(i64 n, int words, bool with_inverse);
// Sorts n keys (rows of `words` uint64, word words-1 most significant; only bits below end_bit
// of the concatenated key take part), writes the sorted unique keys to `unique` (room for n
// rows) and, if `inverse` is not null, unique[inverse[k]] == keys[k]. Synchronises the stream
// to return the number of unique keys. `keys` is left untouched.
i64 sort_unique(const u64* keys, i64 n, int words, int end_bit, u64* unique, i64* inverse,
                void* workspace, std::size_t workspace_bytes, void* stream);
// For each query, its row in `sorted` (unique, ascending) or -1.
void search_keys(const u64* sorted, i64 n_sorted, const u64* queries, i64 n_queries, int words,
                 i64* out, void* stream);
// Local-energy numerators per source s: sum over k in [offsets[s], offsets[s+1]) of
// values[k] * psi[index[k]] (complex psi as interleaved re, im), all of them (num_coupled) and
// those with in_space[index[k]] != 0 (num_variational). Deterministic (fixed reduction order).
void local_energy_sums(const i64* offsets, i64 n, const double* values, const i64* index,
                       const double* psi, const std::uint8_t* in_space, double* num_coupled,
                       double* num_variational, void* stream);

// The autoregressive transformer of cuscikit.nnqs.Ansatz as the amplitude kernel reads it
// (float32, device pointers). `layers`: n_layers blocks of amplitude_layer_floats(d_model)
// floats, each [wq | wk | wv | wo (d x d, (in, out) row-major) | w1 (d x 4d) | w2 (4d x d) |
// bq | bk | bv | bo | ln1 weight | ln1 bias | ln2 weight | ln2 bias (d each) | b1 (4d) | b2 (d)],
// padded to a multiple of 4 floats. tok_emb (5, dp), pos_emb (>= norb, dp), lnfw, lnfb (dp),
// wh (dp, 16): the head's (in, out) weights in columns 0-3; bias16 (>= norb, 16): the head's
// bias plus the position's logit bias in columns 0-3.
struct AmplitudeNet {
  int norb = 0, na = 0, nb = 0, words = 1;
  int d_model = 0, head_dim = 0, n_layers = 0, dp = 0;
  float scale = 1.0f;  // 1 / sqrt(head_dim)
  const float* layers = nullptr;
  // for products 1 and 2: per layer the six matrices (K x N) in the tensor-core kernel's
  // fragment order (weight ((kt N / 8 + nt) 32 + 4 g + t) 2 + c = W[8 kt + 2 t + c][8 nt + g])
  // at 8 bytes a weight (1: float64; 2: a lane's pair as TF32 hi, hi, lo, lo), then the vectors
  // as in `layers`: amplitude_layer_floats(d_model) + 12 d_model^2 floats per layer
  const float* layers_tc = nullptr;
  const float* tok_emb = nullptr;
  const float* pos_emb = nullptr;
  const float* lnfw = nullptr;
  const float* lnfb = nullptr;
  const float* wh = nullptr;
  const float* bias16 = nullptr;
};

// One stage: positions k0..k1-1 (at most 32) of n configurations (rows of `words` uint64),
// k1 - k0 lanes of a warp per configuration. With `parent`
// (int32 per configuration) the keys/values of positions 0..k0-1 come from pkv (per parent
// prefix: (layer, key|value, group of 16 columns, lpc positions, 16) float32) and pamp[parent]
// is added; with `store`, positions 0..k1-1 are written there in the same layout with lps
// positions. Output: 0.5 sum of the positions' log-probabilities (-inf outside the sector),
// float64 to out64 or float32 to out32.
struct AmplitudeStage {
  const u64* configs = nullptr;
  i64 n = 0;
  int k0 = 0, k1 = 0;
  const std::int32_t* parent = nullptr;
  const double* pamp = nullptr;
  const float* pkv = nullptr;
  int lpc = 16;
  float* store = nullptr;
  int lps = 16;
  double* out64 = nullptr;
  float* out32 = nullptr;
  int rows = 0;  // rows per thread: 1, 2 (d_model <= 48) or 0 for amplitude_default_rows
  // the products: 0 float32 FMAs (one thread per row, `rows`); on the tensor cores where
  // amplitude_tc_supported, else as 0: 1 float64 (exact float32 operands), 2 tf32x3
  int products = 0;
};

// Floats per layer block for d_model (0: no kernel for that width; 16, 32, 48, 64 with heads
// of 8 are compiled).
int amplitude_layer_floats(int d_model);
// Rows per thread the kernel takes by default for d_model: 2 up to 48 (every weight read from
// shared memory serves two rows), 1 at 64 (its weights fill shared memory); 0: not compiled.
int amplitude_default_rows(int d_model);
// Runs one stage (asynchronous on `stream`).
void amplitude_stage(const AmplitudeNet& net, const AmplitudeStage& st, void* stream);

}  // namespace csk::gpu
