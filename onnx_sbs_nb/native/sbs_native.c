/* Comparisons of two arrays in one pass: what diff.py computes with numpy in several.
 *
 * Built by the package build (hatch_build.py) into a shared library that
 * onnx_sbs_nb/native/__init__.py loads with ctypes; without it the numpy path runs.
 * Every result must equal the numpy path's bit for bit (tests/test_native.py): the
 * same IEEE operations in the same precision, so no -ffast-math and no contraction
 * of a * b + c into a fused multiply-add (-ffp-contract=off).
 */
#include <float.h>
#include <stdint.h>
#include <string.h>

#define SBS_NATIVE_VERSION 1

int sbs_native_version(void) { return SBS_NATIVE_VERSION; }

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* one build for any x86-64, with an AVX2 body picked at load time where the CPU has it */
#define SBS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SBS_CLONES
#endif

/* out: [max |e - g|, max |e - g| / (|e| + atol), positions where one side is non-finite
 * and the other is not the same non-finite value, count |e - g| > 0.1, count > 0.01,
 * count |e - g| > atol + rtol |e|], over the pairs where both sides are finite (the
 * others contribute nothing but their count).  Integers up to 2^31 per lane, so the
 * vector loop runs in chunks. */
#define SBS_COMPARE(NAME, T, IT, LANES, MAXV, ABSMASK)                                      \
    typedef T NAME##_v __attribute__((vector_size(sizeof(T) * LANES)));                    \
    typedef IT NAME##_m __attribute__((vector_size(sizeof(T) * LANES)));                   \
    SBS_CLONES int NAME(const T *e, const T *g, int64_t n, double atol, double rtol,        \
                        double *out) {                                                     \
        const T a_tol = (T)atol, r_tol = (T)rtol, r_add = atol > 0 ? a_tol : (T)1e-12;     \
        const T t01 = (T)0.1, t001 = (T)0.01;                                              \
        const NAME##_v zero = {0};                                                         \
        const NAME##_v va = zero + a_tol, vr = zero + r_tol, vadd = zero + r_add;          \
        const NAME##_v big = zero + MAXV, v01 = zero + t01, v001 = zero + t001;            \
        T m = 0, rel = 0;                                                                  \
        int64_t c_nan = 0, c01 = 0, c001 = 0, c_fail = 0, i = 0;                           \
        while (i + LANES <= n) {                                                           \
            int64_t stop = n - (n - i) % LANES;                                            \
            if (stop - i > ((int64_t)1 << 28)) stop = i + ((int64_t)1 << 28);              \
            NAME##_v vm = zero, vrel = zero;                                               \
            NAME##_m k_nan = {0}, k01 = {0}, k001 = {0}, k_fail = {0};                     \
            for (; i < stop; i += LANES) {                                                 \
                NAME##_v a, b;                                                             \
                memcpy(&a, e + i, sizeof a);                                               \
                memcpy(&b, g + i, sizeof b);                                               \
                NAME##_v ae = (NAME##_v)((NAME##_m)a & ABSMASK);                           \
                NAME##_v be = (NAME##_v)((NAME##_m)b & ABSMASK);                           \
                NAME##_m fin = (ae <= big) & (be <= big);                                  \
                NAME##_m same = (a == b) | ((a != a) & (b != b));                          \
                k_nan -= ~fin & ~same;                                                     \
                NAME##_v d = a - b;                                                        \
                d = (NAME##_v)((NAME##_m)d & ABSMASK & fin);                               \
                ae = (NAME##_v)((NAME##_m)ae & fin);                                       \
                NAME##_m up = d > vm;                                                      \
                vm = (NAME##_v)(((NAME##_m)d & up) | ((NAME##_m)vm & ~up));                \
                NAME##_v r = d / (ae + vadd);                                              \
                up = r > vrel;                                                             \
                vrel = (NAME##_v)(((NAME##_m)r & up) | ((NAME##_m)vrel & ~up));            \
                k01 -= d > v01;                                                            \
                k001 -= d > v001;                                                          \
                k_fail -= ~(d <= ae * vr + va);                                            \
            }                                                                              \
            for (int k = 0; k < LANES; k++) {                                              \
                m = vm[k] > m ? vm[k] : m;                                                 \
                rel = vrel[k] > rel ? vrel[k] : rel;                                       \
                c_nan += k_nan[k];                                                         \
                c01 += k01[k];                                                             \
                c001 += k001[k];                                                           \
                c_fail += k_fail[k];                                                       \
            }                                                                              \
        }                                                                                  \
        for (; i < n; i++) {                                                               \
            T a = e[i], b = g[i];                                                          \
            T ae = a < 0 ? -a : a, be = b < 0 ? -b : b;                                    \
            if (!(ae <= MAXV) || !(be <= MAXV)) {                                          \
                if (!(a == b || (a != a && b != b))) c_nan++;                              \
                continue;                                                                  \
            }                                                                              \
            T d = a - b;                                                                   \
            d = d < 0 ? -d : d;                                                            \
            m = d > m ? d : m;                                                             \
            T r = d / (ae + r_add);                                                        \
            rel = r > rel ? r : rel;                                                       \
            c01 += d > t01;                                                                \
            c001 += d > t001;                                                              \
            c_fail += !(d <= ae * r_tol + a_tol);                                          \
        }                                                                                  \
        out[0] = (double)m;                                                                \
        out[1] = (double)rel;                                                              \
        out[2] = (double)c_nan;                                                            \
        out[3] = (double)c01;                                                              \
        out[4] = (double)c001;                                                             \
        out[5] = (double)c_fail;                                                           \
        return 0;                                                                          \
    }

SBS_COMPARE(sbs_compare_f32, float, int32_t, 8, FLT_MAX, 0x7fffffff)
SBS_COMPARE(sbs_compare_f64, double, int64_t, 4, DBL_MAX, 0x7fffffffffffffffLL)

/* Whether b (cols x rows, C order) is a (rows x cols, C order) transposed, byte for
 * byte: a transposed weight against its twin.  A tile of a is read row by row (each row
 * a contiguous run), transposed into a buffer that stays in the cache, and compared
 * with the rows of b: neither array is walked across the cache. */
#define SBS_TILE 32
#define SBS_TRANSPOSED(NAME, T)                                                            \
    static int NAME(const T *a, const T *b, int64_t rows, int64_t cols) {                  \
        T buf[SBS_TILE][SBS_TILE];                                                         \
        for (int64_t i0 = 0; i0 < rows; i0 += SBS_TILE) {                                  \
            int64_t ni = rows - i0 < SBS_TILE ? rows - i0 : SBS_TILE;                      \
            for (int64_t j0 = 0; j0 < cols; j0 += SBS_TILE) {                              \
                int64_t nj = cols - j0 < SBS_TILE ? cols - j0 : SBS_TILE;                  \
                for (int64_t i = 0; i < ni; i++) {                                         \
                    const T *row = a + (i0 + i) * cols + j0;                               \
                    for (int64_t j = 0; j < nj; j++) buf[j][i] = row[j];                   \
                }                                                                          \
                for (int64_t j = 0; j < nj; j++)                                           \
                    if (memcmp(buf[j], b + (j0 + j) * rows + i0, (size_t)ni * sizeof(T)))  \
                        return 0;                                                          \
            }                                                                              \
        }                                                                                  \
        return 1;                                                                          \
    }

SBS_TRANSPOSED(transposed_u8, uint8_t)
SBS_TRANSPOSED(transposed_u16, uint16_t)
SBS_TRANSPOSED(transposed_u32, uint32_t)
SBS_TRANSPOSED(transposed_u64, uint64_t)

/* 1: equal, 0: not, -1: an item size this does not handle */
int sbs_equal_transposed(const void *a, const void *b, int64_t rows, int64_t cols,
                         int64_t itemsize) {
    switch (itemsize) {
    case 1: return transposed_u8(a, b, rows, cols);
    case 2: return transposed_u16(a, b, rows, cols);
    case 4: return transposed_u32(a, b, rows, cols);
    case 8: return transposed_u64(a, b, rows, cols);
    default: return -1;
    }
}

int sbs_same_bytes(const void *a, const void *b, int64_t nbytes) {
    return memcmp(a, b, (size_t)nbytes) == 0;
}
