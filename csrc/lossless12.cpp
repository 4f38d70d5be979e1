// Packer and unpacker for the `lossless12` bf16 weight format (see docs/lossless12.md).
//
// A bf16 weight W[N, K] is split into
//   signmant uint8[N, K]          sign bit << 7 | 7 mantissa bits
//   expcode  uint8[N, (K+1)/2]    4-bit exponent codes, low nibble = even k, odd K padded with 0
//   base     uint8[] or [N, G']   window base exponent per tensor or per group of G along K
//   row_ptr/col/bits              CSR list of escapes (exact bf16 bits of values outside the window)
// Code 0 means "exponent field 0" (zeros and subnormals); code c in 1..15 means exponent base+c-1.
// An escape is stored as signmant 0 / code 0, so the main planes decode it to +0.0.
//
// The work runs on raw uint16 buffers with the GIL released; rows are split across threads.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int kWindow = 15;                 // exponent values covered by codes 1..15
constexpr int kMaxBase = 255 - kWindow + 1;  // 241: the window's top stays at exponent 255

using Hist = std::array<uint64_t, 256>;

inline int exponent_of(uint16_t v) { return (v >> 7) & 0xFF; }
inline uint8_t signmant_of(uint16_t v) { return static_cast<uint8_t>(((v >> 8) & 0x80) | (v & 0x7F)); }

// The smallest base b in [1, kMaxBase] maximising the count of exponents in [b, b+kWindow-1].
// Exponent 0 never counts (it has its own code). `emin`/`emax` bound the nonzero exponents seen
// (emax == 0: none), and the best window lies in [emin-kWindow+1, emax], so only that is swept.
int choose_base(const Hist& hist, int emin, int emax) {
  if (emax == 0) return 1;
  const int lo = std::max(1, emin - kWindow + 1);
  const int hi = std::min(kMaxBase, emax);
  uint64_t cov = 0;
  for (int e = lo; e < lo + kWindow; ++e) cov += hist[e];
  uint64_t best_cov = cov;
  int best = lo;
  for (int b = lo + 1; b <= hi; ++b) {
    cov += hist[b + kWindow - 1];
    cov -= hist[b - 1];
    if (cov > best_cov) {  // strict: ties keep the smaller base
      best_cov = cov;
      best = b;
    }
  }
  return best;
}

// Histogram of the exponents of src[0..n), adding into `hist` and widening [emin, emax].
void add_exponents(const uint16_t* src, int64_t n, Hist& hist, int& emin, int& emax) {
  for (int64_t i = 0; i < n; ++i) {
    const int e = exponent_of(src[i]);
    hist[e]++;
    if (e != 0) {
      emin = std::min(emin, e);
      emax = std::max(emax, e);
    }
  }
}

// Per-thread list of escapes, concatenated in row order at the end.
struct Escapes {
  std::vector<int32_t> col;
  std::vector<uint16_t> bits;
};

// Emit one row segment [k0, k1) with window base `base`. k0 is even, so code nibbles pair up.
void emit_segment(const uint16_t* src, int64_t k0, int64_t k1, int base, uint8_t* sm, uint8_t* ec,
                  Escapes& esc, int32_t& row_count) {
  auto code_of = [&](int64_t k) -> uint8_t {
    const uint16_t v = src[k];
    const int e = exponent_of(v);
    const unsigned d = static_cast<unsigned>(e - base);
    if (d < static_cast<unsigned>(kWindow)) {
      sm[k] = signmant_of(v);
      return static_cast<uint8_t>(d + 1);
    }
    if (e == 0) {
      sm[k] = signmant_of(v);
      return 0;
    }
    sm[k] = 0;
    esc.col.push_back(static_cast<int32_t>(k));
    esc.bits.push_back(v);
    ++row_count;
    return 0;
  };
  int64_t k = k0;
  for (; k + 1 < k1; k += 2) {
    const uint8_t lo = code_of(k);
    const uint8_t hi = code_of(k + 1);
    ec[k >> 1] = static_cast<uint8_t>(lo | (hi << 4));
  }
  if (k < k1) ec[k >> 1] = code_of(k);  // odd tail: the high nibble is padding 0
}

// Run fn(row_begin, row_end, thread_index) over [0, n) split into contiguous chunks.
template <typename Fn>
void parallel_rows(int64_t n, int64_t work_per_row, int nthreads, Fn fn) {
  const int64_t min_work = int64_t(1) << 20;  // below ~1M elements a thread costs more than it saves
  int64_t useful = std::max<int64_t>(1, (n * work_per_row) / min_work);
  int t = static_cast<int>(std::min<int64_t>({static_cast<int64_t>(nthreads), n, useful}));
  if (t <= 1) {
    fn(0, n, 0);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + t - 1) / t;
  for (int i = 0; i < t; ++i) {
    const int64_t r0 = i * chunk, r1 = std::min(n, r0 + chunk);
    if (r0 >= r1) break;
    pool.emplace_back(fn, r0, r1, i);
  }
  for (auto& th : pool) th.join();
}

