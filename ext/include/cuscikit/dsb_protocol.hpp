// The wire format of the dSB request service, written once for the server, the load generator
// and (mirrored field by field in cuscikit/ising/protocol.py) Python clients. Little-endian.
//
// Request: a 48-byte header, then `payload_len` bytes of payload.
//   off size field
//     0  u32  magic 0x31425344 ("DSB1" in memory)
//     4  u16  version (1)
//     6  u16  flags (bit 0: LOAD, the payload is a model that replaces model `model_id`)
//     8  u64  request_id (echoed in the reply)
//    16  u32  model_id
//    20  u32  n (must equal the model's n; for LOAD the new model's n)
//    24  u32  steps (solve; 1 .. kMaxSteps)
//    28  u16  replicas B (solve; B * n_p <= kMaxPairs, n_p = n rounded up to 32)
//    30  u16  payload_type: 0 none (the model's own h), 1 the field h as int16[n] (solve);
//             2 binary couplings, the upper triangle's +1 bits packed in 32-bit words of
//             n (n - 1) / 2 bits, row by row; 3 int8 couplings, the upper triangle as
//             n (n - 1) / 2 signed bytes (LOAD; the model's h is then zero)
//    32  f32  dt (solve; finite, > 0)
//    36  u64  seed (solve: the Philox seed; replica b of the request draws as replica b of
//             `solve(model, agents=B, steps, dt, seed)`)
//    44  u32  payload_len
// Reply: a 32-byte header, then ceil(n / 32) u32 words of the best spins (bit j of word j / 32
// set = spin +1); no spin words unless status is OK.
//     0  u32  magic, 4 u16 version, 6 u16 status, 8 u64 request_id, 16 i64 energy,
//    24  u32  residence_ns (receive to reply, on the server's clock), 28 u32 n
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace csk::dsb::wire {

constexpr std::uint32_t kMagic = 0x31425344u;
constexpr std::uint16_t kVersion = 1;
constexpr std::size_t kRequestHeader = 48;
constexpr std::size_t kReplyHeader = 32;
constexpr std::uint16_t kFlagLoad = 1;
constexpr int kMaxN = 4096;      // spins of a served model
constexpr int kMaxPairs = 4096;  // B * n_p of one request (one block's registers on a GPU)
constexpr std::uint32_t kMaxSteps = 1u << 20;
constexpr std::size_t kMaxModelBytes = 512 * 1024;  // one model slot
constexpr std::size_t kMaxDatagram = 65507;         // the largest UDP payload over IPv4

enum Status : std::uint16_t {
  kOk = 0,
  kBusy = 1,
  kBadMagic = 2,
  kBadVersion = 3,
  kBadLength = 4,
  kTooLarge = 5,
  kBadParam = 6,
  kNoModel = 7,
  kStatusCount = 8
};

enum Payload : std::uint16_t { kNone = 0, kFieldInt16 = 1, kBinaryPlanes = 2, kInt8Upper = 3 };

struct Request {
  std::uint16_t version, flags;
  std::uint64_t request_id;
  std::uint32_t model_id, n, steps;
  std::uint16_t replicas, payload_type;
  float dt;
  std::uint64_t seed;
  std::uint32_t payload_len;
  const std::uint8_t* payload;
};

template <typename T>
inline T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
inline void store(std::uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

inline std::size_t upper_pairs(std::uint64_t n) { return std::size_t(n * (n - 1) / 2); }

// Bytes the payload of this type must have for n spins.
inline std::size_t payload_bytes(std::uint16_t type, std::uint64_t n) {
  switch (type) {
    case kNone:
      return 0;
    case kFieldInt16:
      return std::size_t(2 * n);
    case kBinaryPlanes:
      return 4 * ((upper_pairs(n) + 31) / 32);
    case kInt8Upper:
      return upper_pairs(n);
    default:
      return std::size_t(-1);
  }
}

// Parses and checks everything that does not depend on the served models. Returns kOk, or the
// status to reply with (the request id is filled whenever the header is long enough to hold it).
inline Status parse(const std::uint8_t* p, std::size_t len, Request& r) {
  r.request_id = len >= 16 ? load<std::uint64_t>(p + 8) : 0;
  if (len < 4 || load<std::uint32_t>(p) != kMagic) return kBadMagic;
  if (len < 6 || load<std::uint16_t>(p + 4) != kVersion) return kBadVersion;
  if (len < kRequestHeader) return kBadLength;
  r.version = load<std::uint16_t>(p + 4);
  r.flags = load<std::uint16_t>(p + 6);
  r.model_id = load<std::uint32_t>(p + 16);
  r.n = load<std::uint32_t>(p + 20);
  r.steps = load<std::uint32_t>(p + 24);
  r.replicas = load<std::uint16_t>(p + 28);
  r.payload_type = load<std::uint16_t>(p + 30);
  r.dt = load<float>(p + 32);
  r.seed = load<std::uint64_t>(p + 36);
  r.payload_len = load<std::uint32_t>(p + 44);
  r.payload = p + kRequestHeader;
  if (len != kRequestHeader + std::size_t(r.payload_len)) return kBadLength;
  if (r.n < 1 || r.n > std::uint32_t(kMaxN)) return kTooLarge;
  const std::size_t want = payload_bytes(r.payload_type, r.n);
  if (want == std::size_t(-1)) return kBadParam;
  if (r.payload_len != want) return kBadLength;
  const bool load_model = (r.flags & kFlagLoad) != 0;
  if ((r.flags & ~kFlagLoad) != 0) return kBadParam;
  if (load_model) {
    if (r.payload_type != kBinaryPlanes && r.payload_type != kInt8Upper) return kBadParam;
    if (r.payload_len > kMaxModelBytes) return kTooLarge;
    if (r.n < 2) return kBadParam;
    return kOk;
  }
  if (r.payload_type != kNone && r.payload_type != kFieldInt16) return kBadParam;
  const std::uint32_t n_p = (r.n + 31) / 32 * 32;
  if (r.replicas < 1 || std::uint64_t(r.replicas) * n_p > std::uint64_t(kMaxPairs))
    return kTooLarge;
  if (r.steps < 1 || r.steps > kMaxSteps) return kBadParam;
  if (!(std::isfinite(r.dt) && r.dt > 0.0f)) return kBadParam;
  return kOk;
}

inline std::size_t reply_bytes(std::uint16_t status, std::uint32_t n) {
  return kReplyHeader + (status == kOk ? 4 * std::size_t((n + 31) / 32) : 0);
}

// Writes the reply header (and the spin words when status is kOk and signs is not null) into
// out, which holds reply_bytes(status, n) bytes; returns that size.
inline std::size_t write_reply(std::uint8_t* out, std::uint16_t status, std::uint64_t request_id,
                               std::int64_t energy, std::uint32_t residence_ns, std::uint32_t n,
                               const std::uint32_t* signs) {
  store<std::uint32_t>(out, kMagic);
  store<std::uint16_t>(out + 4, kVersion);
  store<std::uint16_t>(out + 6, status);
  store<std::uint64_t>(out + 8, request_id);
  store<std::int64_t>(out + 16, energy);
  store<std::uint32_t>(out + 24, residence_ns);
  store<std::uint32_t>(out + 28, status == kOk ? n : 0u);
  if (status != kOk) return kReplyHeader;
  const std::size_t words = (n + 31) / 32;
  if (signs != nullptr) std::memcpy(out + kReplyHeader, signs, 4 * words);
  return kReplyHeader + 4 * words;
}

}  // namespace csk::dsb::wire