int thread_count() {
  const unsigned hc = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(hc == 0 ? 1 : hc, 1, 16));
}

template <typename T>
py::array_t<T> vector_to_array(const std::vector<std::vector<T>>& parts, int64_t total) {
  py::array_t<T> out(total);
  T* dst = out.mutable_data();
  for (const auto& p : parts) {
    if (!p.empty()) std::memcpy(dst, p.data(), p.size() * sizeof(T));
    dst += p.size();
  }
  return out;
}

py::tuple pack(py::array_t<uint16_t, py::array::c_style> bits, int64_t group_size) {
  if (bits.ndim() != 2) throw std::invalid_argument("lossless12 pack: expected a 2-D uint16 array");
  const int64_t n = bits.shape(0), k = bits.shape(1);
  if (n < 1 || k < 1) throw std::invalid_argument("lossless12 pack: the array is empty");
  if (k > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("lossless12 pack: K exceeds the int32 column index range");
  // Even group sizes keep both nibbles of a code byte in one group (emit_segment pairs them);
  // a group spanning the whole row may be odd since there is no second group to split a byte with.
  if (group_size < 0 || ((group_size & 1) && group_size < k))
    throw std::invalid_argument("lossless12 pack: group_size must be 0 (per tensor), even, or >= K");
  const bool per_tensor = group_size == 0;
  const int64_t g = per_tensor ? k : group_size;
  const int64_t ngroups = per_tensor ? 1 : (k + g - 1) / g;

  py::array_t<uint8_t> signmant({n, k});
  py::array_t<uint8_t> expcode({n, (k + 1) / 2});
  py::array_t<uint8_t> base = per_tensor ? py::array_t<uint8_t>(std::vector<py::ssize_t>{})
                                         : py::array_t<uint8_t>({n, ngroups});
  py::array_t<int32_t> row_ptr(n + 1);

  const uint16_t* src = bits.data();
  uint8_t* sm = signmant.mutable_data();
  uint8_t* ec = expcode.mutable_data();
  uint8_t* bs = base.mutable_data();
  int32_t* rp = row_ptr.mutable_data();
  const int nthreads = thread_count();
  std::vector<Escapes> per_thread(nthreads);
  std::vector<int32_t> row_count(n, 0);
  const int64_t ec_stride = (k + 1) / 2;

  {
    py::gil_scoped_release release;
    int tensor_base = 1;
    if (per_tensor) {
      // Pass 1: one exponent histogram over the whole tensor (per thread, then merged).
      std::vector<Hist> hists(nthreads);
      std::vector<int> emins(nthreads, 256), emaxs(nthreads, 0);
      for (auto& h : hists) h.fill(0);
      parallel_rows(n, k, nthreads, [&](int64_t r0, int64_t r1, int t) {
        add_exponents(src + r0 * k, (r1 - r0) * k, hists[t], emins[t], emaxs[t]);
      });
      Hist total{};
      int emin = 256, emax = 0;
      for (int t = 0; t < nthreads; ++t) {
        for (int e = 0; e < 256; ++e) total[e] += hists[t][e];
        emin = std::min(emin, emins[t]);
        emax = std::max(emax, emaxs[t]);
      }
      tensor_base = choose_base(total, emin, emax);
      bs[0] = static_cast<uint8_t>(tensor_base);
    }
    // Pass 2 (per group, while the group is still in cache: choose its base, then emit it).
    parallel_rows(n, k, nthreads, [&](int64_t r0, int64_t r1, int t) {
      Hist hist{};
      for (int64_t r = r0; r < r1; ++r) {
        const uint16_t* row = src + r * k;
        for (int64_t gi = 0; gi < ngroups; ++gi) {
          const int64_t k0 = gi * g, k1 = std::min(k, k0 + g);
          int b = tensor_base;
          if (!per_tensor) {
            int emin = 256, emax = 0;
            add_exponents(row + k0, k1 - k0, hist, emin, emax);
            b = choose_base(hist, emin, emax);
            hist[0] = 0;
            for (int e = emin; e <= emax; ++e) hist[e] = 0;
            bs[r * ngroups + gi] = static_cast<uint8_t>(b);
          }
          emit_segment(row, k0, k1, b, sm + r * k, ec + r * ec_stride, per_thread[t], row_count[r]);
        }
      }
    });
  }

  int64_t nnz = 0;
  rp[0] = 0;
  for (int64_t r = 0; r < n; ++r) {
    nnz += row_count[r];
    if (nnz > std::numeric_limits<int32_t>::max())
      throw std::invalid_argument("lossless12 pack: more than 2^31-1 escapes");
    rp[r + 1] = static_cast<int32_t>(nnz);
  }
  std::vector<std::vector<int32_t>> cols;
  std::vector<std::vector<uint16_t>> vals;
  for (auto& e : per_thread) {
    cols.push_back(std::move(e.col));
    vals.push_back(std::move(e.bits));
  }
  return py::make_tuple(signmant, expcode, base, row_ptr, vector_to_array(cols, nnz),
                        vector_to_array(vals, nnz));
}

void check(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("lossless12 unpack: ") + what);
}

py::array_t<uint16_t> unpack(py::array_t<uint8_t, py::array::c_style> signmant,
                             py::array_t<uint8_t, py::array::c_style> expcode,
                             py::array_t<uint8_t, py::array::c_style> base,
                             py::array_t<int32_t, py::array::c_style> row_ptr,
                             py::array_t<int32_t, py::array::c_style> col,
                             py::array_t<uint16_t, py::array::c_style> bits, int64_t group_size) {
  check(signmant.ndim() == 2, "signmant must be 2-D");
  const int64_t n = signmant.shape(0), k = signmant.shape(1);
  check(n >= 1 && k >= 1, "signmant is empty");
  check(expcode.ndim() == 2 && expcode.shape(0) == n && expcode.shape(1) == (k + 1) / 2,
        "expcode must have shape [N, (K+1)/2]");
  check(group_size >= 0 && (!(group_size & 1) || group_size >= k),
        "group_size must be 0 (per tensor), even, or >= K");
  const bool per_tensor = group_size == 0;
  const int64_t g = per_tensor ? k : group_size;
  const int64_t ngroups = per_tensor ? 1 : (k + g - 1) / g;
  if (per_tensor)
    check(base.ndim() == 0, "a per-tensor base must be a scalar");
  else
    check(base.ndim() == 2 && base.shape(0) == n && base.shape(1) == ngroups,
          "base must have shape [N, ceil(K/group_size)]");
  const uint8_t* bs = base.data();
  for (int64_t i = 0; i < base.size(); ++i)
    check(bs[i] >= 1 && bs[i] <= kMaxBase, "base exponents must lie in [1, 241]");
  check(row_ptr.ndim() == 1 && row_ptr.shape(0) == n + 1, "row_ptr must have N+1 entries");
  check(col.ndim() == 1 && bits.ndim() == 1 && col.shape(0) == bits.shape(0),
        "col and bits must be 1-D of equal length");
  const int32_t* rp = row_ptr.data();
  const int32_t* cl = col.data();
  check(rp[0] == 0 && rp[n] == col.shape(0), "row_ptr must start at 0 and end at the escape count");
  for (int64_t r = 0; r < n; ++r) check(rp[r] <= rp[r + 1], "row_ptr must be non-decreasing");
  for (int64_t i = 0; i < col.shape(0); ++i) check(cl[i] >= 0 && cl[i] < k, "escape column out of range");

  py::array_t<uint16_t> out({n, k});
  uint16_t* dst = out.mutable_data();
  const uint8_t* sm = signmant.data();
  const uint8_t* ec = expcode.data();
  const uint16_t* eb = bits.data();
  const int64_t ec_stride = (k + 1) / 2;
  {
    py::gil_scoped_release release;
    parallel_rows(n, k, thread_count(), [&](int64_t r0, int64_t r1, int) {
      std::array<uint16_t, 16> lut{};  // code -> exponent field already shifted into place
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* srow = sm + r * k;
        const uint8_t* erow = ec + r * ec_stride;
        uint16_t* orow = dst + r * k;
        for (int64_t gi = 0; gi < ngroups; ++gi) {
          const int b = per_tensor ? bs[0] : bs[r * ngroups + gi];
          lut[0] = 0;
          for (int c = 1; c < 16; ++c) lut[c] = static_cast<uint16_t>((b + c - 1) << 7);
          const int64_t k1 = std::min(k, (gi + 1) * g);
          for (int64_t j = gi * g; j < k1; ++j) {
            const uint8_t s = srow[j];
            const int c = (erow[j >> 1] >> ((j & 1) * 4)) & 0xF;
            orow[j] = static_cast<uint16_t>(((s & 0x80) << 8) | lut[c] | (s & 0x7F));
          }
        }
        for (int32_t i = rp[r]; i < rp[r + 1]; ++i) orow[cl[i]] = eb[i];
      }
    });
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "specpilot host-side hot loops (C++)";
  m.def("lossless12_pack", &pack, py::arg("bits").noconvert(), py::arg("group_size"),
        "Pack a C-contiguous uint16[N, K] array of bf16 bits (group_size 0 = per-tensor base).\n"
        "Returns (signmant, expcode, base, row_ptr, col, bits) as numpy arrays.");
  m.def("lossless12_unpack", &unpack, py::arg("signmant").noconvert(), py::arg("expcode").noconvert(),
        py::arg("base").noconvert(), py::arg("row_ptr").noconvert(), py::arg("col").noconvert(),
        py::arg("bits").noconvert(), py::arg("group_size"),
        "Rebuild the uint16[N, K] bf16 bits from the planes returned by lossless12_pack.");
}
